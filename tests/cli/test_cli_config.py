"""`ktrainer fit` as a Lightning user drives it: flags from the signatures, YAML configs, --print-config,
--ckpt-path, a package in the current directory; help that answers without importing TensorFlow."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import yaml

from ktrainer.cli.main import main
from ktrainer.cli.signature import trainer_signature_stub

TINY = '''
import keras
import numpy as np
import ktrainer as kt


class Tiny(kt.Module):
    def __init__(self, lr: float = 0.1, hidden: int = 4):
        """A tiny regression.

        Args:
            lr: The learning rate of SGD.
            hidden: Width of the hidden layer.
        """
        super().__init__()
        self.lr, self.hidden = lr, hidden

    def build(self):
        return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(self.hidden), keras.layers.Dense(1)])

    def configure_optimizers(self):
        return keras.optimizers.SGD(self.lr)

    def training_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))

    def validation_step(self, batch):
        x, y = batch
        return keras.ops.mean(keras.ops.square(self.model(x)[:, 0] - y))

    def train_data(self):
        x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
        return x, x.sum(axis=1)

    def val_data(self):
        x = np.random.default_rng(1).normal(size=(16, 3)).astype("float32")
        return x, x.sum(axis=1)
'''


@pytest.fixture
def package(tmp_path) -> str:
    """A package in the current directory holding the Module `Tiny`; its import path (unique per test)."""
    name = f"userpkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "models.py").write_text(TINY)
    return f"{name}.models"


def test_the_trainer_flags_are_exactly_the_trainers_signature_and_docs():
    import ktrainer as kt

    stub, real = inspect.signature(trainer_signature_stub()), inspect.signature(kt.Trainer.__init__)
    real_parameters = [p for name, p in real.parameters.items() if name != "self"]
    assert [p.name for p in stub.parameters.values()] == [p.name for p in real_parameters]
    for mine, theirs in zip(stub.parameters.values(), real_parameters, strict=True):
        assert mine.default == theirs.default, mine.name
    assert trainer_signature_stub().__doc__ == inspect.getdoc(kt.Trainer)


def test_module_and_trainer_arguments_from_flags_a_yaml_config_and_print_config(package, tmp_path, capsys):
    assert main(["fit", f"{package}:Tiny", "--module.lr", "0.05", "--max-epochs", "2", "--trainer.batch_size", "8",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    config = yaml.safe_load(printed)
    assert config["target"] == f"{package}:Tiny"
    assert config["module"] == {"lr": 0.05, "hidden": 4}
    assert config["trainer"]["max_epochs"] == 2 and config["trainer"]["batch_size"] == 8
    assert config["trainer"]["preemption_signals"] == ["SIGTERM", "SIGUSR1"]  # the Trainer's real default
    assert not (tmp_path / "tensorboard").exists()  # printing the config trains nothing

    (tmp_path / "run.yaml").write_text(printed)
    status = main(["fit", "--config", "run.yaml", "--trainer.enable_progress_bar", "false", "--module.hidden", "2"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "Finished: epoch 2, global step 10." in out  # 40 examples / 8 per step, 2 epochs
    assert "resume with --ckpt-path last" in out


def test_ckpt_path_last_resumes_the_run_from_the_command_line(package, capsys):
    common = ["fit", f"{package}:Tiny", "--batch-size", "8", "--no-progress-bar"]
    assert main([*common, "--max-epochs", "1"]) == 0
    assert "Finished: epoch 1, global step 5." in capsys.readouterr().out
    assert main([*common, "--max-epochs", "2", "--ckpt-path", "last"]) == 0
    out = capsys.readouterr().out
    assert "Finished: epoch 2, global step 10." in out  # went on from step 5, not from scratch
    fit_loss = float(next(line for line in out.splitlines() if "val/loss =" in line).split("=")[1])

    assert main(["validate", f"{package}:Tiny", "--ckpt-path", "last", "--batch-size", "8"]) == 0
    table = capsys.readouterr().out
    assert "Validate metric" in table
    row = next(line for line in table.splitlines() if "val/loss" in line)
    assert float(row.strip("│| ").split()[-1]) == pytest.approx(fit_loss, abs=1e-4)  # the checkpoint's weights
    assert main(["validate", f"{package}:Tiny", "--ckpt-path", "checkpoints/step-00000005", "--batch-size", "8",
                 "--no-progress-bar"]) == 0
    earlier = capsys.readouterr().out
    assert "Validate metric" in earlier and earlier != table


def test_callbacks_in_a_config_are_built_from_class_path(package, tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(textwrap.dedent(f"""
        target: {package}:Tiny
        trainer:
          max_epochs: 6
          batch_size: 8
          enable_progress_bar: false
          callbacks:
            - class_path: EarlyStopping
              init_args: {{monitor: val/loss, patience: 0, min_delta: 1000.0}}
    """))
    assert main(["fit", "--config", "run.yaml"]) == 0
    assert "Finished: epoch 2, global step 10." in capsys.readouterr().out  # stopped after one check without gain


@pytest.mark.parametrize(("argv", "words"), [
    (["fit"], ["ktrainer fit needs the Module to fit", "FILE.py:ClassName", "--config"]),
    (["fit", "PACKAGE:Tiny", "--module.learning_rate", "0.1"], ["unrecognized arguments: --module.learning_rate"]),
    (["fit", "PACKAGE:Tiny", "--max-epochs", "two"], ["trainer.max_epochs", "two"]),
    (["fit", "missing_pkg_xyz.models:Tiny"], ["Cannot import 'missing_pkg_xyz.models'", "run from the directory"]),
    (["fit", "PACKAGE:Tiny", "--config", "absent.yaml"], ["absent.yaml"]),
    (["fit", "--config", "absent.yaml"], ["ktrainer fit: error: Cannot read the config file absent.yaml"]),
    (["fit", "PACKAGE:Tiny", "--max-epochs", "0", "--no-logger"], ["ktrainer fit: error: max_epochs must be"]),
])
def test_command_line_mistakes_are_one_clear_error(package, argv, words, capsys):
    argv = [token.replace("PACKAGE", package) for token in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def _fastest_run(command: list[str]) -> float:
    best = float("inf")
    for _ in range(3):  # the quickest of three: the least disturbed by a busy machine
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True, timeout=120)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("command", [[], ["fit"], ["validate"], ["test"], ["demo"], ["ckpt"], ["ckpt", "ls"],
                                     ["launch"], ["compare-precision"]], ids=lambda c: " ".join(c) or "ktrainer")
def test_help_answers_without_importing_tensorflow(command):
    argv = [sys.executable, "-X", "importtime", "-m", "ktrainer.cli.main", *command, "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert not imported & {"tensorflow", "keras", "jax"}
    if command in ([], ["fit"], ["validate"]):
        # A ratio, not a time: Python's own start is the unit (importing TensorFlow alone is about 130 of them).
        ratio = _fastest_run(argv[:1] + argv[3:]) / _fastest_run([sys.executable, "-c", "pass"])
        assert ratio < 15, f"--help took {ratio:.1f}x the start of a bare Python"


def test_a_file_target_and_a_package_target_load_the_same_source_and_shadow_nothing(package, tmp_path):
    from ktrainer.cli.fit import load_module_class

    by_package = load_module_class(f"{package}:Tiny")
    by_file = load_module_class(f"{Path(package.replace('.', '/'))}.py:Tiny")
    assert inspect.getsourcefile(by_package) == inspect.getsourcefile(by_file) == str(
        tmp_path / package.replace(".", "/")) + ".py"
    (tmp_path / "yaml.py").write_text("from userpkg_helper import Helper as Model\n")  # a sibling import
    (tmp_path / "userpkg_helper.py").write_text("class Helper:\n    pass\n")
    assert load_module_class("yaml.py:Model").__name__ == "Helper"
    assert hasattr(sys.modules["yaml"], "safe_load")  # the real yaml is still yaml


def test_lightning_spellings_and_a_target_after_flags(package, capsys):
    from ktrainer.cli.config import RunParser

    config = RunParser("ktrainer fit", "", module_class=None).parse([f"{package}:Tiny", "--ckpt_path", "best"])
    assert config.ckpt_path == "best"
    assert main(["fit", "--max-epochs", "2", f"{package}:Tiny"]) == 2
    assert "TARGET (FILE.py:ClassName or package.module:ClassName) right after `fit`" in capsys.readouterr().err


def test_an_error_in_the_users_module_keeps_its_traceback(package, tmp_path):
    (tmp_path / "broken.py").write_text(TINY + textwrap.dedent("""
        class Broken(Tiny):
            def build(self):
                raise ValueError("my build is broken")
    """))
    with pytest.raises(ValueError, match="my build is broken"):  # not shortened to one line
        main(["fit", "broken.py:Broken", "--max-steps", "1", "--no-progress-bar"])

"""The Logger base class: where a run's folder is (`{save_dir}/{name}/version_N`), when it is chosen and created,
what the Trainer fills in, and the version a checkpoint carries so a resumed run appends to its own folder.

(tests/loggers/test_csv.py and test_tensorboard.py cover the concrete loggers; tests/cli/test_launch.py covers a
logger outside the chief of a cluster.)
"""

from __future__ import annotations

import fsspec
import pytest

from ktrainer.loggers import Logger

pytestmark = pytest.mark.both_backends


class Recorder(Logger):
    """A logger that keeps what it is given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.metrics, self.flushes = [], 0

    def log_metrics(self, metrics, step):
        self.metrics.append((step, metrics))

    def log_hyperparams(self, params):
        pass

    def flush(self):
        self.flushes += 1


def test_a_new_run_gets_the_next_version_after_the_highest_and_creates_its_folder_at_first_use(tmp_path):
    for name in ("version_0", "version_3", "version_x", "notes"):
        (tmp_path / "logs" / name).mkdir(parents=True)
    logger = Recorder(str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["notes", "version_0", "version_3", "version_x"]
    assert logger.log_dir == f"{tmp_path}/logs/version_4"
    assert (tmp_path / "logs" / "version_4").is_dir()


def test_the_version_is_fixed_at_first_use(tmp_path):
    logger = Recorder(str(tmp_path), name="runs")
    assert logger.version == 0
    (tmp_path / "runs" / "version_0").mkdir(parents=True)  # e.g. another run starting meanwhile
    (tmp_path / "runs" / "version_5").mkdir()
    assert logger.version == 0 and logger.log_dir.endswith("runs/version_0")
    assert Recorder(str(tmp_path), name="runs").version == 6


def test_a_given_version_is_kept_and_a_string_is_the_folder_name_itself(tmp_path):
    (tmp_path / "logs" / "version_9").mkdir(parents=True)
    assert Recorder(str(tmp_path), version=2).log_dir == f"{tmp_path}/logs/version_2"
    named = Recorder(str(tmp_path), version="baseline")
    assert named.version == "baseline" and named.log_dir == f"{tmp_path}/logs/baseline"
    assert (tmp_path / "logs" / "baseline").is_dir()


def test_constructing_a_logger_creates_nothing(tmp_path):
    Recorder(str(tmp_path / "root"), version=1)
    assert not (tmp_path / "root").exists()


def test_the_trainer_fills_in_save_dir_and_storage_options_only_when_not_given(tmp_path):
    trainer_options = {"auto_mkdir": True}
    unset = Recorder()
    unset.attach(str(tmp_path / "trainer_root"), trainer_options)
    assert unset.save_dir == str(tmp_path / "trainer_root") and unset.storage_options == trainer_options
    assert unset.log_dir == f"{tmp_path}/trainer_root/logs/version_0"
    assert unset.location.storage_options == trainer_options

    own = Recorder(str(tmp_path / "mine"), storage_options={"auto_mkdir": False})
    own.attach(str(tmp_path / "trainer_root"), trainer_options)
    assert own.save_dir == str(tmp_path / "mine") and own.storage_options == {"auto_mkdir": False}

    own_root_only = Recorder(str(tmp_path / "mine"))
    own_root_only.attach(str(tmp_path / "trainer_root"), trainer_options)
    assert own_root_only.storage_options == {}  # the trainer's options are for the trainer's root


def test_a_logger_without_save_dir_says_which_logger_and_how_to_fix_it():
    with pytest.raises(RuntimeError, match=r"Recorder has no save_dir: pass save_dir=\.\.\., or give it to a Trainer, "
                                           r"which uses its default_root_dir\."):
        Recorder().version  # noqa: B018


def test_a_remote_save_dir_gives_a_url_log_dir(tmp_path):
    root = f"memory://logger-{tmp_path.name}"
    logger = Recorder(root, name="tb")
    try:
        assert logger.log_dir == f"{root}/tb/version_0"
        assert not logger.location.is_local and logger.location.exists()
    finally:
        fsspec.filesystem("memory").rm(f"/logger-{tmp_path.name}", recursive=True)


def test_a_resumed_logger_takes_the_saved_version_and_appends_to_that_folder(tmp_path):
    first = Recorder(str(tmp_path))
    assert first.log_dir.endswith("version_0")
    (tmp_path / "logs" / "version_1").mkdir()  # a later run
    saved = first.state_dict()
    assert saved == {"version": 0}

    resumed = Recorder(str(tmp_path))
    resumed.load_state_dict(saved)
    assert resumed.log_dir == f"{tmp_path}/logs/version_0"


def test_a_loaded_version_does_not_override_a_given_one_nor_a_folder_already_in_use(tmp_path):
    given = Recorder(str(tmp_path), version=7)
    given.load_state_dict({"version": 0})
    assert given.version == 7

    in_use = Recorder(str(tmp_path))
    assert in_use.log_dir.endswith("version_0")
    (tmp_path / "logs" / "version_4").mkdir()
    in_use.load_state_dict({"version": 4})
    assert in_use.log_dir.endswith("version_0")

    nothing_saved = Recorder(str(tmp_path))
    nothing_saved.load_state_dict({})
    assert nothing_saved.version == 5


def test_the_state_key_names_the_class_and_the_folder_name():
    assert Recorder(name="tb").state_key == "Recorder{'name': 'tb'}"
    assert Recorder(name="tb").state_key != Recorder(name="csv").state_key


def test_a_subclass_must_implement_logging_and_finalize_flushes(tmp_path):
    base = Logger(str(tmp_path))
    with pytest.raises(NotImplementedError):
        base.log_metrics({"loss": 1.0}, step=1)
    with pytest.raises(NotImplementedError):
        base.log_hyperparams({"lr": 0.1})
    base.flush()
    base.finalize("success")  # the base flush does nothing, and nothing fails
    logger = Recorder(str(tmp_path))
    for status in ("success", "failed", "interrupted"):
        logger.finalize(status)
    assert logger.flushes == 3


def test_in_the_only_process_the_logger_writes():
    assert Recorder().writes

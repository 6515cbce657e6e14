"""`ktrainer ckpt ls|verify|export`."""

from __future__ import annotations

import numpy as np

import ktrainer as kt
from ktrainer.cli.main import main
from tests.helpers import Classifier


def test_ls_verify_and_export(tmp_path, capsys):
    trainer = kt.Trainer(max_epochs=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
                         logger=False)
    module = Classifier()
    trainer.fit(module)
    assert main(["ckpt", "ls", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:2]] == ["step-00000008", "step-00000016"]
    assert all(line.startswith("* ") and "  valid  " in line and "val/loss=" in line for line in lines[:2])
    assert lines[2] == "* the branch ckpt_path='last' follows (newest commit last)"

    assert main(["ckpt", "verify", str(tmp_path / "checkpoints")]) == 0
    capsys.readouterr()
    [broken] = (tmp_path / "checkpoints" / "step-00000008").glob("trainer.*.json")
    broken.write_bytes(broken.read_bytes().replace(b"{", b"[", 1))  # same size, wrong checksum
    assert main(["ckpt", "verify", str(tmp_path / "checkpoints")]) == 1
    assert f"INVALID: {broken.name} does not match its crc32c checksum" in capsys.readouterr().out

    out = tmp_path / "model.keras"
    assert main(["ckpt", "export", str(tmp_path / "checkpoints" / "step-00000016"), str(out)]) == 0
    import keras

    exported = keras.saving.load_model(str(out))
    np.testing.assert_allclose(exported(module.x[:3]).numpy(), module.model(module.x[:3]).numpy(), rtol=1e-5)


def test_missing_checkpoint_is_one_line_and_status_2(tmp_path, capsys):
    assert main(["ckpt", "export", str(tmp_path / "nothing" / "step-00000001"), str(tmp_path / "m.keras")]) == 2
    assert "is not a valid checkpoint: no such checkpoint" in capsys.readouterr().err

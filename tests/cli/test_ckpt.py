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


def test_odd_entries_are_reported_invalid_with_the_reason_never_a_traceback(tmp_path, capsys):
    kt.Trainer(max_steps=8, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False, logger=False,
               callbacks=[kt.callbacks.ModelCheckpoint(every_n_train_steps=4)]).fit(Classifier())
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step-00000001").write_text("a file named like a checkpoint")
    (checkpoints / "step-00000002").mkdir()
    (checkpoints / "step-00000002" / "manifest.json").write_text('{"format_version": 2, "ste')
    (checkpoints / "step-00000003").mkdir()
    (checkpoints / "step-00000003" / "manifest.json").write_text("[]")
    (checkpoints / "step-00000005").mkdir()
    (checkpoints / "step-00000005" / "manifest.json").write_text('{"format_version": 9, "step": 5, "files": []}')
    (checkpoints / "notes.txt").write_text("not named like a checkpoint: not listed")
    assert main(["ckpt", "ls", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert main(["ckpt", "verify", str(checkpoints)]) == 1
    verified = capsys.readouterr().out
    for out in (listed, verified):
        lines = {line[2:].split()[0]: line for line in out.splitlines() if line[2:].startswith("step-")}
        assert sorted(lines) == ["step-00000001", "step-00000002", "step-00000003", "step-00000004", "step-00000005",
                                 "step-00000008"]
        assert "INVALID: a file named like a checkpoint, not a checkpoint directory" in lines["step-00000001"]
        assert "INVALID: manifest is not valid JSON" in lines["step-00000002"]
        assert "INVALID: manifest is a JSON list, not an object" in lines["step-00000003"]
        assert "INVALID: format_version 9 is newer than this ktrainer reads" in lines["step-00000005"]
        assert "  valid  " in lines["step-00000004"] and "  valid  " in lines["step-00000008"]
        assert "Traceback" not in out and "notes.txt" not in out


def test_ls_without_checksums_says_complete_not_valid_and_verify_catches_a_bit_flip(tmp_path, capsys):
    kt.Trainer(max_steps=8, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
               logger=False).fit(Classifier())
    [shard] = (tmp_path / "checkpoints" / "step-00000008").glob("model-00000.*.tensors")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert main(["ckpt", "ls", "--no-checksums", str(tmp_path)]) == 0
    assert "complete (sizes checked)" in capsys.readouterr().out
    assert main(["ckpt", "ls", str(tmp_path)]) == 0
    assert f"INVALID: {shard.name} does not match its crc32c checksum" in capsys.readouterr().out
    assert main(["ckpt", "verify", str(tmp_path)]) == 1


class WithLambda(Classifier):
    def build(self):
        import keras

        inputs = keras.Input((20,))
        hidden = keras.layers.Lambda(lambda t: t * 2.0, name="doubled")(keras.layers.Dense(16)(inputs))
        return keras.Model(inputs, keras.layers.Dense(3, dtype="float32")(hidden))


def test_export_of_a_model_with_a_lambda_is_refused_in_one_paragraph_and_writes_nothing(tmp_path, capsys):
    kt.Trainer(max_steps=2, batch_size=32, default_root_dir=str(tmp_path), enable_progress_bar=False,
               logger=False).fit(WithLambda())
    [checkpoint] = (tmp_path / "checkpoints").glob("step-*")
    out = tmp_path / "model.keras"
    capsys.readouterr()
    assert main(["ckpt", "export", str(checkpoint), str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'doubled' (a keras.layers.Lambda)" in err and "Python code" in err
    assert "safe_mode" in err and "model.save(" in err
    assert not out.exists()

"""The Trainer's stateful components: unique checkpoint keys, and the checks a resume or a fit needs first."""

from __future__ import annotations

import logging
import os
import warnings
from types import SimpleNamespace

import pytest

from ktrainer.callbacks import EarlyStopping, ModelCheckpoint
from ktrainer.trainer.resume_checks import check_checkpoint_dirs, check_global_batch, check_keys, unique_keys


def keyed(*keys: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(state_key=key, number=index) for index, key in enumerate(keys)]


# ----- unique keys ------------------------------------------------------------------------------------


def test_duplicate_keys_are_numbered_in_order():
    components = keyed("key", "other", "key", "key")
    by_key = unique_keys(components)
    assert list(by_key) == ["key", "other", "key#2", "key#3"]
    assert [c.number for c in by_key.values()] == [0, 1, 2, 3]


def test_unique_keys_are_kept_as_they_are():
    assert list(unique_keys(keyed("b", "a", "c"))) == ["b", "a", "c"]
    assert unique_keys([]) == {}


def test_a_numbered_key_never_overwrites_a_component():
    components = keyed("key", "key#2", "key")
    by_key = unique_keys(components)
    assert len(by_key) == 3
    assert by_key["key#2"] is components[1]
    assert by_key["key#3"] is components[2]


def test_the_same_components_in_the_same_order_get_the_same_keys_in_another_run():
    first = unique_keys([EarlyStopping(), EarlyStopping(), EarlyStopping(monitor="val/acc", mode="max")])
    second = unique_keys([EarlyStopping(), EarlyStopping(), EarlyStopping(monitor="val/acc", mode="max")])
    assert list(first) == list(second)


def test_two_early_stoppings_with_different_monitors_get_distinct_unnumbered_keys():
    loss, acc = EarlyStopping(monitor="val/loss"), EarlyStopping(monitor="val/acc", mode="max")
    by_key = unique_keys([loss, acc])
    assert by_key == {loss.state_key: loss, acc.state_key: acc}
    assert loss.state_key != acc.state_key
    assert "val/loss" in loss.state_key and "val/acc" in acc.state_key
    assert not any("#" in key for key in by_key)


# ----- check_keys ---------------------------------------------------------------------------------------


class Stateful:
    def __init__(self, state=None):
        self.state = {"wait": 1} if state is None else state

    def state_dict(self):
        return self.state


def test_check_keys_warns_naming_orphaned_and_fresh_components():
    saved = {"EarlyStopping{'monitor': 'val/loss'}": {"wait": 2}, "Shared": {"wait": 0}}
    current = {"Shared": Stateful(), "EarlyStopping{'monitor': 'val/acc'}": Stateful()}
    with pytest.warns(UserWarning) as caught:
        check_keys("callbacks", saved, current)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "EarlyStopping{'monitor': 'val/loss'}" in message  # in the checkpoint, not in this run
    assert "EarlyStopping{'monitor': 'val/acc'}" in message   # in this run, not in the checkpoint
    assert "callbacks" in message
    assert "Shared" not in message


def test_check_keys_names_one_side_only_when_only_one_differs():
    with pytest.warns(UserWarning, match="does not have") as caught:
        check_keys("loggers", {"CSVLogger": {"version": 0}, "TensorBoardLogger": {"version": 0}},
                   {"CSVLogger": Stateful()})
    assert "TensorBoardLogger" in str(caught[0].message)
    assert "start fresh" not in str(caught[0].message)
    with pytest.warns(UserWarning, match="start fresh") as caught:
        check_keys("loggers", {}, {"CSVLogger": Stateful()})
    assert "does not have" not in str(caught[0].message)


def test_check_keys_ignores_stateless_components_on_either_side():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a progress bar added or dropped on resume changes nothing
        check_keys("callbacks", {"ProgressBar": {}, "a": {"x": 1}},
                   {"a": Stateful(), "LearningRateMonitor": Stateful({})})


def test_check_keys_is_silent_when_the_keys_match():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_keys("callbacks", {"a": {}, "b#2": {}}, {"b#2": Stateful(), "a": Stateful()})


# ----- check_global_batch ------------------------------------------------------------------------------


def progress(batch: int) -> dict:
    return {"global_step": 100, "epoch": 2, "batch_in_epoch": batch, "epoch_sums": None}


def test_the_same_global_batch_passes_the_progress_through():
    saved = progress(10)
    assert check_global_batch(saved, 32, 32, allow_change=False) is saved


def test_a_changed_global_batch_is_refused_naming_both_sizes_and_the_override():
    with pytest.raises(ValueError) as caught:
        check_global_batch(progress(10), 32, 48, allow_change=False)
    message = str(caught.value)
    assert "global batch of 32" in message
    assert "48" in message
    assert "allow_global_batch_change=True" in message


@pytest.mark.parametrize(("batch", "saved", "current", "mapped"), [
    (10, 32, 64, 5),    # 320 examples = 5 batches of 64
    (10, 64, 32, 20),   # 640 examples = 20 batches of 32
    (3, 32, 64, 1),     # 96 examples: the new batch boundary at or before it is 64 (never skips data)
    (0, 32, 48, 0),
    (7, 30, 7, 30),     # 210 examples = 30 batches of 7
])
def test_an_allowed_change_maps_the_position_in_examples(batch, saved, current, mapped, caplog):
    original = progress(batch)
    with caplog.at_level(logging.WARNING, logger="ktrainer"):
        result = check_global_batch(original, saved, current, allow_change=True)
    assert result["batch_in_epoch"] == mapped
    assert result["batch_in_epoch"] * current <= batch * saved  # no example of the epoch is skipped
    assert {k: v for k, v in result.items() if k != "batch_in_epoch"} == {
        k: v for k, v in original.items() if k != "batch_in_epoch"}
    assert original["batch_in_epoch"] == batch  # the saved progress is not modified
    assert f"global batch of {current} instead of {saved}" in caplog.text


# ----- check_checkpoint_dirs ---------------------------------------------------------------------------


@pytest.mark.parametrize("other", ["./runs/x/", "runs/x", "runs//x", "runs/y/../x", "file://{root}/runs/x",
                                   "{root}/runs/x/"])
def test_two_model_checkpoints_in_one_directory_are_refused(other, tmp_path):
    root = os.path.realpath(tmp_path)  # the tests run in tmp_path
    callbacks = [ModelCheckpoint("runs/x"), ModelCheckpoint(other.format(root=root), max_to_keep=1)]
    with pytest.raises(ValueError, match="same dirpath") as caught:
        check_checkpoint_dirs(callbacks, ".", {})
    assert f"file://{root}/runs/x" in str(caught.value)


def test_the_default_directory_and_its_explicit_spelling_are_one_directory(tmp_path):
    root = os.path.realpath(tmp_path / "out")
    callbacks = [ModelCheckpoint(), ModelCheckpoint(f"{root}/checkpoints", every_n_train_steps=10)]
    with pytest.raises(ValueError, match="same dirpath") as caught:
        check_checkpoint_dirs(callbacks, root, {})
    assert f"{root}/checkpoints" in str(caught.value)
    with pytest.raises(ValueError, match="same dirpath"):
        check_checkpoint_dirs([ModelCheckpoint(), ModelCheckpoint("checkpoints")], ".", {})


def test_a_symlink_to_a_directory_is_that_directory(tmp_path):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    os.symlink(tmp_path / "runs" / "x", tmp_path / "alias")
    with pytest.raises(ValueError, match="same dirpath"):
        check_checkpoint_dirs([ModelCheckpoint("runs/x"), ModelCheckpoint("alias")], ".", {})


@pytest.mark.parametrize("dirpaths", [("runs/x", "runs/y"), ("runs/x", "runs/x/sub"), (None, "runs/x"),
                                      ("memory://a", "memory://b"), ("runs/x", "memory://runs/x")])
def test_different_directories_are_accepted(dirpaths):
    callbacks = [ModelCheckpoint(dirpath) for dirpath in dirpaths] + [EarlyStopping(), EarlyStopping()]
    check_checkpoint_dirs(callbacks, ".", {})


def test_callbacks_without_a_location_are_ignored():
    check_checkpoint_dirs([EarlyStopping(), SimpleNamespace(state_key="x"), ModelCheckpoint()], ".", {})


def test_format_1_keys_are_adopted_by_the_only_component_of_their_class():
    from ktrainer.trainer.resume_checks import adopt_class_keys

    current = {"EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}": Stateful(), "ModelCheckpoint{...}": Stateful(),
               "ModelCheckpoint{...}#2": Stateful()}
    adopted = adopt_class_keys({"EarlyStopping": {"wait": 1}, "ModelCheckpoint": {"x": 1}, "Gone": {"y": 2}}, current)
    assert adopted == {"EarlyStopping{'monitor': 'val/loss', 'mode': 'min'}": {"wait": 1},
                       "ModelCheckpoint": {"x": 1}, "Gone": {"y": 2}}  # two ModelCheckpoints: ambiguous, left


def test_an_allowed_change_maps_the_runs_count_of_batches_too():
    result = check_global_batch({**progress(10), "batches_trained": 50}, 32, 64, allow_change=True)
    assert (result["batch_in_epoch"], result["batches_trained"]) == (5, 25)

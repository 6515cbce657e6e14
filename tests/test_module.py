"""The Module contract: hooks, self.log, save_hyperparameters, and the errors for a wrong module."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import ktrainer as kt
from tests.helpers import Classifier, Regressor, regression_data

pytestmark = pytest.mark.both_backends


def test_save_hyperparameters_records_constructor_arguments():
    assert Regressor(lr=0.5).hparams == {"lr": 0.5, "features": 4, "optimizer": "sgd"}
    assert Regressor(lr=0.5).hparams.lr == 0.5  # as Lightning users write it

    class Selected(kt.Module):
        def __init__(self, a=1, b=2):
            super().__init__()
            self.save_hyperparameters("b")

    assert Selected(b=5).hparams == {"b": 5}


class RecordingBase(kt.Module):
    def __init__(self, lr=0.1, **kwargs):
        super().__init__()
        self.save_hyperparameters()


class Widened(RecordingBase):
    def __init__(self, width=8, lr=0.3, **kwargs):
        super().__init__(lr=lr, **kwargs)


class Owner(kt.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.part = Widened(width=4)  # built inside another module's __init__: its own arguments only
        self.save_hyperparameters()


def test_save_hyperparameters_in_a_base_class_records_the_subclass_arguments_too():
    assert Widened(width=16, dropout=0.5).hparams == {"lr": 0.3, "width": 16, "dropout": 0.5}
    assert RecordingBase(lr=0.2).hparams == {"lr": 0.2}
    owner = Owner(depth=3)
    assert (owner.hparams, owner.part.hparams) == ({"depth": 3}, {"lr": 0.3, "width": 4})


class WithBackbone(kt.Module):
    def __init__(self, backbone, lr=0.1, data=None):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone", "data"])


def test_save_hyperparameters_leaves_out_what_ignore_names():
    assert WithBackbone(keras.layers.Dense(2), lr=0.5, data=[1, 2]).hparams == {"lr": 0.5}


def test_save_hyperparameters_outside_init_is_an_error():
    with pytest.raises(RuntimeError, match="__init__"):
        Regressor().save_hyperparameters()


class NoBuild(kt.Module):
    def configure_optimizers(self):
        return keras.optimizers.SGD()

    def training_step(self, batch):
        return 0.0


class NoTrainingStep(Regressor):
    training_step = kt.Module.training_step


class NoSuperInit(Regressor):
    def __init__(self):
        self.lr = 0.1


@pytest.mark.parametrize(
    ("module", "match"),
    [(NoBuild(), "does not define build"), (NoTrainingStep(), "does not define training_step"),
     (NoSuperInit(), r"super\(\).__init__\(\)")],
)
def test_missing_hooks_are_type_errors_naming_the_hook(quiet, module, match):
    with pytest.raises(TypeError, match=match):
        kt.Trainer(max_steps=1, **quiet).fit(module, train_data=regression_data())


class VectorLoss(Regressor):
    def training_step(self, batch):
        x, y = batch
        return keras.ops.square(self.model(x)[:, 0] - y)


class IntegerLoss(Regressor):
    def training_step(self, batch):
        return keras.ops.cast(keras.ops.sum(batch[1]), "int32")


class VectorLog(Regressor):
    def training_step(self, batch):
        self.log("train/vector", batch[1])
        return super().training_step(batch)


class BuildsNoModel(Regressor):
    def build(self):
        return keras.layers.Dense(1)


@pytest.mark.parametrize(
    ("module", "error", "match"),
    [
        (VectorLoss(), ValueError, r"shape \((None|32),\).*must be a scalar"),
        (IntegerLoss(), ValueError, "dtype int32.*must be a float"),
        (VectorLog(), ValueError, "train/vector.*must be scalars"),
        (BuildsNoModel(), TypeError, "must return a keras.Model"),
    ],
)
def test_wrong_step_outputs_are_clear_errors_before_any_step(quiet, module, error, match):
    trainer = kt.Trainer(max_steps=1, **quiet)
    with pytest.raises(error, match=match):
        trainer.fit(module, train_data=regression_data())
    assert trainer.global_step == 0


def test_log_needs_a_destination():
    with pytest.raises(ValueError, match="on_step and on_epoch are both False"):
        Regressor().log("x", 1.0, on_step=False, on_epoch=False)


def test_log_defaults_follow_the_stage(quiet):
    class Logs(Classifier):
        def validation_step(self, batch):
            self.log("val/both", 1.0, on_step=True, on_epoch=True)
            return super().validation_step(batch)

    trainer = kt.Trainer(max_steps=8, batch_size=32, **quiet)
    trainer.fit(Logs())
    assert "train/acc" in trainer.callback_metrics and "train/acc_epoch" not in trainer.callback_metrics
    assert {"val/acc", "val/loss", "val/both_epoch"} <= set(trainer.callback_metrics)
    assert "val/acc_step" not in trainer.callback_metrics


def test_validation_step_without_return_logs_only_what_it_logged(quiet):
    class NoReturn(Classifier):
        def validation_step(self, batch):
            super().validation_step(batch)

    metrics = kt.Trainer(**quiet).validate(NoReturn())
    assert set(metrics) == {"val/acc"}


def test_python_hooks_run_in_order(quiet):
    calls = []

    class Traced(Classifier):
        def setup(self, stage):
            calls.append(("setup", stage))

        def on_train_epoch_start(self):
            calls.append("epoch_start")

        def on_train_epoch_end(self):
            calls.append("epoch_end")

        def teardown(self, stage):
            calls.append(("teardown", stage))

    kt.Trainer(max_epochs=2, batch_size=128, **quiet).fit(Traced())
    assert calls == [("setup", "fit"), "epoch_start", "epoch_end", "epoch_start", "epoch_end", ("teardown", "fit")]


def test_model_is_built_once_and_reused_by_validate(quiet):
    module = Classifier()
    trainer = kt.Trainer(max_steps=3, batch_size=32, **quiet)
    trainer.fit(module)
    model = module.model
    before = [w.copy() for w in model.get_weights()]
    trainer.validate(module)
    assert module.model is model
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_trainer_side_state_is_one_object_that_a_step_hook_leaves_clean():
    from ktrainer.module import module_runtime

    module = Regressor()
    runtime = module_runtime(module)
    assert module_runtime(module) is runtime  # one object per Module, the one every room reaches
    module.log("train/stale", 9.0)
    helper = object()
    with pytest.raises(ValueError, match="the hook failed"), runtime.step_hook("val", manual=helper):
        assert runtime.take_logged() == {}  # what an earlier hook left is not this hook's
        assert runtime.manual is helper and runtime.stage == "val"
        module.log("val/x", 1.0)
        raise ValueError("the hook failed")
    assert runtime.manual is None  # gone after the hook, even when it raised: manual_step outside it is refused
    assert runtime.take_logged() == {"val/x": 1.0} and runtime.log_options["val/x"].on_epoch
    with pytest.raises(RuntimeError, match="inside training_step only"):
        type("Manual", (Regressor,), {"automatic_optimization": False})().manual_step(lambda: 0.0, None)


def test_the_state_of_a_module_without_super_init_is_a_clear_error():
    from ktrainer.module import module_runtime

    with pytest.raises(TypeError, match=r"NoSuperInit.__init__ did not call super\(\).__init__\(\)"):
        module_runtime(NoSuperInit())

"""The policy is set before build and restored after; layer dtypes; float32 overrides; the output check."""

from __future__ import annotations

import warnings

import keras
import pytest

import ktrainer as kt
from ktrainer.precision.report import check_output_dtype, output_dtypes
from tests.helpers import Classifier

pytestmark = pytest.mark.both_backends


class RecordsPolicy(Classifier):
    def build(self):
        self.policy_during_build = keras.config.dtype_policy().name
        model = keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.BatchNormalization(name="norm"),
                                  keras.layers.Dense(3, dtype="float32", name="logits")])
        return model


@pytest.mark.parametrize(("precision", "policy"), [("16-mixed", "mixed_float16"), ("bf16-mixed", "mixed_bfloat16"),
                                                   ("64-true", "float64")])
def test_policy_is_active_during_build_and_restored_after_fit(quiet, precision, policy):
    keras.config.set_dtype_policy("float32")
    module = RecordsPolicy()
    kt.Trainer(max_steps=2, batch_size=32, precision=precision, **quiet).fit(module)
    assert module.policy_during_build == policy
    assert keras.config.dtype_policy().name == "float32"


def test_callers_own_policy_is_restored_after_an_error_in_a_hook(quiet):
    class Fails(RecordsPolicy):
        def on_train_epoch_end(self):
            raise KeyError("boom")

    keras.config.set_dtype_policy("bfloat16")
    try:
        with pytest.raises(KeyError):
            kt.Trainer(max_epochs=1, batch_size=128, precision="16-mixed", **quiet).fit(Fails())
        assert keras.config.dtype_policy().name == "bfloat16"
    finally:
        keras.config.set_dtype_policy("float32")


def test_report_shows_float16_inside_and_float32_at_the_output(quiet):
    trainer = kt.Trainer(max_steps=1, batch_size=32, precision="16-mixed", **quiet)
    module = RecordsPolicy()
    trainer.fit(module)
    report = trainer.precision_report()
    assert list(report) == [layer.name for layer in module.model.layers]
    dense, norm, output = report.values()
    assert (dense.class_name, dense.compute_dtype, dense.variable_dtype) == ("Dense", "float16", "float32")
    assert (norm.compute_dtype, norm.variable_dtype) == ("float16", "float32")
    assert (output.compute_dtype, output.variable_dtype) == ("float32", "float32")


def test_report_needs_a_built_model():
    with pytest.raises(RuntimeError, match="needs a built model"):
        kt.Trainer().precision_report()


@pytest.mark.parametrize("selector", [keras.layers.BatchNormalization, "norm"])
def test_float32_layers_by_class_or_by_name(quiet, selector):
    trainer = kt.Trainer(max_steps=1, batch_size=32, precision="16-mixed", float32_layers=[selector], **quiet)
    trainer.fit(RecordsPolicy())
    report = trainer.precision_report()
    assert (report["norm"].compute_dtype, report["norm"].variable_dtype) == ("float32", "float32")
    assert [r.compute_dtype for r in report.values()] == ["float16", "float32", "float32"]


def test_float32_layers_naming_no_layer_lists_the_layers(quiet):
    trainer = kt.Trainer(max_steps=1, precision="bf16-mixed", float32_layers=["nope"], **quiet)
    with pytest.raises(ValueError, match=r"'nope' matches no layer.*norm \(BatchNormalization\), logits \(Dense\)"):
        trainer.fit(RecordsPolicy())


def test_float32_layers_must_be_classes_or_names():
    with pytest.raises(ValueError, match="float32_layers takes layer classes or layer names"):
        kt.Trainer(float32_layers=[3])


class HalfOutput(Classifier):
    def build(self):
        return keras.Sequential([keras.layers.Input((20,)), keras.layers.Dense(8), keras.layers.Dense(3)])


def test_a_float16_output_triggers_the_warning_with_the_fix(quiet):
    with pytest.warns(UserWarning, match=r"output is float16, not float32.*dtype=\"float32\".*keras.layers.Dense"):
        kt.Trainer(max_steps=1, batch_size=32, precision="16-mixed", **quiet).fit(HalfOutput())


def test_with_several_outputs_the_warning_names_every_layer_whose_output_is_not_float32():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((4,))
        outputs = {"a": keras.layers.Dense(1, name="a", dtype="float32")(inputs),
                   "b": keras.layers.Dense(1, name="b")(inputs), "c": keras.layers.Dense(1, name="c")(inputs)}
        model = keras.Model(inputs, outputs)
    finally:
        keras.config.set_dtype_policy(previous)
    dtypes, layers = output_dtypes(model)
    assert sorted(dtypes) == ["float16", "float16", "float32"] and layers == ["b", "c"]
    with pytest.warns(UserWarning, match=r"create layers 'b', 'c' with dtype=\"float32\""):
        check_output_dtype(dtypes, "16-mixed", "float16", layers)


def test_no_warning_when_the_output_is_float32_or_precision_is_full(quiet):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        kt.Trainer(max_steps=1, batch_size=32, precision="16-mixed", **quiet).fit(Classifier())
        kt.Trainer(max_steps=1, batch_size=32, **quiet).fit(HalfOutput())

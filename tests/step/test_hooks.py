"""Calling step hooks as Lightning users write them: which signatures get `batch_idx`, which index they get, what a
returned dict logs, and which precision-wrapped optimizer `manual_step` uses for the one it is given."""

from __future__ import annotations

import keras
import pytest

import ktrainer as kt
from ktrainer.module import module_runtime
from ktrainer.step.hooks import call_step_hook, loss_from_return, takes_batch_idx, traced_batch_index, wrapped_optimizer

pytestmark = pytest.mark.both_backends


class Hooks:
    def plain(self, batch):
        return batch

    def lightning(self, batch, batch_idx):
        return batch, batch_idx

    def renamed(self, batch, index):
        return batch, index

    def with_default(self, batch, batch_idx=None):
        return batch, batch_idx

    def keras_style(self, batch, training=True):
        return batch, training

    def variadic(self, *args):
        return args

    def keyword_only(self, batch, *, batch_idx=None):
        return batch, batch_idx


@pytest.mark.parametrize(("hook", "takes"), [
    ("plain", False), ("lightning", True), ("renamed", True), ("with_default", True), ("keras_style", False),
    ("variadic", True), ("keyword_only", False)])
def test_a_hook_takes_batch_idx_as_a_second_positional_parameter_named_so_or_without_default(hook, takes):
    assert takes_batch_idx(getattr(Hooks(), hook)) is takes


def test_a_hook_without_batch_idx_is_called_with_the_batch_alone():
    assert call_step_hook(Hooks(), "plain", "batch") == "batch"
    assert call_step_hook(Hooks(), "keras_style", "batch") == ("batch", True)  # its default is left alone


def test_outside_a_traced_step_the_index_is_a_zero_integer_tensor():
    batch, index = call_step_hook(Hooks(), "lightning", "batch")
    assert batch == "batch"
    assert int(keras.ops.convert_to_numpy(index)) == 0
    expected = "int64" if keras.config.backend() == "tensorflow" else "int32"  # JAX has int64 only with x64 on
    assert keras.backend.standardize_dtype(index.dtype) == expected


def test_while_a_step_is_traced_its_hooks_get_its_index_and_the_previous_one_comes_back_after():
    hooks = Hooks()
    with traced_batch_index("outer"):
        assert call_step_hook(hooks, "renamed", "batch") == ("batch", "outer")
        with pytest.raises(RuntimeError), traced_batch_index("inner"):
            assert call_step_hook(hooks, "variadic", "batch") == ("batch", "inner")
            raise RuntimeError("the step failed while tracing")
        assert call_step_hook(hooks, "lightning", "batch") == ("batch", "outer")
    _, index = call_step_hook(hooks, "lightning", "batch")
    assert int(keras.ops.convert_to_numpy(index)) == 0


def test_a_returned_loss_that_is_not_a_dict_comes_back_as_it_is():
    module = kt.Module()
    loss = keras.ops.convert_to_tensor(0.5)
    assert loss_from_return(module, loss, "training_step", "train") is loss
    assert loss_from_return(module, None, "validation_step", "val") is None
    assert module_runtime(module).take_logged() == {}


def test_a_returned_dict_gives_its_loss_and_logs_its_other_scalars_under_the_stage_prefix():
    module = kt.Module()
    loss, accuracy = keras.ops.convert_to_tensor(0.5), keras.ops.convert_to_tensor(0.75)
    predictions = keras.ops.zeros((4, 3))
    returned = {"loss": loss, "acc": accuracy, "count": 3, "weight": 0.5, "val/other": accuracy,
                "preds": predictions, "names": ["a", "b"]}
    assert loss_from_return(module, returned, "validation_step", "val") is loss
    logged = module_runtime(module).take_logged()
    assert set(logged) == {"val/acc", "val/count", "val/weight", "val/other"}  # the loss and non-scalars are not
    assert logged["val/acc"] is accuracy and logged["val/count"] == 3 and logged["val/weight"] == 0.5


def test_a_returned_dict_without_a_loss_is_refused_with_the_keys_it_has():
    with pytest.raises(ValueError, match=r"test_step returned a dict with keys \['acc', 'preds'\], but no 'loss': "
                                         r"return the loss tensor, or a dict whose 'loss' entry is the scalar loss"):
        loss_from_return(kt.Module(), {"preds": 1.0, "acc": 0.5}, "test_step", "test")


def test_manual_step_updates_with_the_wrapped_optimizer_of_the_one_it_is_given():
    generator, discriminator = keras.optimizers.Adam(), keras.optimizers.SGD()
    configured = [generator, discriminator]
    wrapped = [keras.optimizers.LossScaleOptimizer(generator), keras.optimizers.LossScaleOptimizer(discriminator)]
    assert wrapped_optimizer(discriminator, configured, wrapped) is wrapped[1]
    assert wrapped_optimizer(wrapped[0], configured, wrapped) is wrapped[0]  # already wrapped: itself
    assert wrapped_optimizer(generator, configured, configured) is generator  # a precision that wraps nothing
    with pytest.raises(ValueError, match=r"got an optimizer that configure_optimizers\(\) did not return: pass one "
                                         r"of self.optimizers\(\)."):
        wrapped_optimizer(keras.optimizers.SGD(), configured, wrapped)

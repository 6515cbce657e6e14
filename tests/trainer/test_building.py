"""Building a module: the policy is set before build() runs, a model the module already has is kept, a float16
output is named with its fix, and configure_optimizers' answer is read as one, a list or a dict."""

from __future__ import annotations

import keras
import pytest

import ktrainer as kt
from ktrainer.precision import resolve_precision
from ktrainer.trainer.building import build_model, build_optimizers, configured_optimizers
from tests.helpers import Regressor

pytestmark = pytest.mark.both_backends


@pytest.fixture
def engine():
    """The engine of a one-device Trainer, started; the global dtype policy is put back afterwards."""
    trainer = kt.Trainer(max_steps=1, logger=False, enable_progress_bar=False)
    trainer.engine.start()
    policy = keras.config.dtype_policy()
    yield trainer.engine
    keras.config.set_dtype_policy(policy)


class SeesPolicy(Regressor):
    def build(self):
        self.policy_in_build = keras.config.dtype_policy().name
        return keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1, dtype="float32")])


def test_the_policy_is_set_before_build_runs(engine):
    module = SeesPolicy()
    build_model(module, resolve_precision("16-mixed"), [], engine)
    assert module.policy_in_build == "mixed_float16"
    assert isinstance(module.model, keras.Model)


def test_a_model_the_module_already_has_is_kept(engine):
    module = Regressor()
    build_model(module, resolve_precision("32-true"), [], engine)
    first = module.model
    build_model(module, resolve_precision("32-true"), [], engine)
    assert module.model is first


def test_a_float16_output_under_mixed_precision_is_named_with_its_fix(engine):
    with pytest.warns(UserWarning, match=r"output is float16.*Fix: create layer 'dense.*' with dtype=\"float32\""):
        build_model(Regressor(), resolve_precision("16-mixed"), [], engine)


def test_optimizers_are_wrapped_for_loss_scaling_and_kept_unwrapped_as_configured(engine):
    module = SeesPolicy()
    precision = resolve_precision("16-mixed")
    build_model(module, precision, [], engine)
    built = build_optimizers(module, precision, engine, lr_scaling="linear")
    assert isinstance(built.configured[0], keras.optimizers.SGD)
    assert built.wrapped[0] is not built.configured[0]
    assert built.lr_factor == 1.0  # one replica: nothing to scale


class Manual(Regressor):
    automatic_optimization = False


def test_one_a_list_or_a_dict_of_optimizers_become_a_list_in_order():
    sgd, adam = keras.optimizers.SGD(), keras.optimizers.Adam()
    assert configured_optimizers(sgd, Regressor()) == [sgd]
    assert configured_optimizers([sgd, adam], Manual()) == [sgd, adam]
    assert configured_optimizers({"g": adam, "d": sgd}, Manual()) == [adam, sgd]


def test_what_is_not_optimizers_or_several_under_automatic_optimization_is_refused():
    with pytest.raises(TypeError, match="returned 'adam'; it must return a keras optimizer"):
        configured_optimizers("adam", Regressor())
    with pytest.raises(TypeError, match="returned 2 optimizers"):
        configured_optimizers([keras.optimizers.SGD(), keras.optimizers.SGD()], Regressor())

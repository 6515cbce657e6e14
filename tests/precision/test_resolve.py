"""Every precision value is accepted and means what it says; a wrong one lists the valid ones."""

from __future__ import annotations

import pytest

import ktrainer as kt
from ktrainer.precision import MixedPrecision, Precision, TruePrecision, resolve_precision

EXPECTED = {
    "32-true": ("float32", "float32", False), "32": ("float32", "float32", False),
    "16-mixed": ("mixed_float16", "float16", True), "bf16-mixed": ("mixed_bfloat16", "bfloat16", False),
    "16-true": ("float16", "float16", False), "bf16-true": ("bfloat16", "bfloat16", False),
    "64-true": ("float64", "float64", False), "64": ("float64", "float64", False),
}


@pytest.mark.parametrize("value", list(EXPECTED))
def test_each_value_resolves_to_its_policy(value):
    plugin = resolve_precision(value)
    assert (plugin.policy, plugin.compute_dtype, plugin.loss_scaling) == EXPECTED[value]
    assert kt.Trainer(precision=value).precision.policy == EXPECTED[value][0]


def test_plugin_types():
    assert type(resolve_precision("32")) is Precision
    assert isinstance(resolve_precision("16-mixed"), MixedPrecision)
    assert isinstance(resolve_precision("bf16-true"), TruePrecision)
    custom = MixedPrecision("16-mixed", initial_scale=8.0, growth_interval=3)
    assert kt.Trainer(precision=custom).precision is custom


@pytest.mark.parametrize("value", ["16", "fp16", "mixed_float16", "bf16", 16, None])
def test_wrong_value_lists_every_valid_one(value):
    with pytest.raises(ValueError) as caught:
        kt.Trainer(precision=value)
    message = str(caught.value)
    assert f"precision={value!r} is not supported" in message
    for valid in EXPECTED:
        assert repr(valid) in message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"precision": "32-true"}, "precision='32-true' is not supported"),
     ({"initial_scale": 0}, "initial_scale must be a finite number > 0"),
     ({"growth_interval": 0}, "growth_interval must be an int >= 1"),
     ({"stall_window": 0}, "stall_window must be an int >= 1")],
)
def test_mixed_precision_settings_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MixedPrecision(**kwargs)

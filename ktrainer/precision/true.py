"""True precisions: variables and compute in one dtype ("16-true", "bf16-true", "64-true")."""

from __future__ import annotations

from ktrainer.checks import check_choice
from ktrainer.precision.base import Precision

__all__ = ["TruePrecision"]

_DTYPES = {"16-true": "float16", "bf16-true": "bfloat16", "64-true": "float64"}


class TruePrecision(Precision):
    """Every layer stores and computes in one dtype; no loss scaling.

    float16 variables lose small updates (and Adam's epsilon underflows in float16): prefer
    "16-mixed" for training, "16-true" for inference or models known to tolerate it.

    Args:
        name: "16-true", "bf16-true" or "64-true".

    Raises:
        ValueError: For any other name, listing these.
    """

    def __init__(self, name: str) -> None:
        super().__init__(check_choice("precision", name, tuple(_DTYPES)))
        self.policy = self.compute_dtype = _DTYPES[name]

"""What `fit` returns: every epoch-level value of each epoch of that call, as Keras's History holds them."""

from __future__ import annotations

__all__ = ["History"]


class History:
    """The epoch-level values of the epochs one `fit` call trained, to plot or compare.

    `history.history` maps each name logged at epoch level (`train/loss_epoch`, `val/loss`,
    `val/acc`, a metric object's result, a value logged from an epoch hook) to its value at each
    epoch, in order; `history.epoch` lists those epochs (0-based). After a resume it holds the
    epochs of this call only. A name first logged in a later epoch has NaN for the earlier ones,
    so every list has one value per epoch.

    Attributes:
        history: name -> one value per epoch.
        epoch: The epochs, 0-based.
    """

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def record(self, epoch: int, values: dict[str, float]) -> None:
        """Add one epoch's values."""
        for name in values.keys() - self.history.keys():
            self.history[name] = [float("nan")] * len(self.epoch)
        for name, series in self.history.items():
            series.append(float(values.get(name, float("nan"))))
        self.epoch.append(epoch)

    def __repr__(self) -> str:
        return f"History(epochs={self.epoch}, names={sorted(self.history)})"

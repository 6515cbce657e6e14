"""AttributeDict: a dict whose keys read as attributes, for `module.hparams.lr` as Lightning users write it."""

from __future__ import annotations

from typing import Any

__all__ = ["AttributeDict"]


class AttributeDict(dict):
    """A dict whose keys are also attributes: `hparams.lr` is `hparams["lr"]`; still a plain dict to JSON."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r}; recorded: {sorted(self) or 'none'}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

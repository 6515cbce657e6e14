"""The logger interface: where the Trainer's metrics and hyperparameters go."""

from __future__ import annotations

from typing import Any

from ktrainer.utils.fs import Location, next_version

__all__ = ["Logger"]


class Logger:
    """Base class of a logger that writes under `{save_dir}/{name}/version_{N}`.

    Subclasses implement `log_metrics`, `log_hyperparams`, `flush` and `finalize`. The
    version folder is chosen when the Trainer first needs it: the next free number, unless
    `version` is given (a resumed run passes its own, to append to the same run).

    Only the chief of a multi-worker cluster writes (see `writes`); in the other workers a
    logger creates nothing: `log_dir` names the folder without creating it, and the logging
    methods do nothing.

    Args:
        save_dir: Root directory, a local path or any fsspec URL. None: the Trainer's
            `default_root_dir`.
        name: Sub-directory under `save_dir`.
        version: Version number (or full folder name); None picks the next free one.
        storage_options: Passed to the fsspec filesystem (credentials, endpoint, ...).
    """

    def __init__(self, save_dir: str | None = None, name: str = "logs", version: int | str | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.save_dir = save_dir
        self.name = name
        self._version = version
        self.storage_options = dict(storage_options or {})
        self._location: Location | None = None
        self._writes: bool | None = None

    def attach(self, default_root_dir: str, storage_options: dict[str, Any] | None = None) -> None:
        """Called by the Trainer: fill in `save_dir` from the Trainer's root when it was not given."""
        if self.save_dir is None:
            self.save_dir = default_root_dir
            if not self.storage_options:
                self.storage_options = dict(storage_options or {})

    @property
    def writes(self) -> bool:
        """True in the process that writes logs: the chief of a `TF_CONFIG` cluster (else worker 0) on
        TensorFlow, process 0 on JAX, or the only process. Decided at first use, by the backend's rule."""
        if self._writes is None:
            self._writes = _in_chief()
        return self._writes

    @property
    def version(self) -> int | str:
        """The version of this run (the next free number, fixed at first use)."""
        if self._version is None:
            self._version = next_version(self._parent())
        return self._version

    @property
    def location(self) -> Location:
        """The run's folder as a `Location` (created at first use, by the chief only)."""
        if self._location is None:
            version = self.version
            folder = version if isinstance(version, str) else f"version_{version}"
            self._location = self._parent().join(folder)
            if self.writes:
                self._location.makedirs()
        return self._location

    @property
    def log_dir(self) -> str:
        """The run's folder, as a path or URL."""
        return self.location.url

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record scalar metrics at a global step."""
        raise NotImplementedError

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything logged so far visible at `log_dir`."""

    def finalize(self, status: str) -> None:
        """Flush and close at the end of a run.

        Args:
            status: "success", "failed" or "interrupted".
        """
        self.flush()

    @property
    def state_key(self) -> str:
        """The key of this logger's state in a checkpoint: its class and folder name."""
        return f"{type(self).__name__}{{'name': {self.name!r}}}"

    def state_dict(self) -> dict[str, Any]:
        """The run's version, so a resumed run appends to the same folder."""
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved version, unless this logger was given one or has already written."""
        if self._version is None and self._location is None:
            self._version = state.get("version")

    def _parent(self) -> Location:
        if self.save_dir is None:
            raise RuntimeError(
                f"{type(self).__name__} has no save_dir: pass save_dir=..., or give it to a Trainer, "
                "which uses its default_root_dir."
            )
        return Location(str(self.save_dir), self.storage_options).join(self.name)


def _in_chief() -> bool:
    from ktrainer.backends import is_chief_process  # here: it imports Keras

    return is_chief_process()

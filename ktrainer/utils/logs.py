"""Where ktrainer's events go: the "ktrainer" logger, visible by default, TensorFlow's noise kept down.

Events a user must see (the run summary at the start of fit, the resumed checkpoint, why a run
stopped) are INFO lines of the "ktrainer" logger. An application that configured logging decides
what it shows; one that did not (a script, a notebook) sees them on stderr, as Lightning shows its
own. `-v` on the command line adds ktrainer's DEBUG lines, never a second copy of a line.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

__all__ = ["LOGGER_NAME", "show_events", "configure_logging", "quietly", "warn_user"]

LOGGER_NAME = "ktrainer"


class _UntilTheApplicationLogs(logging.Filter):
    """Passes records while the root logger has no handler: once the application sets up logging (even
    after the first Trainer), its handlers show ktrainer's lines and this one steps aside, so none is doubled."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn, pointing at the user's line that called into ktrainer (e.g. their `trainer.fit(...)`), however deep
    in ktrainer the warning is raised: a fixed `stacklevel` breaks whenever a room's call depth changes."""
    frame, level = sys._getframe(1), 2  # level 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def show_events() -> None:
    """Show ktrainer's INFO lines on stderr when the application set up no logging of its own."""
    logger = logging.getLogger(LOGGER_NAME)
    if any(isinstance(each, _UntilTheApplicationLogs) for handler in logger.handlers for each in handler.filters):
        return
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(_UntilTheApplicationLogs())
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def configure_logging(verbose: bool = False) -> None:
    """The command line's logging: ktrainer's events (DEBUG too when `verbose`); TensorFlow's warnings only."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    show_events()
    for noisy in ("tensorflow", "absl", "h5py", "jax"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbose else logging.ERROR)


def quietly(function: Any, *args: Any) -> None:
    """Call a clean-up function on the error path without hiding the original error."""
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 - the user's original error must surface unchanged
        warnings.warn(f"{getattr(function, '__qualname__', function)} failed during clean-up: {error!r}",
                      stacklevel=2)

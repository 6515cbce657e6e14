"""Where ktrainer's events go: on stderr when the application set up no logging, through the application's handlers
(never twice) once it has, more with `-v`, and clean-up errors turned into warnings that keep the user's error.

Each test starts as a fresh script does: no handler on the root logger or on "ktrainer". pytest adds its capture
handler to the root logger as each test's call begins, so the tests set it aside themselves (`as_a_script`).
"""

from __future__ import annotations

import logging
import os

import pytest

from ktrainer.utils.logs import LOGGER_NAME, configure_logging, quietly, show_events

pytestmark = pytest.mark.both_backends

NOISY = ("tensorflow", "absl", "h5py", "jax")


class Collect(logging.Handler):
    """An application's handler: keeps every message it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def ktrainer_logger(monkeypatch) -> logging.Logger:
    """The "ktrainer" logger as a fresh process has it; every logger's level restored after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    monkeypatch.setattr(logger, "handlers", [])
    for name in (LOGGER_NAME, *NOISY):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    logging.getLogger().manager._clear_cache()  # levels are cached per logger; the cache must see the new ones
    yield logger
    logging.getLogger().manager._clear_cache()


def as_a_script(monkeypatch) -> None:
    """No handler on the root logger, as in a script that set up no logging (put back after the test)."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])


def test_without_the_applications_logging_events_show_on_stderr_once(ktrainer_logger, capsys, monkeypatch):
    as_a_script(monkeypatch)
    show_events()
    show_events()
    assert len(ktrainer_logger.handlers) == 1
    ktrainer_logger.info("Resumed from step-00000010.")
    ktrainer_logger.debug("a detail")
    assert capsys.readouterr().err == "Resumed from step-00000010.\n"


def test_once_the_application_sets_up_logging_its_handlers_show_each_line_once(ktrainer_logger, capsys, monkeypatch):
    as_a_script(monkeypatch)
    show_events()  # the first Trainer, before the application configured logging
    application = Collect()
    logging.getLogger().addHandler(application)
    ktrainer_logger.info("Stopped: max_epochs=2 reached.")
    assert application.messages == ["Stopped: max_epochs=2 reached."]
    assert capsys.readouterr().err == ""


def test_an_application_that_logs_already_gets_no_handler_of_ours(ktrainer_logger, monkeypatch):
    as_a_script(monkeypatch)
    logging.getLogger().addHandler(Collect())
    show_events()
    assert ktrainer_logger.handlers == []


def test_a_level_the_application_chose_for_ktrainer_is_kept(ktrainer_logger, capsys, monkeypatch):
    as_a_script(monkeypatch)
    ktrainer_logger.setLevel(logging.WARNING)
    show_events()
    ktrainer_logger.info("an event the application chose not to see")
    assert ktrainer_logger.level == logging.WARNING
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("verbose", "own", "noisy"), [(False, logging.INFO, logging.ERROR),
                                                       (True, logging.DEBUG, logging.WARNING)])
def test_the_command_lines_logging_shows_debug_lines_only_with_verbose(ktrainer_logger, capsys, monkeypatch,
                                                                      verbose, own, noisy):
    as_a_script(monkeypatch)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    configure_logging(verbose=verbose)
    ktrainer_logger.debug("a detail")
    assert ktrainer_logger.level == own
    assert all(logging.getLogger(name).level == noisy for name in NOISY)
    assert capsys.readouterr().err == ("a detail\n" if verbose else "")
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_the_users_own_tensorflow_log_level_is_kept(ktrainer_logger, monkeypatch):
    as_a_script(monkeypatch)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    configure_logging()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_a_clean_up_that_fails_becomes_a_warning_naming_it_and_raises_nothing():
    closed = []

    def close_writer(name: str) -> None:
        closed.append(name)
        raise OSError("disk full")

    with pytest.warns(UserWarning, match=r"close_writer failed during clean-up: OSError\('disk full'\)"):
        quietly(close_writer, "events")
    assert closed == ["events"]

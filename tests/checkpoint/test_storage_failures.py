"""S3 failing under a run, as a user meets it: a write-once bucket, an outage, a failed commit, a reset
connection, a connection lost mid-upload, an async save failing in the background.

Every test runs against moto through `S3Proxy` (tests/checkpoint/s3_proxy.py), which injects the faults;
storage options make botocore try each call twice (see `storage_options_for`), so a failing save fails in
seconds. No sleeps: faults are switched from a callback at a known step, and times are measured.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import fsspec
import pytest
import s3fs

import ktrainer as kt
from ktrainer.checkpoint import CheckpointError, FsspecCheckpointIO
from ktrainer.utils.fs import Location
from tests.checkpoint.resume_run import Net
from tests.checkpoint.s3_proxy import (  # noqa: F401 - the fixtures s3_proxy and proxied_bucket
    DENIED,
    DROPPED,
    FORWARDED,
    RESET,
    UNAVAILABLE,
    proxied_bucket_fixture,
    s3_proxy_fixture,
    storage_options_for,
)

FAIL_WITHIN_S = 60  # generous: a failing save takes a few seconds with 2 attempts per call (see storage_options_for)


class AtStep(kt.callbacks.Callback):
    """Calls `action(trainer)` once, before the batch after the one that reaches `step` (so after that step's
    save: checkpoints run last in a hook), and notes when."""

    def __init__(self, step: int, action: Callable[[Any], Any]) -> None:
        self.step, self.action = step, action
        self.at: float | None = None
        self.result: Any = None

    def on_train_batch_start(self, trainer, module, batch_idx):
        if self.at is None and trainer.global_step == self.step:
            self.result = self.action(trainer)
            self.at = time.monotonic()


def make_trainer(bucket, max_steps: int, *callbacks, options: dict | None = None) -> kt.Trainer:
    return kt.Trainer(max_steps=max_steps, batch_size=32, default_root_dir=f"{bucket.url}/run",
                      storage_options=options or bucket.storage_options, callbacks=list(callbacks),
                      enable_progress_bar=False, logger=False)


def store(bucket) -> FsspecCheckpointIO:
    """The run's checkpoints, read straight from moto (the proxy's faults do not apply)."""
    return FsspecCheckpointIO(Location(f"{bucket.url}/run/checkpoints", bucket.direct_options))


def valid_names(bucket) -> list[str]:
    """The checkpoints that are valid, every checksum checked."""
    return [info.name for info in store(bucket).list(checksums=True) if info.valid]


def contents(bucket) -> dict[str, bytes]:
    """Every object under the run's checkpoints, by key (read straight from moto)."""
    fs = fsspec.filesystem("s3", **bucket.direct_options)
    fs.invalidate_cache()
    root = f"{bucket.url}/run/checkpoints".removeprefix("s3://")
    return {path: fs.cat_file(path) for path in fs.find(root)}


def committed(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    """Assert that every object there before is there after, byte for byte."""
    assert before, "nothing was committed before the fault"
    assert {k: after.get(k) for k in before} == before


def resume_last(bucket, max_steps: int, *callbacks) -> kt.Trainer:
    """A new Trainer continuing from the newest checkpoint (with the callbacks of the run that saved it)."""
    trainer = make_trainer(bucket, max_steps, kt.callbacks.ModelCheckpoint(every_n_train_steps=2), *callbacks)
    trainer.fit(Net(), ckpt_path="last")
    return trainer


# ----- 1. a write-once bucket ---------------------------------------------------------------------


def test_a_bucket_that_refuses_deletes_keeps_every_checkpoint_and_training_goes_on(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    s3_proxy.deny_deletes()
    trainer = make_trainer(bucket, 10, kt.callbacks.ModelCheckpoint(every_n_train_steps=2, max_to_keep=1))
    with pytest.warns(UserWarning, match="Could not delete checkpoint"):
        trainer.fit(Net())
    assert trainer.global_step == 10
    assert s3_proxy.count("DELETE", outcome=DENIED) > 0 and s3_proxy.count("DELETE", outcome=FORWARDED) == 0
    assert valid_names(bucket) == [f"step-{step:08d}" for step in (2, 4, 6, 8, 10)]

    with pytest.warns(UserWarning, match="Could not delete checkpoint"):  # retention of the resumed run: refused too
        resumed = resume_last(bucket, 12)
    assert resumed.run.parent.endswith("/run/checkpoints/step-00000010") and resumed.global_step == 12
    assert valid_names(bucket)[-2:] == ["step-00000010", "step-00000012"]


# ----- 2. and 5. a save that cannot reach the storage ---------------------------------------------


def fail_the_save_after_step_4(bucket, switch_fault: Callable[[], None], *, async_save: bool = False,
                               max_steps: int = 10):
    """Fit with a checkpoint every 2 steps; after step 4 is committed, switch the fault on.

    Returns:
        (the CheckpointError fit raised, the trainer, seconds from the fault to the error, the objects
        under the checkpoints when the fault began).
    """
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2, async_save=async_save)

    def fault(trainer):
        checkpoint.wait()  # step 4's save is committed (it runs in the background with async_save)
        assert checkpoint.last_saved.endswith("step-00000004")
        before = contents(bucket)
        switch_fault()
        return before

    switch = AtStep(4, fault)
    trainer = make_trainer(bucket, max_steps, checkpoint, switch)
    with pytest.raises(CheckpointError) as raised:
        trainer.fit(Net())
    elapsed = time.monotonic() - switch.at
    return raised.value, trainer, elapsed, switch.result


def test_an_outage_during_a_save_fails_it_in_bounded_time_and_loses_nothing(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    error, trainer, elapsed, before = fail_the_save_after_step_4(bucket, lambda: s3_proxy.unavailable("PUT"))
    print(f"\n503 SlowDown on every PUT: the save failed after {elapsed:.1f} s")
    assert trainer.global_step == 6 and elapsed < FAIL_WITHIN_S
    assert "step-00000006" in str(error) and "failed" in str(error)
    assert isinstance(error.__cause__, OSError) and "reduce your request rate" in str(error.__cause__)
    refused = s3_proxy.matching("PUT", outcome=UNAVAILABLE)
    assert refused and all("/step-00000006/" in r.key for r in refused)
    # each file: botocore's 2 attempts (the storage options) in each of s3fs's own tries of a SlowDown
    assert set(Counter(r.key for r in refused).values()) == {2 * s3fs.S3FileSystem.retries}
    assert s3_proxy.count("PUT", suffix="step-00000006/manifest.json") == 0  # never got as far as the commit

    committed(before, contents(bucket))
    assert valid_names(bucket) == ["step-00000002", "step-00000004"]
    s3_proxy.reset()
    resumed = resume_last(bucket, 6, AtStep(-1, lambda trainer: None))  # as the run that saved it
    assert resumed.run.parent.endswith("/step-00000004") and resumed.global_step == 6


def test_a_connection_lost_mid_upload_fails_the_save_in_bounded_time_and_loses_nothing(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    error, trainer, elapsed, before = fail_the_save_after_step_4(bucket, lambda: s3_proxy.drop_mid_upload())
    print(f"\nconnection lost mid-upload on every PUT: the save failed after {elapsed:.1f} s")
    assert trainer.global_step == 6 and elapsed < FAIL_WITHIN_S
    assert "step-00000006" in str(error) and error.__cause__ is not None
    attempts = [r for r in s3_proxy.requests if r.method == "PUT" and "/step-00000006/" in r.key]
    assert attempts and all(r.outcome == DROPPED for r in attempts)

    committed(before, contents(bucket))
    assert valid_names(bucket) == ["step-00000002", "step-00000004"]  # resumable, as the outage test shows


def test_an_outage_of_every_request_fails_the_save_with_a_checkpoint_error(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    outage = lambda: s3_proxy.unavailable(code="ServiceUnavailable")  # noqa: E731 - GET, HEAD, PUT, DELETE, ...
    error, trainer, elapsed, before = fail_the_save_after_step_4(bucket, outage)
    assert trainer.global_step == 6 and elapsed < FAIL_WITHIN_S
    assert "step-00000006" in str(error) and isinstance(error.__cause__, OSError)
    committed(before, contents(bucket))
    assert valid_names(bucket) == ["step-00000002", "step-00000004"]


# ----- 3. the commit itself fails ----------------------------------------------------------------------


def test_a_failed_manifest_put_leaves_the_previous_checkpoint_of_that_name_in_place(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    first = make_trainer(bucket, 4, kt.callbacks.ModelCheckpoint(every_n_train_steps=4))
    first.fit(Net())
    manifest_key = f"{bucket.url}/run/checkpoints/step-00000004/manifest.json".removeprefix("s3://")
    before = contents(bucket)
    assert list(before) and manifest_key in before

    s3_proxy.unavailable("PUT", suffix="manifest.json", code="ServiceUnavailable")
    second = make_trainer(bucket, 4, kt.callbacks.ModelCheckpoint(every_n_train_steps=4))  # a fresh run, same root
    with pytest.raises(CheckpointError, match="step-00000004") as raised:
        second.fit(Net())
    assert isinstance(raised.value.__cause__, OSError)
    assert s3_proxy.count("PUT", suffix="step-00000004/manifest.json", outcome=UNAVAILABLE) > 0
    assert s3_proxy.count("PUT", suffix=".tensors", outcome=FORWARDED) > 0  # its data files went out first

    after = contents(bucket)
    assert after[manifest_key] == before[manifest_key]
    [info] = store(bucket).list(checksums=True)
    assert info.valid and info.fields["run_id"] == first.run.run_id != second.run.run_id
    directory = manifest_key.rsplit("/", 1)[0]
    assert all(f"{directory}/{entry.name}" in after for entry in info.manifest.files)
    committed(before, after)


# ----- 4. a connection reset once ------------------------------------------------------------------------


def test_a_connection_reset_once_is_retried_and_the_save_succeeds(proxied_bucket, s3_proxy):
    bucket = proxied_bucket
    s3_proxy.reset_once(".tensors")
    trainer = make_trainer(bucket, 2, kt.callbacks.ModelCheckpoint(every_n_train_steps=2, verify_checksums=True))
    trainer.fit(Net())
    assert trainer.checkpoint_callback.last_saved.endswith("/step-00000002")

    [reset] = s3_proxy.matching("PUT", outcome=RESET)
    assert [(r.outcome, r.status) for r in s3_proxy.requests if r.method == "PUT" and r.key == reset.key] \
        == [(RESET, 0), (FORWARDED, 200)]
    [info] = store(bucket).list(checksums=True)
    assert info.valid and info.checksums_checked and info.name == "step-00000002"
    assert reset.key.rsplit("/", 1)[-1] in {entry.name for entry in info.manifest.files}


# ----- 6. an async save failing in the background ---------------------------------------------------------


@pytest.mark.parametrize("max_steps, raised_at", [(10, 8), (6, 6)], ids=["at-the-next-save", "at-the-end-of-fit"])
def test_an_async_save_that_fails_in_the_background_is_raised_by_fit(proxied_bucket, s3_proxy, max_steps, raised_at):
    bucket = proxied_bucket
    outage = lambda: s3_proxy.unavailable("PUT", code="ServiceUnavailable")  # noqa: E731
    error, trainer, elapsed, before = fail_the_save_after_step_4(bucket, outage, async_save=True, max_steps=max_steps)
    assert "step-00000006" in str(error) and isinstance(error.__cause__, OSError)
    assert trainer.global_step == raised_at and elapsed < FAIL_WITHIN_S
    assert not [r for r in s3_proxy.requests if "/step-00000008/" in r.key]  # the next save did not start
    refused = s3_proxy.matching("PUT", outcome=UNAVAILABLE)
    assert set(Counter(r.key for r in refused).values()) == {2}  # botocore's 2 attempts; s3fs does not retry these
    committed(before, contents(bucket))
    assert valid_names(bucket) == ["step-00000002", "step-00000004"]


# ----- how long a save takes to fail with s3fs's and botocore's defaults ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("code", ["SlowDown", "ServiceUnavailable"])
def test_how_long_a_save_takes_to_fail_under_an_outage_with_default_retries(proxied_bucket, s3_proxy, code):
    bucket = proxied_bucket
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2)
    switch = AtStep(2, lambda trainer: s3_proxy.unavailable("PUT", code=code))
    trainer = make_trainer(bucket, 4, checkpoint, switch, options=storage_options_for(s3_proxy.url, bounded=False))
    with pytest.raises(CheckpointError, match="step-00000004"):
        trainer.fit(Net())
    elapsed = time.monotonic() - switch.at
    refused = s3_proxy.matching("PUT", outcome=UNAVAILABLE)
    per_file = max(Counter(r.key for r in refused).values())
    print(f"\n503 {code} on every PUT, default s3fs/botocore retries: the save failed after {elapsed:.1f} s, "
          f"{per_file} PUTs of one file, {len(refused)} PUTs refused in all")
    assert elapsed < 600


# ----- 7. the storage goes away right after the commit ----------------------------------------------------


def test_storage_that_cannot_answer_after_the_commit_is_a_warning_not_the_end_of_training(proxied_bucket, s3_proxy,
                                                                                           caplog):
    bucket = proxied_bucket
    arm = AtStep(2, lambda trainer: s3_proxy.unavailable_after_put("step-00000004/manifest.json", method="GET"))
    heal = AtStep(4, lambda trainer: s3_proxy.reset())
    checkpoint = kt.callbacks.ModelCheckpoint(every_n_train_steps=2)
    trainer = make_trainer(bucket, 6, checkpoint, arm, heal)
    with caplog.at_level("WARNING", logger="ktrainer"), pytest.warns(UserWarning, match="to apply retention"):
        trainer.fit(Net())  # the save at step 4 could not be read back, nor the folder listed: training goes on
    assert "step-00000004 could not be read back to verify it" in caplog.text
    assert s3_proxy.count("GET", outcome=UNAVAILABLE) > 0
    assert "step-00000004" in valid_names(bucket) and trainer.global_step == 6

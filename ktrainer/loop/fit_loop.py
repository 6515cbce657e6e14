"""The training loop: epochs of compiled executions, validation inside them, hooks in order, until told to stop.

`Trainer.fit` builds everything, then runs a `FitLoop`. The loop asks the `Schedule` when to
validate, log and stop, keeps `Progress` (what a checkpoint resumes from) true after every
execution, and is the only place that calls the training hooks.
"""

from __future__ import annotations

import itertools
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ktrainer.backends.engine import InFlight
from ktrainer.callbacks import Callback, ModelCheckpoint
from ktrainer.callbacks.callback_list import call_hook
from ktrainer.callbacks.keras_adapter import KerasCallback
from ktrainer.checkpoint.format import checkpoint_name
from ktrainer.checks import defines_hook
from ktrainer.data.checks import check_stream_not_ended, check_training_steps
from ktrainer.data.sources import BatchSource
from ktrainer.loop.evaluation import run_evaluation
from ktrainer.loop.preemption import Preempted, SignalWatcher
from ktrainer.loop.run_summary import stop_line, stop_reason
from ktrainer.module import module_runtime
from ktrainer.progress import Progress
from ktrainer.step.metrics import EpochMetrics, hook_values, metric_object_values, reset_metric_objects
from ktrainer.step.outputs import APPLIED, CLOCK, LOSS_SCALE, SKIPPED, STOP

if TYPE_CHECKING:
    from ktrainer.module import Module
    from ktrainer.trainer import Trainer

__all__ = ["FitLoop", "save_checkpoints_now", "SKIPPED_STEPS"]

log = logging.getLogger("ktrainer")

SKIPPED_STEPS = "precision/skipped_steps"


class FitLoop:
    """Runs a built fit from `on_fit_start` to `on_fit_end`.

    Args:
        trainer: The Trainer (its progress, schedule, engine, callbacks, reporter and flags).
        module: The Module, built.
        train: The training data.
        train_step: The engine's training step (its update rules; `flush` ends an accumulation group).
        train_runner: The compiled training execution (`engine.train_runner`).
        val: The validation data, or None.
        val_runner: The compiled validation execution, or None.
        val_batches: Batches per validation (None: all).
        signals: The watcher of preemption signals.
    """

    def __init__(self, trainer: Trainer, module: Module, train: BatchSource, train_step: Any, train_runner: Any,
                 val: BatchSource | None, val_runner: Any, val_batches: int | None, signals: SignalWatcher) -> None:
        self.trainer, self.module = trainer, module
        self.train, self.train_step, self.train_runner = train, train_step, train_runner
        self.val, self.val_runner, self.val_batches = val, val_runner, val_batches
        self.signals = signals
        self.epoch_record: dict[str, float] = {}  # what History records of the current epoch
        self._validated_at: tuple[int, int, int] | None = None  # (epoch, batch, step) of the last validation
        self._validated_metrics: dict[str, float] = {}
        self.sync_each_batch = _batch_hooks_read_weights(trainer.callbacks)
        self.window = in_flight_window(trainer, module, train_runner, self.sync_each_batch)
        self.checkpoints = [callback for callback in trainer.callbacks if isinstance(callback, ModelCheckpoint)]
        self._stop_voted = False  # several processes: an execution's all-reduce said a process was signalled

    def run(self) -> None:
        """`on_fit_start`, epochs until the Schedule (or a callback, or a signal) stops them, `on_fit_end`.

        Raises:
            Preempted: After a preemption signal, once a checkpoint is saved.
        """
        trainer = self.trainer
        self._call("on_fit_start")
        if self._finished():
            log.warning("Nothing to train: the run is at step %d (epoch %d): %s. Raise the limit to train on.",
                        trainer.global_step, trainer.current_epoch, stop_reason(trainer))
        started = time.monotonic()
        try:
            while not self._finished():
                self._check_for_preemption()
                self._train_epoch()
        except _PreemptionRequested as request:
            self._stop_for_preemption(request.signum)
        trainer.engine.sync()
        self._call("on_train_end")
        if trainer.is_global_zero:
            log.info(stop_line(trainer, time.monotonic() - started))
        self._finalize_ema()
        self._call("on_fit_end")

    # ----- one epoch --------------------------------------------------------------------

    def _train_epoch(self) -> None:
        metrics = self._start_epoch()
        if self.trainer.progress.pending_validation and self.val is not None:
            self._validate()
        epoch_ended = self._run_batches(metrics)
        self._end_epoch(metrics, epoch_ended)

    def _start_epoch(self) -> EpochMetrics:
        trainer, module, progress = self.trainer, self.module, self.trainer.progress
        trainer.state.at_epoch_end = trainer.state.validated_this_epoch = False
        trainer.state.first_batch_of_epoch = progress.batch_in_epoch
        if progress.batch_in_epoch == 0:
            reset_metric_objects(module, "train")  # resumed mid-epoch, they hold the checkpoint's state
        progress.start_epoch()
        self.epoch_record = {}
        runtime = module_runtime(module)
        runtime.stage = "train"
        module.on_train_epoch_start()
        self._call("on_train_epoch_start")
        self._log_hook_values()
        return EpochMetrics(runtime.log_options, progress.epoch_sums)

    def _run_batches(self, metrics: EpochMetrics) -> bool:
        """Compiled executions until the epoch's batches run out, a step limit is hit, or a callback stops.

        Up to `window` executions are in flight: the next is dispatched before the oldest is read back,
        and each is accounted (progress, logs, batch hooks) in order, exactly as if it had been read at
        once. Whatever must see the state at a step (a save, a validation, the epoch's end, `max_steps`)
        is known when the execution before it is dispatched, which is then read back before another is.

        Returns:
            Whether the epoch ended (its batches, or its data, ran out).
        """
        trainer, progress = self.trainer, self.trainer.progress
        iterator = trainer.engine.batches(self.train, progress.epoch, self._batches_to_skip(), progress.shuffle_seed)
        flight: deque[_Dispatched] = deque()
        try:
            while True:
                if self._may_dispatch(flight):
                    try:
                        dispatched = self._dispatch(iterator, flight[-1].after if flight else progress)
                    except Exception:  # the data failed: the steps before it are trained, accounted as without a window
                        self._drain(flight, metrics)
                        raise
                    if dispatched is not None:
                        flight.append(dispatched)
                        if len(flight) < self.window and not dispatched.drain_after:
                            continue
                if not flight:
                    return self._epoch_counted_out()
                ended = self._finish(flight.popleft(), metrics, flight)
                if ended is not None:
                    self._drain(flight, metrics)  # dispatched before the stop was known: trained, so accounted
                    return ended or self._epoch_counted_out()
        except BaseException:
            _abandon(flight)
            raise

    def _drain(self, flight: deque[_Dispatched], metrics: EpochMetrics) -> None:
        """Read back and account every execution still in flight, oldest first."""
        while flight:
            self._finish(flight.popleft(), metrics, flight)

    def _may_dispatch(self, flight: deque[_Dispatched]) -> bool:
        if self.trainer.should_stop or self._stop_voted or (flight and flight[-1].drain_after):
            return False
        return self.trainer.engine.multi_process or self.signals.received is None

    def _dispatch(self, iterator: Any, planned: Any) -> _Dispatched | None:
        """Dispatch the execution after `planned` (the progress once every call in flight ran whole), deciding
        now what its end must see; None when the epoch or the run has no batch left."""
        trainer, schedule = self.trainer, self.trainer.schedule
        num_steps = schedule.batches_in_next_execution(planned)
        if num_steps == 0:
            return None
        if self.window == 1:
            self._call("on_train_batch_start", planned.batch_in_epoch)
        if trainer.engine.multi_process:
            if self.signals.received is not None:
                trainer.engine.request_stop(self.train_step)  # every process learns it from this execution's all-reduce
            trainer.engine.share_clock(self.train_step, trainer.clock.local())  # the chief's comes back to all
        after = schedule.progress_after(planned, num_steps)
        ahead = schedule.batches_after(planned, num_steps)
        now = trainer.clock.now()  # with several processes the chief's, as of the last execution read back
        saves = {id(callback): callback.save_due(after.global_step, now) for callback in self.checkpoints}
        drain = (ahead == 0 or any(reason is not None for reason in saves.values())
                 or (self.val is not None and schedule.validates_within_epoch(after)))
        call = self.train_runner.dispatch(iterator, num_steps, planned.batch_in_epoch, ahead=ahead)
        return _Dispatched(call, num_steps, planned.batch_in_epoch, after, after.global_step - planned.global_step,
                           saves, drain)

    def _finish(self, dispatched: _Dispatched, metrics: EpochMetrics, flight: deque[_Dispatched]) -> bool | None:
        """Read one execution back and account it; True when the epoch's data ended, False when the run stops
        here (a step limit, a callback), None to go on."""
        trainer, progress = self.trainer, self.trainer.progress
        outputs = dispatched.call.result()
        ran = len(outputs[APPLIED])
        if ran == 0:
            self._check_epoch_had_data()
            return True
        if self.window > 1:  # no batch hook reads the weights: called where the execution is accounted
            self._call("on_train_batch_start", dispatched.first_batch)
        step_metrics = self._account(outputs, metrics, updates_in_flight=sum(each.updates for each in flight))
        due = self.val is not None and trainer.schedule.validates_within_epoch(progress)
        progress.pending_validation = due  # a checkpoint saved before it runs (batch hooks, preemption) runs it
        if self.sync_each_batch:
            trainer.engine.sync()
        self._batch_end(dispatched, step_metrics)
        if trainer.engine.multi_process:
            self._agree(outputs)
        if not flight:  # the state is at this step: a preemption can be saved here
            self._check_for_preemption(outputs)
        if due:
            self._validate()
        if ran < dispatched.num_steps:
            return True
        return False if self._step_limit_or_stop() else None

    def _check_epoch_had_data(self) -> None:
        """An execution ran no batch: unless the epoch trained some already, its data ended before a first batch.

        Raises:
            ValueError: For a stream that ended in an earlier epoch, or data too short for one step.
        """
        trainer, progress = self.trainer, self.trainer.progress
        if progress.batch_in_epoch == 0:
            check_stream_not_ended(self.train, progress.epoch)
            check_training_steps(0, None, trainer.batch_size, trainer.engine.replicas)

    def _batch_end(self, dispatched: _Dispatched, step_metrics: dict[str, float]) -> None:
        """`on_train_batch_end`, with the saves decided at dispatch in force when the execution ran whole."""
        trainer, progress = self.trainer, self.trainer.progress
        if progress.global_step == dispatched.after.global_step:  # else its data ended early: decide now
            trainer.state.planned_saves = dispatched.planned_saves
        try:
            self._call("on_train_batch_end", step_metrics, progress.batch_in_epoch - 1)
        finally:
            trainer.state.planned_saves = None

    def _agree(self, outputs: dict[str, np.ndarray]) -> None:
        """Several processes: take the chief's clock and the stop vote from the execution's all-reduce."""
        self.trainer.clock.agree(outputs[CLOCK][-1])
        self._stop_voted = self._stop_voted or outputs[STOP][-1] > 0

    def _step_limit_or_stop(self) -> bool:
        """True when a callback asked to stop, or the run reached `max_steps`."""
        trainer = self.trainer
        limit = trainer.max_steps
        return trainer.should_stop or (limit is not None and trainer.progress.global_step >= limit)

    def _epoch_counted_out(self) -> bool:
        trainer = self.trainer
        return trainer.num_training_batches is not None and trainer.progress.batch_in_epoch >= \
            trainer.num_training_batches

    def _batches_to_skip(self) -> int:
        """The batches of this epoch already trained; for a stream (read once, across epochs), every batch the run
        trained, so a resumed run given the same generator anew continues where the interrupted one stopped."""
        progress, per_epoch = self.trainer.progress, self.trainer.num_training_batches
        if self.train.is_stream and per_epoch is not None:
            return progress.epoch * per_epoch + progress.batch_in_epoch
        return progress.batch_in_epoch

    def _account(self, outputs: dict[str, np.ndarray], metrics: EpochMetrics, updates_in_flight: int = 0
                 ) -> dict[str, float]:
        """Advance Progress over one execution's steps, log the steps the Schedule picks; the last step's metrics.
        `updates_in_flight`: the optimizer steps of the executions dispatched after this one (the optimizer's
        iteration count already holds them)."""
        trainer, progress = self.trainer, self.trainer.progress
        metrics.add(outputs)
        # Python lists: for the one or few steps of an execution, numpy's per-call cost is most of the work.
        stepped = [bool(each) for each in outputs[APPLIED].tolist()]
        skipped = [int(each) for each in outputs[SKIPPED].tolist()]
        ran = len(stepped)
        steps_after = list(itertools.accumulate(stepped, initial=progress.global_step))[1:]
        skips_after = list(itertools.accumulate(skipped, initial=progress.skipped_steps))[1:]
        log_at = trainer.schedule.log_indices(stepped, steps_after)
        running = metric_object_values(self.module, "train", epoch=False)  # their result after this execution
        for index in log_at:
            progress.global_step = steps_after[index]
            extra = {SKIPPED_STEPS: skips_after[index]} if trainer.precision.loss_scaling else {}
            trainer.log_metrics({**metrics.step_metrics(outputs, index), **running, **extra})
        trainer.state.logged_steps = tuple(
            (steps_after[index], _updates_after(stepped, skipped, index) + updates_in_flight) for index in log_at)
        progress.global_step = steps_after[-1]
        progress.skipped_steps = skips_after[-1]
        progress.batch_in_epoch += ran
        progress.batches_trained += ran
        scale = outputs.get(LOSS_SCALE)
        trainer.precision.watch([flag for flag, ended in zip(skipped, stepped, strict=True) if ended],
                                None if scale is None else float(scale[-1]))
        step_metrics = {**metrics.step_metrics(outputs, ran - 1), **running}
        trainer.reporter.remember(step_metrics, metrics.prog_bar_names())
        return step_metrics

    def _end_epoch(self, metrics: EpochMetrics, epoch_ended: bool) -> None:
        trainer, module, progress = self.trainer, self.module, self.trainer.progress
        if epoch_ended:
            stepped, skipped = self.train_step.flush()
            progress.global_step += int(stepped)
            progress.skipped_steps += int(skipped)
        trainer.state.at_epoch_end = True
        trainer.engine.sync()
        if self.val is not None and trainer.schedule.validates_at_epoch_end(progress):
            if self._validated_at == (progress.epoch, progress.batch_in_epoch, progress.global_step):
                self.epoch_record.update(self._validated_metrics)  # data of unknown length ended where it validated
            else:
                self._validate()
        epoch_values = {**metrics.epoch_metrics(), **metric_object_values(module, "train", epoch=True)}
        trainer.log_metrics(epoch_values)
        trainer.reporter.remember(epoch_values, metrics.prog_bar_names())
        self.epoch_record.update(epoch_values)
        progress.epoch_done = epoch_ended
        module_runtime(module).stage = "train"
        module.on_train_epoch_end()
        self._call("on_train_epoch_end")
        self._log_hook_values()
        if epoch_ended:
            trainer.history.record(progress.epoch, self.epoch_record)
        trainer.reporter.flush()
        self.train.end_epoch()
        if epoch_ended:
            progress.next_epoch()

    # ----- validation, stopping ---------------------------------------------------------

    def _validate(self) -> None:
        """A validation run inside fit. Preempted part-way, it is marked pending, and a resumed run repeats it
        (at an epoch end, the whole epoch end is repeated: the epoch is not marked done until it ran)."""
        trainer = self.trainer
        at_epoch_end = trainer.state.at_epoch_end
        trainer.progress.pending_validation = not at_epoch_end
        trainer.engine.sync()
        self._call("on_validation_start")
        metrics = run_evaluation(trainer, self.module, self.val, self.val_runner, self.val_batches, "val",
                                 before_execution=self._check_for_preemption)
        trainer.progress.pending_validation = False
        progress = trainer.progress
        self._validated_at = (progress.epoch, progress.batch_in_epoch, progress.global_step)  # the weights it saw
        self._validated_metrics = metrics
        trainer.log_metrics(metrics)
        if at_epoch_end:
            self.epoch_record.update(metrics)
        trainer.state.validated_this_epoch = at_epoch_end
        self._call("on_validation_end")

    def _finished(self) -> bool:
        return self.trainer.should_stop or self.trainer.schedule.finished(self.trainer.progress)

    def _check_for_preemption(self, outputs: dict[str, np.ndarray] | None = None) -> None:
        """Stop here when a preemption signal arrived.

        With several workers the decision is the one every worker read from the last training
        execution's all-reduce (`outputs`), so all stop after the same step and none waits
        forever in a collective; elsewhere (between epochs, during validation) they go on.
        """
        received = self.signals.received
        if not self.trainer.engine.multi_process:
            if received is not None:
                raise _PreemptionRequested(received)
        elif outputs is not None and outputs[STOP][-1] > 0:
            raise _PreemptionRequested(received if received is not None else signal.SIGTERM)

    def _stop_for_preemption(self, signum: int) -> None:
        """Save a checkpoint at the step reached (waiting for a save in flight), then raise Preempted."""
        trainer = self.trainer
        callback = trainer.checkpoint_callback
        if trainer.is_global_zero:
            saved = save_checkpoints_now(trainer, "preemption") or (
                [callback.last_saved] if callback and callback.last_saved else [])
        else:  # the chief saves, at the same step (every worker stopped after the same one)
            saved = [f"{trainer.checkpoint_dir.url.rstrip('/')}/{checkpoint_name(trainer.global_step)}"] \
                if callback else []
        preempted = Preempted(signum, trainer.global_step, saved[0] if saved else None)
        log.warning("%s Resume with ckpt_path='last'.", preempted)
        raise preempted

    def _finalize_ema(self) -> None:
        """Put the moving averages into the weights, as Keras's fit does for an optimizer with `use_ema=True`.

        After `on_train_end`, where the last checkpoint (raw weights and averages both, for an exact
        resume) is saved; `on_fit_end` hooks and the caller see the averaged weights.
        """
        engine = self.trainer.engine
        for rule in self.train_step.rules:
            inner = getattr(rule.optimizer, "inner_optimizer", rule.optimizer)
            if getattr(inner, "use_ema", False):
                engine.sync()
                inner.finalize_variable_values(rule.variables)
                engine.reload()
                self.trainer.state.averages_in_weights = True

    def _log_hook_values(self) -> None:
        """Log what the module logged from a Python hook (numbers), at once, at the current step."""
        values = hook_values(module_runtime(self.module).take_logged())
        if values:
            self.trainer.log_metrics(values)
            self.epoch_record.update(values)

    def _call(self, hook: str, *args: Any) -> None:
        call_hook(self.trainer.callbacks, hook, self.trainer, self.module, *args)


def save_checkpoints_now(trainer: Trainer, reason: str) -> list[str]:
    """Save through every ModelCheckpoint now and wait until each is committed; the URLs saved."""
    saved = []
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint):
            callback.save(trainer, reason=reason)
            callback.wait()
            if callback.last_saved:
                saved.append(callback.last_saved)
    return saved


def _updates_after(stepped: list[bool], skipped: list[int], index: int) -> int:
    """The optimizer updates an execution applied after its step `index`: steps that ended a group, not skipped."""
    return sum(ended and not skip for ended, skip in zip(stepped[index + 1:], skipped[index + 1:], strict=True))


def _batch_hooks_read_weights(callbacks: list) -> bool:
    """Whether a user's callback (or a Keras callback) has batch hooks, which may read the weights: the engine
    then syncs its state into the variables before them. ktrainer's own callbacks read none there."""
    def may_read(callback: Callback) -> bool:
        own = type(callback).__module__.startswith("ktrainer.callbacks.")
        if own and not isinstance(callback, KerasCallback):
            return False
        return any(defines_hook(callback, hook, Callback) for hook in ("on_train_batch_start", "on_train_batch_end"))

    return any(may_read(callback) for callback in callbacks)


def in_flight_window(trainer: Trainer, module: Module, runner: Any, batch_hooks_read_weights: bool) -> int:
    """How many executions the loop keeps in flight: `Trainer(max_in_flight=...)`, or 1 where the engine runs
    each call to its end before it returns (TensorFlow), or where an execution's effect must be known before
    the next is dispatched: a batch hook that may read the weights; loss scaling (an in-flight step may be
    skipped, so the optimizer's iteration count is unknown until read); manual optimization (each optimizer
    counts its own updates)."""
    if (not runner.dispatches_ahead or batch_hooks_read_weights or trainer.precision.loss_scaling
            or not module.automatic_optimization):
        return 1
    return trainer.max_in_flight


@dataclass(frozen=True)
class _Dispatched:
    """An execution in flight, with what the loop decided when it dispatched it."""

    call: InFlight
    num_steps: int  # the batches asked for
    first_batch: int  # its first batch's index in the epoch
    after: Progress  # the progress once it ran whole
    updates: int  # the optimizer steps it takes if it runs whole
    planned_saves: dict[int, str | None]  # each ModelCheckpoint's decision for its batch end
    drain_after: bool  # read back before another is dispatched


def _abandon(flight: deque[_Dispatched]) -> None:
    """Wait for the executions left in flight when the loop fails (their errors give way to the first)."""
    while flight:
        try:
            flight.popleft().call.result()
        except Exception:  # noqa: BLE001 - the loop's own error is the one raised
            pass


class _PreemptionRequested(Exception):  # noqa: N818 - a signal to unwind the loop, caught by run
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

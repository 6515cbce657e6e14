"""The Module: what the user writes. The Trainer owns everything else."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras

from ktrainer.utils.attribute_dict import AttributeDict

__all__ = ["Module", "LogOptions", "ModuleRuntime", "module_runtime"]


@dataclass(frozen=True)
class LogOptions:
    """How one logged value is aggregated and shown.

    Attributes:
        on_step: Log the value of each step (at the Trainer's `log_every_n_steps`).
        on_epoch: Log the mean over the epoch (weighted by batch size), at epoch end.
        prog_bar: Show the value in the progress bar.
    """

    on_step: bool
    on_epoch: bool
    prog_bar: bool


@dataclass(eq=False)
class ModuleRuntime:
    """What the Trainer keeps on a Module while it runs it; the user's code never touches it.

    The rooms that run a Module (the loop, the engines' steps, evaluation, the build) reach it with
    `module_runtime(module)`: one public door instead of each reading the Module's private names.

    Attributes:
        stage: The stage whose step hook runs now ("train", "val", "test", "predict"): sets
            `self.log`'s defaults and which metric objects a logged Metric joins.
        log_options: How each name `self.log` was given is aggregated and shown.
        metric_objects: The Keras metric objects logged, by stage, then by logged name.
        built_model: The model the Trainer's `build()` made (to tell it from a model the user set).
        configured_optimizers: What `configure_optimizers()` returned, as it returned it.
        manual: The compiled step's manual-optimization helper while `training_step` runs, else None.
    """

    stage: str = "train"
    log_options: dict[str, LogOptions] = field(default_factory=dict)
    metric_objects: dict[str, dict[str, keras.metrics.Metric]] = field(default_factory=dict)
    built_model: keras.Model | None = None
    configured_optimizers: Any = None
    manual: Any = None
    # MirroredStrategy runs each replica's step in a thread of its own: each logs into its own buffer
    _replica_local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def log_buffer(self) -> dict[str, Any]:
        """What was logged and not yet taken, in this thread."""
        if not hasattr(self._replica_local, "buffer"):
            self._replica_local.buffer = {}
        return self._replica_local.buffer

    def take_logged(self) -> dict[str, Any]:
        """What was logged since the last take, in this thread; the buffer is emptied."""
        logged = dict(self.log_buffer)
        self.log_buffer.clear()
        return logged

    @contextlib.contextmanager
    def step_hook(self, stage: str, manual: Any = None) -> Iterator[None]:
        """Around one step hook of `stage`: what an earlier hook left unlogged is dropped, and `manual`
        (the compiled step, for `self.manual_step`) is reachable only while the hook runs."""
        self.stage = stage
        self.take_logged()
        self.manual = manual
        try:
            yield
        finally:
            self.manual = None


def module_runtime(module: Module) -> ModuleRuntime:
    """The Trainer-side state of `module` (see `ModuleRuntime`).

    Raises:
        TypeError: When the Module's `__init__` did not call `super().__init__()`.
    """
    runtime = vars(module).get("_runtime")
    if not isinstance(runtime, ModuleRuntime):
        raise TypeError(f"{type(module).__name__}.__init__ did not call super().__init__(): call it first in "
                        "__init__, so the Module has the state the Trainer keeps on it.")
    return runtime


class Module:
    """Base class of a ktrainer module: build a model, configure an optimizer, compute a loss.

    Subclass it and override `build`, `configure_optimizers` and `training_step`; everything
    else is optional. The Trainer calls `build()` inside the right precision policy and
    distribution scope and stores the result as `self.model`.

    Attributes:
        automatic_optimization: True (default): the Trainer differentiates the loss `training_step`
            returns and steps the optimizer. False: `training_step` makes its updates itself with
            `self.manual_step(loss_fn, optimizer, variables)` (e.g. a GAN's discriminator and
            generator, each with its own optimizer); a loss it returns is logged, not differentiated.
        add_model_losses: Add the model's own losses (`model.losses`: kernel and activity
            regularizers, `add_loss` terms) to the loss `training_step` (and `validation_step`,
            `test_step`) returns, as Keras's `fit` and `evaluate` do, logged as `train/reg_loss`.
            Set it to False in a Module that adds them itself.

    Hooks are called in this order by `Trainer.fit`:
    `setup` -> `train_data` / `val_data` -> `build` -> `configure_optimizers` ->
    (`on_train_epoch_start` -> `training_step`... -> [`on_validation_epoch_start` ->
    `validation_step`... -> `on_validation_epoch_end`] -> `on_train_epoch_end`) per epoch ->
    `teardown`. docs/guide.md ("Order of hooks") shows them with the callbacks' hooks.
    """

    automatic_optimization: bool = True
    add_model_losses: bool = True

    def __init__(self) -> None:
        self.model: keras.Model | None = None
        self.trainer = None
        self.hparams: AttributeDict = AttributeDict()
        self._runtime = ModuleRuntime()

    # ----- hooks the user overrides -----------------------------------------------------

    def build(self) -> keras.Model:
        """Build and return the keras model. Called by the Trainer; the result becomes `self.model`.

        Returns:
            A `keras.Model`.
        """
        raise NotImplementedError

    def configure_optimizers(self) -> keras.optimizers.Optimizer | list | dict:
        """Return the keras optimizer (a `LearningRateSchedule` inside it is fine).

        Several optimizers (a list, or a dict by name) need `automatic_optimization = False`:
        `training_step` then decides which updates which variables, with `self.manual_step`.
        """
        raise NotImplementedError

    def configure_layout(self, mesh: Any) -> Any:
        """Say how each variable is split over the device mesh (strategy "model_parallel" or "fsdp", JAX).

        Called once before `build()` and `configure_optimizers()`; the variables are then created already
        sharded, and the optimizer's moments follow their variable's layout.

        Args:
            mesh: The run's `keras.distribution.DeviceMesh` (its `axis_names` and `shape`).

        Returns:
            A `keras.distribution.LayoutMap`, or a dict `{regex on variable.path: axes tuple}`, e.g.
            `{".*dense.*kernel": (None, "model")}` (the regex must match the whole path); None (the default):
            under "fsdp" every large variable is sharded along "batch", under "model_parallel" all replicated.
            A key that matches no variable, or an axis that does not divide its dimension, is an error before
            anything is trained or written.
        """
        return None

    def training_step(self, batch: Any) -> Any:
        """Compute and return the scalar float loss of one batch.

        Runs inside a compiled TensorFlow function: use `keras.ops`, not numpy.

        Args:
            batch: One batch, as the data yields it (e.g. an `(x, y)` tuple).

        Returns:
            A scalar float tensor.
        """
        raise NotImplementedError

    def validation_step(self, batch: Any) -> Any:
        """Evaluate one validation batch. A returned scalar is logged as `val/loss`.

        Args:
            batch: One batch of validation data.

        Returns:
            None, or a scalar tensor logged as `val/loss`.
        """
        return None

    def test_step(self, batch: Any) -> Any:
        """Evaluate one test batch. A returned scalar is logged as `test/loss`.

        Args:
            batch: One batch of test data.

        Returns:
            None, or a scalar tensor logged as `test/loss`.
        """
        return None

    def predict_step(self, batch: Any) -> Any:
        """Return the predictions of one batch. The default calls the model on the inputs.

        Args:
            batch: One batch; a tuple is taken as `(x, ...)` and only `x` is fed to the model.

        Returns:
            A tensor or a structure of tensors with a leading batch dimension.
        """
        x = batch[0] if isinstance(batch, tuple | list) else batch
        return self.model(x, training=False)

    def train_data(self) -> Any:
        """Return the training data (tf.data.Dataset, tuple of numpy arrays or PyDataset), or None."""
        return None

    def val_data(self) -> Any:
        """Return the validation data, or None."""
        return None

    def test_data(self) -> Any:
        """Return the test data, or None."""
        return None

    def predict_data(self) -> Any:
        """Return the data to predict on, or None."""
        return None

    def setup(self, stage: str) -> None:
        """Called before `build`, once per fit/validate/test/predict call.

        Args:
            stage: One of "fit", "validate", "test", "predict".
        """

    def teardown(self, stage: str) -> None:
        """Called at the end of fit/validate/test/predict, also after an error.

        Args:
            stage: One of "fit", "validate", "test", "predict".
        """

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch (Python, outside the compiled step)."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of each training epoch, after its validation."""

    def on_validation_epoch_start(self) -> None:
        """Called before each validation run (in fit or `validate`), after the validation metrics were reset."""

    def on_validation_epoch_end(self) -> None:
        """Called after each validation run; values logged here join its results."""

    def on_test_epoch_start(self) -> None:
        """Called before the test run, after the test metrics were reset."""

    def on_test_epoch_end(self) -> None:
        """Called after the test run; values logged here join its results."""

    # ----- services the module gets from ktrainer -----------------------------------------

    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
    ) -> None:
        """Log a scalar, or a Keras metric object, to every logger and, with `prog_bar=True`, to the progress bar.

        Works inside the step hooks, where `value` is a tensor of the compiled function, and in
        the Python hooks (`on_train_epoch_end`, `on_validation_epoch_end`, ...), where it may be a
        number: it is logged at once, at the current step.

        A `keras.metrics.Metric` (e.g. `keras.metrics.AUC()`, created in `build()` so it lives
        under the distribution strategy), updated by you in the step with `update_state`, is
        logged as its `result()`: at the end of the epoch (or evaluation), exact over every batch
        and every replica, and with `on_step` its running result at the log steps (with
        `steps_per_execution > 1`, at the end of each execution). The Trainer resets it at the
        start of each training epoch, validation run and test run; a checkpoint keeps a training
        metric's state, so a resumed epoch's result stays exact.

        Args:
            name: The metric name, e.g. "train/acc". Logged as `name` when only one of
                `on_step`/`on_epoch` is on, as `name_step` and `name_epoch` when both are.
            value: A scalar (tensor or number), or a `keras.metrics.Metric`.
            on_step: Log each step's value. Default: True in `training_step`, else False.
            on_epoch: Log the epoch mean. Default: False in `training_step`, else True.
            prog_bar: Show it in the progress bar.

        Raises:
            ValueError: If `name` is empty or neither `on_step` nor `on_epoch` is on.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log needs a non-empty string name, got {name!r}.")
        runtime = module_runtime(self)
        training = runtime.stage == "train"
        options = LogOptions(
            on_step=training if on_step is None else bool(on_step),
            on_epoch=(not training) if on_epoch is None else bool(on_epoch),
            prog_bar=bool(prog_bar),
        )
        if not (options.on_step or options.on_epoch):
            raise ValueError(
                f"self.log({name!r}, ...): on_step and on_epoch are both False, so the value "
                "would go nowhere. Set at least one of them to True."
            )
        runtime.log_options[name] = options
        if isinstance(value, keras.metrics.Metric):
            runtime.metric_objects.setdefault(runtime.stage, {})[name] = value
            return
        runtime.log_buffer[name] = value

    def optimizers(self) -> Any:
        """The optimizers `configure_optimizers()` returned, as it returned them (one, a list or a dict).

        Raises:
            RuntimeError: Before the Trainer configured them.
        """
        configured = module_runtime(self).configured_optimizers
        if configured is None:
            raise RuntimeError("self.optimizers() is known once the Trainer called configure_optimizers(): use it "
                               "in training_step or a later hook.")
        return configured

    def manual_step(self, loss_fn: Any, optimizer: Any, variables: Any = None) -> Any:
        """Update `variables` with `optimizer` from the loss `loss_fn()` returns (manual optimization).

        Call it in `training_step` when `automatic_optimization = False`, once per update. It
        computes the gradients of the loss (the mean over this replica's batch) and applies, under
        the Trainer's precision and strategy, loss scaling, the non-finite skip decided for all
        replicas at once, gradient clipping and accumulation, each update with its own loss scale.

        Args:
            loss_fn: A function of no arguments returning the scalar loss (call the model inside it).
            optimizer: One of `self.optimizers()`.
            variables: The variables to update; default: every trainable variable of `self.model`.

        Returns:
            The loss.

        Raises:
            RuntimeError: Outside `training_step`, or with automatic optimization.
            ValueError: For an optimizer `configure_optimizers()` did not return.
        """
        if self.automatic_optimization:
            raise RuntimeError(f"self.manual_step(...) needs manual optimization: set automatic_optimization = "
                               f"False in {type(self).__name__} (the Trainer then makes no update of its own).")
        manual = module_runtime(self).manual
        if manual is None:
            raise RuntimeError("self.manual_step(...) works inside training_step only.")
        return manual.manual_step(loss_fn, optimizer, variables)

    def save_hyperparameters(self, *names: str, ignore: str | Sequence[str] | None = None) -> None:
        """Record the constructor arguments in `self.hparams`; loggers and checkpoints carry them.

        Call it in `__init__` after `super().__init__()`. With no names, every argument of the
        calling `__init__` is recorded, and of every `__init__` of this object's classes that led to
        it: called in a base class, it records the subclass's arguments too (a subclass's value wins).

        Args:
            *names: Only record these arguments.
            ignore: Leave these arguments out (e.g. a backbone model or a dataset: not hyperparameters).

        Raises:
            RuntimeError: If not called from within an `__init__`.
        """
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        frame = inspect.currentframe().f_back
        if frame is None or frame.f_code.co_name != "__init__":
            raise RuntimeError("save_hyperparameters() must be called from the module's __init__.")
        values: dict[str, Any] = {}
        for init in _init_frames_of(self, frame):  # the innermost (a base class's) first
            args = inspect.getargvalues(init)
            wanted = names or args.args[1:]
            values.update({name: args.locals[name] for name in wanted if name in args.locals})
            if args.keywords and not names:
                values.update(args.locals.get(args.keywords, {}))
        self.hparams.update({name: value for name, value in values.items() if name not in ignored})


def _init_frames_of(module: Module, frame: Any) -> list[Any]:
    """The chain of `__init__` frames constructing `module`, from `frame` out to the first caller that is not one."""
    chain = []
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_code.co_argcount:
        if frame.f_locals.get(frame.f_code.co_varnames[0]) is not module:
            break
        chain.append(frame)
        frame = frame.f_back
    return chain

"""Fine-tune to a target accuracy (or a budget): the project's one training loop, so "samples to the
target" means the same everywhere. Every step goes through `device.run_step`; device seconds count training
steps only. In-memory tensors and index slicing, no DataLoader (bench/loop_overhead.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from powerctl.devices.base import Device
from powerctl.errors import ArgumentError
from powerctl.files.mapping import check_result
from powerctl.profiling.monitor import PowerMonitor, PowerReading
from powerctl.progress import progress_bar
from powerctl.records.workload import Workload, measure_workload
from powerfed.training.checkpoint import (
    Part,
    Saved,
    Tensors,
    identity_digest,
    optimizer_parts,
    optimizer_state,
    restore_parts,
    resumable,
    save_parts,
    state_digest,
)
from powerfed.training.errors import DataError
from powerfed.training.evaluation import eval_subset, evaluate
from powerfed.training.finetune_records import (
    CurvePoint,
    FineTuneCallbacks,
    FineTuneConfig,
    FineTuneResult,
    LossFn,
    StepHook,
    UserFunctions,
    make_optimizer,
    step_failed,
    train_step,
)
from powerfed.training.tasks import loss_fn

log = logging.getLogger(__name__)
"""`powerfed.training.finetune`: a fine-tune resumed from its checkpoint (INFO)."""

if TYPE_CHECKING:
    from powerfed.training.data import Dataset

POWER_RATE_HZ = 20.0
"""Power readings per second while training (what the step hooks and the energy figures see)."""


def _model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any): where its batches go."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def step_workload(
    model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, loss: LossFn | None = None
) -> Workload:
    """Workload of one step, from a batch of 2; buffers (BatchNorm statistics) are put back after."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    name = getattr(model, "model_name", None) or type(model).__name__
    wl = measure_workload(model, x[:2], y[:2], loss or loss_fn(task), name)
    with torch.no_grad():
        for bname, b in model.named_buffers():
            b.copy_(buffers[bname])
    return wl


class TrainingPower:
    """Power over the training segments only: the monitor is paused around every evaluation."""

    def __init__(self, device: Device, rate_hz: float) -> None:
        self.monitor = PowerMonitor(device, rate_hz)
        self.readings: list[PowerReading] = []

    def resume(self) -> None:
        self.monitor.start()

    def after_step(self, hooks: Sequence[StepHook], device_s: float) -> None:
        """Hand the readings of the step just run to the step hooks."""
        if hooks:
            readings = self.monitor.new_samples()
            for hook in hooks:
                hook.after_step(readings, device_s)

    def pause(self) -> None:
        if (reading := self.monitor.stop()) is not None:
            self.readings.append(reading)

    def abort(self) -> None:
        self.monitor.stop(keep=False)

    def summary(self) -> tuple[float | None, float | None, float | None]:
        """(energy J, peak W, mean W) over all segments, or Nones without a sensor."""
        if not self.monitor.device.has_power_sensor or not self.readings:
            return None, None, None
        energy = sum(r.energy_j for r in self.readings)
        seconds = sum(r.seconds for r in self.readings)
        peak = max(r.peak_w for r in self.readings)
        mean = energy / seconds if seconds > 0 else sum(r.mean_w for r in self.readings) / len(self.readings)
        return energy, peak, mean


@dataclass
class _Progress:
    """Where a run stands: what the loop advances, saved and restored field by field."""

    batch_size: int
    lr: float
    next_eval: int
    """Evaluate once `samples` reaches this."""
    samples: int = 0
    steps: int = 0
    device_s: float = 0.0
    first: int = 0
    """Where in `perm` the next batch starts."""
    perm: torch.Tensor | None = None
    """This epoch's order of the train split (a new one when the next batch does not fit)."""
    curve: list[CurvePoint] = field(default_factory=list)
    stop_reason: str = ""
    """Why the run ended ("target", "max_samples", "max_device_s"); "" while it runs."""

    def take(self) -> tuple[Tensors, dict[str, Any]]:
        """(the permutation, every other field) for a checkpoint."""
        assert self.perm is not None, "a checkpoint is taken after a step"
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("perm", "curve")}
        return {"perm": self.perm}, {**plain, "curve": [asdict(p) for p in self.curve]}

    def put(self, tensors: Tensors, plain: dict[str, Any], device: torch.device) -> None:
        """Back to what `take` returned."""
        for name, value in plain.items():
            setattr(self, name, [CurvePoint(**p) for p in value] if name == "curve" else value)
        self.perm = tensors["perm"].to(device)


def _rng_states(gen: torch.Generator, cuda: list[int]) -> Tensors:
    states = {"torch": torch.get_rng_state(), "data": gen.get_state()}
    return states | ({"cuda": torch.cuda.get_rng_state(cuda[0])} if cuda else {})


def _set_rng_states(gen: torch.Generator, cuda: list[int], states: Tensors) -> None:
    torch.set_rng_state(states["torch"])
    gen.set_state(states["data"])
    if cuda and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], cuda[0])


def _check_data(config: FineTuneConfig, train: Dataset, test: Dataset) -> None:
    """One DataError line for splits the run cannot use (the settings are checked by `FineTuneConfig`)."""
    if train.task != test.task:
        raise DataError(f"train split is {train.task!r} data but test split is {test.task!r}")
    if len(train) < config.batch_size:
        raise DataError(
            f"the train split of {train.name} has {len(train)} samples, fewer than batch size "
            f"{config.batch_size}; use a smaller batch size or more data"
        )
    if len(test) == 0:
        raise DataError(f"the test split of {test.name} is empty")


class _Loop:
    """One fine-tune under way: the model and its data on the model's device, the optimizer, the power
    segments and where the run stands (`_Progress`). `fine_tune` makes it, then inside the run's own RNG
    calls `start`, `restore`, `run_to_end`, `save_end`."""

    def __init__(
        self,
        model: nn.Module,
        train: Dataset,
        test: Dataset,
        config: FineTuneConfig,
        device: Device,
        callbacks: FineTuneCallbacks,
        user: UserFunctions,
    ) -> None:
        self.model, self.config, self.device, self.user = model, config, device, user
        self.callbacks, self.hooks = callbacks, callbacks.hooks
        self.task, self.n = train.task, len(train)
        self.max_samples = config.sample_budget(self.n)
        self.dev = _model_device(model)
        self.x, self.y = train.x.to(self.dev), train.y.to(self.dev)
        self.ex, self.ey = (t.to(self.dev) for t in eval_subset(test, config.eval_max_samples))
        self.criterion = user.loss or loss_fn(self.task)
        self.start_lr = config.start_lr()
        self.run = _Progress(config.batch_size, self.start_lr, config.eval_every_samples or 0)
        self.cuda = [self.dev.index or 0] if self.dev.type == "cuda" else []
        self.identity = ""
        self.resumed_at: int | None = None
        """The samples a checkpoint held, None when the run started afresh."""
        self.finished = False
        """True when the checkpoint held this work's end: its result again, without training."""
        self.saved_at = 0
        self.bar: Any = None
        """The progress bar (`progress_bar`: a disabled one when not shown), made by `run_to_end`."""

    def find_saved(self, train: Dataset, test: Dataset) -> Saved | None:
        """This same work's checkpoint, if any: its identity is the caller's key, the starting weights, the
        data, the settings, the device and the kinds of hooks."""
        checkpoint = self.callbacks.checkpoint
        if checkpoint is None:
            return None
        config, name = self.config, self.config.optimizer
        settings = {
            "batch_size": config.batch_size,
            "lr": self.run.lr,
            "target_accuracy": config.target_accuracy,
            "max_samples": self.max_samples,
            "max_device_s": config.max_device_s,
            "eval": [config.eval_every_samples, config.eval_max_samples],
            "seed": config.seed,
            "optimizer": name if name is None or isinstance(name, str) else "custom",
        }
        self.identity = identity_digest(
            {
                "key": checkpoint.key,
                "weights": state_digest(self.model.state_dict()),
                "train": [train.name, len(train)],
                "test": [test.name, len(test)],
                "settings": settings,
                "device": getattr(self.device, "spec", type(self.device).__name__),
                "hooks": [type(h).__name__ for h in self.hooks],
            }
        )
        return resumable(checkpoint, self.identity)

    def start(self, workload: Workload) -> None:
        """Seed the run and make what trains; called inside the run's own RNG (the caller's is left alone)."""
        torch.manual_seed(self.config.seed)  # dropout and friends: repeatable
        self.workload = workload
        self.opt = make_optimizer(self.task, self.model.parameters(), self.run.lr, self.config.optimizer)
        make_step = self.user.make_step
        self.step: Callable[..., Any] = partial(train_step, self.model, self.opt, self.criterion)
        if make_step is not None:  # None back would train the project's step instead, without a word
            made = make_step(self.model)
            self.step = check_result("fine_tune", "make_step(model)", made, Callable, "the step step(x, y)")
        self.gen = torch.Generator().manual_seed(self.config.seed)
        self.power = TrainingPower(self.device, POWER_RATE_HZ)
        self.parts = self._parts()

    def _parts(self) -> dict[str, Part]:
        """Everything a resumed run needs to end where an uninterrupted one ends, saved and restored in
        this order (the device before the hooks: a follower resumes on the device's clock)."""
        model, opt, gen, cuda = self.model, self.opt, self.gen, self.cuda
        run, power, device, hooks = self.run, self.power, self.device, self.hooks

        def put_hooks(_: Any, states: Any) -> None:
            for h, st in zip(hooks, states, strict=True):
                h.load_resume_state(st)

        return {
            "model": Part(lambda: (model.state_dict(), None), lambda t, _: model.load_state_dict(t)),
            "optimizer": Part(
                lambda: optimizer_parts(opt), lambda t, plain: opt.load_state_dict(optimizer_state(t, plain))
            ),
            "rng": Part(lambda: (_rng_states(gen, cuda), None), lambda t, _: _set_rng_states(gen, cuda, t)),
            "progress": Part(run.take, lambda t, plain: run.put(t, plain, self.dev)),
            "power": Part(  # restored into the fresh TrainingPower of `start`
                lambda: ({}, [asdict(r) for r in power.readings]),
                lambda _, plain: power.readings.extend(PowerReading(**r) for r in plain),
            ),
            "device": Part(
                lambda: ({}, device.resume_state()), lambda _, plain: device.load_resume_state(plain)
            ),
            "hooks": Part(
                lambda: ({}, [h.resume_state() for h in hooks]),
                put_hooks,
            ),
        }

    def restore(self, saved: Saved | None) -> None:
        """Continue from this work's checkpoint: mid-run, or its end state (then nothing is trained)."""
        if saved is not None:
            restore_parts(saved, self.parts)
            self.resumed_at, self.finished = self.run.samples, bool(self.run.stop_reason)
            if self.finished:
                log.info(
                    "checkpoint: %s holds this work's end (%s samples, stopped at %s): its result again, "
                    "without training",
                    saved.path,
                    self.resumed_at,
                    self.run.stop_reason,
                )
            else:
                log.info("checkpoint: resuming from %s at %s samples", saved.path, self.resumed_at)
        self.saved_at = self.run.samples

    def run_to_end(self) -> None:
        """Train until the target or a budget stops the run; on a failure the open power segment is lost."""
        run, power, callbacks = self.run, self.power, self.callbacks
        self.bar = progress_bar(
            callbacks.progress, self.max_samples, callbacks.desc or "fine-tune", "sample", run.samples
        )
        try:
            if self.resumed_at is None and self.config.eval_every_samples is not None and self._look():
                run.stop_reason = "target"  # met before any training
            if not self.finished:  # (a finished run's end state: no step, no reading, no look)
                power.resume()
            while not run.stop_reason:
                self._step()
                self._stop_or_evaluate()
            power.pause()
            if not self.finished and run.stop_reason != "target" and self._look():
                run.stop_reason = "target"  # budget spent: one last look may still meet the target
        except BaseException:
            power.abort()
            raise
        finally:
            self.bar.close()

    def _step(self) -> None:
        """One training step of the next batch in the epoch's order, at the hooks' batch size."""
        run, hooks, device = self.run, self.hooks, self.device
        for hook in hooks:
            if (b := hook.before_step(run.samples)) is not None:
                self._use_batch_size(b)
        if run.perm is None or run.first + run.batch_size > self.n:  # a new epoch; the tail is dropped
            run.perm, run.first = torch.randperm(self.n, generator=self.gen).to(self.dev), 0
        idx = run.perm[run.first : run.first + run.batch_size]
        run.first += run.batch_size
        xb, yb = self.x.index_select(0, idx), self.y.index_select(0, idx)

        t0 = device.clock()
        try:
            device.run_step(partial(self.step, xb, yb), batch_size=run.batch_size, workload=self.workload)
        except Exception as exc:
            taken = next((b for h in hooks if (b := step_failed(h, exc)) is not None), None)
            if taken is None:
                raise
            run.device_s += device.clock() - t0
            run.first -= len(idx)  # nothing trained: the same samples come next, at the new batch size
            self.power.monitor.new_samples()  # the failed step's readings belong to no step
            self._use_batch_size(taken)
            return
        run.device_s += device.clock() - t0
        run.samples += run.batch_size
        run.steps += 1
        self.power.after_step(hooks, run.device_s)
        self.bar.update(run.batch_size)
        if self.callbacks.on_step is not None:
            self.callbacks.on_step(run.steps, run.samples)

    def _use_batch_size(self, b: int) -> None:
        """Train with batch size `b` from the next step on: the rate rescaled, the optimizer state kept."""
        run = self.run
        if b != run.batch_size:
            run.batch_size, run.lr = b, self.config.rate(b)
            for group in self.opt.param_groups:
                group["lr"] = run.lr

    def _stop_or_evaluate(self) -> None:
        """After a step: stop on a spent budget; else evaluate when due (stop at the target) and save."""
        run, config, checkpoint = self.run, self.config, self.callbacks.checkpoint
        if self.max_samples is not None and run.samples >= self.max_samples:
            run.stop_reason = "max_samples"
        elif config.max_device_s is not None and run.device_s >= config.max_device_s:
            run.stop_reason = "max_device_s"
        elif config.eval_every_samples is not None and run.samples >= run.next_eval:
            self.power.pause()
            met = self._look()
            while run.next_eval <= run.samples:
                run.next_eval += config.eval_every_samples
            if met:
                run.stop_reason = "target"
            elif checkpoint is not None and run.samples - self.saved_at >= checkpoint.every_samples:
                save_parts(checkpoint.path, self.identity, self.parts)
                self.saved_at = run.samples
            self.power.resume()

    def _look(self) -> bool:
        """Evaluate now; True when the target is met."""
        run, target = self.run, self.config.target_accuracy
        acc = evaluate(self.model, self.task, self.ex, self.ey, metric=self.user.metric)
        run.curve.append(CurvePoint(run.samples, run.device_s, acc))
        self.bar.set_postfix(acc=f"{acc:.3f}", dev_s=f"{run.device_s:.1f}", refresh=False)
        return target is not None and acc >= target

    def save_end(self) -> None:
        """Leave the end state for this same work sent again (nothing when no step was taken)."""
        checkpoint = self.callbacks.checkpoint
        if checkpoint is None or self.finished:
            return
        if self.run.perm is None:
            checkpoint.path.unlink(missing_ok=True)
        else:
            save_parts(checkpoint.path, self.identity, self.parts, finished=True)

    def result(self, wall_start: float) -> FineTuneResult:
        run = self.run
        energy, peak, mean = self.power.summary()
        return FineTuneResult(
            reached=run.stop_reason == "target",
            samples=run.samples,
            device_s=run.device_s,
            energy_j=energy,
            peak_power_w=peak,
            mean_power_w=mean,
            final_accuracy=run.curve[-1].accuracy,
            curve=run.curve,
            batch_size=self.config.batch_size,
            lr=self.start_lr,
            steps=run.steps,
            target_accuracy=self.config.target_accuracy,
            stop_reason=run.stop_reason,
            wall_s=time.perf_counter() - wall_start,
            extra={} if self.resumed_at is None else {"resumed_at_samples": self.resumed_at},
        )


def fine_tune(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    config: FineTuneConfig,
    *,
    device: Device,
    workload: Workload | None = None,
    callbacks: FineTuneCallbacks | None = None,
    user: UserFunctions | None = None,
) -> FineTuneResult:
    """Train `model` in place on `train` until its accuracy on `test` reaches `config.target_accuracy`
    or the budget (`FineTuneConfig`) is spent, evaluating before training, every `eval_every_samples`
    samples and at the end on a fixed test subset. Batches follow a seeded permutation per epoch (its
    incomplete last batch dropped): same seed, data and weights → the same curve (on the CPU).
    `workload`: what the device charges per step (default: measured from the model).

    `callbacks.hooks` act between steps (`StepHook`); with `callbacks.checkpoint` the run saves itself at
    evaluations and continues the same work's checkpoint as if never interrupted (a finished run's end
    state returns its result again: `extra.resumed_at_samples` equals `samples`). `user` replaces the
    task's loss, metric or whole step (`UserFunctions`).
    """
    callbacks = callbacks or FineTuneCallbacks()
    user = user or UserFunctions()
    if user.make_step is not None and (callbacks.checkpoint is not None or callbacks.hooks):
        raise ArgumentError("fine_tune: a user's make_step runs without checkpoints or step hooks")
    if user.train_to_target is not None:
        raise ArgumentError("fine_tune: train_to_target is a loop of the user's own, not a part of this one")
    _check_data(config, train, test)
    wall_start = time.perf_counter()
    loop = _Loop(model, train, test, config, device, callbacks, user)
    if workload is None:
        workload = step_workload(model, loop.task, loop.x, loop.y, user.loss)
    model.train()
    saved = loop.find_saved(train, test)
    with torch.random.fork_rng(devices=loop.cuda):
        loop.start(workload)
        loop.restore(saved)
        loop.run_to_end()
        loop.save_end()
    return loop.result(wall_start)

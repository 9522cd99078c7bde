"""Fine-tune to a target accuracy (or a budget): the one training loop of the project.

Pre-training, relation-vector estimation and the clients all use this loop, so "samples to the target"
means the same thing everywhere. Every step goes through `device.run_step`, so a simulated board charges
its virtual clock and power sensor; device seconds count training steps only (evaluation excluded), as
the time-to-accuracy (docs/design/method.md) is a training time. The loop is lean (in-memory tensors, index
slicing, no DataLoader): its overhead must stay within a few percent of a bare PyTorch loop
(bench/loop_overhead.py measures it).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from powerctl.devices.base import Device, PowerSamples
from powerctl.follow import CapFollower
from powerctl.guard import PowerGuard
from powerctl.monitor import PowerMonitor, PowerReading
from powerctl.workload import Workload, measure_workload
from training import checkpoint as checkpoint_io
from training.checkpoint import (
    Checkpointing,
    identity_digest,
    optimizer_parts,
    optimizer_state,
    resumable,
    state_digest,
)
from training.errors import DataError
from training.models import correct_count, loss_fn, targets_count

if TYPE_CHECKING:
    from training.data import Dataset

__all__ = [
    "DEFAULT_EVAL_EVERY_SAMPLES",
    "DEFAULT_EVAL_MAX_SAMPLES",
    "DEFAULT_MAX_EPOCHS",
    "CurvePoint",
    "FineTuneResult",
    "evaluate",
    "evaluate_with_loss",
    "step_workload",
    "fine_tune",
    "make_optimizer",
]

DEFAULT_EVAL_EVERY_SAMPLES = 1024
"""Evaluate after every this many training samples (the resolution of samples-to-target)."""
DEFAULT_EVAL_MAX_SAMPLES = 1024
"""Evaluate on at most this many test samples (a fixed subset, the same for every run)."""
DEFAULT_MAX_EPOCHS = 20
"""With neither `max_samples` nor `max_device_seconds`, stop after this many epochs of the train split,
so that an unreachable target can never run forever."""
EVAL_BATCH_SIZE = 256
_EVAL_SUBSET_SEED = 0x5EED  # fixed: every run (any batch size, any seed) is evaluated on the same samples

OptimizerFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]


@dataclass(frozen=True)
class CurvePoint:
    samples: int
    device_seconds: float
    accuracy: float


@dataclass
class FineTuneResult:
    reached: bool
    """True when the test accuracy reached `target_accuracy`."""
    samples: int
    """Training samples consumed when the target was first reached, or in total."""
    device_seconds: float
    """Device-clock seconds of the training steps only (evaluation excluded)."""
    energy_j: float | None
    """Energy over the training steps, None when the device has no power sensor."""
    peak_power_w: float | None
    mean_power_w: float | None
    final_accuracy: float
    curve: list[CurvePoint]
    batch_size: int
    lr: float
    steps: int
    target_accuracy: float | None = None
    stop_reason: str = ""
    """"target", "max_samples" or "max_device_seconds"."""
    wall_seconds: float = 0.0
    """Host wall time of the whole call, evaluation included (for overhead accounting, not for TTA)."""
    extra: dict[str, Any] = field(default_factory=dict)
    step_downs: list[dict[str, Any]] = field(default_factory=list)
    """What the power guard did: {device_seconds, old_hz, new_hz, measured_w, power_cap_w} per step-down."""
    cap_events: list[dict[str, Any]] = field(default_factory=list)
    """What the cap follower did (a cap that changes, `powerctl.follow.CapEvent`), in order."""
    paused_seconds: float = 0.0
    """Device seconds the follower paused (nothing fitted under the cap); not in `device_seconds`."""
    over_cap_seconds: float | None = None
    """Device seconds the follower measured over the cap in force (None: no follower)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_optimizer(
    task: str, params: Iterable[nn.Parameter], lr: float, optimizer: str | OptimizerFactory | None = None
) -> torch.optim.Optimizer:
    """Adam for images, AdamW for text (the paper's choice); a name or a factory overrides it."""
    if optimizer is None:
        optimizer = "adamw" if task == "text" else "adam"
    if callable(optimizer):
        return optimizer(params, lr)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {optimizer!r}; use adam, adamw or sgd")


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _eval_subset(test: Dataset, eval_max_samples: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(test)
    if eval_max_samples is None or eval_max_samples >= n:
        return test.x, test.y
    g = torch.Generator().manual_seed(_EVAL_SUBSET_SEED)
    idx = torch.randperm(n, generator=g)[:eval_max_samples].sort().values
    return test.x[idx], test.y[idx]


@torch.no_grad()
def evaluate_with_loss(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on (x, y): eval mode, no gradients, fixed batches; train mode
    restored. The loss is the task's training loss, averaged over samples."""
    was_training = model.training
    model.eval()
    criterion = loss_fn(task)
    correct = total = 0
    loss_sum = 0.0
    try:
        for start in range(0, len(x), EVAL_BATCH_SIZE):
            xb, yb = x[start : start + EVAL_BATCH_SIZE], y[start : start + EVAL_BATCH_SIZE]
            logits = model(xb)
            correct += correct_count(task, logits, yb)
            total += targets_count(task, yb)
            loss_sum += float(criterion(logits, yb)) * len(xb)
    finally:
        model.train(was_training)
    return (correct / total if total else 0.0), (loss_sum / len(x) if len(x) else math.nan)


def evaluate(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy of `model` on (x, y) (see `evaluate_with_loss`)."""
    return evaluate_with_loss(model, task, x, y)[0]


def step_workload(model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor) -> Workload:
    """Workload of one step, from a batch of 2; buffers (BatchNorm statistics) are put back after."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    name = getattr(model, "model_name", None) or type(model).__name__
    wl = measure_workload(model, x[:2], y[:2], loss_fn(task), name)
    with torch.no_grad():
        for bname, b in model.named_buffers():
            b.copy_(buffers[bname])
    return wl


class _TrainingPower:
    """Power over the training segments only: the monitor is paused around every evaluation."""

    def __init__(self, device: Device, rate_hz: float) -> None:
        self._monitor = PowerMonitor(device, rate_hz) if device.has_power_sensor else None
        self.readings: list[PowerReading] = []
        self._open = False
        self._seen = 0

    def resume(self) -> None:
        if self._monitor is not None and not self._open:
            self._monitor.start()
            self._open = True
            self._seen = 0

    def new_samples(self) -> PowerSamples:
        """The readings since the last call (the step just run), for the power guard and the cap
        follower."""
        if self._monitor is None or not self._open:
            return []
        samples = self._monitor.samples_so_far()
        end = len(samples)
        new = samples[self._seen : end]
        self._seen = end
        return new

    def pause(self) -> None:
        if self._monitor is not None and self._open:
            self._open = False
            if (reading := self._monitor.stop()) is not None:
                self.readings.append(reading)

    def abort(self) -> None:
        if self._monitor is not None and self._open:
            self._open = False
            self._monitor.stop(keep=False)

    def summary(self) -> tuple[float | None, float | None, float | None]:
        """(energy J, peak W, mean W) over all segments, or Nones without a sensor."""
        if self._monitor is None or not self.readings:
            return None, None, None
        energy = sum(r.energy_j for r in self.readings)
        seconds = sum(r.seconds for r in self.readings)
        peak = max(r.peak_w for r in self.readings)
        mean = energy / seconds if seconds > 0 else sum(r.mean_w for r in self.readings) / len(self.readings)
        return energy, peak, mean


def _check_positive(name: str, value: float | None, *, integer: bool = False) -> None:
    if value is None:
        return
    bad_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad_type or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def fine_tune(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    *,
    device: Device,
    batch_size: int,
    lr: float,
    target_accuracy: float | None,
    workload: Workload | None = None,
    max_samples: int | None = None,
    max_device_seconds: float | None = None,
    eval_every_samples: int | None = DEFAULT_EVAL_EVERY_SAMPLES,
    eval_max_samples: int | None = DEFAULT_EVAL_MAX_SAMPLES,
    seed: int = 0,
    optimizer: str | OptimizerFactory | None = None,
    progress: bool = True,
    power_rate_hz: float = 20.0,
    desc: str | None = None,
    power_guard: PowerGuard | None = None,
    checkpoint: Checkpointing | None = None,
    on_step: Callable[[int, int], None] | None = None,
    follower: CapFollower | None = None,
) -> FineTuneResult:
    """Train `model` in place on `train` until its accuracy on `test` reaches `target_accuracy`.

    Stops at the first evaluation at or above the target, or when `max_samples` training samples or
    `max_device_seconds` device seconds are spent (with neither, after DEFAULT_MAX_EPOCHS epochs).
    `target_accuracy=None` trains for the budget only (pre-training). Evaluation happens before
    training, every `eval_every_samples` samples (None: only at the end) and at the end, on a fixed
    subset of at most `eval_max_samples` test samples. Batches are drawn from a seeded permutation per
    epoch (the last incomplete batch of an epoch is dropped so every step has `batch_size` samples).
    Same seed, same data, same starting weights → the same curve (on the CPU).

    `power_guard` (on a pinned device with a sensor) is checked after every step with the highest
    power reading of that step, and steps the frequency down under a sustained excess over its cap;
    its step-downs are returned in `step_downs`.
    With `checkpoint`, the run saves itself at evaluations (see `training.checkpoint`) and, when a
    checkpoint of the same work exists, continues from it instead of starting over: the weights,
    samples, accuracy curve, device seconds and energy are then those of a run never interrupted. The
    checkpoint is removed when the run returns. `on_step(steps, samples)` is called after every
    training step (progress reports, fault injection); what it raises ends the run.

    With `follower` (a cap that changes, `powerctl.follow`) the loop asks it before every step: it
    may pin another frequency, pause, or hand over another batch size, which takes effect at once with
    the optimizer state kept and the learning rate `follower.lr_for(b)`; its power guard replaces
    `power_guard`. `batch_size` and `lr` are then where the run starts (the follower's first pick).
    """
    _check_positive("batch_size", batch_size, integer=True)
    _check_positive("lr", lr)
    _check_positive("max_samples", max_samples, integer=True)
    _check_positive("max_device_seconds", max_device_seconds)
    _check_positive("eval_every_samples", eval_every_samples, integer=True)
    _check_positive("eval_max_samples", eval_max_samples, integer=True)
    if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    if target_accuracy is not None and eval_every_samples is None:
        raise ValueError("a target accuracy needs periodic evaluation: set eval_every_samples")
    if train.task != test.task:
        raise DataError(f"train split is {train.task!r} data but test split is {test.task!r}")
    task = train.task
    n = len(train)
    if n < batch_size:
        raise DataError(
            f"the train split of {train.name} has {n} samples, fewer than batch size {batch_size}; "
            "use a smaller batch size or more data"
        )
    if len(test) == 0:
        raise DataError(f"the test split of {test.name} is empty")
    if max_samples is None and max_device_seconds is None:
        max_samples = DEFAULT_MAX_EPOCHS * n

    wall_start = time.perf_counter()
    start_batch_size, start_lr = batch_size, lr
    dev = _model_device(model)
    x, y = train.x.to(dev), train.y.to(dev)
    ex, ey = (t.to(dev) for t in _eval_subset(test, eval_max_samples))
    if workload is None:
        workload = step_workload(model, task, x, y)
    criterion = loss_fn(task)
    model.train()

    rng_devices = [dev.index or 0] if dev.type == "cuda" else []
    identity = ""
    saved = None
    if checkpoint is not None:
        identity = identity_digest(
            {
                "key": checkpoint.key,
                "weights": state_digest(model.state_dict()),
                "train": [train.name, n],
                "test": [test.name, len(test)],
                "settings": [batch_size, lr, target_accuracy, max_samples, max_device_seconds],
                "eval": [eval_every_samples, eval_max_samples],
                "seed": seed,
                "optimizer": optimizer if optimizer is None or isinstance(optimizer, str) else "custom",
                "device": getattr(device, "spec", type(device).__name__),
            }
        )
        saved = resumable(checkpoint, identity)
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)  # dropout and friends: repeatable, and the caller's RNG is left alone
        opt = make_optimizer(task, model.parameters(), lr, optimizer)
        gen = torch.Generator().manual_seed(seed)
        power = _TrainingPower(device, power_rate_hz)
        bar = _progress_bar(progress, max_samples, desc)
        curve: list[CurvePoint] = []
        samples = steps = 0
        device_seconds = 0.0
        reached = False
        stop_reason = ""
        perm: torch.Tensor | None = None
        first = 0  # where in `perm` the next batch starts
        next_eval = eval_every_samples or 0
        saved_at = 0

        def check(acc: float) -> bool:
            curve.append(CurvePoint(samples, device_seconds, acc))
            if bar is not None:
                bar.set_postfix(acc=f"{acc:.3f}", dev_s=f"{device_seconds:.1f}", refresh=False)
            return target_accuracy is not None and acc >= target_accuracy

        def save_checkpoint() -> None:
            assert checkpoint is not None and perm is not None
            opt_tensors, opt_plain = optimizer_parts(opt)
            tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
            tensors.update(opt_tensors)
            tensors["rng.torch"] = torch.get_rng_state()
            tensors["rng.data"] = gen.get_state()
            tensors["data.perm"] = perm
            if rng_devices:
                tensors["rng.cuda"] = torch.cuda.get_rng_state(rng_devices[0])
            state = {
                "identity": identity,
                "samples": samples,
                "steps": steps,
                "device_seconds": device_seconds,
                "next_eval": next_eval,
                "first": first,
                "curve": [asdict(p) for p in curve],
                "power": [asdict(r) for r in power.readings],
                "device": device.resume_state(),
                "optimizer": opt_plain,
                "batch_size": batch_size,
                "lr": lr,
                "follower": None if follower is None else follower.resume_state(),
            }
            checkpoint_io.save(checkpoint.path, tensors, state)

        if saved is not None:
            t, st = saved.tensors, saved.state
            model.load_state_dict({k[len("model.") :]: v for k, v in t.items() if k.startswith("model.")})
            opt.load_state_dict(optimizer_state(t, st["optimizer"]))
            torch.set_rng_state(t["rng.torch"])
            gen.set_state(t["rng.data"])
            if rng_devices and "rng.cuda" in t:
                torch.cuda.set_rng_state(t["rng.cuda"], rng_devices[0])
            perm, first = t["data.perm"].to(dev), int(st["first"])
            samples, steps = int(st["samples"]), int(st["steps"])
            device_seconds, next_eval = float(st["device_seconds"]), int(st["next_eval"])
            curve = [CurvePoint(**p) for p in st["curve"]]
            power.readings = [PowerReading(**r) for r in st["power"]]
            device.load_resume_state(st["device"])
            batch_size, lr = int(st.get("batch_size", batch_size)), float(st.get("lr", lr))
            if follower is not None and st.get("follower"):
                follower.load_resume_state(st["follower"])
            saved_at = samples
            if bar is not None:
                bar.update(samples)

        try:
            if saved is None and eval_every_samples is not None and check(evaluate(model, task, ex, ey)):
                reached, stop_reason = True, "target"  # met before any training
            power.resume()
            guard = power_guard
            while not reached and not stop_reason:
                if follower is not None:
                    if (b := follower.before_step(samples)) is not None and b != batch_size:
                        batch_size, lr = b, follower.lr_for(b)
                        for group in opt.param_groups:  # the optimizer state (moments) is kept
                            group["lr"] = lr
                    guard = follower.guard
                if perm is None or first + batch_size > len(perm):  # a new epoch; the tail is dropped
                    perm, first = torch.randperm(n, generator=gen).to(dev), 0
                idx = perm[first : first + batch_size]
                xb, yb = x.index_select(0, idx), y.index_select(0, idx)
                first += batch_size

                def step(xb: torch.Tensor = xb, yb: torch.Tensor = yb) -> None:
                    opt.zero_grad(set_to_none=True)
                    criterion(model(xb), yb).backward()
                    opt.step()

                t0 = device.clock()
                device.run_step(step, batch_size=batch_size, workload=workload)
                device_seconds += device.clock() - t0
                samples += batch_size
                steps += 1
                if guard is not None or follower is not None:
                    new = power.new_samples()
                    if guard is not None and new:
                        guard.check(max(w for _, w in new), device_seconds)
                    if follower is not None:
                        follower.after_step(new)
                if bar is not None:
                    bar.update(batch_size)
                if on_step is not None:
                    on_step(steps, samples)
                if max_samples is not None and samples >= max_samples:
                    stop_reason = "max_samples"
                elif max_device_seconds is not None and device_seconds >= max_device_seconds:
                    stop_reason = "max_device_seconds"
                if eval_every_samples is not None and samples >= next_eval and not stop_reason:
                    power.pause()
                    reached = check(evaluate(model, task, ex, ey))
                    while next_eval <= samples:
                        next_eval += eval_every_samples
                    if reached:
                        stop_reason = "target"
                    elif checkpoint is not None and samples - saved_at >= checkpoint.every_samples:
                        save_checkpoint()
                        saved_at = samples
                    power.resume()
            power.pause()
            if stop_reason != "target":  # budget spent: one last look, which may still meet the target
                reached = check(evaluate(model, task, ex, ey))
                if reached:
                    stop_reason = "target"
        except BaseException:
            power.abort()
            raise
        finally:
            if bar is not None:
                bar.close()
    if checkpoint is not None:
        checkpoint.path.unlink(missing_ok=True)  # done: nothing left to resume

    energy, peak, mean = power.summary()
    return FineTuneResult(
        reached=reached,
        samples=samples,
        device_seconds=device_seconds,
        energy_j=energy,
        peak_power_w=peak,
        mean_power_w=mean,
        final_accuracy=curve[-1].accuracy,
        curve=curve,
        batch_size=start_batch_size,
        lr=float(start_lr),
        steps=steps,
        target_accuracy=target_accuracy,
        stop_reason=stop_reason,
        wall_seconds=time.perf_counter() - wall_start,
        step_downs=(
            follower.step_downs
            if follower is not None
            else []
            if power_guard is None
            else [e.to_dict() for e in power_guard.step_downs]
        ),
        extra={"resumed_at_samples": int(saved.state["samples"])} if saved is not None else {},
        cap_events=[] if follower is None else [e.to_dict() for e in follower.events],
        paused_seconds=0.0 if follower is None else follower.paused_s,
        over_cap_seconds=None if follower is None else follower.over_cap_s,
    )


def _progress_bar(progress: bool, total: int | None, desc: str | None) -> Any:
    """A tqdm bar on stderr, only when asked for and stderr is a terminal (logs stay clean)."""
    if not progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc or "fine-tune", unit="sample", file=sys.stderr, leave=False)

"""`PowerSession`: a power-aware round around a user's own training loop (docs/howto/bring-your-own.md):
it profiles the loop's step, chooses a pair under the node's cap, pins the board, charges every step run
through it and reports the round; the device is restored on every way out of the `with`."""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from fl_client.node import NodeSettings
from fl_client.pinning import pinned
from fl_client.round import (
    ClientWorkError,
    Pinning,
    Prepared,
    Profiled,
    ProfiledStep,
    RoundSteps,
    RoundWork,
    measured_profile_step,
    node_device_seed,
)
from fl_client.step_identity import cell_value, step_identity
from powerctl.devices.base import Device
from powerctl.devices.simulated import SimulatedBoard
from powerctl.errors import ArgumentError, first_line
from powerctl.files.mapping import MAX_COUNT, FolderPath, Integer, Number, check_arguments, check_callable
from powerctl.profiling.profiler import StepFactory
from powerctl.records.workload import (
    MODEL_INPUT_ERRORS,
    Workload,
    check_model,
    count_flops,
    measure_workload,
)
from powerfed.training.finetune import POWER_RATE_HZ, TrainingPower
from powerfed.training.finetune_records import FineTuneResult, LossFn, MakeStep
from powerfed.training.models import same_model
from strategies.protocol import TrainInstructions
from strategies.report import ClientReport

log = logging.getLogger(__name__)

FIRST_STEP_TOLERANCE = 1.25  # the first step's FLOPs a sample against the profiled step's, either way
STEP_TIME_TOLERANCE = 2.0  # wide: timing noise, a shared GPU (`_check_step_time`)
TIMED_STEPS = 3
MIN_TIMED_STEP_S = 2e-3


class SessionError(ClientWorkError):
    """The session cannot run as used (no round to join, a loop that ran no step through it, ...)."""


@dataclass
class RoundContext:
    """The round a `PowerSession` runs in: the node, the plan, the profile cache, and where the session
    leaves its report. `power_aware_mod` makes one per train message; a loop without the mod makes its
    own, `RoundContext(node, instructions)`, and reads `session.report`."""

    node: NodeSettings
    instructions: TrainInstructions  # the plan (relation vector, target, method, budget)
    profile_cache: Path | None = None  # default: the shared cache
    sessions: list[PowerSession] = field(default_factory=list)

    def __post_init__(self) -> None:
        where = "RoundContext"
        if not isinstance(self.instructions, TrainInstructions):
            raise ArgumentError(
                f"{where}: 'instructions' must be a TrainInstructions (TrainInstructions.for_relation "
                f"makes one), got {type(self.instructions).__name__}"
            )
        if not isinstance(self.node, NodeSettings):
            raise ArgumentError(f"{where}: 'node' must be a NodeSettings, got {type(self.node).__name__}")
        if self.profile_cache is not None:  # '' is the working directory: cached wherever the loop started
            folder = FolderPath("a folder path (leave it out for the shared cache)")
            check_arguments(where, profile_cache=(self.profile_cache, folder))
            self.profile_cache = Path(self.profile_cache)


# set by `power_aware_mod` while a train message is handled
CURRENT_ROUND: contextvars.ContextVar[RoundContext | None] = contextvars.ContextVar(
    "powerfed_round", default=None
)


def user_step(
    instr: TrainInstructions,
    model: nn.Module,
    make_step: MakeStep,
    example: Sequence[torch.Tensor],
    loss: LossFn | None,
    key: str,
) -> ProfiledStep:
    """The user's step as the round profiles it, on a copy of `model`, batches made from the example."""
    x, y = _example(example)
    loss_fn = loss or nn.functional.cross_entropy
    _check_fit(model, x, y, loss_fn)

    def build(dev: Device) -> tuple[Workload, StepFactory]:
        torch_device = dev.torch_device()
        net = copy.deepcopy(model).to(torch_device)
        xs, ys = x.to(torch_device), y.to(torch_device)
        workload = measure_workload(net, xs[:4], ys[:4], loss_fn, instr.model)
        step = make_step(net)
        if not callable(step):
            raise SessionError(f"PowerSession: make_step(model) returned {step!r}; it must return the step")
        _, flops = count_flops(lambda: step(xs[:4], ys[:4]))  # the step's own work, not one pass's
        if flops:
            workload = dataclasses.replace(workload, flops_per_sample=flops / len(xs[:4]))
        if (states := optimizer_states(step, net)) is not None:  # after a step: its state exists
            workload = dataclasses.replace(workload, optimizer_states=states)

        def make(batch_size: int) -> Callable[[], None]:
            rows = torch.arange(batch_size, device=xs.device) % len(xs)
            xb, yb = xs.index_select(0, rows), ys.index_select(0, rows)
            return lambda: step(xb, yb)

        return workload, make

    # its name in the profile cache: the model's class and size, the code, and the user's `key`
    params = sum(p.numel() for p in model.parameters())
    parts = [type(model).__module__, type(model).__qualname__, str(params), step_identity(make_step)]
    what = "|".join([*parts, step_identity(type(model))])
    step_key = f"{type(model).__qualname__}:{hashlib.sha256(what.encode()).hexdigest()[:16]}:{key}"
    return ProfiledStep(instr.model, tuple(int(s) for s in x.shape[1:]), build, step_key)


def optimizer_states(step: Any, model: nn.Module) -> int | None:
    """How many copies of the parameters the step's optimizer keeps (Adam 2, SGD 0), read from its state
    after one step (None: no optimizer in the step's closure or bound object)."""
    params = {id(p) for p in model.parameters()}
    found: list[torch.optim.Optimizer] = []
    for value in [
        getattr(step, "__self__", None),
        *map(cell_value, getattr(step, "__closure__", None) or ()),
    ]:
        if isinstance(value, torch.optim.Optimizer):
            found.append(value)
        elif value is not None and not callable(value) and hasattr(value, "__dict__"):
            found += [v for v in vars(value).values() if isinstance(v, torch.optim.Optimizer)]
    for opt in found:
        counts = [
            sum(
                1 for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor) and v.shape == p.shape
            )
            for group in opt.param_groups
            for p in group["params"]
            if id(p) in params
        ]
        if counts:
            return max(counts)
    return None


def _example(example: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        x, y = example
    except (TypeError, ValueError):
        raise SessionError(
            "PowerSession: 'example' must be one batch (inputs, targets) of the loop's data, e.g. "
            "next(iter(trainloader))"
        ) from None
    tensors = isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() > 0 and y.dim() > 0
    if not tensors or not len(x) or len(x) != len(y):
        raise SessionError(
            "PowerSession: 'example' must be two tensors (inputs, targets) with the same number of "
            "samples (at least 1)"
        )
    return x, y


def _check_fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> None:
    """One sample of the example through the model and the loss: an example of another shape is one line
    where the session is made, not a torch error inside profiling."""
    device = next(model.parameters(), torch.empty(0)).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            loss_fn(model(x[:1].to(device)), y[:1].to(device))
    except MODEL_INPUT_ERRORS as exc:
        raise SessionError(
            f"PowerSession: the model and loss cannot take the example (inputs {tuple(x.shape[1:])} a "
            f"sample, targets {tuple(y.shape[1:])}): {first_line(exc)}; give one batch of the loop's own data"
        ) from None
    finally:
        model.train(was_training)


class PowerSession:
    """One round of a user's own loop under the node's power cap (see the module's docstring).

    `model` has the server's weights; `make_step(model)` returns the loop's step `step(x, y)` (called once
    on a copy to profile); `example` is one batch (inputs, targets) of the loop's data; `train_examples`
    the node's samples (batch sizes it cannot fill once are left out); `loss(outputs, targets)` counts
    the step's work on a simulated board (default: cross entropy); `key` changes the profile cache's key
    where the step changes in a way its code does not show; `lr` is the loop's rate for the report
    (default: `session.lr`); `round_context` the node and plan where no `power_aware_mod` gives them.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        make_step: MakeStep,
        example: Sequence[torch.Tensor],
        train_examples: int,
        loss: LossFn | None = None,
        key: str = "",
        lr: float | None = None,
        round_context: RoundContext | None = None,
    ) -> None:
        joined = CURRENT_ROUND.get() if round_context is None else round_context
        if joined is None:
            raise SessionError(
                "PowerSession: no round to join: add powerfed.power_aware_mod to the ClientApp's mods, "
                "or give round_context=RoundContext(node, instructions)"
            )
        if not isinstance(joined, RoundContext):
            raise ArgumentError(
                f"PowerSession: 'round_context' must be a RoundContext, got {type(joined).__name__}"
            )
        where = "PowerSession"
        check_model(where, model)
        check_callable(where, "make_step", make_step, "(model), returning step(x, y)", 1)
        check_callable(where, "loss", loss, "(outputs, targets)", 2, optional=True)
        rate = {} if lr is None else {"lr": (lr, Number(0.0, above=True))}
        checked = check_arguments(where, train_examples=(train_examples, Integer(1, MAX_COUNT)), **rate)
        train_examples, lr = checked["train_examples"], checked.get("lr")
        if not isinstance(key, str):
            raise ArgumentError(f"{where}: 'key' must be a string, got {key!r}")
        instructions, node = joined.instructions, joined.node
        differs = same_model(instructions.relation_vector.extra.get("model_fingerprint"), model)
        if differs is not None:
            raise SessionError(
                f"PowerSession: the plan is for another model: {differs}; estimate the relation vector "
                "with this model (estimate_relation(YourModel, ...))"
            )
        self.instructions = instructions
        self._loop_lr = lr
        self.work = RoundWork(
            node,
            instructions,
            None,
            None,
            node_device_seed(node, instructions.seed),
            joined.profile_cache,
            step=user_step(instructions, model, make_step, example, loss, key),
            examples=train_examples,
        )
        self._joined = joined
        self.report: ClientReport | None = None
        self.prepared: Prepared | None = None
        self.samples, self.steps, self.device_s = 0, 0, 0.0
        self.accuracy: float | None = None
        self._stack: ExitStack | None = None
        self._dev: Device | None = None
        self._pinning: Pinning | None = None
        self._power: TrainingPower | None = None
        self._workload: Workload | None = None
        self._step_s: list[float] = []
        self._entered = False

    def __enter__(self) -> PowerSession:
        if self._entered:  # a second block would add its steps to the first's, charged one block's energy
            where = "inside its own `with` block" if self._stack is not None else "a second time"
            raise SessionError(
                f"PowerSession: entered {where}: a session is one round and enters once; make a new "
                "PowerSession for another block"
            )
        self._entered = True
        try:  # profile (or read the cache) and choose (a test replaces this module's measured_profile_step)
            self.prepared = prepared = Prepared.of(self.work, RoundSteps(measured_profile_step))
            with ExitStack() as stack:  # pin the device, start the power trace; on an error, restored
                dev, self._pinning = stack.enter_context(pinned(self.work, prepared.chosen.rule))
                self._workload = Workload(**prepared.profiled.profile.extra["workload"])
                self._power = TrainingPower(dev, POWER_RATE_HZ)
                self._power.resume()
                self._stack, self._dev = stack.pop_all(), dev
        except BaseException:  # nothing trained and the device left as found: entering may be tried again
            self._entered = False
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, power, dev = self._stack, self._power, self._dev
        self._stack = None
        if stack is None or power is None or dev is None:
            return
        try:
            if exc_type is not None:
                power.abort()
                return
            power.pause()
            if self.steps == 0 and isinstance(dev, SimulatedBoard):
                raise SessionError(
                    "PowerSession: the loop ran no training step through session.step(...): a simulated "
                    "board charges only the steps it runs, so this round would report 0 s and 0 J"
                )
            examples = self.work.examples or 0
            if self.samples < examples and not self.done:
                log.warning(
                    "PowerSession: the loop ended after %d samples through session.step, fewer than one "
                    "pass over its %d training examples: steps run outside session.step are not charged "
                    "(device seconds and energy undercount)",
                    self.samples,
                    examples,
                )
            self.report = self._report(dev)
        finally:
            stack.close()  # the device restored on every way out
        self._joined.sessions.append(self)

    @property
    def batch_size(self) -> int:
        """The batch size chosen (a cap that changes may change it between steps)."""
        return self._active().batch_size

    @property
    def lr(self) -> float:
        """The plan's learning rate for the batch size in force (its LR rule)."""
        return float(self.instructions.lr_for(self.batch_size))

    @property
    def torch_device(self) -> str:
        """Where the loop's tensors go (the board's GPU; "cpu" on a simulated board)."""
        if self._dev is None:
            raise SessionError("PowerSession: use it inside its `with` block")
        return self._dev.torch_device()

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one training step `fn(*args, **kwargs)` on the pinned board, charged by `len(args[0])`."""
        pinning, dev, power = self._active(), self._dev, self._power
        assert dev is not None and power is not None and self._workload is not None
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() == 0:
            raise SessionError("PowerSession.step: the batch is a 0-d tensor; pass the batch's inputs first")
        batch = len(first) if first is not None and hasattr(first, "__len__") else self.batch_size
        for hook in pinning.hooks:
            hook.before_step(self.samples)
        t0 = dev.clock()
        if self.steps == 0:  # the first step is counted: is it the step that was profiled?
            result, flops = dev.run_step(
                lambda: count_flops(lambda: fn(*args, **kwargs)), batch_size=batch, workload=self._workload
            )
            self._check_first_step(flops, batch, self._workload.flops_per_sample)
        else:
            result = dev.run_step(lambda: fn(*args, **kwargs), batch_size=batch, workload=self._workload)
        seconds = dev.clock() - t0
        if 1 <= self.steps <= TIMED_STEPS and not isinstance(dev, SimulatedBoard):
            self._check_step_time(batch, seconds)
        self.device_s += seconds
        self.samples += batch
        self.steps += 1
        power.after_step(pinning.hooks, self.device_s)
        return result

    def _check_first_step(self, flops: float | None, batch: int, profiled: float) -> None:
        """The first step's FLOPs per sample against the profiled step's (not compared when torch counts
        none): another step would be charged the wrong workload."""
        if not flops or not profiled or batch < 1:
            return
        ratio = flops / batch / profiled
        if not 1 / FIRST_STEP_TOLERANCE <= ratio <= FIRST_STEP_TOLERANCE:
            raise SessionError(
                f"PowerSession: the step run through session.step does {flops / batch:.3g} FLOPs a "
                f"sample, the step make_step returned (profiled) {profiled:.3g}: make_step(model) must "
                "return the step the loop runs, so that what was profiled is what trains"
            )

    def _check_step_time(self, batch: int, seconds: float) -> None:
        """On a real board, the median of steps 2 to 1 + TIMED_STEPS against the profile's time at the pair
        in force (the FLOP check sees only matmuls and convolutions); a short batch, and profiled steps
        under MIN_TIMED_STEP_S (launch overheads dominate), are not compared."""
        assert self.profiled is not None
        if batch != self.batch_size:
            return
        self._step_s.append(seconds)
        if len(self._step_s) < TIMED_STEPS:
            return
        hz = self._active().frequency_hz
        point = self.profiled.profile.point(batch, hz)
        if point is None or point.seconds_per_batch < MIN_TIMED_STEP_S:
            return
        measured = sorted(self._step_s)[len(self._step_s) // 2]
        ratio = measured / point.seconds_per_batch
        if not 1 / STEP_TIME_TOLERANCE <= ratio <= STEP_TIME_TOLERANCE:
            raise SessionError(
                f"PowerSession: the step run through session.step takes {measured * 1e3:.3g} ms at "
                f"b={batch}, {hz / 1e6:.1f} MHz, the step make_step returned (profiled) "
                f"{point.seconds_per_batch * 1e3:.3g} ms: make_step(model) must return the step the loop "
                "runs, so that the pair chosen is chosen for it (or the GPU was shared while profiling)"
            )

    def evaluated(self, accuracy: float) -> bool:
        """Record an evaluation of the model (the last one is reported, its time not charged); True once it
        meets the target. An accuracy outside [0, 1] is one ArgumentError line."""
        check_arguments("PowerSession.evaluated", accuracy=(accuracy, Number(0.0, 1.0)))
        self.accuracy = float(accuracy)
        return self.reached

    @property
    def reached(self) -> bool:
        return self.accuracy is not None and self.accuracy >= self.instructions.target_accuracy

    @property
    def done(self) -> bool:
        """The target met, or the plan's budget (samples, device seconds) spent: stop the loop."""
        instr = self.instructions
        return (
            self.reached
            or (bool(instr.budget_samples) and self.samples >= instr.budget_samples)
            or (bool(instr.budget_device_s) and self.device_s >= instr.budget_device_s)
        )

    def _active(self) -> Pinning:
        if self._pinning is None or self._stack is None:
            raise SessionError("PowerSession: use it inside its `with` block")
        return self._pinning

    @property
    def profiled(self) -> Profiled | None:
        """The profile the pair was chosen from (None before the `with`)."""
        return None if self.prepared is None else self.prepared.profiled

    def _report(self, dev: Device) -> ClientReport:
        assert self._pinning is not None and self._power is not None and self.prepared is not None
        instr, start = self.instructions, self._pinning.choice
        energy, peak, mean = self._power.summary()
        result = FineTuneResult(
            reached=self.reached,
            samples=self.samples,
            device_s=self.device_s,
            energy_j=energy,
            peak_power_w=peak,
            mean_power_w=mean,
            final_accuracy=self.accuracy if self.accuracy is not None else 0.0,
            curve=[],
            batch_size=start.batch_size,
            lr=float(self._loop_lr if self._loop_lr is not None else instr.lr_for(start.batch_size)),
            steps=self.steps,
            target_accuracy=instr.target_accuracy,
            stop_reason="target" if self.reached else ("budget" if self.done else "loop"),
        )
        return self.prepared.report(self._pinning.trained(result, {}, dev.board))

"""A run's weights after every step, so that `powerfed.training.crossing.run_dense` reads the same run on
a denser evaluation grid without training it again (`StepTrace.replay`; None where the trace cannot)."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from powerfed.training.evaluation import evaluate
from powerfed.training.finetune_records import CurvePoint, FineTuneResult, MetricFn

if TYPE_CHECKING:
    from powerctl.devices.base import PowerSamples

MAX_TRACE_BYTES = 1 << 29
"""A trace keeps at most this many bytes of weights (512 MiB; then it stops and the caller trains again):
hundreds of steps of a model of a million parameters (ResNet18-small: 2.8 MB a step)."""


class StepTrace:
    """The weights after every step of one run (a `StepHook`: it changes nothing in the run)."""

    def __init__(self, model: nn.Module, *, max_bytes: int = MAX_TRACE_BYTES) -> None:
        self._model = model
        each = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        self._max_steps = max_bytes // max(each, 1)
        self._states: list[dict[str, torch.Tensor]] = []
        self._seconds: list[float] = []
        self.overflowed = False
        """More steps than `max_bytes` holds: the trace stopped and replays nothing."""

    def before_step(self, samples: int) -> int | None:
        return None

    def after_step(self, power: PowerSamples, device_s: float) -> None:
        if len(self._states) >= self._max_steps:
            self.overflowed = True
            return
        self._states.append({k: v.detach().clone() for k, v in self._model.state_dict().items()})
        self._seconds.append(device_s)

    def resume_state(self) -> dict[str, Any]:
        return {}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """A trace is not checkpointed: a resumed run has none of its earlier steps (it replays nothing)."""
        self.overflowed = True

    def replay(
        self,
        first: FineTuneResult,
        every_samples: int,
        *,
        eval_x: torch.Tensor,
        eval_y: torch.Tensor,
        task: str,
        max_samples: int | None,
        metric: MetricFn | None = None,
    ) -> FineTuneResult | None:
        """The traced run `first` as it would have run evaluating every `every_samples` samples (on its
        evaluation subset `eval_x`, `eval_y`), or None when the trace does not hold that run."""
        b, target = first.batch_size, first.target_accuracy
        usable = (
            not self.overflowed
            and first.energy_j is None  # power was measured: a replay could not say what it drew
            and first.curve
            and first.steps == len(self._states)
            and every_samples % b == 0
            and first.extra.get("resumed_at_samples") is None
        )
        if not usable or target is None:
            return None
        started = time.perf_counter()
        model = copy.deepcopy(self._model)
        curve = [first.curve[0]]  # the look before training: the same weights
        stride = every_samples // b
        for step in range(stride, len(self._states) + 1, stride):
            if max_samples is not None and step * b >= max_samples:
                return None  # the budget would have stopped it here first: not what a replay reads
            model.load_state_dict(self._states[step - 1])
            accuracy = evaluate(model, task, eval_x, eval_y, metric=metric)
            curve.append(CurvePoint(step * b, self._seconds[step - 1], accuracy))
            if accuracy >= target:
                return replace(
                    first,  # no power readings (see `usable`), the same batch size, rate and target
                    reached=True,
                    samples=step * b,
                    device_s=self._seconds[step - 1],
                    final_accuracy=accuracy,
                    curve=curve,
                    steps=step,
                    stop_reason="target",
                    wall_s=time.perf_counter() - started,
                    extra={"replayed": True},
                )
        return None

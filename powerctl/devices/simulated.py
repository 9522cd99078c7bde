"""Simulated Jetson boards: real training steps on the CPU, charged to a virtual clock and power sensor."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from powerctl.devices.base import Device, PowerSampler, PowerSamples
from powerctl.devices.boards import BoardModel, board_model
from powerctl.errors import DeviceError, DeviceOutOfMemory
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.workload import Workload

T = TypeVar("T")

SIM_BOARDS = ("jetson-nano", "jetson-tx2nx")  # boards with a simulation model: `sim:NAME`


def check_board_name(name: str) -> str:
    """`name` when it is a simulated board, else one DeviceError line naming them."""
    if name not in SIM_BOARDS:
        known = ", ".join(f"sim:{b}" for b in SIM_BOARDS)
        raise DeviceError(f"no simulated board named {name!r}; choose one of: {known}")
    return name


TIME_NOISE = 0.01  # relative standard deviation of a step's duration (seeded)
POWER_NOISE = 0.01  # relative standard deviation of a power reading (seeded)

_ADAM_PASSES = 7  # parameter-sized memory passes of an Adam step: read p, g, m, v; write p, m, v
_GRAD_PASSES = 2  # the weight gradients: written in backward, zeroed for the next step
_TRAFFIC_READ_WRITE = 2.0  # measured traffic counts the bytes ops write; they read about as much
_UNMEASURED_KERNELS = 200  # kernels per pass assumed for a workload measured without a count


@dataclass(frozen=True)
class StepCost:
    """The model's prediction for one training step at (batch size, frequency), noise-free."""

    compute_s: float  # arithmetic kernels: scale with the GPU clock
    fixed_s: float  # kernel launches and memory traffic: independent of the GPU clock
    compute_w: float
    fixed_w: float

    @property
    def seconds(self) -> float:
        return self.compute_s + self.fixed_s

    @property
    def peak_w(self) -> float:
        return max(self.compute_w, self.fixed_w)

    @property
    def energy_j(self) -> float:
        return self.compute_s * self.compute_w + self.fixed_s * self.fixed_w


def step_cost(board: BoardModel, workload: Workload, batch_size: int, hz: int) -> StepCost:
    """Time and power of one step: a compute phase at the GPU clock and a frequency-independent one."""
    gflop = batch_size * workload.flops_per_sample / 1e9
    kernels = workload.kernels_per_step or _UNMEASURED_KERNELS
    occupancy = (gflop / kernels / board.half_utilisation_gflop_per_kernel) ** board.utilisation_exponent
    u = board.max_utilisation * occupancy / (1.0 + occupancy)
    ghz = hz / 1e9
    compute_s = gflop / (board.gflops_per_ghz * ghz * u) if gflop > 0 else 0.0
    launches = kernels + board.optimizer_kernels_per_tensor * max(workload.parameter_tensors, 1)
    traffic = (
        _TRAFFIC_READ_WRITE * batch_size * workload.traffic_bytes_per_sample
        + (_ADAM_PASSES + _GRAD_PASSES) * workload.parameter_bytes
    )
    memory_s = traffic / (board.memory_bandwidth_gbs * 1e9 * board.memory_efficiency)
    dynamic = board.full_load_power(hz) - board.idle_power_w
    return StepCost(
        compute_s=compute_s,
        fixed_s=board.step_overhead_s + launches * board.launch_s + memory_s,
        compute_w=board.idle_power_w + u * dynamic,
        fixed_w=board.overhead_power_w(hz),
    )


def top_clock_time_ratio(
    reference: BoardModel, board: BoardModel, workload: Workload, batch_size: int
) -> float:
    """Step time on `reference` over that on `board`, each at its top clock (what `calibration` holds)."""
    return (
        step_cost(reference, workload, batch_size, reference.frequencies_hz[-1]).seconds
        / step_cost(board, workload, batch_size, board.frequencies_hz[-1]).seconds
    )


def predicted_point(
    board: BoardModel, workload: Workload, batch_size: int, hz: int, samples: int
) -> ProfilePoint:
    """The profile point a noise-free profiling run would measure: peak and mean power of a step, T_N."""
    cost = step_cost(board, workload, batch_size, hz)
    return ProfilePoint(
        batch_size=batch_size,
        frequency_hz=hz,
        peak_power_w=cost.peak_w,
        mean_power_w=cost.energy_j / cost.seconds,
        seconds_per_batch=cost.seconds,
        seconds_for_samples=cost.seconds * samples / batch_size,
    )


def replay_cost(
    board: BoardModel, workload: Workload, batch_size: int, steps: int, hz: int
) -> tuple[float, float]:
    """(device seconds, energy J) of `steps` steps of `batch_size` at `hz`, noise-free."""
    cost = step_cost(board, workload, batch_size, hz)
    return steps * cost.seconds, steps * cost.energy_j


def predicted_profile(
    board: BoardModel | str,
    workload: Workload,
    batch_sizes: Sequence[int],
    samples: int,
    frequencies: Sequence[int] | None = None,
) -> Profile:
    """The board model's noise-free profile of a grid (no training), skipping batch sizes that do not fit;
    `frequencies` (default: all) are the board's, as its callers take them from it or its device."""
    model = board_model(board) if isinstance(board, str) else board
    table = sorted(frequencies or model.frequencies_hz)
    points, skipped = [], []
    for b in sorted(set(batch_sizes)):
        need = workload.memory_bytes(b)
        if need > model.training_memory_bytes:
            skipped.append({"batch_size": b, "reason": f"out of memory: needs {need / 2**30:.2f} GiB"})
            continue
        points += [predicted_point(model, workload, b, f, samples) for f in table]
    return Profile(
        device=model.name,
        model=workload.model,
        input_shape=list(workload.input_shape),
        samples=samples,
        points=points,
        skipped=skipped,
        extra={"predicted": True, "order": "grid", "workload": workload.to_dict()},
    )


class TimelineSampler(PowerSampler):
    """Reads the virtual sensor at every change of power, so peak and energy are exact up to noise."""

    def __init__(self, board: SimulatedBoard) -> None:
        self._board = board
        self._samples: PowerSamples = []

    def start(self) -> None:
        t = self._board.clock()
        self._samples = [(t, self._board.read_power_w())]
        self._board._samplers.append(self)

    def record(self, t0: float, t1: float, watts: float) -> None:
        # two readings per constant-power segment: the trapezoid rule integrates it exactly
        self._samples.append((t0, self._board._noisy(watts)))
        self._samples.append((t1, self._board._noisy(watts)))

    def stop(self) -> PowerSamples:
        if self in self._board._samplers:
            self._board._samplers.remove(self)
        self._samples.append((self._board.clock(), self._board.read_power_w()))
        return self._samples


class SimulatedBoard(Device):
    """`sim:NAME`: the board's frequency table, memory and calibrated power/time model."""

    has_power_sensor = True

    def __init__(
        self, model: BoardModel, seed: int = 0, *, noise: bool = True, power_scale: float = 1.0
    ) -> None:
        """`power_scale`: draw that many times what the model says (a hot board, for the power guard)."""
        if not math.isfinite(power_scale) or power_scale <= 0:
            raise ValueError(f"power_scale must be a positive number, got {power_scale!r}")
        self._power_scale = power_scale
        self.model = model
        self.board = model.name
        self.spec = f"sim:{model.name}"
        self._table = model.frequencies_hz
        self._min_hz, self._max_hz = model.frequencies_hz[0], model.frequencies_hz[-1]
        self._t = 0.0
        self._watts = model.idle_power_w
        self._rng = np.random.default_rng(seed)
        self._time_noise, self._power_noise = (TIME_NOISE, POWER_NOISE) if noise else (0.0, 0.0)
        self._samplers: list[TimelineSampler] = []
        self._last_reading = (-1.0, 0.0)

    @classmethod
    def open(
        cls, name: str, *, seed: int = 0, noise: bool = True, power_scale: float = 1.0
    ) -> SimulatedBoard:
        return cls(board_model(check_board_name(name)), seed=seed, noise=noise, power_scale=power_scale)

    # knob: the devfreq min/max pair of a real board, under a governor that runs at max under load
    def current_frequency(self) -> int:
        return self._max_hz

    def _write_pin(self, hz: int) -> None:
        self._min_hz = self._max_hz = hz

    def snapshot(self) -> dict[str, Any]:
        return {"min_freq": self._min_hz, "max_freq": self._max_hz}

    def apply_snapshot(self, state: dict[str, Any]) -> None:
        self._min_hz, self._max_hz = int(state["min_freq"]), int(state["max_freq"])

    def _noisy(self, watts: float) -> float:
        return float(watts * (1.0 + self._power_noise * self._rng.standard_normal()))

    def read_power_w(self) -> float:
        # one reading per instant of the virtual clock: total and rails agree when read together
        if self._last_reading[0] != self._t:
            self._last_reading = (self._t, self._noisy(self._watts))
        return self._last_reading[1]

    def rails(self) -> dict[str, float]:
        return {self.model.rails[0] if self.model.rails else "total": self.read_power_w()}

    def power_sampler(self, rate_hz: float) -> PowerSampler:
        return TimelineSampler(self)

    def memory_bytes(self) -> int:
        return self.model.training_memory_bytes

    def clock(self) -> float:
        return self._t

    def idle(self, seconds: float) -> None:
        self._watts = self.model.idle_power_w * self._power_scale
        self._advance(seconds, self._watts)

    def resume_state(self) -> dict[str, Any]:
        return {
            "t": self._t,
            "watts": self._watts,
            "last_reading": list(self._last_reading),
            "rng": self._rng.bit_generator.state,
        }

    def load_resume_state(self, state: dict[str, Any]) -> None:
        self._t, self._watts = float(state["t"]), float(state["watts"])
        t, w = state["last_reading"]
        self._last_reading = (float(t), float(w))
        self._rng.bit_generator.state = state["rng"]

    def synchronize(self) -> None:
        return None

    def torch_device(self) -> str:
        return "cpu"

    def predict(self, workload: Workload, batch_size: int, hz: int | None = None) -> StepCost:
        """The model's noise-free cost of one step at `hz` (default: the frequency in force)."""
        return step_cost(self.model, workload, batch_size, self._max_hz if hz is None else hz)

    def check_fits(self, workload: Workload, batch_size: int) -> None:
        need = workload.memory_bytes(batch_size)
        if need > self.memory_bytes():
            raise DeviceOutOfMemory(
                f"batch size {batch_size} of {workload.model} needs {need / 2**30:.2f} GiB; "
                f"{self.spec} has {self.memory_bytes() / 2**30:.2f} GiB for training"
            )

    def run_step(self, fn: Callable[[], T], *, batch_size: int, workload: Workload) -> T:
        self.check_fits(workload, batch_size)
        result = fn()
        cost = self.predict(workload, batch_size)
        jitter = max(0.5, 1.0 + self._time_noise * self._rng.standard_normal())
        scale = self._power_scale
        self._advance(cost.compute_s * jitter, cost.compute_w * scale)
        self._advance(cost.fixed_s * jitter, cost.fixed_w * scale)
        self._watts = cost.fixed_w * scale
        return result

    def _advance(self, seconds: float, watts: float) -> None:
        if seconds <= 0 or not math.isfinite(seconds):
            return
        t0, self._t = self._t, self._t + seconds
        for sampler in self._samplers:
            sampler.record(t0, self._t, watts)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "description": f"simulated {self.model.description}",
            "rails": list(self.model.rails[:1]),
        }

"""A rule in force while any loop trains (`Pinning`), and the train step's outcome it gives (`Trained`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from powerctl.devices.base import Device
from powerctl.pinning.safety import restore_on_exit
from powerctl.profiling.budget import confirmed_in_training
from powerctl.records.pick import Pick
from powerctl.selection.confirm import TrainingConfirmation
from powerctl.selection.follow import CapFollower
from powerctl.selection.guard import PowerGuard
from powerctl.selection.joint import select
from powerfed.training.finetune_records import FineTuneResult
from strategies.report import CapFollowed

if TYPE_CHECKING:
    import torch

    from fl_client.round import CapRule, RoundWork

    State = dict[str, torch.Tensor]

log = logging.getLogger(__name__)
SWITCHED = (
    "%s: b=%d at %d Hz read %.2f W, over the %g W cap or outranked once measured: "
    "b=%d at %d Hz from %.3g s of training"
)


@dataclass
class Trained:
    """A train step's outcome; `choice`: the pair it started from (a changing cap: the follower's first)."""

    result: FineTuneResult
    state: State
    board: str
    choice: Pick
    stand_in: bool = False  # not trained: a bench's stand-in charged a board model
    step_downs: list[dict[str, Any]] = field(default_factory=list)  # what the power guard did
    cap: CapFollowed = field(default_factory=CapFollowed)  # what the cap follower did (defaults: none)
    pinned: bool = True  # False: trained at the clock in force (`open_device(pin=...)`)


@dataclass
class Pinning:
    """A rule in force on an open device while a loop trains with `hooks`: under a constant cap pinned at
    the rule's pair with the power guard watching; under a cap that changes, the follower re-applying the
    rule at every change. The caller restores the device."""

    choice: Pick
    guard: PowerGuard | None = None
    follower: CapFollower | None = None
    confirmation: TrainingConfirmation | None = None  # the predicted choice, confirmed by the first steps
    pinned: bool = True  # False: the device runs at the clock in force; nothing is written

    @classmethod
    def start(cls, work: RoundWork, rule: CapRule, dev: Device) -> Pinning:
        instr = work.instr
        if work.caps.is_constant:
            cap = work.cap_at_start
            choice = rule(cap)
            dev.pin_frequency(choice.frequency_hz)
            if cap is None or not dev.has_power_sensor:
                return cls(choice, pinned=dev.pins)
            guard = PowerGuard(
                dev, cap, choice.frequency_hz, window=instr.guard_window, tolerance=instr.guard_tolerance
            )
            if not confirmed_in_training(rule.profile):
                return cls(choice, guard=guard, pinned=dev.pins)
            confirmation = TrainingConfirmation(
                dev,
                rule.profile,
                lambda merged: select(merged, rule.relation, cap, rule=instr.relation_rule),
                cap,
                choice,
                warmup_steps=int(rule.profile.extra.get("warmup_steps", instr.profile_warmup)),
                measure_steps=int(rule.profile.extra.get("measure_steps", instr.profile_steps)),
                guard=guard,
            )
            return cls(choice, confirmation=confirmation, pinned=dev.pins)
        follower = CapFollower(
            dev,
            work.caps,
            rule,
            samples_to_target=rule.relation.samples_map(),
            poll_s=instr.cap_poll_s,
            pause_timeout_s=instr.cap_pause_timeout_s,
            guard_window=instr.guard_window,
            guard_tolerance=instr.guard_tolerance,
        )
        first = follower.start()
        choice = Pick(first.batch_size, first.frequency_hz, first.predicted_s, method=instr.method)
        return cls(choice, follower=follower, pinned=dev.pins)

    @property
    def hooks(self) -> list[Any]:
        """The step hooks a loop runs (`powerfed.training.finetune_records.StepHook`)."""
        return [h for h in (self.confirmation or self.guard, self.follower) if h is not None]

    @property
    def batch_size(self) -> int:
        """The batch size in force (a follower or the confirmation may change it between steps)."""
        holders = (self.follower, self.confirmation, self.choice)
        return int(next(h for h in holders if h is not None).batch_size)

    @property
    def frequency_hz(self) -> int:
        """The frequency in force (the guard's after its step-downs)."""
        holders = (self.follower, self.confirmation, self.guard, self.choice)
        return int(next(h for h in holders if h is not None).frequency_hz)

    def trained(self, result: FineTuneResult, state: State, board: str) -> Trained:
        """The train step's outcome, with what the guard or the follower did."""
        choice, cap, method = self.choice, CapFollowed(), self.choice.method
        stepped: PowerGuard | CapFollower | None = self.guard
        if self.confirmation is not None:  # the pair confirmed (or in force): what trained
            choice, stepped = replace(self.confirmation.pick, method=method), self.confirmation.guard
            for s in self.confirmation.switches:
                log.info(SWITCHED, board, *s.old, s.measured_w, s.power_cap_w, *s.new, s.device_s)
        if self.follower is not None:
            cap, stepped = CapFollowed.of(self.follower), self.follower
            # the pair it started with (from the events: a resumed run's first pick is its first run's)
            e = next(e for e in cap.cap_events if e["kind"] in ("start", "resume"))
            pair = (e["new_batch_size"], e["new_frequency_hz"], e["predicted_remaining_s"])
            choice = Pick(*pair, method=method)
        downs = [] if stepped is None else [asdict(d) for d in stepped.step_downs]
        return Trained(result, state, board, choice, step_downs=downs, cap=cap, pinned=self.pinned)


@contextmanager
def pinned(
    work: RoundWork, rule: CapRule, observe: Callable[[Device], AbstractContextManager[Any]] | None = None
) -> Iterator[tuple[Device, Pinning]]:
    """A fresh handle on the node's device with the rule in force, restored on every way out of the block
    (an exception, SIGTERM, SIGHUP, exit); `observe(device)` is entered before the rule."""
    with work.device() as dev, restore_on_exit(dev), observe(dev) if observe else nullcontext():
        yield dev, Pinning.start(work, rule, dev)

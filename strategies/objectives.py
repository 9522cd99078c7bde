"""What `PowerAware` is given besides its strategy: what a round asks of its clients, `RoundObjective`
(`time`) or `EnergyUnderDeadline` (docs/design/deadline-rounds.md), named as the method registry's
`ROUND_OBJECTIVES`; and how long it waits for nodes, `NodeWaits` (Flower's sampling waits forever)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from powerctl.files.mapping import Custom, Integer, Number, check_fields, field_kinds, must_be
from powerctl.files.mapping import kind_field as kind
from powerctl.selection.methods import ENERGY_UNDER_DEADLINE, ROUND_OBJECTIVES, TIME
from strategies.report import Plan

Plans = Callable[[], Sequence[Plan]]  # the plans of the round's sampled nodes that answered (asked once)


@dataclass(frozen=True)
class NodeWaits:
    """The waits of a `PowerAware` run, kept as checked (plain numbers where numpy's were given)."""

    min_available_nodes: int = kind(Integer(0), 0)  # once, before round 1 (0: the inner strategy's)
    rejoin_wait_s: float = kind(Number(0.0, unit="seconds"), 30.0)  # each round, for the nodes seen before
    query_timeout_s: float = kind(Number(0.0, above=True, unit="seconds"), 120.0)  # a question to a node

    def __post_init__(self) -> None:
        check_fields(self, "NodeWaits", field_kinds(self))


@dataclass(eq=False)
class RoundObjective:
    """The `time` objective (the paper's): no deadline, each client its fastest pair. Other objectives
    subclass it and override only what differs."""

    name: ClassVar[str] = TIME

    def round_deadline(self, plans: Plans) -> float:
        """The round's deadline in device seconds (0: none, each client runs its fastest pair)."""
        return 0.0


@dataclass(eq=False)
class EnergyUnderDeadline(RoundObjective):
    """Each client its least-energy pair that meets the round's deadline: `deadline_s` (device seconds),
    or with 0 the slowest sampled node's predicted fastest time."""

    name: ClassVar[str] = ENERGY_UNDER_DEADLINE
    deadline_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, "EnergyUnderDeadline", {"deadline_s": Number(0.0, unit="seconds")})

    def round_deadline(self, plans: Plans) -> float:
        # asked with a fixed deadline too: the plan's profiling is billed to the round that trains
        planned = plans()
        return self.deadline_s if self.deadline_s > 0 else max((p.fastest_s for p in planned), default=0.0)


def objective_named(name: str, deadline_s: float = 0.0) -> RoundObjective:
    """The objective `name` (a checked `ROUND_OBJECTIVES` name) is, with `deadline_s` where it takes one."""
    return EnergyUnderDeadline(deadline_s) if name.strip() == EnergyUnderDeadline.name else RoundObjective()


def _objective(value: Any) -> RoundObjective:
    if isinstance(value, RoundObjective):
        return value
    if isinstance(value, str) and value.strip() in ROUND_OBJECTIVES:
        return objective_named(value)
    raise must_be(OBJECTIVE.expected, value)


# a constructor argument's kind (`check_arguments`): a `RoundObjective`, or the name of one
OBJECTIVE = Custom(
    _objective,
    expected=f"one of {', '.join(ROUND_OBJECTIVES)} (or a RoundObjective)",
    python_type=RoundObjective,
)

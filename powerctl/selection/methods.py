"""The methods, one registry: a `Method` is how a client chooses (b, f), with what the project asks of it
instead of its name; a `RunMethod` is what a run's `methods` setting names (a client method and its round
objective). `register_method` adds one's own to this process (a client's instructions name built-ins only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from powerctl.errors import PowerctlError
from powerctl.records.pick import Pick
from powerctl.records.relation import DEFAULT_RELATION_RULE
from powerctl.selection.names import ORACLE, OURS, OURS_DEADLINE, PROXY_BATCH, STATE_OF_PRACTICE

if TYPE_CHECKING:
    from powerctl.records.profile import Profile
    from powerctl.records.relation import RelationVector


TIME = "time"
ENERGY_UNDER_DEADLINE = "energy-under-deadline"
ROUND_OBJECTIVES: tuple[str, ...] = (TIME, ENERGY_UNDER_DEADLINE)
"""time: every client its fastest pair (the paper); energy-under-deadline: each power-aware client its
least-energy pair that meets the round's deadline (docs/design/deadline-rounds.md)."""


@dataclass(frozen=True)
class MethodContext:
    """What a rule may read besides the profile, the relation and the cap."""

    target_relation: RelationVector | None = None  # the oracle's: measured on the client's own data
    deadline_s: float = 0.0  # the round's deadline in device seconds (0: none), for power-aware methods
    relation_rule: str = DEFAULT_RELATION_RULE  # how a power-aware method reads the relation


Rule = Callable[["Profile", "RelationVector", "float | None", MethodContext], Pick]
"""(profile, relation, cap in W or None, context) → the pair picked; nothing feasible: InfeasibleCapError."""


@dataclass(frozen=True)
class Method:
    """A client method: its name, its rule, and what it is."""

    name: str
    rule: Rule = field(repr=False, compare=False)
    power_aware: bool = False  # ours: its profiling is charged and budgeted, it takes a round deadline
    searches_own_data: bool = False  # the oracle: samples to target measured on the client's own data
    reference: bool = False  # the state of practice: every ratio's denominator

    def choose(
        self,
        profile: Profile,
        relation: RelationVector,
        power_cap_w: float | None,
        context: MethodContext | None = None,
    ) -> Pick:
        """The (b, f) this method picks for this profile and cap, its `method` set to this name."""
        return replace(
            self.rule(profile, relation, power_cap_w, context or MethodContext()), method=self.name
        )


@dataclass(frozen=True)
class RunMethod:
    """What a run compares: a client method, run under a round objective."""

    name: str
    client_method: str
    round_objective: str | None = None
    """Always this round objective; None: the run's `round-objective` if power-aware, else time."""

    @property
    def method(self) -> Method:
        return method_named(self.client_method)

    def objective(self, configured: str) -> str:
        """The round objective of a run of this method whose `round-objective` setting is `configured`."""
        if self.round_objective is not None:
            return self.round_objective
        return configured if self.method.power_aware else TIME


def _ours(profile: Profile, relation: RelationVector, cap: float | None, ctx: MethodContext) -> Pick:
    """Algorithm 1 under the relation rule; with a deadline (> 0) the least-energy pair meeting it."""
    from powerctl.selection.joint import select, select_under_deadline  # as the baselines': on first use

    if ctx.deadline_s > 0:
        pick, met = select_under_deadline(profile, relation, cap, ctx.deadline_s, ctx.relation_rule)
        return replace(pick, meets_deadline=met)
    return select(profile, relation, cap, rule=ctx.relation_rule)


def _state_of_practice(
    profile: Profile, relation: RelationVector, cap: float | None, _: MethodContext
) -> Pick:
    from powerctl.selection.baselines import state_of_practice

    return state_of_practice(profile, cap, relation=relation)


def _proxy_batch(profile: Profile, relation: RelationVector, cap: float | None, _: MethodContext) -> Pick:
    from powerctl.selection.baselines import proxy_batch

    return proxy_batch(profile, relation, cap)


def _oracle(profile: Profile, _relation: RelationVector, cap: float | None, ctx: MethodContext) -> Pick:
    from powerctl.selection.baselines import oracle

    if ctx.target_relation is None:
        raise PowerctlError("the oracle needs samples to target measured on this client's own data")
    return oracle(profile, ctx.target_relation, cap)


_BUILT_IN: tuple[Method, ...] = (
    Method(OURS, _ours, power_aware=True),
    Method(STATE_OF_PRACTICE, _state_of_practice, reference=True),
    Method(PROXY_BATCH, _proxy_batch),
    Method(ORACLE, _oracle, searches_own_data=True),
)
METHODS: tuple[str, ...] = tuple(m.name for m in _BUILT_IN)
"""The built-in client methods: the power-aware method and the baselines (`powerctl.selection.baselines`)."""
_RUN_METHODS: tuple[RunMethod, ...] = (
    *(RunMethod(name, name) for name in METHODS),
    RunMethod(OURS_DEADLINE, OURS, ENERGY_UNDER_DEADLINE),
)
RUN_METHODS: tuple[str, ...] = tuple(r.name for r in _RUN_METHODS)
"""What a run compares: the client methods, and `ours-deadline` = ours with energy-under-deadline rounds."""

_registry: dict[str, Method] = {m.name: m for m in _BUILT_IN}


def method_named(name: str) -> Method:
    """The client method called `name`, or one PowerctlError line naming the known ones."""
    try:
        return _registry[name]
    except (KeyError, TypeError):
        raise PowerctlError(f"unknown method {name!r}; methods are {', '.join(_registry)}") from None


def run_method_named(name: str) -> RunMethod:
    """The run method called `name`, or one PowerctlError line naming the known ones."""
    if (found := next((r for r in _RUN_METHODS if r.name == name), None)) is not None:
        return found
    raise PowerctlError(f"unknown run method {name!r}; run methods are {', '.join(RUN_METHODS)}")


def register_method(method: Method) -> Method:
    """Add (or replace) a method of one's own in this process's registry; a built-in's name is refused."""
    if not isinstance(method, Method):
        raise PowerctlError(
            f"register_method takes a powerctl.selection.methods.Method, got {type(method).__name__}"
        )
    if method.name in RUN_METHODS:
        raise PowerctlError(f"{method.name!r} is a built-in method's name: register yours under another")
    _registry[method.name] = method
    return method

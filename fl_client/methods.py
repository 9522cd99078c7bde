"""How a client chooses (batch size, GPU frequency) for the method the server names in its instructions.

One code path for every method: the power-aware method is `powerctl.selection.select`; the baselines
are `powerctl.baselines` (state-of-practice, proxy-batch, oracle), so a fleet comparison runs exactly
the rules a single-board comparison runs. The oracle needs what only the client can measure: samples to
the target per batch size on its own data (`target_relation`).
"""

from __future__ import annotations

from dataclasses import dataclass

from powerctl.baselines import oracle, proxy_batch, state_of_practice
from powerctl.errors import PowerctlError
from powerctl.profile_table import Profile
from powerctl.relation import RelationVector
from powerctl.selection import DEFAULT_RELATION_RULE, select, select_under_deadline
from strategies.protocol import METHODS, ORACLE, OURS, PROXY_BATCH, STATE_OF_PRACTICE


@dataclass(frozen=True)
class Choice:
    """The pair a method chose, with what the profile predicts for it (None: not profiled)."""

    method: str
    batch_size: int
    frequency_hz: int
    predicted_seconds: float | None
    """T_N(b, f) · r_b under the proxy's relation (the oracle's: under the target relation)."""
    profiled_peak_power_w: float | None
    meets_deadline: bool | None = None
    """Energy-under-deadline rounds: whether the pair is predicted to meet the round's deadline (None:
    no deadline)."""


def choose(
    method: str,
    profile: Profile,
    relation: RelationVector,
    power_cap_w: float | None,
    target_relation: RelationVector | None = None,
    deadline_s: float = 0.0,
    relation_rule: str = DEFAULT_RELATION_RULE,
) -> Choice:
    """The (b, f) `method` picks for this profile and cap; a cap nothing meets is one error line.

    Ours reads the relation by `relation_rule` (`powerctl.selection`: its mean, or robust over the seeds).
    With a round deadline (`deadline_s` > 0, ours only) the power-aware method picks the pair with the
    least predicted energy that meets it, or its fastest pair when none does; the baselines ignore it."""
    if method == OURS and deadline_s > 0:
        sel, met = select_under_deadline(profile, relation, power_cap_w, deadline_s, relation_rule)
        return Choice(OURS, sel.batch_size, sel.frequency_hz, sel.predicted_seconds, sel.peak_power_w, met)
    if method == OURS:
        sel = select(profile, relation, power_cap_w, rule=relation_rule)
        return Choice(OURS, sel.batch_size, sel.frequency_hz, sel.predicted_seconds, sel.peak_power_w)
    if method == STATE_OF_PRACTICE:
        b = state_of_practice(profile, power_cap_w, relation=relation)
    elif method == PROXY_BATCH:
        b = proxy_batch(profile, relation, power_cap_w)
    elif method == ORACLE:
        if target_relation is None:
            raise PowerctlError("the oracle needs samples to target measured on this client's own data")
        b = oracle(profile, target_relation, power_cap_w)
    else:
        raise PowerctlError(f"unknown method {method!r}; methods are {', '.join(METHODS)}")
    return Choice(method, b.batch_size, b.frequency_hz, b.predicted_seconds, b.peak_power_w)

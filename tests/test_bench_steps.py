"""The fleet runner's steps live with the fleet runner (issue 27): the production round has none of
them, and a client finds them through the `powerfed.round_steps` entry point only when the server's
instructions ask for scale mode, predicted profiles or the oracle's search."""

from __future__ import annotations

import dataclasses

import pytest

import fl_client.round as client_round
from fl_client.round import ClientWorkError, RoundSteps, fine_tune_step, measured_profile_step, method_step
from simulations import bench_steps
from strategies.protocol import ORACLE, STATE_OF_PRACTICE
from tests.fl_helpers import instructions


def test_the_production_round_holds_no_bench_step() -> None:
    for name in ("oracle_search", "stand_in_step", "predicted_profile_step", "PinnedRule"):
        assert not hasattr(client_round, name), name
    steps = RoundSteps.for_instructions(instructions())
    assert (steps.profile, steps.choose, steps.train) == (measured_profile_step, method_step, fine_tune_step)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"stand_in": True, "profile_source": "predicted"},
            ("predicted_profile_step", "method_step", "stand_in_step"),
        ),
        ({"method": ORACLE}, ("measured_profile_step", "oracle_search", "fine_tune_step")),
        (
            {"method": STATE_OF_PRACTICE, "stand_in": True},
            ("measured_profile_step", "method_step", "stand_in_step"),
        ),
    ],
)
def test_what_only_the_benches_ask_for_comes_through_the_entry_point(changes: dict, expected: tuple) -> None:
    steps = RoundSteps.for_instructions(dataclasses.replace(instructions(), **changes))
    assert tuple(f.__name__ for f in (steps.profile, steps.choose, steps.train)) == expected
    assert steps.train.__module__ in (bench_steps.__name__, client_round.__name__)


def test_without_the_fleet_runner_installed_it_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [])
    client_round._bench_steps_factory.cache_clear()  # found once per process: look again, now absent
    with pytest.raises(ClientWorkError, match="does not provide") as caught:
        RoundSteps.for_instructions(dataclasses.replace(instructions(), stand_in=True))
    assert "\n" not in str(caught.value)

"""One object per method, found in one registry (`powerctl.selection.methods`), each choosing a `Pick` by the
same
rule as the selection and baselines functions; nothing outside the registry compares method names."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from powerctl.errors import PowerctlError
from powerctl.records.pick import Pick
from powerctl.selection import methods
from powerctl.selection.baselines import oracle, proxy_batch, state_of_practice
from powerctl.selection.joint import select, select_under_deadline
from powerctl.selection.methods import (
    ENERGY_UNDER_DEADLINE,
    METHODS,
    ORACLE,
    OURS,
    OURS_DEADLINE,
    PROXY_BATCH,
    RUN_METHODS,
    STATE_OF_PRACTICE,
    TIME,
    Method,
    MethodContext,
    method_named,
    register_method,
    run_method_named,
)
from strategies.report import Plan
from tests.test_baselines import nano_grid
from tests.test_selection import make_relation

ROOT = Path(__file__).resolve().parent.parent
PROFILE = nano_grid([8, 16, 32, 64, 128])
PROXY = make_relation({8: 6000.0, 16: 3000.0, 32: 3500.0, 64: 4000.0, 128: 6000.0})
OWN = make_relation({8: 9000.0, 16: 5000.0, 32: 2000.0, 64: 4500.0, 128: 7000.0}, "own data")


def _pair(p: Pick) -> tuple[int, int]:
    return p.batch_size, p.frequency_hz


@pytest.mark.parametrize("cap", [3.0, 4.0, 5.0, None])
def test_every_built_in_chooses_what_its_function_picks(cap: float | None) -> None:
    old = {
        OURS: select(PROFILE, PROXY, cap),
        STATE_OF_PRACTICE: state_of_practice(PROFILE, cap, relation=PROXY),
        PROXY_BATCH: proxy_batch(PROFILE, PROXY, cap),
        ORACLE: oracle(PROFILE, OWN, cap),
    }
    assert set(old) == set(METHODS) == set(list(methods._registry)[: len(METHODS)])
    for name, expected in old.items():
        method = method_named(name)
        got = method.choose(PROFILE, PROXY, cap, MethodContext(target_relation=OWN))
        assert (method.name, got.method) == (name, name)
        assert got == replace(expected, method=name)
    # the flags the rest of the project reads instead of names
    assert [m for m in METHODS if method_named(m).power_aware] == [OURS]
    assert [m for m in METHODS if method_named(m).searches_own_data] == [ORACLE]
    assert [m for m in METHODS if method_named(m).reference] == [STATE_OF_PRACTICE]


def test_ours_with_a_deadline_and_a_relation_rule_is_select_under_deadline() -> None:
    fastest = select(PROFILE, PROXY, 5.0)
    for deadline in (fastest.predicted_s * 1.5, fastest.predicted_s / 2):
        pick, met = select_under_deadline(PROFILE, PROXY, 5.0, deadline, "robust")
        got = method_named(OURS).choose(
            PROFILE, PROXY, 5.0, MethodContext(deadline_s=deadline, relation_rule="robust")
        )
        assert got == replace(pick, method=OURS, meets_deadline=met)
    assert method_named(OURS).choose(PROFILE, PROXY, 5.0).meets_deadline is None  # no deadline
    # a baseline ignores the deadline
    sop = method_named(STATE_OF_PRACTICE).choose(PROFILE, PROXY, 5.0, MethodContext(deadline_s=1.0))
    assert _pair(sop) == _pair(state_of_practice(PROFILE, 5.0)) and sop.meets_deadline is None


def test_the_oracle_without_its_own_data_is_one_line() -> None:
    with pytest.raises(
        PowerctlError, match=r"^the oracle needs samples to target measured on this client's own data$"
    ):
        method_named(ORACLE).choose(PROFILE, PROXY, 5.0)


def test_an_unknown_name_is_one_line_naming_the_methods() -> None:
    with pytest.raises(PowerctlError) as info:
        method_named("fastest")
    assert (
        str(info.value)
        == "unknown method 'fastest'; methods are ours, state-of-practice, proxy-batch, oracle"
    )
    with pytest.raises(PowerctlError, match=r"^unknown run method 'x'; run methods are .*ours-deadline$"):
        run_method_named("x")


def test_run_methods_name_their_client_method_and_round_objective() -> None:
    assert (*METHODS, OURS_DEADLINE) == RUN_METHODS
    deadline = run_method_named(OURS_DEADLINE)
    assert (deadline.client_method, deadline.method.name) == (OURS, OURS)
    assert deadline.objective(TIME) == ENERGY_UNDER_DEADLINE
    assert run_method_named(OURS).objective(ENERGY_UNDER_DEADLINE) == ENERGY_UNDER_DEADLINE
    assert run_method_named(OURS).objective(TIME) == TIME
    for name in (STATE_OF_PRACTICE, PROXY_BATCH, ORACLE):  # the baselines' rounds are time rounds
        assert run_method_named(name).objective(ENERGY_UNDER_DEADLINE) == TIME


def test_the_settings_names_are_the_registrys() -> None:
    from strategies import protocol, settings

    assert settings.RUN_METHODS is RUN_METHODS
    assert protocol.METHODS is METHODS and protocol.OURS_DEADLINE is OURS_DEADLINE


def test_a_registered_method_is_found_by_name_and_a_built_in_name_is_refused() -> None:
    def smallest(profile, relation, cap, context):
        b = min(profile.batch_sizes())
        return Pick(b, profile.frequencies()[0])

    mine = Method("smallest", smallest)
    register_method(mine)
    try:
        assert method_named("smallest") is mine
        got = method_named("smallest").choose(PROFILE, PROXY, None)
        assert got == Pick(8, PROFILE.frequencies()[0], method="smallest")
    finally:
        methods._registry.pop("smallest")
    for name in (OURS, OURS_DEADLINE):
        with pytest.raises(PowerctlError, match=rf"^'{name}' is a built-in method's name"):
            register_method(Method(name, smallest))


def test_a_plan_reports_a_pick_under_its_wire_keys() -> None:
    fastest = select(PROFILE, PROXY, 5.0)
    plan = Plan.of(fastest, 2.5)
    assert sorted(plan.to_config()) == [
        "batch-size",
        "energy-j",
        "fastest-s",
        "frequency-hz",
        "profiling-s",
    ]
    assert Plan.from_config(plan.to_config()) == plan
    pair = (plan.batch_size, plan.frequency_hz, plan.fastest_s, plan.energy_j)
    assert pair == (
        fastest.batch_size,
        fastest.frequency_hz,
        fastest.predicted_s,
        fastest.predicted_energy_j,
    )


# --- no module outside the registry compares a method's name ------------------------------------------
NAMES = {"OURS", "STATE_OF_PRACTICE", "PROXY_BATCH", "ORACLE", "OURS_DEADLINE"}
CHECKED = ("powerctl", "strategies", "fl_server", "fl_client", "powerfed", "simulations", "bench")
LITERALS_CHECKED = ("powerctl", "strategies", "fl_server", "fl_client", "powerfed", "simulations")
"""Where a method's name written out is a method's name; bench's tables label their own rows and
variants with such words ("ours-robust", ...)."""
REGISTRY = ROOT / "powerctl" / "selection" / "methods.py"


def _operands(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [o for e in node.elts for o in _operands(e)]
    return [node]


def name_comparisons(path: Path, literals: bool) -> list[int]:
    """The lines where `path` compares (==, !=, in, ...) with a method-name constant (or, with
    `literals`, a method's name written out)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        for o in (x for side in (node.left, *node.comparators) for x in _operands(side)):
            if (
                (isinstance(o, ast.Name) and o.id in NAMES)
                or (isinstance(o, ast.Attribute) and o.attr in NAMES)
                or (literals and isinstance(o, ast.Constant) and o.value in RUN_METHODS)
            ):
                found.append(node.lineno)
                break
    return found


def test_no_module_outside_the_registry_compares_a_method_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for top in CHECKED
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != REGISTRY
        for line in name_comparisons(path, literals=top in LITERALS_CHECKED)
    ]
    assert not found, (
        f"method names compared outside powerctl/selection/methods.py (ask the registry): {found}"
    )


def test_the_name_check_sees_constants_attributes_and_literals(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "if m == OURS:\n    pass\nx = m in (p.ORACLE, 'a')\ny = 'ours-deadline' != m\n"
        "z = OURS\nw = m == 'b'\n"
    )
    assert name_comparisons(module, literals=True) == [1, 3, 4]
    assert name_comparisons(module, literals=False) == [1, 3]

"""A population sampled per round (`strategies.population`): the draw is seeded by the run's seed and
the round over partition ids, the inner strategy sees only the sampled nodes, and every round's draw is
recorded (population.json → results.json and the summary: a whole sampled fleet run end to end is
tests/test_fleet_run.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from powerctl.errors import PowerctlError
from simulations.fleet import FleetFileError, load_fleet_spec
from strategies.population import (
    POPULATION_FILE,
    Population,
    PopulationError,
    PopulationSampled,
)

FLEET = """\
name: pop
groups:
  - {{device: sim:jetson-nano, power-cap-w: 3.0, count: {a}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: none, count: {b}}}
task: {{model: cnn-tiny, pretrain-samples: 256, target-accuracy: 0.3, batch-sizes: [8, 16]}}
rounds: 2
seeds: {{run: 3, relation: [0]}}
budget: {{samples: 96}}
evaluation: {{every-samples: 32, max-samples: 64}}
scale: {{profiles: predicted, real-share: 0.1}}
population: {population}
methods: [ours, state-of-practice]
"""


def test_the_draw_is_seeded_by_seed_and_round_over_partition_ids() -> None:
    pop = Population(clients_per_round=10, availability=0.6, seed=3)
    boards = range(200)
    one = pop.draw(1, boards, 200)
    assert one == pop.draw(1, reversed(boards), 200)  # the order nodes come in does not matter
    assert one != pop.draw(2, boards, 200) and one != Population(10, 0.6, seed=4).draw(1, boards, 200)
    assert (
        len(one.sampled) == 10
        and set(one.sampled) <= set(one.available)
        and one.sampled == sorted(one.sampled)
    )
    assert 80 < len(one.available) < 160  # about 0.6 of 200
    assert Population(0, 1.0).draw(1, boards, 200).sampled == list(boards)  # all there, all sampled
    assert Population(500, 1.0).draw(1, boards, 200).sampled == list(boards)  # more asked than there are
    rec = one.record()
    assert rec["available"] + len(rec["unavailable"]) == 200 and not set(rec["unavailable"]) & set(
        one.sampled
    )
    assert not Population().active and Population(1).active and Population(0, 0.5).active


class FakeGrid:
    def __init__(self, node_ids: list[int]) -> None:
        self.node_ids = node_ids

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


class Inner:
    """Records the node ids the inner strategy is shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, list[int]]] = []

    def configure_train(self, rnd: int, arrays: Any, config: Any, grid: Any) -> list[int]:
        self.seen.append(("train", rnd, sorted(grid.get_node_ids())))
        return []

    def configure_evaluate(self, rnd: int, arrays: Any, config: Any, grid: Any) -> list[int]:
        self.seen.append(("evaluate", rnd, sorted(grid.get_node_ids())))
        return []

    def aggregate_train(self, rnd: int, replies: Any) -> tuple[None, None]:
        return None, None

    def aggregate_evaluate(self, rnd: int, replies: Any) -> None:
        return None

    def summary(self) -> None:
        return None


def test_the_inner_strategy_sees_only_the_rounds_sampled_nodes_and_each_draw_is_written(
    tmp_path: Path,
) -> None:
    mapping = {1000 + p: p for p in range(50)}  # node id -> partition id, as the simulation registered
    pop = Population(clients_per_round=5, availability=0.8, seed=1)
    inner = Inner()
    strategy = PopulationSampled(inner, pop, path=tmp_path / POPULATION_FILE, partitions=lambda: mapping)
    grid = FakeGrid(list(mapping))
    for rnd in (1, 2):
        strategy.configure_train(rnd, None, None, grid)
        strategy.configure_evaluate(rnd, None, None, grid)
    for rnd in (1, 2):
        expected = [1000 + p for p in pop.draw(rnd, range(50), 50).sampled]
        assert [s for s in inner.seen if s[1] == rnd] == [
            ("train", rnd, expected),
            ("evaluate", rnd, expected),
        ]
    data = json.loads((tmp_path / POPULATION_FILE).read_text())
    assert data["clients_per_round"] == 5 and data["availability"] == 0.8 and data["seed"] == 1
    assert [r["round"] for r in data["rounds"]] == [1, 2]
    assert data["rounds"][0] == pop.draw(1, range(50), 50).record()


def test_nobody_available_sends_nothing_and_no_simulation_is_one_line() -> None:
    inner = Inner()
    nobody = PopulationSampled(inner, Population(5, 0.0), partitions=lambda: {7: 0, 8: 1})
    assert list(nobody.configure_train(1, None, None, FakeGrid([7, 8]))) == [] and inner.seen == []
    deployed = PopulationSampled(inner, Population(5), partitions=dict)
    with pytest.raises(PopulationError) as info:
        deployed.configure_train(1, None, None, FakeGrid([7, 8]))
    assert isinstance(info.value, PowerctlError) and "\n" not in str(info.value)


def test_the_fleet_file_population_section_is_run_settings(tmp_path: Path) -> None:
    fleet = tmp_path / "f.yaml"
    fleet.write_text(FLEET.format(a=3, b=3, population="{clients-per-round: 4, availability: 0.5}"))
    config = load_fleet_spec(fleet).run_config(tmp_path / "r", ["ours"], tmp_path / "p")
    assert config["clients-per-round"] == 4 and config["availability"] == 0.5 and config["seed"] == 3
    for bad, says in (
        ("{availability: 1.5}", "'availability'"),
        ("{clients-per-round: -1}", "'clients-per-round'"),
        ("{per-round: 3}", "per-round"),
    ):
        fleet.write_text(FLEET.format(a=3, b=3, population=bad))
        with pytest.raises(FleetFileError) as info:
            load_fleet_spec(fleet)
        assert says in str(info.value) and "\n" not in str(info.value)


def test_a_groups_own_availability_is_each_of_its_boards_chance(tmp_path: Path) -> None:
    from strategies.population import run_population
    from strategies.settings import read_settings

    fleet = tmp_path / "groups.yaml"
    fleet.write_text(
        "groups:\n"
        "  - {device: sim:jetson-nano, power-cap-w: 3.0, count: 50, availability: 0.0}\n"
        "  - {device: sim:jetson-tx2nx, power-cap-w: none, count: 50}\n"
        "  - {device: sim:jetson-tx2nx, power-cap-w: 3.5, count: 100, availability: 0.5}\n"
    )
    per_board = run_population(read_settings({"fleet": str(fleet)})).per_board  # as the ServerApp reads it
    assert per_board == (0.0,) * 50 + (None,) * 50 + (0.5,) * 100
    pop = Population(clients_per_round=0, availability=1.0, seed=3, per_board=per_board)
    assert pop.active
    draws = [pop.draw(r, range(200), 200) for r in (1, 2, 3)]
    for draw in draws:
        available = set(draw.available)
        assert not available & set(range(50))  # never there
        assert set(range(50, 100)) <= available  # the run's availability, 1.0: always there
        assert 20 < len(available & set(range(100, 200))) < 80  # about half, drawn per round
    assert draws[0].available != draws[1].available  # present in some rounds, not others
    again = Population(clients_per_round=0, availability=1.0, seed=3, per_board=per_board)
    assert again.draw(2, range(200), 200) == draws[1]  # seeded
    assert Population(per_board=(None, None)).active is False  # no group sets one: as before


def test_a_groups_availability_outside_0_1_is_one_line(tmp_path: Path) -> None:
    from strategies.fleet import NodeConfigError
    from strategies.population import run_population
    from strategies.settings import read_settings

    fleet = tmp_path / "bad.yaml"
    fleet.write_text("groups:\n  - {device: sim:jetson-nano, power-cap-w: 3.0, availability: 1.5}\n")
    with pytest.raises(NodeConfigError, match="availability") as caught:
        run_population(read_settings({"fleet": str(fleet)}))
    assert "\n" not in str(caught.value)


TRACE = """\
board,first-round,last-round
0,1,1
0,3,
2,2,3
4,1,
5,9,9
"""


def test_a_trace_gives_each_board_its_rounds_and_sampling_draws_among_them(tmp_path: Path) -> None:
    from strategies.population import read_availability_trace

    (tmp_path / "trace.csv").write_text(TRACE)
    trace = read_availability_trace(tmp_path / "trace.csv")
    pop = Population(clients_per_round=0, seed=3, trace=trace)
    assert pop.active
    available = {r: pop.draw(r, range(6), 6).available for r in (1, 2, 3, 4)}
    # boards 1 and 3 are not in the trace: never there; board 5 only in round 9
    assert available == {1: [0, 4], 2: [2, 4], 3: [0, 2, 4], 4: [0, 4]}
    two = Population(clients_per_round=2, seed=3, trace=trace)
    draws = [two.draw(3, range(6), 6) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0].sampled) == 2 and set(draws[0].sampled) <= {0, 2, 4}
    assert draws[0].record()["unavailable"] == [1, 3, 5]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("board,round\n0,1\n", "line 1"),
        ("board,first-round,last-round\n0,x,\n", "line 2"),
        ("board,first-round,last-round\n0,1,\n-1,1,2\n", "line 3"),
        ("board,first-round,last-round\n0,3,2\n", "not before the first"),
        ("board,first-round,last-round\n0,0,\n", "line 2"),
        ("board,first-round,last-round\n0,1\n", "line 2"),
        ("", "line 1"),
        ("board,first-round,last-round\n0,1,\n1,\x002,\n", "line 3"),
        ('board,first-round,last-round\n0,"1,\n', "not CSV"),
    ],
)
def test_a_bad_trace_is_one_line_naming_the_file_and_the_line(tmp_path: Path, text: str, says: str) -> None:
    from strategies.population import read_availability_trace

    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(PopulationError) as info:
        read_availability_trace(path)
    assert says in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_trace_that_is_not_a_text_file_is_one_line(tmp_path: Path) -> None:
    from strategies.population import read_availability_trace

    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00board")
    for path in (tmp_path / "bin.csv", tmp_path, tmp_path / "missing.csv"):
        with pytest.raises(PopulationError) as info:
            read_availability_trace(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_fleet_files_trace_is_read_from_its_folder_and_reaches_the_serverapp(tmp_path: Path) -> None:
    from strategies.population import run_population
    from strategies.settings import read_settings

    (tmp_path / "trace.csv").write_text(TRACE)
    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        FLEET.format(a=3, b=3, population="{clients-per-round: 2, availability-trace: trace.csv}")
    )
    config = load_fleet_spec(fleet).run_config(tmp_path / "r", ["ours"], tmp_path / "p")
    assert config["availability-trace"] == str(tmp_path / "trace.csv")
    pop = run_population(read_settings(config), ())  # what the ServerApp builds from the run config
    assert pop.trace is not None and pop.draw(2, range(6), 6).available == [2, 4]
    sampled = PopulationSampled(Inner(), pop, path=tmp_path / POPULATION_FILE, partitions=lambda: {9: 0})
    sampled.configure_train(1, None, None, FakeGrid([9]))
    assert json.loads((tmp_path / POPULATION_FILE).read_text())["availability_trace"] == str(
        tmp_path / "trace.csv"
    )


@pytest.mark.parametrize(
    ("population", "groups_availability", "says"),
    [
        ("{availability-trace: trace.csv, availability: 0.5}", "", "keep one"),
        ("{availability-trace: trace.csv}", ", availability: 0.5", "keep one"),
        ("{availability-trace: bad.csv}", "", "line 2"),
        ("{availability-trace: none.csv}", "", "none.csv"),
    ],
)
def test_a_fleet_files_trace_that_cannot_be_used_is_one_line_before_anything_runs(
    tmp_path: Path, population: str, groups_availability: str, says: str
) -> None:
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "bad.csv").write_text("board,first-round,last-round\n1,2,one\n")
    fleet = tmp_path / "f.yaml"
    text = FLEET.format(a=3, b=3, population=population)
    fleet.write_text(text.replace("count: 3}", f"count: 3{groups_availability}}}", 1))
    with pytest.raises(FleetFileError) as info:
        load_fleet_spec(fleet)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_summary_says_the_trace_decided_who_was_there() -> None:
    from simulations.fleet_results import population_lines

    draw = Population(clients_per_round=1, seed=3).draw(1, range(4), 4)
    results = {
        "fleet": {"boards": [{}] * 4},
        "population": {
            "ours": {
                "clients_per_round": 1,
                "availability": 1.0,
                "availability_trace": "/data/trace.csv",
                "seed": 3,
                "rounds": [draw.record()],
            }
        },
    }
    lines = population_lines(results)
    assert "in the rounds the trace /data/trace.csv gives it" in lines[0] and "probability" not in lines[0]


@pytest.mark.parametrize(
    ("population", "trace", "says"),
    [
        ("{availability: 0.0}", None, "no board is available in any of the 2 round(s): availability 0"),
        ("{clients-per-round: 2, availability-trace: t.csv}", "", "has no window in rounds 1-2"),
        ("{availability-trace: t.csv}", "4,3,\n", "has no window in rounds 1-2"),
        ("{availability-trace: t.csv}", "0,1,\n6,1,2\n9,2,\n", "names board(s) 6, 9 the fleet does not have"),
    ],
)
def test_a_population_under_which_no_board_can_train_is_one_line_before_ray_starts(
    tmp_path: Path, population: str, trace: str | None, says: str
) -> None:
    """Issue 36, class 5: refused by the fleet file's reader (and `make run`'s, tests/test_preflight.py),
    not found out after Ray and pre-training as a run in which every client 'failed'."""
    from simulations.__main__ import main as simulations_main

    if trace is not None:
        (tmp_path / "t.csv").write_text("board,first-round,last-round\n" + trace)
    fleet = tmp_path / "f.yaml"
    fleet.write_text(FLEET.format(a=3, b=3, population=population))
    with pytest.raises(FleetFileError) as info:
        load_fleet_spec(fleet)
    assert says in str(info.value) and "\n" not in str(info.value)
    assert simulations_main(["run", str(fleet), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_population_that_trains_in_some_round_passes_whatever_its_chance() -> None:
    from strategies.population import check_population

    rare = Population(availability=0.02, seed=1)
    check_population(rare, 200, 2)  # seeded draws: some board is there in round 1 or 2
    with pytest.raises(PopulationError, match="no board is available in any of the 1 round"):
        check_population(Population(availability=0.0), 10_000, 1)
    check_population(Population(availability=0.0), 0, 3)  # no boards known (a deployment): not checked


def test_the_power_aware_fedavg_is_composed_around_the_sampled_fedavg() -> None:
    """Issue 39: the population's sampling wraps the FedAvg when the strategy is made (`inner=`), not by
    replacing the wrapper's strategy afterwards."""
    from strategies.fedavg import FedAvgInOrder, PowerAwareFedAvg
    from tests.fl_helpers import instructions

    pop = Population(clients_per_round=2, availability=1.0, seed=0)
    made = PowerAwareFedAvg(
        instructions=instructions(), fraction_train=0.5, inner=lambda s: PopulationSampled(s, pop)
    )
    assert isinstance(made.strategy, PopulationSampled) and made.strategy.population is pop
    assert isinstance(made.strategy.strategy, FedAvgInOrder) and made.strategy.strategy.fraction_train == 0.5
    assert isinstance(PowerAwareFedAvg(instructions=instructions()).strategy, FedAvgInOrder)

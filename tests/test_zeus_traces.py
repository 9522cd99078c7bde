"""bench/zeus_traces.py on small hand-made trace files (the real ones: docs/results/zeus_traces.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import zeus_traces

TRAIN_HEAD = "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
POWER_HEAD = "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n"


def _train(path: Path, rows: dict[tuple[str, int], list[float]], easy: float = 1.0) -> Path:
    """rows: (dataset, b) → epochs per run at target 0.8; every run also reaches 0.5 in `easy` epochs,
    and no run reaches 0.9 (nan)."""
    lines = [TRAIN_HEAD]
    for (ds, b), epochs in rows.items():
        for run, e in enumerate(epochs, start=1):
            lines += [
                f"{ds},bert,{b},adamw,1e-5,{run},{t},{v}\n"
                for t, v in (("0.5", easy), ("0.8", e), ("0.9", "nan"))
            ]
    path.write_text("".join(lines))
    return path


def _power(path: Path, table: dict[tuple[str, int, int], tuple[float, float]]) -> Path:
    lines = [POWER_HEAD] + [f"{ds},bert,{b},adamw,{pl},{t},{w}\n" for (ds, b, pl), (t, w) in table.items()]
    path.write_text("".join(lines))
    return path


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    # squad: b=8 needs 2 epochs, b=16 needs 3 (runs 1-2 are the held-out proxy, 3-5 the truth);
    # sentiment140 (its proxy) says b=8 needs 4 and b=16 needs 4
    train = _train(tmp_path / "train.csv", {
        ("squad", 8): [2, 2, 2, 2, 2], ("squad", 16): [3, 3, 3, 3, 3],
        ("sentiment140", 8): [4, 4, 4, 4], ("sentiment140", 16): [4, 4, 4, 4],
    })  # fmt: skip
    # an epoch: b=8 10 s at 100 W, 8 s at 200 W; b=16 6 s at 100 W, 5 s at 200 W (average 90 / 180 W)
    power = _power(tmp_path / "summary_power_gpu1.csv", {
        ("squad", 8, 100): (10.0, 90.0), ("squad", 8, 200): (8.0, 180.0),
        ("squad", 16, 100): (6.0, 90.0), ("squad", 16, 200): (5.0, 180.0),
        ("sentiment140", 8, 100): (10.0, 90.0), ("sentiment140", 16, 100): (6.0, 90.0),
    })  # fmt: skip
    return train, power


def test_cells_worked_by_hand(traces: tuple[Path, Path]) -> None:
    train, power = traces
    cells, _notes = zeus_traces.run(train, [power], proxy_seeds=2, caps=(150.0, None))
    squad = {
        (c["proxy"].split(" (")[0], c["cap_w"], c["objective"]): c
        for c in cells
        if c["workload"] == "squad/bert"
    }
    # held-out seeds agree with the truth: time 2·10 = 20 s (b=8) vs 3·6 = 18 s (b=16) under 150 W → b=16
    held = squad[("held-out seeds", 150.0, "time")]
    assert (held["ours_batch_size"], held["ours_power_limit_w"], held["fastest_batch_size"]) == (
        16,
        100.0,
        16,
    )
    assert held["ours"] == pytest.approx(18.0) and held["ours_over_fastest"] == pytest.approx(1.0)
    # no cap: b=8 at 200 W = 16 s, b=16 at 200 W = 15 s → b=16 @ 200 W
    assert squad[("held-out seeds", None, "time")]["ours_power_limit_w"] == 200.0
    # sentiment140 says both need 4 epochs: per sample b=16 is faster either way → the same choice here
    other = squad[("sentiment140", None, "time")]
    assert other["ours_batch_size"] == 16 and other["sop_over_ours"] == pytest.approx(1.0)
    # energy: b=16 at 100 W: 3·6·90 = 1620 J < at 200 W: 3·5·180 = 2700 J
    energy = squad[("held-out seeds", None, "energy")]
    assert (energy["ours_batch_size"], energy["ours_power_limit_w"], energy["ours"]) == (16, 100.0, 1620.0)
    # the target rule: 0.8 (the most epochs every run reaches), not 0.5, never 0.9 (nan)
    assert held["proxy"] == "held-out seeds (target 0.8)"
    # sentiment140 has 4 runs per batch size: 2 held out, 2 truth; its power table lacks 200 W points
    assert any(c["workload"] == "sentiment140/bert" for c in cells)
    for c in cells:
        assert {"gpu", "workload", "cap_w", "objective", "ours_batch_size", "fastest_batch_size",
                "ours_over_fastest", "sop_over_ours"} <= set(c)  # fmt: skip
        assert c["gpu"] == "gpu1"


def test_a_proxy_that_misleads_is_measured_as_slower(tmp_path: Path) -> None:
    # the truth: b=16 needs 6 epochs (36 s), b=8 2 (20 s); the held-out seeds say b=16 needs 1
    train = _train(tmp_path / "t.csv", {("squad", 8): [2, 2, 2, 2, 2], ("squad", 16): [1, 1, 6, 6, 6]})
    power = _power(
        tmp_path / "summary_power_x.csv", {("squad", 8, 100): (10.0, 90.0), ("squad", 16, 100): (6.0, 90.0)}
    )
    cells, _ = zeus_traces.run(train, [power], proxy_seeds=2, caps=(None,))
    time_cell = next(c for c in cells if c["objective"] == "time")
    assert (time_cell["ours_batch_size"], time_cell["fastest_batch_size"]) == (16, 8)
    assert time_cell["ours_over_fastest"] == pytest.approx(36 / 20)
    assert time_cell["ci95"] == pytest.approx([1.8, 1.8]) and not time_cell["indistinguishable"]


def test_main_writes_json_and_bad_files_are_one_line(
    traces: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, power = traces
    out = tmp_path / "cells.json"
    assert zeus_traces.main(["--train", str(train), "--power", str(power), "--json", str(out)]) == 0
    assert len(json.loads(out.read_text())) > 0 and "ours/fastest" in capsys.readouterr().out
    # several power files: listed after one --power or with --power repeated, the same cells
    a40 = tmp_path / "summary_power_a40.csv"
    a40.write_text(power.read_text())
    listed, repeated = tmp_path / "listed.json", tmp_path / "repeated.json"
    assert (
        zeus_traces.main(["--train", str(train), "--power", str(power), str(a40), "--json", str(listed)]) == 0
    )
    assert (
        zeus_traces.main(
            ["--train", str(train), "--power", str(power), "--power", str(a40), "--json", str(repeated)]
        )
        == 0
    )
    cells = json.loads(listed.read_text())
    assert cells == json.loads(repeated.read_text())
    assert {c["gpu"] for c in cells} == {"gpu1", "a40"}
    capsys.readouterr()
    bad = tmp_path / "bad.csv"
    bad.write_text("dataset,network\nsquad,bert\n")
    assert zeus_traces.main(["--train", str(bad), "--power", str(power)]) == 1
    err = capsys.readouterr().err
    assert "missing column(s)" in err and err.count("\n") == 1
    _power(bad, {("squad", 8, 100): (10.0, 90.0)})
    bad.write_text(bad.read_text().replace("10.0", "ten"))
    assert zeus_traces.main(["--train", str(train), "--power", str(bad)]) == 1
    assert "'ten' is not a number" in capsys.readouterr().err


def test_a_pair_whose_average_power_is_above_its_limit_is_over_a_cap_at_that_limit(tmp_path: Path) -> None:
    """Zeus's traces hold rows whose measured average power is above the limit they were run at (the
    GPU did not hold it): such a pair's peak is at least that average, so a cap at its limit excludes it,
    and the cells name it by its limit."""
    train = _train(tmp_path / "t.csv", {("squad", 8): [2, 2, 2, 2, 2], ("squad", 16): [3, 3, 3, 3, 3]})
    # b=16 at 150 W is the fastest (3·5 = 15 s against b=8's 2·9.5 = 19 s), but it averaged 151 W
    power = _power(tmp_path / "summary_power_x.csv", {
        ("squad", 8, 150): (9.5, 140.0), ("squad", 16, 150): (5.0, 151.0), ("squad", 16, 100): (6.0, 99.0),
    })  # fmt: skip
    cells, _ = zeus_traces.run(train, [power], proxy_seeds=2, caps=(150.0, None))
    capped = next(c for c in cells if c["objective"] == "time" and c["cap_w"] == 150.0)
    free = next(c for c in cells if c["objective"] == "time" and c["cap_w"] is None)
    assert (capped["ours_batch_size"], capped["ours_power_limit_w"]) == (16, 100.0)  # 3·6 = 18 s < 19 s
    assert (free["ours_batch_size"], free["ours_power_limit_w"]) == (16, 150.0)
    assert capped["sop_power_limit_w"] == 100.0  # the largest batch size at the highest limit it held

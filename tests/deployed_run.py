"""What the deployed-run tests share: the task a deployment runs (cnn-tiny on small budgets, its weights
and relation vector from the test run's seeded cache) and the checks of its output and results.

`deploy/loopback.sh`'s test (tests/test_loopback_script.py) checks a whole round of two boards with
these; the restart test (tests/test_restarts.py) runs the same task through SuperLink restarts, a
SuperNode lost mid-round and an unregistered node refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from fl_server.results import CLIENT_COLUMNS, RESULTS_SCHEMA

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EMPTY_LOG_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR)\s*:\s*")


def run_config_for(results_dir: Path) -> str:
    """cnn-tiny, one relation seed, one round, on small budgets: about a minute deployed."""
    return " ".join(
        [
            "model='cnn-tiny'",
            "relation-seeds='0'",
            "num-server-rounds=1",
            f"results-dir='{results_dir}'",
            "min-nodes=2",  # both SuperNodes in the round, whichever connects first
            "pretrain-samples=256",
            "relation-max-samples=3000",
            "batch-sizes='8,32'",
            "target-accuracy=0.5",
            "budget-samples=512",
            "eval-every-samples=64",
            "eval-max-samples=200",
            "profile-samples=1000",
            "profile-steps=1",
            "profile-warmup=0",
            "round-timeout=180.0",
        ]
    )


def content_lines(output: str) -> list[str]:
    """The output's lines without colour codes, blank lines, or Flower log records with no message.

    Flower 1.41 streams one empty ``INFO :`` record after the ServerApp returns, so the app's own
    last line is the last line with content, not the stream's last line.
    """
    lines = (_ANSI.sub("", line).rstrip() for line in output.splitlines())
    return [line for line in lines if line.strip() and not _EMPTY_LOG_RECORD.fullmatch(line.strip())]


def seeded_task(seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """$POWERFED_CACHE (which a Deployment passes on to its processes) holds the run's weights and
    relation vector, built once per test run by the server's own code."""
    task = " ".join(p for p in run_config_for(Path("unused")).split() if not p.startswith("results-dir="))
    monkeypatch.setenv("POWERFED_CACHE", str(seeded_cache(task)))


def check_table(output: str, nodes: dict[str, tuple[str, float]], context: str) -> list[str]:
    """One round's client table with a row per node (by the name in its first column: its device and
    cap); the output's content lines."""
    lines = content_lines(output)
    header = [i for i, line in enumerate(lines) if line.split()[:3] == ["node", "device", "cap"]]
    assert len(header) == 1, f"expected one per-client table (one round){context}"
    rows = lines[header[0] + 2 : header[0] + 2 + len(nodes)]
    for name, (device, cap) in nodes.items():
        row = next((r for r in rows if r.startswith(f"{name} ")), None)
        assert row is not None, f"no table row for {name}{context}"
        assert row.split()[1:3] == [device, f"{cap:.2f}"], f"row {row!r}{context}"
    return lines


def check_results(
    path: Path,
    context: str,
    nodes: dict[str, tuple[str, float]],
    failed: tuple[tuple[str, str], ...] = (),
) -> dict:
    """One round in which `nodes` (device and cap, by name) reported in full, under their caps, and
    `failed` (node key, kind) failed; the global weights written beside."""
    results = json.loads(path.read_text(encoding="utf-8"))
    assert results["schema"] == RESULTS_SCHEMA
    assert [r["round"] for r in results["rounds"]] == [1], results["rounds"]
    rnd = results["rounds"][0]
    assert [(f["node_key"], f["kind"]) for f in rnd["failed"]] == list(failed), f"{rnd['failed']}{context}"
    assert len(rnd["summary"]["failed"]) == len(failed), f"{rnd['summary']}{context}"
    clients = rnd["clients"]
    assert len(clients) == len(nodes), f"{clients}{context}"
    for c in clients:
        missing = [k for k in CLIENT_COLUMNS[:11] if k not in c]  # those every report has
        assert not missing, f"client report lacks {missing}: {c}"
    got = sorted((c["device"], c["power_cap_w"]) for c in clients)
    assert got == sorted(nodes.values()), got
    for c in clients:
        assert c["peak_power_w"] is not None and c["peak_power_w"] <= c["power_cap_w"], c
        assert c["batch_size"] in (8, 32) and c["frequency_hz"] > 0 and c["samples"] > 0, c
        assert c["device_s"] > 0 and c["energy_j"] > 0 and 0.0 <= c["accuracy"] <= 1.0, c
        # a deployed SuperNode starts a flwr-clientapp per message: its start-up is measured and reported
        assert c["startup_s"] is not None and 0.0 < c["startup_s"] < 600.0, c
    assert rnd["summary"]["over_cap"] == [], rnd["summary"]
    assert rnd["evaluation"]["clients"] and (path.parent / "global.safetensors").is_file()
    return results

"""Resuming a run: a restarted ServerApp with the same fingerprint continues after the last round both
`results.json` and the saved global model agree on; anything else is renamed aside once the new run has a
result of its own (`move_aside`), never mixed in."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fl_server.results import RESULTS_SCHEMA
from powerctl.cli.util import say
from powerctl.errors import FileFormatError
from powerctl.files.jsonfile import read_json
from powerfed.training.errors import DataError
from strategies.settings import SETTINGS

GLOBAL_FILE = "global.safetensors"
RESULTS_FILE = "results.json"
# keys that do not change what a round computes: a resumed run may extend its rounds or wait longer
NOT_IN_FINGERPRINT = frozenset(key for key, s in SETTINGS.items() if not s.fingerprint)


def run_fingerprint(run_config: dict[str, Any], weights_digest: str, relation: dict[str, Any]) -> str:
    """What identifies a run: its run config (less NOT_IN_FINGERPRINT), starting weights, relation."""
    config = {k: v for k, v in run_config.items() if k not in NOT_IN_FINGERPRINT}
    blob = json.dumps({"config": config, "weights": weights_digest, "relation": relation}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class ResumePoint:
    """The rounds already done (their records) and the global model after the last of them."""

    last_round: int
    rounds: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    state: dict[str, torch.Tensor]


class NotResumable(Exception):
    """Why a results folder cannot be continued (one line)."""


def read_point(out: Path, fingerprint: str) -> ResumePoint | None:
    """The point to continue from, None when the folder holds no completed round, or NotResumable."""
    from fl_server.weights import load_weights

    results, model = out / RESULTS_FILE, out / GLOBAL_FILE
    try:
        data = read_json(results, RESULTS_SCHEMA)
    except FileFormatError as exc:
        raise NotResumable(str(exc)) from None
    if data.get("run", {}).get("fingerprint") != fingerprint:
        raise NotResumable(f"{results} is of another run (its run config, weights or relation vector differ)")
    rounds = data.get("rounds")
    if not isinstance(rounds, list) or not all(isinstance(r, dict) and "round" in r for r in rounds):
        raise NotResumable(f"{results}: 'rounds' is not a list of round records")
    if not model.exists():
        if rounds:
            raise NotResumable(f"{model} is missing: the model after round {rounds[-1]['round']} is lost")
        return None
    try:
        state, meta = load_weights(model)
    except DataError as exc:
        raise NotResumable(str(exc)) from None
    if meta.extra.get("fingerprint") != fingerprint or not meta.extra.get("round", "").isdigit():
        raise NotResumable(f"{model} is not the global model of this run")
    last = int(meta.extra["round"])
    done = [r for r in rounds if isinstance(r["round"], int) and r["round"] <= last]
    if [r["round"] for r in done] != list(range(1, last + 1)):
        raise NotResumable(f"{results} lacks records of rounds 1 to {last}, which {model} has completed")
    nodes = data["nodes"] if isinstance(data.get("nodes"), list) else []
    return ResumePoint(last, done, nodes, state)


def move_aside(out: Path) -> Path:
    """Rename an earlier run's results.json and global.safetensors in `out` to `previous-STAMP-*`, never
    over an earlier set-aside of the same second; returns where the results file went."""
    names, base = (RESULTS_FILE, GLOBAL_FILE), time.strftime("%Y%m%dT%H%M%S")
    stamps = (f"{base}.{n}" if n else base for n in itertools.count())
    stamp = next(t for t in stamps if not any((out / f"previous-{t}-{x}").exists() for x in names))
    for name in names:
        if (out / name).exists():
            (out / name).replace(out / f"previous-{stamp}-{name}")
    return out / f"previous-{stamp}-{RESULTS_FILE}"


def resume_point(out: Path, fingerprint: str, resume: bool, rounds: int) -> tuple[ResumePoint | None, bool]:
    """Where a run of `rounds` rounds continues from (None: round 1), and whether `out` holds earlier files
    it does not continue (`move_aside` once this run has a result of its own, never mixed in)."""
    if not (out / RESULTS_FILE).exists() and not (out / GLOBAL_FILE).exists():
        return None, False
    point, reason = None, ""
    if not resume:
        reason = f"resume = false: the earlier results in {out} are not continued"
    else:
        try:
            point = read_point(out, fingerprint)
        except NotResumable as exc:
            reason = f"resume: {exc}"
    if point is not None and point.last_round >= rounds:
        # a finished run is not resumed: the same command again is a new run (a seeded one repeats)
        point, reason = None, f"resume: an earlier run with these settings is complete in {out}"
    if reason:
        say(f"{reason}; starting from round 1 (moved aside when a client of this run first reports)")
    elif point is not None:
        say(f"resume: rounds 1-{point.last_round} of this run are complete in {out}")
    return point, bool(reason)

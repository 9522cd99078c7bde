"""`results.json` (`fl_server.results/2`), rewritten atomically after every round, and the printed tables."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError, FileFormatError
from powerctl.files.jsonfile import read_json, write_json
from powerctl.files.outputs import OutputPathError, writable_file
from powerctl.profiling.budget import over_budget
from strategies.rounds import NodeInfo, RoundRecord

RESULTS_SCHEMA = "fl_server.results/2"
CLIENT_COLUMNS = tuple(
    """device power_cap_w batch_size frequency_hz device_s energy_j peak_power_w samples accuracy
    reached_target profiling_s board node_key predicted_s profiled_peak_power_w profile_cached
    profile_points lr stop_reason steps train_examples wall_s startup_s method stand_in
    resumed_at_samples deadline_s meets_deadline_predicted oracle_samples_to_target
    oracle_search_device_s oracle_stopped_at_samples step_downs cap_source cap_events final_pair
    paused_s over_cap_s pinned restored profiling_choice profiling_predicted_from
    predicted_training_s profiling_budget_s profiling_costs_predicted partition_id""".split()  # noqa: SIM905
)
"""The order of a client's columns in the file (docs/reference/files.md); any other column after them."""


def ordered(client: dict[str, Any]) -> dict[str, Any]:
    """A client's columns in the file's order (`CLIENT_COLUMNS`)."""
    return {**{k: client[k] for k in CLIENT_COLUMNS if k in client}, **client}


class ResultsWriter:
    """Holds the run's record and rewrites `path` whole (temp file + rename) on every update."""

    def __init__(
        self,
        path: Path,
        run: dict[str, Any],
        rounds: list[dict[str, Any]] | None = None,
        nodes: list[dict[str, Any]] | None = None,
        *,
        held: bool = False,
    ) -> None:
        """A new file, or (a resumed run) one that starts with the `rounds` and `nodes` done before.
        `held`: write nothing until `release()` (an earlier run's file stays until this run has a result)."""
        writable_file(path, "results file")  # a device, a FIFO, a folder: refused now, not after round 1
        self.path = path
        self.data: dict[str, Any] = {
            "schema": RESULTS_SCHEMA,
            "run": run,
            "nodes": list(nodes or []),
            "rounds": list(rounds or []),
        }
        self.held = held
        if not held:
            write_json(self.path, self.data)

    def release(self) -> None:
        """Start writing: the record so far now, every update from now on."""
        self.held = False
        write_json(self.path, self.data)

    def record_round(self, record: RoundRecord, nodes: list[NodeInfo]) -> None:
        """Add (or replace) `record`, and the nodes by key (one known only before a resume stays)."""
        by_key = {n["key"]: n for n in self.data["nodes"] if isinstance(n, dict) and "key" in n}
        by_key.update({n.key: asdict(n) for n in nodes})
        self.data["nodes"] = [by_key[k] for k in sorted(by_key)]
        rounds = [r for r in self.data["rounds"] if r["round"] != record.round]
        done = record.to_dict()
        rounds.append({**done, "clients": [ordered(c) for c in done["clients"]]})
        self.data["rounds"] = sorted(rounds, key=lambda r: r["round"])
        if not self.held:
            write_json(self.path, self.data)


def cell(v: float | None, fmt: str = ".1f", unit: str = "") -> str:
    """A table cell: the number in `fmt` and its unit, "-" for none."""
    return "-" if v is None else format(v, fmt) + unit


# how a client profiled (`profiling_choice`), as the round table shows it
PROFILING_WAYS = {"efficient": "eff", "grid": "grid", "fitted": "fit", "predicted": "pred", "model": "model"}


def profiled_as(client: dict[str, Any]) -> str:
    """ "cached", or the way the client profiled this round."""
    if client.get("profile_cached"):
        return "cached"
    way = client.get("profiling_choice") or ""
    return PROFILING_WAYS.get(way, way or "-")


def _mhz(client: dict[str, Any]) -> str:
    """The client's frequency in MHz, or "not pinned" (it ran at the clock in force)."""
    return f"{client['frequency_hz'] / 1e6:.1f}" if client.get("pinned", True) else "not pinned"


def client_table(record: RoundRecord) -> str:
    """One row per client: device, cap, b, MHz, how it profiled at what cost against its budget, device
    s, energy J, peak W, accuracy, at target; `start s` (process start to first step) where measured."""
    startup = any(c.get("startup_s") is not None for c in record.clients)

    def start_s(c: dict[str, Any] | None) -> str:
        if not startup:
            return ""
        return f" {'start s':>7}" if c is None else f" {cell(c.get('startup_s'), '7.1f'):>7}"

    head = (
        f"{'node':<13} {'device':<18} {'cap W':>6} {'b':>4} {'MHz':>7} {'profiled':>8} {'prof s':>7} "
        f"{'budget s':>8} {'device s':>9}{start_s(None)} {'energy J':>9} {'peak W':>7} {'acc':>6} "
        f"{'target':>6}"
    )
    lines = [head, "-" * len(head)]
    for c in record.clients:
        lines.append(
            f"{c['node_key']:<13.13} {c['device']:<18.18} {cell(c['power_cap_w'], '6.2f'):>6} "
            f"{c['batch_size']:>4} {_mhz(c):>7} {profiled_as(c):>8} "
            f"{c['profiling_s']:>7.1f} {cell(c.get('profiling_budget_s'), '8.1f'):>8} "
            f"{c['device_s']:>9.1f}{start_s(c)} {cell(c['energy_j'], '9.0f'):>9} "
            f"{cell(c['peak_power_w'], '7.2f'):>7} "
            f"{c['accuracy']:>6.3f} {'yes' if c['reached_target'] else 'no':>6}"
        )
    lines += [f"{f.node_key:<13.13} {f.device:<18.18} FAILED ({f.kind}): {f.reason}" for f in record.failed]
    lines += [f"{c['node_key']}: {c['restored']}" for c in record.clients if c.get("restored")]
    if any(c.get("profiling_budget_s") is not None for c in record.clients):
        lines.append(
            "profiled: eff/grid/fit = that order measured, pred = the predicted profile's choice "
            "confirmed by the training's first steps; budget s = profiling-budget × the training "
            "predicted before profiling"
        )
    return "\n".join(lines)


def profiling_share(clients: list[dict[str, Any]], tuned: str = "device_s") -> float | None:
    """Profiling over fine-tuning device seconds (`tuned`), summed over `clients` (None: none trained)."""
    training = sum(c[tuned] for c in clients)
    return sum(c["profiling_s"] for c in clients) / training if training > 0 else None


def summary_lines(record: RoundRecord) -> str:
    s = record.summary
    parts = [
        f"round {record.round}: makespan {s['makespan_s']:.1f} device s (slowest: {s['slowest']}, "
        f"profiling included)",
        f"profiling {s['profiling_s']:.1f} device s"
        + ("" if (share := profiling_share(record.clients)) is None else f" ({share:.1%} of fine-tuning)"),
        f"total energy {s['total_energy_j']:.0f} J"
        + ("" if s["energy_complete"] else " (some clients lack a sensor)"),
        f"at target {s['share_at_target']:.0%} of {s['sampled']}",
        f"over cap: {', '.join(o['node'] for o in s['over_cap']) or 'none'}",
        f"failed: {len(s['failed'])}",
    ]
    if restored := [c["node_key"] for c in record.clients if c.get("restored")]:
        parts.append(f"boards found left pinned and restored: {', '.join(restored)}")
    if s.get("unreported"):
        parts.append(f"aggregated without a report: {', '.join(s['unreported'])}")
    if s.get("stand_ins"):
        parts.append(f"stand-ins (not trained): {s['stand_ins']}")
    if not s["reported"]:
        parts.append("no client reported: the global model stays as it was")
    return "; ".join(parts)


def over_budget_lines(record: RoundRecord, most: int = 3) -> list[str]:
    """Why each budgeted client's profiling overran its budget (a large round: the first `most`, a count)."""
    over = [
        f"{c['node_key']}: {why}"
        for c in record.clients
        if (budget := c.get("profiling_budget_s")) is not None
        and (costs := c.get("profiling_costs_predicted")) is not None
        and (
            why := over_budget(
                c["profiling_choice"], costs, budget, c["profiling_s"], c.get("predicted_training_s") or 0.0
            )
        )
    ]
    if len(over) > most:
        over = [*over[:most], f"profiling over its budget on {len(over)} of {len(record.clients)} clients"]
    return over


def evaluation_line(record: RoundRecord) -> str:
    ev = record.evaluation or {}
    if ev.get("accuracy") is None:
        return f"round {record.round} evaluation: no results"
    return (
        f"round {record.round} evaluation on the clients' test splits: accuracy {ev['accuracy']:.3f}, "
        f"loss {ev['loss']:.3f} ({len(ev['clients'])} clients, {len(ev['failed'])} failed)"
    )


def save_results(strategy: Any, path: Path | str, run: dict[str, Any] | None = None) -> Path:
    """Write a `PowerAware` strategy's rounds and nodes to `path` as `results.json`, after
    `strategy.start(...)` in a user's own ServerApp. `run` describes the run (default: the plan sent and
    its relation vector). A file at `path` that is not a results file is never replaced."""
    if not isinstance(getattr(strategy, "rounds", None), dict) or not hasattr(strategy, "instructions"):
        raise ArgumentError(
            f"save_results: 'strategy' must be the PowerAware strategy that ran (its rounds are what is "
            f"saved), got {type(strategy).__name__}"
        )
    target = writable_file(path, "save_results path")
    if target.exists():
        try:
            read_json(target, RESULTS_SCHEMA)
        except FileFormatError as exc:
            raise OutputPathError(
                f"save_results: {path} is not a results file and is never replaced ({exc}); give another path"
            ) from None
    plan = strategy.instructions
    default = {"instructions": dict(plan.to_config()), "relation": plan.relation_vector.to_dict()}
    writer = ResultsWriter(Path(path), dict(run or default), held=True)
    for server_round in sorted(strategy.rounds):
        writer.record_round(strategy.rounds[server_round], list(strategy.nodes.values()))
    writer.release()
    return writer.path

"""The fleet's `results.json` (`simulations.fleet/2`) and its summary table: a record per client, round and
method, and per method the fleet's time to target, makespans, energy, failures and ratios to the state of
practice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fl_server.results import cell, profiled_as, profiling_share
from powerctl.procs import alive
from powerctl.selection.methods import run_method_named
from simulations.fleet import FleetSpec
from strategies.population import POPULATION_FILE

FLEET_SCHEMA = "simulations.fleet/2"


def _method_file(flwr_out: Path, method: str, methods: list[str]) -> Path:
    return flwr_out / "results.json" if len(methods) == 1 else flwr_out / method / "results.json"


def missing_methods(flwr_out: Path, methods: list[str]) -> list[str]:
    """The methods whose results file the ServerApp did not write (a run that ended early)."""
    return [m for m in methods if not _method_file(flwr_out, m, methods).is_file()]


def fleet_block(spec: FleetSpec) -> dict[str, Any]:
    """`results.json`'s block on the fleet itself."""
    return {
        "file": str(spec.path),
        "name": spec.name,
        "boards": [
            {"partition_id": i, "device": b.device, "power_cap_w": b.power_cap_w, "cap": b.cap_label()}
            for i, b in enumerate(spec.boards)
        ],
        "target_accuracy": spec.settings.target_accuracy,
        "model": spec.settings.model,
        "rounds": spec.settings.num_server_rounds,
        "scale_mode": spec.scale_mode,
        "profile_source": spec.settings.profile_source,
        "real_share": spec.settings.real_share,
        "notes": list(spec.notes),
    }


def records_of(spec: FleetSpec, method: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat record per client per round, with the fleet file's group and cap schedule."""
    out = []
    for rnd in data["rounds"]:
        for c in rnd["clients"]:
            pid = c.get("partition_id")
            entry = spec.boards[pid % len(spec.boards)] if isinstance(pid, int) else None
            schedule = entry.power_cap_schedule if entry else None
            events = c.get("cap_events") or []
            out.append(
                {
                    **c,
                    "method": method,  # the run's method (ours-deadline: the client's is ours)
                    "round": rnd["round"],
                    "group": entry.group if entry else None,
                    "power_cap_schedule": [list(s) for s in schedule] if schedule else None,
                    "cap_source": entry.cap_label() if entry else None,
                    "switches": sum(e["kind"] == "switch" for e in events),
                    "pauses": sum(e["kind"] == "pause" for e in events),
                }
            )
    return out


def method_summary(
    method: str, data: dict[str, Any], target: float, boards: int, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Time to target, makespans, energy, clients at target, cap violations and failures of one method."""
    makespans, accuracies = [], []
    reached_round = time_to_target = train_to_target = None
    training = 0.0
    through_target: list[dict[str, Any]] = []  # client reports through the round that reached it
    for rnd in data["rounds"]:
        if reached_round is None:
            through_target += rnd["clients"]
        makespans.append(rnd["summary"]["makespan_s"])
        training += max((c["device_s"] for c in rnd["clients"]), default=0.0)
        acc = (rnd.get("evaluation") or {}).get("accuracy")
        accuracies.append(acc)
        if reached_round is None and acc is not None and acc >= target:
            reached_round, time_to_target, train_to_target = rnd["round"], sum(makespans), training
    last = data["rounds"][-1] if data["rounds"] else {"clients": []}
    return {
        "method": method,
        "rounds": len(data["rounds"]),
        "time_to_target_s": time_to_target,
        "training_to_target_s": train_to_target,
        "profiling_s": sum(c["profiling_s"] for c in through_target),
        "profiling_share": profiling_share(through_target),
        "reached_round": reached_round,
        "total_makespan_s": sum(makespans),
        "makespans_s": makespans,
        "energy_j": sum((rnd["summary"]["total_energy_j"] for rnd in data["rounds"]), 0.0),
        "clients_at_target": sum(bool(c["reached_target"]) for c in last["clients"]),
        "clients": boards,
        "over_cap": sum(len(rnd["summary"]["over_cap"]) for rnd in data["rounds"]),
        "over_cap_profiled": sum(
            r["power_cap_w"] is not None and (r.get("profiled_peak_power_w") or 0) > r["power_cap_w"]
            for r in records
        ),
        "failed": sum(len(rnd["failed"]) for rnd in data["rounds"]),
        "deadlines_s": [rnd["summary"].get("deadline_s") for rnd in data["rounds"]],
        "switches": sum(r.get("switches", 0) for r in records),
        "pauses": sum(r.get("pauses", 0) for r in records),
        "paused_s": sum(r.get("paused_s") or 0.0 for r in records),
        "accuracy": accuracies,
        "stand_ins": sum(bool(r.get("stand_in")) for r in records),
    }


def reference_method(methods: list[str]) -> str | None:
    """The state of practice among `methods` (None: not run, so no ratios)."""
    return next((m for m in methods if run_method_named(m).method.reference), None)


def ratio(reference: float | None, value: float | None, *, speedup: bool) -> float | None:
    """A method's ratio to the state of practice: speed-up reference / value, else value / reference;
    None unless both are > 0."""
    if not reference or not value or reference <= 0 or value <= 0:
        return None
    return reference / value if speedup else value / reference


def build_results(spec: FleetSpec, flwr_out: Path, methods: list[str], *, wall_s: float) -> dict[str, Any]:
    """Merge the ServerApp's per-method files into the fleet's results."""
    records: list[dict[str, Any]] = []
    summaries, evaluations, failures, run = [], {}, [], {}
    population: dict[str, Any] = {}
    for method in methods:
        path = _method_file(flwr_out, method, methods)
        data = json.loads(path.read_text(encoding="utf-8"))
        draws = path.parent / POPULATION_FILE
        if draws.is_file():  # a population sampled per round (strategies.population)
            population[method] = json.loads(draws.read_text(encoding="utf-8"))
        run = data["run"]
        mine = records_of(spec, method, data)
        records += mine
        # clients: the boards of the last round (a sampled population: those sampled, not the whole fleet)
        drawn = population.get(method)
        clients = len(drawn["rounds"][-1]["sampled"]) if drawn else len(spec.boards)
        summaries.append(method_summary(method, data, spec.settings.target_accuracy, clients, mine))
        evaluations[method] = [
            {"round": r["round"], **{k: v for k, v in (r.get("evaluation") or {}).items() if k != "clients"}}
            for r in data["rounds"]
        ]
        failures += [
            {"method": method, "round": r["round"], **f} for r in data["rounds"] for f in r["failed"]
        ]
    sop = next((s for s in summaries if s["method"] == reference_method(methods)), {})
    for s in summaries:  # speed-up: SoP's time to target / the method's; energy: the method's / SoP's
        s["speedup_vs_sop"] = ratio(sop.get("time_to_target_s"), s["time_to_target_s"], speedup=True)
        s["energy_vs_sop"] = ratio(sop.get("energy_j"), s["energy_j"], speedup=False)
    return {
        "schema": FLEET_SCHEMA,
        "fleet": fleet_block(spec),
        "run": {"relation": run.get("relation"), "weights": run.get("weights"), "config": run.get("config")},
        "methods": methods,
        "definitions": {
            "time_to_target_s": "summed round makespans (the slowest client's device seconds, profiling "
            "included) through the first round after which the global model's accuracy on the clients' "
            "test splits reaches the target; null: not reached in the rounds run",
            "state-of-practice": "state-of-practice = the largest batch size that fits in memory at the "
            "board's fixed frequency for the cap: the highest at which every model of the paper's set "
            "(ResNet18, MobileNetV2, the character transformer) at every batch size 4-128 stays under it "
            "(powerctl/data/boards.yaml); no cap: the top frequency",
            "profiling": "only 'ours' is charged for profiling; the baselines do not profile and the "
            "oracle's own-data search is reported apart (oracle_search_device_s)",
            "profiling_share": "every client's profiling device seconds over its fine-tuning device "
            "seconds, summed through the round that reached the target (all rounds if none did)",
            "stand_in": "scale mode: A stand-in client does not train; its device time and energy are the "
            "board model's for the proxy's samples to target at the chosen pair; its weights go back "
            "unchanged",
        },
        "summary": summaries,
        "evaluations": evaluations,
        "failures": failures,
        "records": records,
        "wall_s": wall_s,
    } | ({"population": population} if population else {})


def processes(pids: list[int]) -> dict[str, list[int]]:
    """The processes a run started, and those still alive after it."""
    return {"started": pids, "alive_after": [p for p in pids if alive(p)]}


def cap_cell(power_cap_w: float | None) -> str:
    """A cap as a table cell or a cell's key: its watts without a unit, or none."""
    return "none" if power_cap_w is None else f"{power_cap_w:g}"


def table(head: str, rows: list[str]) -> list[str]:
    """A printed table: its head, a rule as wide, its rows."""
    return [head, "-" * len(head), *rows]


def headline(fleet: dict[str, Any], over: str = "") -> str:
    """The first line of a fleet's summary (`over`: what follows its name)."""
    return (
        f"fleet {fleet['name']}{over}: {len(fleet['boards'])} boards, model {fleet['model']}, "
        f"target accuracy {fleet['target_accuracy']:g}, {fleet['rounds']} round(s)"
    )


def some(items: list[str], shown: int = 8, counted: bool = True) -> str:
    """The first `shown` of a list; the rest an ellipsis (`counted`: with how many in all)."""
    more = f" … ({len(items)} in all)" if counted else " …"
    return ", ".join(items[:shown]) + (more if len(items) > shown else "")


def summary_text(results: dict[str, Any]) -> str:
    """The table printed at the end of a fleet run (and saved as summary.txt)."""
    fleet = results["fleet"]
    head = (
        f"{'method':<18} {'to target s':>11} {'(training)':>10} {'prof %':>6} {'round':>5} "
        f"{'makespans s':<22} {'energy J':>9} {'at target':>9} {'over cap':>8} {'failed':>6} "
        f"{'speed-up':>8} {'energy':>7}"
    )
    rows = []
    for s in results["summary"]:
        spans = some([f"{m:.1f}" for m in s["makespans_s"]], 4, counted=False)
        ttt = (
            cell(s["time_to_target_s"])
            if s["time_to_target_s"] is not None
            else f">{s['total_makespan_s']:.1f}"
        )
        share = cell(s.get("profiling_share"), ".1%")
        rows.append(
            f"{s['method']:<18} {ttt:>11} {cell(s['training_to_target_s']):>10} {share:>6} "
            f"{cell(s['reached_round'], 'd'):>5} {spans:<22} "
            f"{s['energy_j']:>9.0f} {s['clients_at_target']:>4}/{s['clients']:<4} {s['over_cap']:>8} "
            f"{s['failed']:>6} {cell(s['speedup_vs_sop'], '.2f', 'x'):>8} "
            f"{cell(s['energy_vs_sop'], '.2f'):>7}"
        )
    lines = [headline(fleet), *table(head, rows)]
    lines += [
        "",
        "to target s: " + results["definitions"]["time_to_target_s"] + "; (training): the same without "
        "profiling (each round's slowest fine-tuning); prof %: "
        + results["definitions"]["profiling_share"]
        + ".",
        "speed-up: state-of-practice's time to target / the method's; energy: the method's energy / "
        "state-of-practice's (all rounds). " + results["definitions"]["state-of-practice"] + ".",
        "at target: clients that reported the target in the last round; over cap: client-rounds whose "
        "measured peak passed the cap (simulated sensor noise is 1 % per reading).",
    ]
    for s in results["summary"]:
        if any(d is not None for d in s.get("deadlines_s", [])):
            lines.append(
                f"{s['method']}: round deadlines "
                + ", ".join("-" if d is None else f"{d:.2f} s" for d in s["deadlines_s"])
                + " (the slowest client's predicted fastest time to target; each client ran its "
                "least-energy pair predicted to meet it)"
            )
    lines += ["", *choices_table(results)]
    lines += switches_table(results)
    if fleet["scale_mode"]:
        stand = sum(s["stand_ins"] for s in results["summary"])
        lines.append(
            f"scale mode: profiles {fleet['profile_source']}; {fleet['real_share']:.0%} of the clients "
            f"fine-tune the real model; {stand} client-rounds were stand-ins. "
            + results["definitions"]["stand_in"][len("scale mode: ") :]
            + "."
        )
    lines += population_lines(results)
    lines += [f"note: {n}" for n in fleet["notes"]]
    return "\n".join(lines)


def population_lines(results: dict[str, Any]) -> list[str]:
    """Who was available and who was sampled, per round (the same draw for every method)."""
    drawn = results.get("population") or {}
    if not drawn:
        return []
    first = next(iter(drawn.values()))
    per_round = first["clients_per_round"] or "every available"
    trace = first.get("availability_trace", "")
    present = (
        f"each board available in the rounds the trace {trace} gives it"
        if trace
        else f"each board available with probability {first['availability']:g}"
    )
    lines = [
        f"population: {len(results['fleet']['boards'])} boards; {per_round} sampled per round, {present} "
        f"(seed {first['seed']}); the same boards for every method; results.json 'population' lists each "
        "round's sampled and unavailable boards"
    ]
    for r in first["rounds"]:
        shown = some([str(p) for p in r["sampled"]], counted=False)
        lines.append(
            f"  round {r['round']}: {r['available']} of {r['population']} available, "
            f"{len(r['sampled'])} sampled (partitions {shown})"
        )
    return lines


def choices_table(results: dict[str, Any]) -> list[str]:
    """Round 1 per (device, cap) and method: the pair chosen and its mean device seconds and energy."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results["records"]:
        if r["round"] == 1:
            groups.setdefault((r["device"], cap_cell(r["power_cap_w"]), r["method"]), []).append(r)
    head = (
        f"{'round 1: device':<18} {'cap W':>6} {'method':<18} {'n':>4} {'b':>4} {'MHz':>7} {'profiled':>8} "
        f"{'prof s':>7} {'device s':>9} {'energy J':>9} {'peak W':>7}"
    )
    rows = []
    order = {m: i for i, m in enumerate(results["methods"])}
    for (device, cap, method), rs in sorted(groups.items(), key=lambda kv: (*kv[0][:2], order[kv[0][2]])):
        pairs = sorted({(r["batch_size"], r["frequency_hz"]) for r in rs})
        b, hz = pairs[0]
        more = "+" if len(pairs) > 1 else ""
        n = len(rs)
        peaks = [r["peak_power_w"] for r in rs if r["peak_power_w"] is not None]
        prof = sum(r["profiling_s"] for r in rs) / n
        power_aware = run_method_named(method).method.power_aware
        ways = "/".join(sorted({profiled_as(r) for r in rs})) if power_aware else "-"
        secs = sum(r["device_s"] for r in rs) / n
        joules = sum(r["energy_j"] or 0 for r in rs) / n
        rows.append(
            f"{device:<18} {cap:>6} {method:<18} {n:>4} {b:>4} {hz / 1e6:>6.1f}{more:1} {ways:>8} "
            f"{prof:>7.1f} {secs:>9.1f} {joules:>9.0f} {cell(max(peaks) if peaks else None, '.2f'):>7}"
        )
    return table(head, rows)


def switches_table(results: dict[str, Any]) -> list[str]:
    """Per client under a changing cap: what it did (switches, pauses, time paused, over the cap)."""
    changed = [r for r in results["records"] if r.get("cap_events")]
    if not changed:
        return []
    head = (
        f"{'changing cap: client':<22} {'method':<18} {'round':>5} {'switches':>8} {'pauses':>6} "
        f"{'paused s':>8} {'over cap s':>10}  pairs (b@MHz) in order"
    )
    rows = []
    for r in sorted(changed, key=lambda r: (r["node_key"], r["method"], r["round"])):
        pairs = [f"{e['new_batch_size']}@{e['new_frequency_hz'] / 1e6:.0f}" for e in r["cap_events"]]
        beyond = sum(e["over_cap_s"] for e in r["cap_events"])
        rows.append(
            f"{r['node_key']:<22} {r['method']:<18} {r['round']:>5} {r['switches']:>8} {r['pauses']:>6} "
            f"{r.get('paused_s') or 0.0:>8.1f} {beyond:>10.2f}  {' → '.join(pairs)}"
        )
    return [
        "",
        *table(head, rows),
        "over cap s: measured over the cap in force beyond the step in progress at each change (a drop "
        "is acted on before the next step); paused: nothing fitted under the cap.",
    ]

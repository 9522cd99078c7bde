"""The fleet file of `python -m simulations run`: boards, task, partitioning, rounds, seeds, budget.

One strict reader: an unknown key or a bad value is one `FleetFileError` line naming the key and its
place in the file (``quick.yaml: groups[1].power-cap-w: expected a number > 0 or none, got "abc"``).
The groups (which board, how many, which cap) are read by `fl_client.node`, the one place that maps
partition ids to boards, so the runner and every ClientApp see the same fleet. A file becomes a Flower
run config (`FleetSpec.run_config`): the ServerApp and ClientApps then read nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_client.node import FleetEntry, NodeConfigError, parse_fleet_groups, quoted, read_yaml
from powerctl.devices.simulated import SIM_BOARDS
from strategies.protocol import PROFILE_ORDERS, PROFILE_SOURCES, RUN_METHODS
from training.lr import LR_RULES

TOP_KEYS = (
    "name",
    "groups",
    "task",
    "partitioning",
    "rounds",
    "seeds",
    "budget",
    "methods",
    "scale",
    "profiling",
    "evaluation",
    "round-timeout-s",
)
REQUIRED_TOP = ("groups", "task")
FILE_KINDS = (
    "cifar10",
    "cifar100",
    "cifar10-jpeg",
    "cinic10",
    "svhn",
    "fashion-mnist",
    "mnist",
    "text",
    "npz",
)
GENERATED = ("synthetic-image", "synthetic-text")


class FleetFileError(NodeConfigError):
    """A fleet file that cannot be run; the text names the key, its place and the value."""


@dataclass(frozen=True)
class Task:
    model: str
    pretrain: str
    """A dataset spec to pre-train on, used when `weights` is empty."""
    pretrain_samples: int
    weights: str
    proxy: str
    relation: str
    target: str
    """The clients' data (partitioned among the boards)."""
    target_accuracy: float
    batch_sizes: list[int]
    lr_max: float
    lr_rule: str


@dataclass(frozen=True)
class FleetSpec:
    """A parsed fleet file; `boards` has one entry per board (groups expanded by count)."""

    path: Path
    name: str
    boards: list[FleetEntry]
    task: Task
    partitioning: str
    dirichlet_alpha: float
    rounds: int
    seeds: dict[str, Any]
    budget_samples: int
    budget_device_seconds: float
    methods: list[str]
    profile_source: str
    real_share: float
    profiling: dict[str, Any]
    evaluation: dict[str, int]
    round_timeout_s: float
    notes: list[str] = field(default_factory=list)
    """What the run cannot do as the file says (a cap schedule), said in output and results."""

    @property
    def scale_mode(self) -> bool:
        return self.profile_source == "predicted" or self.real_share < 1.0

    def run_config(self, results_dir: Path, methods: list[str], profile_cache: Path) -> dict[str, Any]:
        """The Flower run config that runs this fleet (every value a str, int or float)."""
        t = self.task
        return {
            "num-server-rounds": self.rounds,
            "model": t.model,
            "weights": t.weights,
            "pretrain-data": t.pretrain,
            "pretrain-samples": t.pretrain_samples,
            "pretrain-seed": self.seeds["pretrain"],
            "relation": t.relation,
            "proxy-data": t.proxy,
            "proxy-seed": self.seeds["proxy"],
            "relation-seeds": ",".join(map(str, self.seeds["relation"])),
            "target-accuracy": t.target_accuracy,
            "batch-sizes": ",".join(map(str, t.batch_sizes)),
            "lr-max": t.lr_max,
            "lr-rule": t.lr_rule,
            "budget-samples": self.budget_samples,
            "budget-device-seconds": self.budget_device_seconds,
            "eval-every-samples": self.evaluation["every-samples"],
            "eval-max-samples": self.evaluation["max-samples"],
            "profile-order": self.profiling["order"],
            "profile-samples": self.profiling["samples"],
            "profile-warmup": self.profiling["warmup"],
            "profile-steps": self.profiling["steps"],
            "seed": self.seeds["run"],
            "results-dir": str(results_dir),
            "round-timeout": self.round_timeout_s,
            "fleet": str(self.path),
            "client-data": t.target,
            "client-data-seed": self.seeds["data"],
            "partitioning": self.partitioning,
            "dirichlet-alpha": self.dirichlet_alpha,
            "methods": ",".join(methods),
            "profile-source": self.profile_source,
            "real-share": self.real_share,
            "profile-cache": str(profile_cache),
        }


class _Section:
    """A mapping of the file read key by key; every error names `where.key`."""

    def __init__(self, raw: Any, where: str, keys: tuple[str, ...]) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise FleetFileError(
                f"{where}: expected a mapping with keys {', '.join(keys)}, got {quoted(raw)}"
            )
        unknown = sorted(str(k) for k in set(raw) - set(keys))
        if unknown:
            raise FleetFileError(f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(keys)}")
        self.raw, self.where = raw, where

    def fail(self, key: str, expected: str) -> FleetFileError:
        return FleetFileError(f"{self.where}.{key}: expected {expected}, got {quoted(self.raw[key])}")

    def get(self, key: str, default: Any, check: Callable[[Any], bool], expected: str) -> Any:
        if key not in self.raw:
            if default is _REQUIRED:
                raise FleetFileError(f"{self.where}: missing key {key!r} ({expected})")
            return default
        if not check(self.raw[key]):
            raise self.fail(key, expected)
        return self.raw[key]

    def integer(self, key: str, default: Any, minimum: int) -> int:
        return self.get(key, default, lambda v: _is_int(v) and v >= minimum, f"an integer ≥ {minimum}")

    def number(self, key: str, default: Any, *, minimum: float, strict: bool) -> float:
        op = ">" if strict else "≥"
        ok = lambda v: _is_num(v) and (v > minimum if strict else v >= minimum)  # noqa: E731
        return float(self.get(key, default, ok, f"a number {op} {minimum:g}"))

    def choice(self, key: str, default: Any, allowed: tuple[str, ...]) -> str:
        return self.get(key, default, lambda v: v in allowed, f"one of {', '.join(allowed)}")

    def string(self, key: str, default: Any, expected: str) -> str:
        return self.get(key, default, lambda v: isinstance(v, str) and bool(v.strip()), expected).strip()


_REQUIRED = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _dataset(sec: _Section, key: str, default: Any, base: Path) -> str:
    """A dataset spec; a file path in it is made absolute (relative paths start at the fleet file)."""
    expected = f"a dataset spec ({', '.join(GENERATED)} or KIND:PATH with KIND in {', '.join(FILE_KINDS)})"
    spec = sec.string(key, default, expected)
    if spec in GENERATED:
        return spec
    kind, _, arg = spec.partition(":")
    if kind not in FILE_KINDS or not arg.strip():
        raise sec.fail(key, expected)
    path = Path(arg.strip()).expanduser()
    path = path if path.is_absolute() else (base / path).resolve()
    if not path.exists():
        raise FleetFileError(f"{sec.where}.{key}: no such file or folder {path}")
    return f"{kind}:{path}"


def _file(sec: _Section, key: str, base: Path) -> str:
    value = sec.get(key, "", lambda v: isinstance(v, str), "a file path")
    if not value.strip():
        return ""
    path = Path(value.strip()).expanduser()
    path = path if path.is_absolute() else (base / path).resolve()
    if not path.is_file():
        raise FleetFileError(f"{sec.where}.{key}: no such file {path}")
    return str(path)


def _task(raw: Any, where: str, base: Path) -> Task:
    from training.models import model_names

    keys = (
        "model",
        "pretrain",
        "pretrain-samples",
        "weights",
        "proxy",
        "relation",
        "target",
        "target-accuracy",
        "batch-sizes",
        "lr-max",
        "lr-rule",
    )
    s = _Section(raw, where, keys)
    names = tuple(model_names())
    acc = s.get("target-accuracy", 0.7, lambda v: _is_num(v) and 0 < v <= 1, "an accuracy in (0, 1]")
    sizes = s.get(
        "batch-sizes",
        [8, 16, 32, 64],
        lambda v: (
            isinstance(v, list) and v and all(_is_int(b) and b >= 1 for b in v) and len(set(v)) == len(v)
        ),
        "a list of distinct integers ≥ 1, e.g. [8, 16, 32, 64]",
    )
    return Task(
        model=s.choice("model", _REQUIRED, names),
        pretrain=_dataset(s, "pretrain", "synthetic-image", base),
        pretrain_samples=s.integer("pretrain-samples", 2000, 1),
        weights=_file(s, "weights", base),
        proxy=_dataset(s, "proxy", "synthetic-image", base),
        relation=_file(s, "relation", base),
        target=_dataset(s, "target", "synthetic-image", base),
        target_accuracy=float(acc),
        batch_sizes=sorted(sizes),
        lr_max=s.number("lr-max", 2e-3, minimum=0, strict=True),
        lr_rule=s.choice("lr-rule", "sqrt", LR_RULES),
    )


def _boards(raw: Any, name: str, base: Path) -> list[FleetEntry]:
    boards = parse_fleet_groups(raw, name, "groups", base)
    for b in boards:
        kind, _, board = b.device.partition(":")
        if kind != "sim" or board not in SIM_BOARDS:
            known = ", ".join(f"sim:{n}" for n in SIM_BOARDS)
            where = f"{name}: groups[{b.group}].device"
            raise FleetFileError(f"{where}: expected a simulated board ({known}), got {quoted(b.device)}")
    return boards


def load_fleet_spec(path: Path) -> FleetSpec:
    """Read and check a fleet file; the first problem found is one FleetFileError line."""
    try:
        return _load(path)
    except FleetFileError:
        raise
    except NodeConfigError as exc:  # the groups, read by fl_client.node
        raise FleetFileError(str(exc)) from None


def _load(path: Path) -> FleetSpec:
    path = Path(path).expanduser().resolve()
    name = path.name
    if not path.is_file():
        raise FleetFileError(f"{path}: no such fleet file")
    doc = read_yaml(path)
    top = _Section(doc, name, TOP_KEYS)
    for key in REQUIRED_TOP:
        if key not in top.raw:
            raise FleetFileError(f"{name}: missing key {key!r} (see simulations/fleets/quick.yaml)")
    base = path.parent
    boards = _boards(top.raw["groups"], name, base)
    task = _task(top.raw["task"], f"{name}: task", base)
    part = _Section(top.raw.get("partitioning"), f"{name}: partitioning", ("scheme", "alpha"))
    seeds = _Section(top.raw.get("seeds"), f"{name}: seeds", ("run", "pretrain", "proxy", "data", "relation"))
    budget = _Section(top.raw.get("budget"), f"{name}: budget", ("samples", "device-seconds"))
    scale = _Section(top.raw.get("scale"), f"{name}: scale", ("profiles", "real-share"))
    prof = _Section(top.raw.get("profiling"), f"{name}: profiling", ("order", "samples", "warmup", "steps"))
    ev = _Section(top.raw.get("evaluation"), f"{name}: evaluation", ("every-samples", "max-samples"))
    relation_seeds = seeds.get(
        "relation",
        [0, 1, 2],
        lambda v: (
            isinstance(v, list) and v and all(_is_int(x) and x >= 0 for x in v) and len(set(v)) == len(v)
        ),
        "a list of distinct integers ≥ 0, e.g. [0, 1, 2]",
    )
    methods = top.get(
        "methods",
        [m for m in RUN_METHODS if m != "ours-deadline"],
        lambda v: isinstance(v, list) and v and all(m in RUN_METHODS for m in v) and len(set(v)) == len(v),
        f"a list of distinct methods from {', '.join(RUN_METHODS)}",
    )
    spec = FleetSpec(
        path=path,
        name=top.string("name", path.stem, "a name"),
        boards=boards,
        task=task,
        partitioning=part.choice("scheme", "iid", ("iid", "dirichlet")),
        dirichlet_alpha=part.number("alpha", 0.5, minimum=0, strict=True),
        rounds=top.integer("rounds", 2, 1),
        seeds={
            "run": seeds.integer("run", 0, 0),
            "pretrain": seeds.integer("pretrain", 0, 0),
            "proxy": seeds.integer("proxy", 1, 0),
            "data": seeds.integer("data", 2, 0),
            "relation": list(relation_seeds),
        },
        budget_samples=budget.integer("samples", 6000, 0),
        budget_device_seconds=budget.number("device-seconds", 0.0, minimum=0, strict=False),
        methods=[m for m in RUN_METHODS if m in methods],
        profile_source=scale.choice("profiles", "measured", PROFILE_SOURCES),
        real_share=float(
            scale.get("real-share", 1.0, lambda v: _is_num(v) and 0 <= v <= 1, "a share in [0, 1]")
        ),
        profiling={
            "order": prof.choice("order", "efficient", PROFILE_ORDERS),
            "samples": prof.integer("samples", 4000, 1),
            "warmup": prof.integer("warmup", 1, 0),
            "steps": prof.integer("steps", 2, 1),
        },
        evaluation={
            "every-samples": ev.integer("every-samples", 128, 1),
            "max-samples": ev.integer("max-samples", 300, 1),
        },
        round_timeout_s=top.number("round-timeout-s", 3600.0, minimum=0, strict=True),
    )
    if any(b.caps() is not None for b in boards) and spec.scale_mode:
        spec.notes.append(
            "stand-in clients (scale mode) do not train, so they do not follow a changing cap: each "
            "applies its cap at t = 0; the clients that fine-tune follow theirs"
        )
    return spec

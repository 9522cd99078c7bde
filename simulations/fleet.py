"""The fleet file of `python -m simulations run`, read strictly (the first problem is one `FleetFileError`
line): its groups by `strategies.fleet`, every other value a run setting under another name (`PLACES`)."""

from __future__ import annotations

import dataclasses
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from powerctl.files.mapping import MAX_SEED, Custom, Integer, MappingReader, mapping_reader, must_be
from powerctl.selection.methods import METHODS, RUN_METHODS
from strategies.fleet import FleetEntry, NodeConfigError, not_simulated, parse_fleet_groups, read_yaml
from strategies.population import PopulationError, check_population, run_population
from strategies.setting_kinds import APP_FILE, DATASET
from strategies.settings import SETTINGS, RunSettings, to_config

PLACES: dict[str, str | dict[str, str]] = {
    "rounds": "num-server-rounds",
    "round-timeout-s": "round-timeout",
    "methods": "methods",
    "task": {
        "model": "model",
        "pretrain": "pretrain-data",
        "pretrain-samples": "pretrain-samples",
        "weights": "weights",
        "proxy": "proxy-data",
        "relation": "relation",
        "target": "client-data",
        "target-accuracy": "target-accuracy",
        "batch-sizes": "batch-sizes",
        "lr-max": "lr-max",
        "lr-rule": "lr-rule",
    },
    "partitioning": {"scheme": "partitioning", "alpha": "dirichlet-alpha"},
    "seeds": {
        "run": "seed",
        "pretrain": "pretrain-seed",
        "proxy": "proxy-seed",
        "data": "client-data-seed",
        "relation": "relation-seeds",
    },
    "budget": {"samples": "budget-samples", "device-s": "budget-device-s"},
    "scale": {"profiles": "profile-source", "real-share": "real-share"},
    "profiling": {
        "order": "profile-order",
        "samples": "profile-samples",
        "warmup": "profile-warmup",
        "steps": "profile-steps",
    },
    "evaluation": {"every-samples": "eval-every-samples", "max-samples": "eval-max-samples"},
    "population": {
        "clients-per-round": "clients-per-round",
        "availability": "availability",
        "availability-trace": "availability-trace",
    },
}
"""Where each run setting a fleet file may set stands in it: a top-level key, or a section's key."""
TOP_KEYS = ("name", "groups", *PLACES)
RUN_KEYS = {
    *(key for key in PLACES.values() if isinstance(key, str)),
    *(key for section in PLACES.values() if isinstance(section, dict) for key in section.values()),
    "fleet",
    "results-dir",
    "profile-cache",
}
"""The run config keys a fleet run passes to Flower (the others are pyproject's declared defaults)."""
SEED_COUNT_KEY = "count"
"""`seeds: {count: N}`: how many seeds the runner runs (`--seeds` wins)."""
MAX_SEEDS = 100
"""The most seeds one command runs: each is a whole `flwr run`."""
FLEET_METHODS = list(METHODS)
"""Without `methods`, a fleet file compares every client method (not the run config's `ours`)."""


NAME_EXPECTED = "a name of one line without '/' (it names the results and their folder runs/fleet-NAME)"


def _fleet_name(value: Any) -> str:
    """The fleet's name, a label in every report and a folder's name: no '/', '..' or control character."""
    text = value.strip() if isinstance(value, str) else ""
    if not text or "/" in text or text in (".", "..") or any(unicodedata.category(c) == "Cc" for c in text):
        raise must_be(NAME_EXPECTED, value)
    return text


class FleetFileError(NodeConfigError):
    """A fleet file that cannot be run; the text names the key, its place and the value."""


@dataclass(frozen=True)
class FleetSpec:
    """A parsed fleet file; `boards` has one entry per board (groups expanded by count)."""

    path: Path
    name: str
    boards: list[FleetEntry]
    settings: RunSettings
    """What the file sets (paths made absolute, `fleet` this file), the declared defaults for the rest."""
    notes: list[str] = field(default_factory=list)
    """What the run cannot do as the file says, said in output and results."""
    seed_count: int = 1
    """`seeds.count`: how many seeds `python -m simulations run` runs (`for_seed`)."""

    @property
    def scale_mode(self) -> bool:
        return self.settings.profile_source == "predicted" or self.settings.real_share < 1.0

    def run_config(self, results_dir: Path, methods: list[str], profile_cache: Path) -> dict[str, Any]:
        """The Flower run config of this fleet: the settings a fleet file sets, where to write, which
        methods, and any other setting off its default (a test's injected fault)."""
        given = dataclasses.replace(
            self.settings, methods=methods, results_dir=str(results_dir), profile_cache=str(profile_cache)
        )
        run, declared = to_config(given), to_config(RunSettings())
        return {key: run[key] for key in SETTINGS if key in RUN_KEYS or run[key] != declared[key]}

    def for_seed(self, offset: int) -> FleetSpec:
        """This fleet with its run and data seeds moved by `offset`; the pre-training, proxy and relation
        seeds stay, so every seed starts from the same cached weights and relation vector."""
        run = self.settings
        moved = dataclasses.replace(
            run, seed=run.seed + offset, client_data_seed=run.client_data_seed + offset
        )
        return dataclasses.replace(self, settings=moved)

    def check_seed_count(self, count: int, where: str) -> int:
        """`count` (1 to MAX_SEEDS, as its flag and key read it) with every derived run and data seed
        valid; else one FleetFileError line naming `where`."""
        run = self.settings
        for name, first in (("seeds.run", run.seed), ("seeds.data", run.client_data_seed)):
            if first + count - 1 > MAX_SEED:
                raise FleetFileError(
                    f"{where}: {count} seeds take {name} {first} to {first + count - 1}, over the largest "
                    f"seed {MAX_SEED}; lower {name} or the count"
                )
        return count


def _setting(r: MappingReader, leaf: str, key: str, base: Path) -> Any:
    """Run setting `key`, written as `leaf` in `r`'s section: checked by its kind, its default when
    absent; relative paths from the fleet file's folder, and what they name must exist."""
    setting = SETTINGS[key]
    if key == "methods":
        chosen = r.value(leaf, setting.kind, FLEET_METHODS)
        return [m for m in RUN_METHODS if m in chosen]
    if setting.kind is DATASET:
        spec = r.value(leaf, DATASET, setting.typed_default())
        kind, sep, arg = spec.partition(":")
        if not sep:
            return spec
        path = _resolve(arg, base)
        if not path.exists():
            raise r.fail(leaf, f"names no such file or folder: {path}")
        return f"{kind}:{path}"
    if setting.kind is APP_FILE:
        given = r.get(leaf, "")
        text = str(_resolve(given, base)) if isinstance(given, str) and given.strip() else given
        return r.check(leaf, text, APP_FILE)
    return r.value(leaf, setting.kind, setting.typed_default())


def _resolve(text: str, base: Path) -> Path:
    path = Path(text.strip()).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _missing(where: str, key: str) -> NoReturn:
    raise FleetFileError(f"{where}: missing key {key!r} (see simulations/fleets/quick.yaml)")


def load_fleet_spec(path: Path) -> FleetSpec:
    """Read and check a fleet file; the first problem found is one FleetFileError line."""
    try:
        return _load(path)
    except NodeConfigError as exc:  # also the groups, read by strategies.fleet
        raise FleetFileError(str(exc)) from None


def _load(path: Path) -> FleetSpec:
    path = Path(path).expanduser().resolve()
    name = path.name
    if not path.exists():
        raise FleetFileError(f"{path}: no such fleet file")
    top = mapping_reader(read_yaml(path), name, FleetFileError, TOP_KEYS)  # bounded, a regular file only
    for required in ("groups", "task"):
        if top.get(required, None) is None:
            _missing(name, required)
    base = path.parent
    boards = parse_fleet_groups(top.get("groups"), name, "groups", base)
    for b in boards:
        if problem := not_simulated(b.device):
            raise FleetFileError(f"{name}: groups[{b.group}]: 'device' {problem}")
    settings: dict[str, Any] = {}
    count = 1
    for place, key in PLACES.items():
        if isinstance(key, str):
            settings[key] = _setting(top, place, key, base)
            continue
        section = top.section(place, (*key, SEED_COUNT_KEY) if place == "seeds" else tuple(key))
        if place == "task" and "model" not in section:
            _missing(section.where, "model")
        if place == "seeds":
            count = section.value(SEED_COUNT_KEY, Integer(1, MAX_SEEDS), 1)
        for leaf, setting_key in key.items():
            settings[setting_key] = _setting(section, leaf, setting_key, base)
    run = RunSettings(**{SETTINGS[key].attr: value for key, value in settings.items()}, fleet=str(path))
    try:  # the ServerApp draws its population: refused here, before Ray starts
        population = run_population(run, tuple(b.availability for b in boards))
        check_population(population, len(boards), run.num_server_rounds)
    except PopulationError as exc:
        raise FleetFileError(f"{name}: population: {exc}") from None
    fleet_name = top.value("name", Custom(_fleet_name, NAME_EXPECTED, str), path.stem)
    spec = FleetSpec(path, fleet_name, boards, run, seed_count=count)
    spec.check_seed_count(count, f"{name}: seeds: {SEED_COUNT_KEY!r}")
    if any(b.cap_source is not None for b in boards) and spec.scale_mode:
        spec.notes.append(
            "stand-in clients (scale mode) do not train, so they do not follow a changing cap: each "
            "applies its cap at t = 0; the clients that fine-tune follow theirs"
        )
    return spec

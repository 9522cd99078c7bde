"""Every run setting, declared once: its key, default, kind (type and check), help, and who reads it.

A setting is a dataclass field (`setting_field`) of the group its readers make it: `SentSettings` (the
ServerApp reads it and sends it to every client; `strategies.protocol.TrainInstructions` carries this
group), `ClientSettings` (the ClientApp reads it from its run config, `client_setting`) or `RunSettings`
(the ServerApp only), which is composed of the other two. `SETTINGS` (key → `Setting`) is derived from
those fields, and from it the ServerApp's checked config (`read_settings`, `fl_server.run_config`), the
command-line flags (`flag`), the fleet file's defaults and checks (`simulations.fleet`), and, through
`make docs`, pyproject.toml's ``[tool.flwr.app.config]`` (``python -m strategies.settings`` prints it;
Flower takes the defaults from there and overrides with ``--run-config``) and the tables of
docs/reference/run-config.md. A new setting is one field in its group.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerctl.cli.util import kind_type
from powerctl.errors import PowerctlError
from powerctl.files.mapping import (
    MAX_BATCH_SIZE,
    MAX_COUNT,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_STEPS,
    Choice,
    Custom,
    Distinct,
    Flag,
    Integer,
    Invalid,
    Kind,
    MappingReader,
    Number,
    Text,
    distinct_ints,
    distinct_names,
    must_be,
)
from powerctl.records.relation import DEFAULT_RELATION_RULE, INTERVAL_STANDARD_ERRORS, RELATION_RULES, VECTORS
from powerctl.selection.follow import DEFAULT_PAUSE_TIMEOUT_S, DEFAULT_POLL_S, POLL_S_RANGE
from powerctl.selection.guard import DEFAULT_TOLERANCE, DEFAULT_WINDOW
from powerctl.selection.methods import (
    METHODS as METHODS,  # the registry's names (powerctl.selection.methods), re-exported
)
from powerctl.selection.methods import ROUND_OBJECTIVES, RUN_METHODS
from powerfed.training.lr import LR_RULES
from strategies.fleet import MAX_BOARDS, app_path_of, fleet_file, fleet_table

SERVER = "server"
"""Read by the ServerApp only."""
CLIENT = "client"
"""Read by the ClientApp from the run config (the ServerApp checks it before round 1)."""
BOTH = "both"
"""Read by the ServerApp, which sends it to every client in its train instructions."""
READERS = (SERVER, CLIENT, BOTH)
READ_BY = {SERVER: "server", CLIENT: "client app", BOTH: "server, clients"}
"""How the docs name each kind of reader."""
SETTING_METADATA = "setting"
"""The metadata key of a setting's dataclass field (`setting_field`): its run config key."""
GROUPS = ("task", "rounds", "profiling", "power", "fleet", "results", "faults")
"""The sections of docs/reference/run-config.md, one table each, in its order."""

PROFILE_ORDERS = ("efficient", "grid", "fitted")
"""How a client measures its profile (powerctl.profiling.profiler): efficient (stop each batch size at the
cap),
grid (every pair), fitted (a few points, a fit, and measurements confirming the choice)."""
PROFILE_SOURCES = ("measured", "predicted")
"""measured: profile the device (cached); predicted: a simulated board's model profile (no device time)."""
PARTITION_SCHEMES = ("iid", "dirichlet")
FAULT_KINDS = ("raise", "hang", "kill")
"""Injected failures (soak tests only, `fl_client.faults`)."""


class SettingsError(PowerctlError):
    """A setting that is unknown or holds a value that cannot be used; the text names the key and value."""


# --- kinds of the project's own values --------------------------------------------------------------
def _model(value: Any) -> str:
    from powerfed.training.models import model_names

    return Choice(tuple(model_names()))(value)


def _dataset(value: Any) -> str:
    """A dataset spec, read by the loader's own parser (`powerfed.training.data.load.dataset_path`):
    checked for its form here; the file is the loader's (in a deployment it lives on the clients, not
    where the run is checked; a local simulation's pre-flight checks it exists, `simulations.launcher`)."""
    from powerfed.training.data.load import _FILE_LOADERS, GENERATED, dataset_path
    from powerfed.training.errors import DataError

    text = value.strip() if isinstance(value, str) else ""
    try:
        dataset_path(text)  # "" is no spec
    except DataError:
        raise must_be(
            f"a dataset spec ({', '.join(GENERATED)}, or KIND:PATH with KIND in {', '.join(_FILE_LOADERS)})",
            value,
        ) from None
    return text


def _app_file(value: Any) -> str:
    """Empty, or a file that exists: absolute, or relative to the app folder (the ServerApp runs in
    Flower's copy of the app, not where `flwr run` started)."""
    from powerctl.files.readfile import not_regular

    text = Text(empty=True)(value)
    if text and (what := not_regular(path := app_path_of(text))) is not None:
        if what == "no such file":
            raise Invalid(f"names no such file: {path} (give an absolute path)")
        raise Invalid(f"names {path}, which is {what}, not a regular file; give a file")
    return text


def _torch_device(value: Any) -> str:
    """Where the server trains, in its one written form (`powerctl.devices.torchdev`): checked for its
    form here; whether that GPU is there only the machine that trains can say (it refuses one that is
    not, in one line, before any work)."""
    from powerctl.devices.torchdev import TORCH_SPEC_HELP, check_torch_spec
    from powerctl.errors import DeviceError

    try:
        return check_torch_spec(value)
    except DeviceError:
        raise must_be(TORCH_SPEC_HELP, value) from None


def _folder(value: Any) -> str:
    text = Text(empty=True)(value)
    if text and not Path(text).expanduser().is_absolute():
        raise must_be("an absolute folder (the apps do not run in the folder flwr run started in)", value)
    return text


def _fleet(value: Any) -> str:
    """A fleet table (parsed, every cap checked against its board) or a fleet file that exists (its
    YAML is read by `fl_client.node.load_fleet_file`, see `fl_server.run_config.parse_server_config`)."""
    text = Text()(value)
    if fleet_file(text) is None:
        fleet_table(text)
    return text


def parse_fault_spec(spec: str) -> dict[str, float]:
    """``raise:0.1,hang:0.05,kill:0.05`` → probabilities per kind (empty: none), or `Invalid`."""
    probabilities: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        kind, _, p = part.partition(":")
        try:
            value = float(p)
        except ValueError:
            value = -1.0
        if kind not in FAULT_KINDS or not 0.0 <= value <= 1.0:
            raise Invalid(
                f"holds {part!r}, which is not KIND:P (KIND in {', '.join(FAULT_KINDS)}, P in [0, 1])"
            )
        probabilities[kind] = value
    if sum(probabilities.values()) > 1.0:
        raise Invalid(f"has probabilities that add up to more than 1: {spec!r}")
    return probabilities


def _faults(value: Any) -> str:
    text = Text(empty=True)(value)
    parse_fault_spec(text)
    return text


MODEL = Custom(_model, "a model name", str)
DATASET = Custom(_dataset, "a dataset spec", str)
APP_FILE = Custom(_app_file, "a file (or empty)", str)
TORCH_DEVICE = Custom(_torch_device, "auto, cpu, cuda or cuda:INDEX", str)
FOLDER = Custom(_folder, "an absolute folder (or empty)", str)
FLEET = Custom(_fleet, "a fleet table or a fleet file", str)
FAULTS = Custom(_faults, "KIND:P, ... (or empty)", str)


# --- the declaration ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    key: str
    """The run config key (kebab-case); the Python attribute is its snake_case."""
    default: bool | int | float | str
    """As pyproject.toml holds it (a list is text separated by commas)."""
    kind: Kind
    help: str
    """What it is, its range where the kind does not say, what empty or 0 means (the docs' table and
    pyproject's comments)."""
    readers: str = SERVER
    """Who reads it: the group class its field is declared in (`SentSettings`, `ClientSettings`, else
    `RunSettings`)."""
    group: str = ""
    """One of `GROUPS`: the table of docs/reference/run-config.md it is listed in."""

    @property
    def attr(self) -> str:
        return self.key.replace("-", "_")

    def typed_default(self) -> Any:
        return self.kind(self.default)


def run_default(key: str) -> Any:
    """Run setting `key`'s declared default, typed: what a caller that is not given it uses."""
    return SETTINGS[key].typed_default()


def _default_of(key: str) -> Callable[[], Any]:
    return lambda: run_default(key)


def setting_field(key: str, default: bool | int | float | str, kind: Kind, help: str, *, group: str) -> Any:
    """A run setting, declared as the dataclass field of its group class (``lr_max: float =
    setting_field("lr-max", 0.002, Number(...), "help", group="task")``): the field's name is the key's
    snake_case, its type the kind's; who reads it is the class it is declared in. Its default is the
    declaration's (`SETTINGS`), read when an object is made."""
    declared = Setting(key, default, kind, help, readers="", group=group)
    return dataclasses.field(default_factory=_default_of(key), metadata={SETTING_METADATA: declared})


@dataclass(frozen=True, kw_only=True)
class SentSettings:
    """The settings the ServerApp reads and sends to every client in its train instructions
    (`strategies.protocol.TrainInstructions` carries them)."""

    model: str = setting_field(
        "model",
        "resnet18-small",
        MODEL,
        "The model to fine-tune, a registered model name (`fl-server pretrain --help` lists the built-ins); "
        "cnn-tiny is the smoke tests' (profiling then outweighs its seconds of training).",
        group="task",
    )
    relation_rule: str = setting_field(
        "relation-rule",
        DEFAULT_RELATION_RULE,
        Choice(RELATION_RULES),
        "How clients read the relation: Algorithm 1 on its mean (mean), the least mean regret over "
        "the seeds' vectors (robust), or its mean with the larger batch size winning among the pairs the "
        f"seeds cannot tell from the best ({INTERVAL_STANDARD_ERRORS:g} standard errors of each seed's "
        "own ratio between the two batch sizes) (interval).",
        group="task",
    )
    target_accuracy: float = setting_field(
        "target-accuracy",
        0.5,
        Number(0.0, 1.0, above=True),
        "The test accuracy to reach: of the relation estimate and of every client.",
        group="task",
    )
    lr_max: float = setting_field(
        "lr-max",
        0.002,
        Number(0.0, 10.0, above=True),
        "Learning rate of the largest batch size.",
        group="task",
    )
    lr_rule: str = setting_field(
        "lr-rule",
        "sqrt",
        Choice(LR_RULES),
        "How the rate scales to smaller batch sizes, in the relation estimate (part of its cache key) and "
        "on the clients: sqrt (the paper's, for Adam/AdamW), linear or constant.",
        group="task",
    )
    budget_samples: int = setting_field(
        "budget-samples",
        6000,
        Integer(0, MAX_COUNT),
        "Each client's training samples per round (0: no budget).",
        group="rounds",
    )
    budget_device_seconds: float = setting_field(
        "budget-device-seconds",
        0.0,
        Number(0.0),
        "Each client's device seconds of training per round (0: none).",
        group="rounds",
    )
    eval_every_samples: int = setting_field(
        "eval-every-samples",
        256,
        Integer(1, MAX_COUNT),
        "Clients evaluate every this many training samples, the relation estimate at least this often "
        "(a run that crosses the target within a few evaluations is run again more densely): the "
        "resolution of samples to target.",
        group="rounds",
    )
    eval_max_samples: int = setting_field(
        "eval-max-samples",
        300,
        Integer(1, MAX_COUNT),
        "Most test samples an evaluation uses (a fixed subset).",
        group="rounds",
    )
    profile_order: str = setting_field(
        "profile-order",
        "efficient",
        Choice(PROFILE_ORDERS),
        "How a client profiles its board: efficient (each batch size up to the cap; no cap: the whole "
        "grid), grid (every pair), fitted (a few pairs measured, the rest predicted, the choice confirmed: "
        "docs/design/fitted-profiling.md). Under a cap that changes every order profiles the grid.",
        group="profiling",
    )
    profile_samples: int = setting_field(
        "profile-samples",
        4000,
        Integer(1, MAX_COUNT),
        "N of T_N: the samples a profile's times are given for.",
        group="profiling",
    )
    profile_warmup: int = setting_field(
        "profile-warmup", 1, Integer(0, MAX_STEPS), "Warm-up steps per profiled pair.", group="profiling"
    )
    profile_steps: int = setting_field(
        "profile-steps", 2, Integer(1, MAX_STEPS), "Measured steps per profiled pair.", group="profiling"
    )
    profiling_budget: float = setting_field(
        "profiling-budget",
        0.01,
        Number(0.0, 1.0),
        "Share of its predicted training a client (ours) may spend profiling: the profile-order if it "
        "fits, else the fitted order, else its predicted profile's choice, confirmed by the training's first "
        "steps (0: no budget, "
        "always the profile-order).",
        group="profiling",
    )
    seed: int = setting_field(
        "seed",
        0,
        Integer(0, MAX_SEED),
        "The clients' training seed; with the node's name, the seed of a simulated board's sensor noise.",
        group="rounds",
    )
    checkpoint_every_samples: int = setting_field(
        "checkpoint-every-samples",
        4096,
        Integer(0, MAX_COUNT),
        "Clients checkpoint their fine-tune this often (at the next evaluation) and resume it when the "
        "same work comes again (0: never).",
        group="results",
    )
    guard_window: int = setting_field(
        "guard-window",
        DEFAULT_WINDOW,
        Integer(1, MAX_COUNT),
        "Power guard: consecutive training steps over cap × (1 + guard-tolerance) before a client steps "
        "its frequency down (docs/design/power-guard.md).",
        group="power",
    )
    guard_tolerance: float = setting_field(
        "guard-tolerance",
        DEFAULT_TOLERANCE,
        Number(0.0, 1.0, below=True),
        "Power guard: relative excess over the cap a reading may show (the sensor's noise band); 0 guards "
        "the cap exactly.",
        group="power",
    )
    cap_poll_s: float = setting_field(
        "cap-poll-s",
        DEFAULT_POLL_S,
        Number(*POLL_S_RANGE, unit="seconds"),
        "A client paused because nothing fits under its changing cap reads the cap this often "
        "(docs/design/changing-caps.md).",
        group="power",
    )
    cap_pause_timeout_s: float = setting_field(
        "cap-pause-timeout-s",
        DEFAULT_PAUSE_TIMEOUT_S,
        Number(0.0, above=True, unit="seconds"),
        "A client paused under its changing cap gives up after this long (one error line, its frequency "
        "restored).",
        group="power",
    )
    profile_source: str = setting_field(
        "profile-source",
        "measured",
        Choice(PROFILE_SOURCES),
        "measured (profile each device, cached) or predicted (a simulated board's noise-free model "
        "profile, no device time: scale mode).",
        group="profiling",
    )


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """The settings the ClientApp reads from its run config (`client_setting`); the ServerApp checks
    them before round 1."""

    fleet: str = setting_field(
        "fleet",
        "sim:jetson-nano@3.0, sim:jetson-tx2nx@4.5, sim:jetson-nano@none, sim:jetson-tx2nx@3.5",
        FLEET,
        "Device and cap of nodes without a device in their node config, by partition id: a table "
        "DEVICE@CAP, ... (CAP in W or none; partition i takes entry i mod its length) or a YAML fleet "
        "file (docs/reference/node-config.md#the-fleet-table).",
        group="fleet",
    )
    client_data: str = setting_field(
        "client-data",
        "synthetic-image",
        DATASET,
        "The data split among the nodes that have no data of their own.",
        group="fleet",
    )
    client_data_seed: int = setting_field(
        "client-data-seed", 2, Integer(0, MAX_SEED), "Seed of the client data and its split.", group="fleet"
    )
    partitioning: str = setting_field(
        "partitioning",
        "iid",
        Choice(PARTITION_SCHEMES),
        "How client data is shared out: iid, or dirichlet (label skew).",
        group="fleet",
    )
    dirichlet_alpha: float = setting_field(
        "dirichlet-alpha",
        0.5,
        Number(0.0, above=True),
        "The Dirichlet concentration of dirichlet partitioning (smaller: more label skew).",
        group="fleet",
    )
    profile_cache: str = setting_field(
        "profile-cache",
        "",
        FOLDER,
        "An absolute folder for the clients' profile cache; empty: $POWERFED_CACHE/profile.",
        group="profiling",
    )
    inject_failures: str = setting_field(
        "inject-failures",
        "",
        FAULTS,
        "Soak tests only (POWERFED_FAULT_INJECTION=1): failures per train message, KIND:P,... with KIND "
        "in raise, hang, kill, drawn from (seed, node, round), e.g. raise:0.1,hang:0.05.",
        group="faults",
    )
    inject_seed: int = setting_field(
        "inject-seed",
        0,
        Integer(0, MAX_SEED),
        "Soak tests only: the seed of injected failures.",
        group="faults",
    )
    inject_hang_s: float = setting_field(
        "inject-hang-s",
        60.0,
        Number(0.0, 3600.0, above=True, below=True, unit="seconds"),
        "Soak tests only: how long an injected hang sleeps.",
        group="faults",
    )


@dataclass(frozen=True, kw_only=True)
class RunSettings(ClientSettings, SentSettings):
    """The run config, every key checked and typed (`read_settings`): the sent and the client groups'
    settings, then those only the ServerApp reads, declared here; `SETTINGS` in this order (the order of
    `to_run_config`)."""

    num_server_rounds: int = setting_field(
        "num-server-rounds",
        2,
        Integer(1, MAX_ROUNDS),
        "Rounds of federated training (each: train, evaluate).",
        group="rounds",
    )
    weights: str = setting_field(
        "weights",
        "",
        APP_FILE,
        "Weights (safetensors) to start from, absolute or relative to the app folder; empty: pre-train "
        "on pretrain-data (cached in $POWERFED_CACHE/weights: "
        "docs/reference/files.md#caches-checkpoints-and-board-records).",
        group="task",
    )
    pretrain_data: str = setting_field(
        "pretrain-data",
        "synthetic-image",
        DATASET,
        "Pre-training data, when `weights` is empty.",
        group="task",
    )
    pretrain_samples: int = setting_field(
        "pretrain-samples", 2000, Integer(1, MAX_COUNT), "Pre-training samples.", group="task"
    )
    pretrain_seed: int = setting_field(
        "pretrain-seed", 0, Integer(0, MAX_SEED), "Pre-training seed.", group="task"
    )
    server_device: str = setting_field(
        "server-device",
        "auto",
        TORCH_DEVICE,
        "Where the ServerApp pre-trains and estimates the relation vector: auto (the first CUDA device "
        "torch sees, else the CPU), cpu, cuda or cuda:INDEX. Not in the caches' keys: a GPU reaches the "
        "same samples to target up to floating-point nondeterminism (docs/howto/server-gpu.md).",
        group="task",
    )
    relation: str = setting_field(
        "relation",
        "",
        APP_FILE,
        "A relation vector file (powerctl.relation/1: "
        "docs/reference/files.md#relation-vector-powerctlrelation1) for the same model, absolute or "
        "relative to the app folder; empty: estimate it on proxy-data (cached in $POWERFED_CACHE/relation).",
        group="task",
    )
    proxy_data: str = setting_field(
        "proxy-data",
        "synthetic-image",
        DATASET,
        "The proxy data the relation vector is estimated on.",
        group="task",
    )
    proxy_seed: int = setting_field(
        "proxy-seed",
        1,
        Integer(0, MAX_SEED),
        "Seed of the proxy data (generated data; the image train/test split).",
        group="task",
    )
    relation_seeds: list[int] = setting_field(
        "relation-seeds",
        "0,1,2",
        distinct_ints(0, "0,1,2", maximum=MAX_SEED),
        "Training seeds of the relation estimate, each batch size trained once per seed: samples to "
        "target is the mean over them (see relation-values), and the file keeps every seed's.",
        group="task",
    )
    relation_max_samples: int = setting_field(
        "relation-max-samples",
        16000,
        Integer(1, MAX_COUNT),
        "Most samples a relation run trains: a batch size that has not reached the target by then is an "
        "error that says what to change.",
        group="task",
    )
    relation_max_seeds: int = setting_field(
        "relation-max-seeds",
        0,
        Integer(0, 64),
        "Seeds are added beyond relation-seeds until the batch sizes' ranking is stable, up to this many "
        "in all (0: relation-seeds only).",
        group="task",
    )
    relation_values: str = setting_field(
        "relation-values",
        "raw",
        Choice(VECTORS),
        "The vector clients use: the seeds' means (raw) or the batch-efficiency fit to them (fitted).",
        group="task",
    )
    batch_sizes: list[int] = setting_field(
        "batch-sizes",
        "8,16,32,64",
        distinct_ints(1, "8,16,32,64", ascending=True, maximum=MAX_BATCH_SIZE),
        "Batch sizes of the relation vector, and so of every profile.",
        group="task",
    )
    results_dir: str = setting_field(
        "results-dir",
        "",
        FOLDER,
        "An absolute folder for results.json and global.safetensors; empty: "
        "$XDG_DATA_HOME/powerfed/runs/RUN_ID (default ~/.local/share/powerfed/runs/RUN_ID). `make run` "
        "sets runs/flwr.",
        group="results",
    )
    resume: bool = setting_field(
        "resume",
        True,
        Flag(),
        "Continue after the last completed round of this run found in results-dir; false: start over, "
        "the old files renamed aside (docs/design/federation.md#resuming).",
        group="results",
    )
    round_timeout: float = setting_field(
        "round-timeout",
        3600.0,
        Number(0.0, above=True, unit="seconds"),
        "Seconds a round waits for its replies; a client that has not replied is named timeout.",
        group="rounds",
    )
    rejoin_wait_s: float = setting_field(
        "rejoin-wait-s",
        30.0,
        Number(0.0, unit="seconds"),
        "Seconds a round waits for nodes that were connected before and are not now (a SuperNode "
        "restarting, a SuperLink back from a restart) before it goes on without them; each is waited "
        "for once.",
        group="rounds",
    )
    min_nodes: int = setting_field(
        "min-nodes",
        1,
        Integer(1, MAX_BOARDS),
        "A run starts once this many nodes are connected (deployment: the number of boards); later rounds "
        "take whoever is connected.",
        group="rounds",
    )
    fraction_train: float = setting_field(
        "fraction-train",
        1.0,
        Number(0.0, 1.0),
        "FedAvg's share of the connected nodes sampled to train each round.",
        group="rounds",
    )
    clients_per_round: int = setting_field(
        "clients-per-round",
        0,
        Integer(0, MAX_BOARDS),
        "Simulation: the boards sampled to train and evaluate each round among those available, seeded by "
        "`seed` and the round (strategies/population.py); 0: every connected node, as `fraction-train` says.",
        group="rounds",
    )
    availability: float = setting_field(
        "availability",
        1.0,
        Number(0.0, 1.0),
        "Simulation: each board's chance to be available in a round (seeded by `seed` and the round); "
        "an unavailable board is not sampled. 1: always there.",
        group="rounds",
    )
    availability_trace: str = setting_field(
        "availability-trace",
        "",
        APP_FILE,
        "Simulation: instead of `availability`, a CSV of the rounds each board is there "
        "(board,first-round,last-round; docs/reference/files.md#availability-trace), absolute or relative "
        "to the app folder; a board it does not name is never available. Empty: `availability` decides.",
        group="rounds",
    )
    fraction_evaluate: float = setting_field(
        "fraction-evaluate",
        1.0,
        Number(0.0, 1.0),
        "FedAvg's share of the connected nodes sampled to evaluate each round.",
        group="rounds",
    )
    round_objective: str = setting_field(
        "round-objective",
        "time",
        Choice(ROUND_OBJECTIVES),
        "time: every client its fastest pair (the paper); energy-under-deadline: each client its "
        "least-energy pair that meets the round's deadline, for ours (docs/design/deadline-rounds.md).",
        group="rounds",
    )
    round_deadline_s: float = setting_field(
        "round-deadline-s",
        0.0,
        Number(0.0, unit="seconds"),
        "Energy-under-deadline rounds: the deadline in device seconds (0: the slowest client's predicted "
        "fastest time).",
        group="rounds",
    )
    methods: list[str] = setting_field(
        "methods",
        "ours",
        distinct_names(RUN_METHODS),
        "The methods to run one after another from the same weights, relation and fleet (ours, "
        "state-of-practice, proxy-batch, oracle, ours-deadline); with several, one results folder each "
        "(docs/design/method.md#baselines).",
        group="rounds",
    )
    real_share: float = setting_field(
        "real-share",
        1.0,
        Number(0.0, 1.0),
        "Scale mode: the share of clients (spread evenly over partition ids) that fine-tune the real "
        "model; the others run the stand-in (docs/howto/fleets.md#scale-mode).",
        group="profiling",
    )
    inject_server_stop_round: int = setting_field(
        "inject-server-stop-round",
        0,
        Integer(0, MAX_ROUNDS),
        "Soak tests only: the ServerApp stops as if it crashed once this round's replies are in (0: never).",
        group="faults",
    )

    def method_list(self) -> list[str]:
        return list(self.methods)

    def seeds(self) -> list[int]:
        return list(self.relation_seeds)

    def batch_size_list(self) -> list[int]:
        return sorted(self.batch_sizes)

    def to_run_config(self) -> dict[str, Any]:
        return to_config(setting_fields(self))


def _field_type(kind: Kind) -> Any:
    """The type a setting's field is annotated with: its kind's Python type (a list's items' too)."""
    if isinstance(kind, Distinct):
        return types.GenericAlias(list, (kind.item.python_type,))
    return kind.python_type


def _name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _declare(cls: type, readers: Mapping[type, str]) -> dict[str, Setting]:
    """{key: Setting} of `cls`'s setting fields, in field order, each read by the `readers` of the group
    class that declares it; a field whose name or type is not its setting's is one SettingsError line."""
    owner = {name: who for c, who in readers.items() for name in inspect.get_annotations(c)}
    hints = typing.get_type_hints(cls)
    out: dict[str, Setting] = {}
    for f in dataclasses.fields(cls):
        s = dataclasses.replace(f.metadata[SETTING_METADATA], readers=owner[f.name])
        if f.name != s.attr or hints[f.name] != _field_type(s.kind):
            raise SettingsError(
                f"strategies.settings: setting {s.key!r} is declared as {f.name}: {_name(hints[f.name])}; "
                f"write {s.attr}: {_name(_field_type(s.kind))}"
            )
        if s.group not in (*GROUPS, ""):  # "": none yet (`make docs` says which)
            raise SettingsError(
                f"strategies.settings: setting {s.key!r} has group {s.group!r}: one of {GROUPS}"
            )
        # every integer has a ceiling: Flower carries run config integers as int64 and refuses a larger
        # one only after the run started ("Value out of range"); a typo must be one line before that
        if isinstance(s.kind, Integer) and s.kind.maximum is None:
            raise SettingsError(f"strategies.settings: setting {s.key!r} is an integer without a maximum")
        out[s.key] = s
    return out


SETTINGS: dict[str, Setting] = _declare(
    RunSettings, {SentSettings: BOTH, ClientSettings: CLIENT, RunSettings: SERVER}
)
"""Every run setting by its key, derived from the group classes' fields."""


def settings_of(readers: Collection[str]) -> list[Setting]:
    """The declared settings read by any of `readers`, in declaration order (looked up now, so a
    changed declaration is seen)."""
    return [s for s in SETTINGS.values() if s.readers in readers]


# --- what derives from it ----------------------------------------------------------------------------
def setting_fields(obj: Any) -> dict[str, Any]:
    """{key: value} of the declared settings among `obj`'s dataclass fields."""
    return {
        f.metadata[SETTING_METADATA].key: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if SETTING_METADATA in f.metadata
    }


def to_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """{key: typed value} → as a run config or a ConfigRecord holds them (lists as text)."""
    return {key: SETTINGS[key].kind.to_config(v) for key, v in values.items()}


def _reader(run_config: Any, error: type[PowerctlError]) -> MappingReader:
    return MappingReader(run_config, "run config", error)


def read_settings(run_config: Any, error: type[PowerctlError] = SettingsError) -> RunSettings:
    """Every key of `run_config` checked by its declaration (an unknown key named with the nearest
    known one), the others at their defaults; the first problem is one `error` line."""
    r = _reader(run_config, error).only(SETTINGS)
    return RunSettings(**{s.attr: r.value(s.key, s.kind, s.typed_default()) for s in SETTINGS.values()})


def client_setting(run_config: Any, key: str, error: type[PowerctlError] = SettingsError) -> Any:
    """One setting as the ClientApp reads it from its run config: checked, typed, else the default."""
    s = SETTINGS[key]
    return _reader(run_config, error).value(key, s.kind, s.typed_default())


def flag(key: str, help: str) -> dict[str, Any]:
    """`add_argument` keywords for a command-line flag that is run setting `key`: its kind reads the text
    (what it refuses is argparse's one line), its declared default, and `help` naming both. A command
    that takes a run setting as a flag takes it from here, so its default and check are the run's."""
    setting = SETTINGS[key]
    return {
        "type": kind_type(setting.kind, key),
        "default": run_default(key),
        "help": f"{help} (run config {key}; default: {setting.default})",
    }


def app_config_toml(settings: Iterable[Setting] | None = None) -> str:
    """The ``[tool.flwr.app.config]`` table pyproject.toml must hold, each key under its help."""
    lines = ["[tool.flwr.app.config]"]
    for s in settings if settings is not None else SETTINGS.values():
        lines += textwrap.wrap(
            s.help, 100, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False
        )
        lines.append(f"{s.key} = {_toml(s.default)}")
    return "\n".join(lines) + "\n"


def markdown_table(settings: Iterable[Setting] | None = None, text: Callable[[str], str] = str) -> str:
    """The settings as a Markdown table (key, default, the values its check takes, what it is, who reads
    it) for the docs; `text` turns a help text into the cell (docs/generate.py makes docs/ paths links)."""
    lines = ["| key | default | takes | what it is | read by |", "|---|---|---|---|---|"]
    for s in settings if settings is not None else SETTINGS.values():
        cells = [f"`{s.key}`", f"`{_toml(s.default)}`", s.kind.expected, text(s.help), READ_BY[s.readers]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m strategies.settings",
        description="Print the run settings as pyproject.toml's [tool.flwr.app.config] table (default) or "
        "as a Markdown table.",
    )
    p.add_argument("--markdown", action="store_true", help="a Markdown table for the docs")
    args = p.parse_args(argv)
    sys.stdout.write(markdown_table() if args.markdown else app_config_toml())
    return 0


def _toml(value: bool | int | float | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


if __name__ == "__main__":
    sys.exit(main())

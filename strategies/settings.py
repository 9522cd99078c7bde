"""Every run setting, declared once as a dataclass field (`setting_field`) of the group that reads it:
`SentSettings` (sent to every client), `ClientSettings` or `RunSettings` (the ServerApp's, composed of the
other two). Its key is the field's name in kebab-case; `SETTINGS` and what derives from it come from these."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from powerctl.errors import PowerctlError
from powerctl.files.mapping import (
    MAX_BATCH_SIZE,
    MAX_COUNT,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_STEPS,
    Choice,
    Distinct,
    Flag,
    Integer,
    Kind,
    MappingReader,
    Number,
    distinct_ints,
    distinct_names,
)
from powerctl.records.relation import DEFAULT_RELATION_RULE, INTERVAL_STANDARD_ERRORS, RELATION_RULES, VECTORS
from powerctl.selection.follow import DEFAULT_PAUSE_TIMEOUT_S, DEFAULT_POLL_S, POLL_S_RANGE
from powerctl.selection.guard import DEFAULT_TOLERANCE, DEFAULT_WINDOW
from powerctl.selection.methods import ROUND_OBJECTIVES, RUN_METHODS
from powerfed.training.lr import LR_RULES
from strategies.fleet import MAX_BOARDS
from strategies.setting_kinds import APP_FILE, DATASET, FAULTS, FLEET, FOLDER, MODEL, TORCH_DEVICE

SERVER, CLIENT, BOTH = "server", "client", "both"  # who reads a setting: the group it is declared in
SETTING_METADATA = "setting"  # a setting field's metadata key: its declaration
GROUPS = ("task", "rounds", "profiling", "power", "fleet", "results", "faults")
"""The sections of docs/reference/run-config.md, one table each, in its order."""

PROFILE_ORDERS = ("efficient", "grid", "fitted")
PROFILE_SOURCES = ("measured", "predicted")
PARTITION_SCHEMES = ("iid", "dirichlet")


class SettingsError(PowerctlError):
    """An unknown setting or an unusable value, named with its key."""


@dataclass(frozen=True)
class Setting:
    key: str
    default: bool | int | float | str  # as pyproject.toml holds it (a list: text separated by commas)
    kind: Kind
    help: str
    readers: str = SERVER
    group: str = ""  # one of GROUPS (docs/generate.py refuses another)
    fingerprint: bool = True
    """False: it changes nothing a round computes; a resumed run may change it (`fl_server.resume`)."""

    @property
    def attr(self) -> str:
        return self.key.replace("-", "_")

    def typed_default(self) -> Any:
        return self.kind(self.default)


def key_of(name: str) -> str:
    """The run config key of the setting whose attribute is `name` (a key is taken as is)."""
    return name.replace("_", "-")


@dataclass
class _Default:
    """A setting field's default_factory: its declared default, read when an object is made."""

    key: str = ""

    def __call__(self) -> Any:
        return SETTINGS[self.key].typed_default()


def setting_field(
    group: str, default: bool | int | float | str, kind: Kind, help: str, *, fingerprint: bool = True
) -> Any:
    """A run setting, declared as a dataclass field of its group class (``lr_max: float =
    setting_field("task", 0.002, Number(...), "help")``); `group` is its table in the docs."""
    declared = Setting("", default, kind, help, readers="", group=group, fingerprint=fingerprint)
    return dataclasses.field(default_factory=_Default(), metadata={SETTING_METADATA: declared})


@dataclass(frozen=True, kw_only=True)
class SentSettings:
    """The settings the ServerApp reads and sends to every client (`TrainInstructions`)."""

    model: str = setting_field(
        "task",
        "resnet18-small",
        MODEL,
        "The model to fine-tune, a registered model name (`fl-server pretrain --help` lists the built-ins); "
        "cnn-tiny is the smoke tests' (profiling then outweighs its seconds of training).",
    )
    relation_rule: str = setting_field(
        "task",
        DEFAULT_RELATION_RULE,
        Choice(RELATION_RULES),
        "How clients read the relation: Algorithm 1 on its mean (mean), the least mean regret over "
        "the seeds' vectors (robust), or its mean with the larger batch size winning among the pairs the "
        f"seeds cannot tell from the best ({INTERVAL_STANDARD_ERRORS:g} standard errors of each seed's "
        "own ratio between the two batch sizes) (interval).",
    )
    target_accuracy: float = setting_field(
        "task",
        0.5,
        Number(0.0, 1.0, above=True),
        "The test accuracy to reach: of the relation estimate and of every client.",
    )
    lr_max: float = setting_field(
        "task", 0.002, Number(0.0, 10.0, above=True), "Learning rate of the largest batch size."
    )
    lr_rule: str = setting_field(
        "task",
        "sqrt",
        Choice(LR_RULES),
        "How the rate scales to smaller batch sizes, in the relation estimate (part of its cache key) and "
        "on the clients: sqrt (the paper's, for Adam/AdamW), linear or constant.",
    )
    budget_samples: int = setting_field(
        "rounds", 6000, Integer(0, MAX_COUNT), "Each client's training samples per round (0: no budget)."
    )
    budget_device_s: float = setting_field(
        "rounds", 0.0, Number(0.0), "Each client's device seconds of training per round (0: none)."
    )
    eval_every_samples: int = setting_field(
        "rounds",
        256,
        Integer(1, MAX_COUNT),
        "Clients evaluate every this many training samples, the relation estimate at least this often "
        "(a run that crosses the target within a few evaluations is run again more densely): the "
        "resolution of samples to target.",
    )
    eval_max_samples: int = setting_field(
        "rounds", 300, Integer(1, MAX_COUNT), "Most test samples an evaluation uses (a fixed subset)."
    )
    profile_order: str = setting_field(
        "profiling",
        "efficient",
        Choice(PROFILE_ORDERS),
        "How a client profiles its board: efficient (each batch size up to the cap; no cap: the whole "
        "grid), grid (every pair), fitted (a few pairs measured, the rest predicted, the choice confirmed: "
        "docs/design/fitted-profiling.md). Under a cap that changes every order profiles the grid.",
    )
    profile_samples: int = setting_field(
        "profiling", 4000, Integer(1, MAX_COUNT), "N of T_N: the samples a profile's times are given for."
    )
    profile_warmup: int = setting_field(
        "profiling", 1, Integer(0, MAX_STEPS), "Warm-up steps per profiled pair."
    )
    profile_steps: int = setting_field(
        "profiling", 2, Integer(1, MAX_STEPS), "Measured steps per profiled pair."
    )
    profiling_budget: float = setting_field(
        "profiling",
        0.01,
        Number(0.0, 1.0),
        "Share of its predicted training a client (ours) may spend profiling: the profile-order if it "
        "fits, else the fitted order, else its predicted profile's choice, confirmed by the training's first "
        "steps (0: no budget, always the profile-order).",
    )
    seed: int = setting_field(
        "rounds",
        0,
        Integer(0, MAX_SEED),
        "The clients' training seed; with the node's name, the seed of a simulated board's sensor noise.",
    )
    checkpoint_every_samples: int = setting_field(
        "results",
        4096,
        Integer(0, MAX_COUNT),
        "Clients checkpoint their fine-tune this often (at the next evaluation) and resume it when the "
        "same work comes again (0: never).",
    )
    guard_window: int = setting_field(
        "power",
        DEFAULT_WINDOW,
        Integer(1, MAX_COUNT),
        "Power guard: consecutive training steps over cap × (1 + guard-tolerance) before a client steps "
        "its frequency down (docs/design/power-guard.md).",
    )
    guard_tolerance: float = setting_field(
        "power",
        DEFAULT_TOLERANCE,
        Number(0.0, 1.0, below=True),
        "Power guard: relative excess over the cap a reading may show (the sensor's noise band); 0 guards "
        "the cap exactly.",
    )
    cap_poll_s: float = setting_field(
        "power",
        DEFAULT_POLL_S,
        Number(*POLL_S_RANGE, unit="seconds"),
        "A client paused because nothing fits under its changing cap reads the cap this often "
        "(docs/design/changing-caps.md).",
    )
    cap_pause_timeout_s: float = setting_field(
        "power",
        DEFAULT_PAUSE_TIMEOUT_S,
        Number(0.0, above=True, unit="seconds"),
        "A client paused under its changing cap gives up after this long (one error line, its frequency "
        "restored).",
    )
    profile_source: str = setting_field(
        "profiling",
        "measured",
        Choice(PROFILE_SOURCES),
        "measured (profile each device, cached) or predicted (a simulated board's noise-free model "
        "profile, no device time: scale mode).",
    )


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """The settings the ClientApp reads (`client_setting`); the ServerApp checks them before round 1."""

    fleet: str = setting_field(
        "fleet",
        "sim:jetson-nano@3.0, sim:jetson-tx2nx@4.5, sim:jetson-nano@none, sim:jetson-tx2nx@3.5",
        FLEET,
        "Device and cap of nodes without a device in their node config, by partition id: a table "
        "DEVICE@CAP, ... (CAP in W or none; partition i takes entry i mod its length) or a YAML fleet "
        "file (docs/reference/node-config.md#the-fleet-table).",
    )
    client_data: str = setting_field(
        "fleet", "synthetic-image", DATASET, "The data split among the nodes that have no data of their own."
    )
    client_data_seed: int = setting_field(
        "fleet", 2, Integer(0, MAX_SEED), "Seed of the client data and its split."
    )
    partitioning: str = setting_field(
        "fleet",
        "iid",
        Choice(PARTITION_SCHEMES),
        "How client data is shared out: iid, or dirichlet (label skew).",
    )
    dirichlet_alpha: float = setting_field(
        "fleet",
        0.5,
        Number(0.0, above=True),
        "The Dirichlet concentration of dirichlet partitioning (smaller: more label skew).",
    )
    profile_cache: str = setting_field(
        "profiling",
        "",
        FOLDER,
        "An absolute folder for the clients' profile cache; empty: $POWERFED_CACHE/profile.",
    )
    inject_failures: str = setting_field(
        "faults",
        "",
        FAULTS,
        "Soak tests only (POWERFED_FAULT_INJECTION=1): failures per train message, KIND:P,... with KIND "
        "in raise, hang, kill, drawn from (seed, node, round), e.g. raise:0.1,hang:0.05.",
    )
    inject_seed: int = setting_field(
        "faults", 0, Integer(0, MAX_SEED), "Soak tests only: the seed of injected failures."
    )
    inject_hang_s: float = setting_field(
        "faults",
        60.0,
        Number(0.0, 3600.0, above=True, below=True, unit="seconds"),
        "Soak tests only: how long an injected hang sleeps.",
    )


@dataclass(frozen=True, kw_only=True)
class RunSettings(ClientSettings, SentSettings):
    """The run config, checked and typed (`read_settings`): the sent and client groups, then the settings
    only the ServerApp reads; `SETTINGS` is in this order."""

    num_server_rounds: int = setting_field(
        "rounds",
        2,
        Integer(1, MAX_ROUNDS),
        "Rounds of federated training (each: train, evaluate).",
        fingerprint=False,
    )
    weights: str = setting_field(
        "task",
        "",
        APP_FILE,
        "Weights (safetensors) to start from, absolute or relative to the app folder; empty: pre-train "
        "on pretrain-data (cached in $POWERFED_CACHE/weights: docs/reference/files.md#caches-checkpoints-"
        "and-board-records).",
    )
    pretrain_data: str = setting_field(
        "task", "synthetic-image", DATASET, "Pre-training data, when `weights` is empty."
    )
    pretrain_samples: int = setting_field("task", 2000, Integer(1, MAX_COUNT), "Pre-training samples.")
    pretrain_seed: int = setting_field("task", 0, Integer(0, MAX_SEED), "Pre-training seed.")
    server_device: str = setting_field(
        "task",
        "auto",
        TORCH_DEVICE,
        "Where the ServerApp pre-trains and estimates the relation vector: auto (the first CUDA device "
        "torch sees, else the CPU), cpu, cuda or cuda:INDEX. Not in the caches' keys: a GPU reaches the "
        "same samples to target up to floating-point nondeterminism (docs/howto/server-gpu.md).",
        fingerprint=False,
    )
    relation: str = setting_field(
        "task",
        "",
        APP_FILE,
        "A relation vector file (powerctl.relation/2: "
        "docs/reference/files.md#relation-vector-powerctlrelation2) for the same model, absolute or "
        "relative to the app folder; empty: estimate it on proxy-data (cached in $POWERFED_CACHE/relation).",
    )
    proxy_data: str = setting_field(
        "task", "synthetic-image", DATASET, "The proxy data the relation vector is estimated on."
    )
    proxy_seed: int = setting_field(
        "task",
        1,
        Integer(0, MAX_SEED),
        "Seed of the proxy data (generated data; the image train/test split).",
    )
    relation_seeds: list[int] = setting_field(
        "task",
        "0,1,2",
        distinct_ints(0, "0,1,2", maximum=MAX_SEED),
        "Training seeds of the relation estimate, each batch size trained once per seed: samples to "
        "target is the mean over them (see relation-values), and the file keeps every seed's.",
    )
    relation_max_samples: int = setting_field(
        "task",
        16000,
        Integer(1, MAX_COUNT),
        "Most samples a relation run trains: a batch size that has not reached the target by then is an "
        "error that says what to change.",
    )
    relation_max_seeds: int = setting_field(
        "task",
        0,
        Integer(0, 64),
        "Seeds are added beyond relation-seeds until the batch sizes' ranking is stable, up to this many "
        "in all (0: relation-seeds only).",
    )
    relation_values: str = setting_field(
        "task",
        "raw",
        Choice(VECTORS),
        "The vector clients use: the seeds' means (raw) or the batch-efficiency fit to them (fitted).",
    )
    batch_sizes: list[int] = setting_field(
        "task",
        "8,16,32,64",
        distinct_ints(1, "8,16,32,64", ascending=True, maximum=MAX_BATCH_SIZE),
        "Batch sizes of the relation vector, and so of every profile.",
    )
    results_dir: str = setting_field(
        "results",
        "",
        FOLDER,
        "An absolute folder for results.json and global.safetensors; empty: "
        "$XDG_DATA_HOME/powerfed/runs/RUN_ID (default ~/.local/share/powerfed/runs/RUN_ID). `make run` "
        "sets runs/flwr.",
        fingerprint=False,
    )
    resume: bool = setting_field(
        "results",
        True,
        Flag(),
        "Continue after the last completed round of this run found in results-dir; false: start over, "
        "the old files renamed aside (docs/design/federation.md#resuming).",
        fingerprint=False,
    )
    round_timeout: float = setting_field(
        "rounds",
        3600.0,
        Number(0.0, above=True, unit="seconds"),
        "Seconds a round waits for its replies; a client that has not replied is named timeout.",
        fingerprint=False,
    )
    rejoin_wait_s: float = setting_field(
        "rounds",
        30.0,
        Number(0.0, unit="seconds"),
        "Seconds a round waits for nodes that were connected before and are not now (a SuperNode "
        "restarting, a SuperLink back from a restart) before it goes on without them; each is waited "
        "for once.",
        fingerprint=False,
    )
    min_nodes: int = setting_field(
        "rounds",
        1,
        Integer(1, MAX_BOARDS),
        "A run starts once this many nodes are connected (deployment: the number of boards); later rounds "
        "take whoever is connected.",
    )
    fraction_train: float = setting_field(
        "rounds", 1.0, Number(0.0, 1.0), "FedAvg's share of the connected nodes sampled to train each round."
    )
    clients_per_round: int = setting_field(
        "rounds",
        0,
        Integer(0, MAX_BOARDS),
        "Simulation: the boards sampled to train and evaluate each round among those available, seeded by "
        "`seed` and the round (strategies/population.py); 0: every connected node, as `fraction-train` says.",
    )
    availability: float = setting_field(
        "rounds",
        1.0,
        Number(0.0, 1.0),
        "Simulation: each board's chance to be available in a round (seeded by `seed` and the round); "
        "an unavailable board is not sampled. 1: always there.",
    )
    availability_trace: str = setting_field(
        "rounds",
        "",
        APP_FILE,
        "Simulation: instead of `availability`, a CSV of the rounds each board is there "
        "(board,first-round,last-round; docs/reference/files.md#availability-trace), absolute or relative "
        "to the app folder; a board it does not name is never available. Empty: `availability` decides.",
    )
    fraction_evaluate: float = setting_field(
        "rounds",
        1.0,
        Number(0.0, 1.0),
        "FedAvg's share of the connected nodes sampled to evaluate each round.",
    )
    round_objective: str = setting_field(
        "rounds",
        "time",
        Choice(ROUND_OBJECTIVES),
        "time: every client its fastest pair (the paper); energy-under-deadline: each client its "
        "least-energy pair that meets the round's deadline, for ours (docs/design/deadline-rounds.md).",
    )
    round_deadline_s: float = setting_field(
        "rounds",
        0.0,
        Number(0.0, unit="seconds"),
        "Energy-under-deadline rounds: the deadline in device seconds (0: the slowest client's predicted "
        "fastest time).",
    )
    methods: list[str] = setting_field(
        "rounds",
        "ours",
        distinct_names(RUN_METHODS),
        "The methods to run one after another from the same weights, relation and fleet (ours, "
        "state-of-practice, proxy-batch, oracle, ours-deadline); with several, one results folder each "
        "(docs/design/method.md#baselines).",
    )
    real_share: float = setting_field(
        "profiling",
        1.0,
        Number(0.0, 1.0),
        "Scale mode: the share of clients (spread evenly over partition ids) that fine-tune the real "
        "model; the others run the stand-in (docs/howto/fleets.md#scale-mode).",
    )
    inject_server_stop_round: int = setting_field(
        "faults",
        0,
        Integer(0, MAX_ROUNDS),
        "Soak tests only: the ServerApp stops as if it crashed once this round's replies are in (0: never).",
        fingerprint=False,
    )


def _field_type(kind: Kind) -> Any:
    """The type a setting's field is annotated with: its kind's (a list's items' too)."""
    if isinstance(kind, Distinct):
        return types.GenericAlias(list, (kind.item.python_type,))
    return kind.python_type


def _declare(cls: type, readers: Mapping[type, str]) -> dict[str, Setting]:
    """{key: Setting} of `cls`'s setting fields in order, each read by `readers` of the class declaring
    it; a field whose type is not its kind's is one SettingsError line."""
    owner = {name: who for c, who in readers.items() for name in inspect.get_annotations(c)}
    hints = typing.get_type_hints(cls)
    out: dict[str, Setting] = {}
    for f in dataclasses.fields(cls):
        key = key_of(f.name)
        s = dataclasses.replace(f.metadata[SETTING_METADATA], key=key, readers=owner[f.name])
        if isinstance(f.default_factory, _Default):
            f.default_factory.key = key
        if hints[f.name] != _field_type(s.kind):
            name = inspect.formatannotation
            raise SettingsError(
                f"strategies.settings: setting {key!r} is declared as {f.name}: {name(hints[f.name])}; "
                f"write {f.name}: {name(_field_type(s.kind))}"
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


def settings_of(readers: Collection[str]) -> list[Setting]:
    """The declared settings read by any of `readers`, in declaration order."""
    return [s for s in SETTINGS.values() if s.readers in readers]


def to_config(obj: Any) -> dict[str, Any]:
    """{key: value} of the declared settings among `obj`'s dataclass fields, as a run config or a
    ConfigRecord holds them (lists as text)."""
    names = {f.name for f in dataclasses.fields(obj)}
    return {s.key: s.kind.to_config(getattr(obj, s.attr)) for s in SETTINGS.values() if s.attr in names}


def read_settings(run_config: Any, error: type[PowerctlError] = SettingsError) -> RunSettings:
    """Every key of `run_config` checked by its declaration, the others at their defaults; the first
    problem (an unknown key named with the nearest known one) is one `error` line."""
    r = MappingReader(run_config, "run config", error).only(SETTINGS)
    return RunSettings(**{s.attr: r.value(s.key, s.kind, s.typed_default()) for s in SETTINGS.values()})


def client_setting(run_config: Any, name: str, error: type[PowerctlError] = SettingsError) -> Any:
    """Setting `name` (its attribute) read from a run config: checked, typed, else the default."""
    s = SETTINGS[key_of(name)]
    return MappingReader(run_config, "run config", error).value(s.key, s.kind, s.typed_default())

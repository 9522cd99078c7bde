"""What a relation estimate is (`RelationRequest`, its hash the cache key; the user's part,
`RelationSettings`) and how it is made (`RelationCompute`), each checked where it is made. Run settings
take their default and check from `strategies.settings`: with nothing given, the ServerApp's estimate."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError, PowerctlError
from powerctl.files.mapping import (
    FIELD_KIND,
    Custom,
    Flag,
    FolderPath,
    Integer,
    Kind,
    Maybe,
    Text,
    check_arguments,
    check_fields,
    field_kinds,
    kind_field,
    must_be,
)
from powerctl.progress import Say
from powerfed.training.crossing import DEFAULT_MIN_EVALUATIONS
from powerfed.training.finetune_records import FineTuneConfig
from powerfed.training.lr import scaled_lr
from powerfed.training.models import MAX_SEQ_LEN
from powerfed.training.numerics import numerics_key
from strategies.settings import SETTINGS, key_of

WHERE = "estimate_relation"  # the call every refusal of an estimate's arguments names
CACHE_VERSION = 2
"""Bump when a code change alters what a relation estimate would be: old cache entries then miss."""
# the proxy runs' settings, and what the request locates, in the cache key
RUNS_KEY = ("limit", "data_seed", "max_samples", "eval_every_samples", "eval_max_samples", "min_evaluations")
WHAT_KEY = ("model", "overrides", "weights_sha256", "proxy_spec", "proxy_sha256", "seq_len", "model_entry")


class RelationError(PowerctlError):
    """The relation vector cannot be estimated as asked (a batch size never reached the target, ...)."""


class NotCached(RelationError):
    """`estimate_relation(compute=False)` found no cached vector for its settings."""


def each(item: Kind, what: str) -> Custom:
    """A list (or tuple) of distinct values that `item` accepts, not empty, given back as a tuple; text
    is not a list."""

    def parse(value: Any) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise must_be(f"a list of {what}", value)
        items = tuple(item(v) for v in value)
        if not items or len(set(items)) != len(items):
            raise must_be(f"a non-empty list of distinct {what}", value)
        return items

    return Custom(parse, f"a list of {what}")


RUN_SETTING = "run_setting"  # the field metadata naming the run setting a RelationSettings field is


def _run(attr: str, *, optional: bool = False) -> Any:
    """A field that is the run setting `attr`, its default and kind (`optional`: None too, for a 0)."""
    s = SETTINGS[key_of(attr)]
    default = s.typed_default()
    kind: Kind = Maybe(s.kind) if optional else s.kind
    default = (default or None) if optional else default
    if isinstance(default, list):
        default, kind = tuple(default), each(getattr(s.kind, "item", s.kind), getattr(s.kind, "what", ""))
    return field(default=default, metadata={FIELD_KIND: kind, RUN_SETTING: attr})


@dataclass(frozen=True)
class RelationSettings:
    """How the proxy runs of a relation estimate run (beside its model, weights, proxy, target and batch
    sizes); a field that is a run setting has its default, check and help (`strategies.settings`).
    Checked when made: one ArgumentError line naming the setting; numpy's numbers become plain ones."""

    seeds: Sequence[int] = _run("relation_seeds")
    lr_max: float = _run("lr_max")
    lr_rule: str = _run("lr_rule")
    max_samples: int = _run("relation_max_samples")
    eval_every_samples: int = _run("eval_every_samples")
    eval_max_samples: int | None = _run("eval_max_samples", optional=True)
    min_evaluations: int = kind_field(Integer(1), DEFAULT_MIN_EVALUATIONS)
    """Evaluations before the crossing; a run that crossed sooner runs again, denser (`run_dense`)."""
    max_seeds: int | None = _run("relation_max_seeds", optional=True)
    vector: str = _run("relation_values")
    seq_len: int | None = kind_field(Maybe(Integer(1, MAX_SEQ_LEN)), None)
    """A text model's sequence length (None: the model's)."""
    limit: int | None = kind_field(Maybe(Integer(1)), None)
    """Proxy samples to use at most (None: all)."""
    data_seed: int = _run("proxy_seed")
    overrides: dict[str, Any] | None = None
    """The model's options; with weights, those they were built with."""

    def __post_init__(self) -> None:
        check_fields(self, WHERE, field_kinds(RelationSettings))
        if self.overrides is not None and not isinstance(self.overrides, dict):
            raise ArgumentError(
                f"{WHERE}: 'overrides' must be a dict of the model's options, got {self.overrides!r}"
            )
        if self.max_seeds and self.max_seeds < (n := len(self.seeds)):
            raise RelationError(f"max_seeds ({self.max_seeds}) is fewer than the {n} seeds given")


@dataclass(frozen=True)
class RelationCompute:
    """Where a relation estimate is cached and how it is computed and shown: nothing here changes the
    vector (the thread count `parallel` implies is in the key). Checked when made."""

    cache_key: str | None = None
    """Names the version of the user's code (model, loss, metric, step or loop): only then is such an
    estimate cached, and it must change when that code does."""
    cache_dir: str | Path | None = None
    """The cache's folder (None: $POWERFED_CACHE/relation or $XDG_CACHE_HOME/powerfed/relation)."""
    use_cache: bool = kind_field(Flag(), True)
    compute: bool = kind_field(Flag(), True)
    """False: nothing trains; the cached vector, else `NotCached`."""
    parallel: bool = kind_field(Flag(), False)
    """The runs as Ray tasks of one torch thread each, where the model and callables pickle."""
    num_cpus: int | None = kind_field(Maybe(Integer(1)), None)
    """CPUs of the Ray started here (None: one per run, at most this machine's)."""
    device: str = kind_field(Text(what="a torch device: auto, cpu or cuda[:INDEX]"), "auto")
    progress: bool = kind_field(Flag(), True)
    """A bar on stderr where it is a terminal."""
    say: Say | None = None
    """Hears a line per finished run: progress where no terminal shows a bar (a ServerApp's log)."""

    def __post_init__(self) -> None:
        check_fields(self, WHERE, field_kinds(RelationCompute))  # a flag is a bool: "no" must not train
        if self.cache_dir is not None:  # '' is the working directory, not the default cache (None)
            folder = FolderPath("a folder path (leave it out, or None, for the default cache)")
            check_arguments(WHERE, cache_dir=(self.cache_dir, folder))
        key = self.cache_key
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise RelationError(f"cache_key must be a non-empty string naming the user code, got {key!r}")


@dataclass(frozen=True)
class RelationRequest:
    """Everything that determines a relation estimate; its `cache_key` names the cache's file. Made from
    a call's target, batch sizes and settings, then completed once the model, weights and proxy are found."""

    target_accuracy: float = kind_field(SETTINGS[key_of("target_accuracy")].kind)
    batch_sizes: Sequence[int] = kind_field(_run("batch_sizes").metadata[FIELD_KIND])
    """Kept sorted, as a tuple: the largest last (the vector's denominator)."""
    settings: RelationSettings = field(default_factory=RelationSettings)
    threads: int = 1
    """torch's intra-op thread count: another sums in another order, enough to move a crossing."""
    model: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    """The model's options, as its weights were built with."""
    weights_sha256: str = ""
    """Hash of the starting weights' tensors, or ``init:SEED`` for a seeded fresh initialisation."""
    proxy_spec: str = ""
    proxy_sha256: str | None = None
    seq_len: int | None = None  # None for an image model
    user_key: str | None = None
    """The user's `cache_key` where user code is involved (None for the project's own models)."""
    model_entry: dict[str, Any] = field(default_factory=dict)
    """The registry entry's defaults, input shape and task: a name registered again differently differs."""
    own_loop: bool = False
    """The user's `train_to_target`: its data, budgets and evaluation are its own (keyed as none)."""

    def __post_init__(self) -> None:
        check_fields(self, WHERE, field_kinds(RelationRequest))
        object.__setattr__(self, "batch_sizes", tuple(sorted(self.batch_sizes)))

    @property
    def max_seeds(self) -> int:
        """Seeds at most: those given, or `max_seeds` where it is more."""
        return max(len(self.settings.seeds), self.settings.max_seeds or 0)

    @property
    def lrs(self) -> list[float]:
        s, largest = self.settings, self.batch_sizes[-1]
        return [scaled_lr(s.lr_max, b, largest, s.lr_rule) for b in self.batch_sizes]

    def runs_key(self) -> dict[str, Any]:
        """The proxy runs' part of the key: none for the user's own loop."""
        none = {"limit": None, "eval_max_samples": None}
        return {k: none.get(k, 0) if self.own_loop else getattr(self.settings, k) for k in RUNS_KEY}

    def cache_key(self) -> str:
        s = self.settings
        fields = {
            **{k: getattr(self, k) for k in (*WHAT_KEY, "target_accuracy")},
            **{k: getattr(s, k) for k in ("lr_max", "lr_rule", "vector")},
            **self.runs_key(),
            "batch_sizes": list(self.batch_sizes),
            "seeds": list(s.seeds),
            "max_seeds": self.max_seeds,
            "cache_version": CACHE_VERSION,
            **({} if self.user_key is None else {"user_key": self.user_key}),  # None: the keys they had
            **numerics_key(self.threads),
        }
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()

    def jobs(self, seeds: Sequence[int]) -> list[FineTuneConfig]:
        """Every batch size × seed, each with its scaled rate."""
        budgets = {k: getattr(self.settings, k) for k in RUNS_KEY[2:5]}  # the budgets and evaluations
        return [
            FineTuneConfig(batch_size=b, lr=lr, target_accuracy=self.target_accuracy, seed=seed, **budgets)
            for b, lr in zip(self.batch_sizes, self.lrs, strict=True)
            for seed in seeds
        ]


def check_record(name: str, value: Any, kind: type) -> Any:
    """An argument that must be a `kind` record or None: one ArgumentError line otherwise."""
    if value is not None and not isinstance(value, kind):
        raise ArgumentError(f"{WHERE}: {name!r} must be a {kind.__name__} or None, got {value!r}")
    return value

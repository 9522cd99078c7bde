"""The ServerApp's settings, read from Flower's run config (`[tool.flwr.app.config]` + `--run-config`).

Every key is checked before any expensive work starts; a bad one is one line naming the key, the value
and what is expected. Paths must be absolute (or relative to the app folder): the ServerApp runs from
Flower's copy of the app, not from the folder `flwr run` was started in.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from powerctl.follow import DEFAULT_PAUSE_TIMEOUT_S, DEFAULT_POLL_S
from powerctl.guard import DEFAULT_TOLERANCE, DEFAULT_WINDOW
from strategies.protocol import PROFILE_ORDERS, PROFILE_SOURCES, ROUND_OBJECTIVES, RUN_METHODS
from training.lr import LR_RULES

APP_DIR = Path(__file__).resolve().parents[1]
"""The app's root (the project folder, or Flower's copy of it): relative paths start here."""


class RunConfigError(PowerctlError):
    """A run config key is missing or holds a value that cannot be used."""


@dataclass(frozen=True)
class ServerConfig:
    """The run, as the server runs it: model and task, where weights and relation come from, rounds."""

    num_server_rounds: int = 2
    model: str = "cnn-tiny"
    weights: str = ""
    """A weights file (safetensors) to start from; empty = pre-train on `pretrain_data` (cached)."""
    pretrain_data: str = "synthetic-image"
    pretrain_samples: int = 2000
    pretrain_seed: int = 0
    relation: str = ""
    """A relation vector file (powerctl.relation/1); empty = estimate on `proxy_data` (cached)."""
    proxy_data: str = "synthetic-image"
    proxy_seed: int = 1
    relation_seeds: str = "0,1,2"
    relation_max_samples: int = 16000
    target_accuracy: float = 0.7
    batch_sizes: str = "8,16,32,64"
    lr_max: float = 2e-3
    lr_rule: str = "sqrt"
    budget_samples: int = 6000
    budget_device_seconds: float = 0.0
    eval_every_samples: int = 128
    eval_max_samples: int = 300
    profile_order: str = "efficient"
    profile_samples: int = 4000
    profile_warmup: int = 1
    profile_steps: int = 2
    seed: int = 0
    results_dir: str = ""
    """Absolute folder for results.json; empty = ~/.local/share/powerfed/runs/RUN_ID."""
    checkpoint_every_samples: int = 4096
    """Clients checkpoint their fine-tune this often and resume it when restarted (0: never)."""
    resume: bool = True
    """Continue from the last completed round of the same run found in `results_dir`."""
    inject_server_stop_round: int = 0
    """Soak tests only (POWERFED_FAULT_INJECTION=1): the ServerApp stops, as if it crashed, once this
    round's training replies are in, before the round completes (0: never)."""
    round_timeout: float = 3600.0
    min_nodes: int = 1
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    guard_window: int = DEFAULT_WINDOW
    """Power guard: consecutive over-cap training steps before a client steps its frequency down."""
    guard_tolerance: float = DEFAULT_TOLERANCE
    """Power guard: relative excess over the cap a reading may show (the sensor's noise band)."""
    round_objective: str = "time"
    """time: every client its fastest pair; energy-under-deadline: the least-energy pair meeting the
    round's deadline (ours; `ours-deadline` in `methods` runs it beside the others)."""
    round_deadline_s: float = 0.0
    """Energy-under-deadline rounds: the deadline in device seconds (0: the slowest client's fastest)."""
    cap_poll_s: float = DEFAULT_POLL_S
    """A client paused because nothing fits under its changing cap reads the cap this often."""
    cap_pause_timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S
    """... and gives up after this long paused (one error line, frequency restored)."""
    methods: str = "ours"
    """The methods to run one after another, each from the same weights: ours, state-of-practice,
    proxy-batch, oracle (comma-separated)."""
    profile_source: str = "measured"
    """measured (profile each device, cached) or predicted (a simulated board's model: scale mode)."""
    real_share: float = 1.0
    """Scale mode: the share of clients that fine-tune the real model; the others run the stand-in."""

    def method_list(self) -> list[str]:
        names = [m.strip() for m in self.methods.split(",") if m.strip()]
        if not names or len(set(names)) != len(names) or any(m not in RUN_METHODS for m in names):
            raise RunConfigError(
                f"run config 'methods' must be distinct names from {', '.join(RUN_METHODS)}, "
                f"got {self.methods!r}"
            )
        return names

    def seeds(self) -> list[int]:
        return _int_list(self.relation_seeds, "relation-seeds", minimum=0)

    def batch_size_list(self) -> list[int]:
        return sorted(_int_list(self.batch_sizes, "batch-sizes", minimum=1))


def _int_list(text: str, key: str, *, minimum: int) -> list[int]:
    try:
        values = [int(t) for t in text.replace(";", ",").split(",") if t.strip()]
    except ValueError:
        raise RunConfigError(
            f"run config {key!r} must be integers separated by commas, got {text!r}"
        ) from None
    if not values or any(v < minimum for v in values) or len(set(values)) != len(values):
        raise RunConfigError(f"run config {key!r} must be distinct integers ≥ {minimum}, got {text!r}")
    return values


_SERVER_ONLY = {f.name.replace("_", "-") for f in fields(ServerConfig)}
CLIENT_KEYS = {
    "fleet",
    "client-data",
    "client-data-seed",
    "partitioning",
    "dirichlet-alpha",
    "profile-cache",
    "inject-failures",
    "inject-seed",
    "inject-hang-s",
}
"""Run config keys the ClientApp reads (fl_client.node, fl_client.local_data, fl_client.faults: soak
tests only)."""


def _check(key: str, value: Any, default: Any) -> Any:
    """`value` as the type of `default`, or one RunConfigError line."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise RunConfigError(f"run config {key!r} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RunConfigError(f"run config {key!r} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RunConfigError(f"run config {key!r} must be a finite number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise RunConfigError(f"run config {key!r} must be a string, got {value!r}")
    return value.strip()


def parse_server_config(run_config: Any) -> ServerConfig:
    """Check every key the server uses; unknown keys are refused (a typo must not pass silently)."""
    unknown = sorted(set(run_config) - _SERVER_ONLY - CLIENT_KEYS)
    if unknown:
        known = ", ".join(sorted(_SERVER_ONLY | CLIENT_KEYS))
        raise RunConfigError(f"run config has unknown key {unknown[0]!r}; known keys: {known}")
    defaults = ServerConfig()
    values = {}
    for f in fields(ServerConfig):
        key = f.name.replace("_", "-")
        if key in run_config:
            values[f.name] = _check(key, run_config[key], getattr(defaults, f.name))
    cfg = ServerConfig(**values)
    _validate(cfg)
    return cfg


def _validate(cfg: ServerConfig) -> None:
    from training.models import model_names

    def need(ok: bool, key: str, value: Any, what: str) -> None:
        if not ok:
            raise RunConfigError(f"run config {key!r} {what}, got {value!r}")

    need(cfg.model in model_names(), "model", cfg.model, f"must be one of {', '.join(model_names())}")
    need(0 < cfg.target_accuracy <= 1, "target-accuracy", cfg.target_accuracy, "must be in (0, 1]")
    need(cfg.num_server_rounds >= 1, "num-server-rounds", cfg.num_server_rounds, "must be ≥ 1")
    need(cfg.lr_max > 0, "lr-max", cfg.lr_max, "must be > 0")
    need(cfg.lr_rule in LR_RULES, "lr-rule", cfg.lr_rule, f"must be one of {', '.join(LR_RULES)}")
    need(
        cfg.profile_order in PROFILE_ORDERS,
        "profile-order",
        cfg.profile_order,
        "must be efficient, grid or fitted",
    )
    need(cfg.budget_samples >= 0, "budget-samples", cfg.budget_samples, "must be ≥ 0 (0: none)")
    need(cfg.budget_device_seconds >= 0, "budget-device-seconds", cfg.budget_device_seconds, "must be ≥ 0")
    for key in ("pretrain-samples", "relation-max-samples", "eval-every-samples", "eval-max-samples"):
        v = getattr(cfg, key.replace("-", "_"))
        need(v >= 1, key, v, "must be ≥ 1")
    for key in ("profile-samples", "profile-steps", "min-nodes"):
        v = getattr(cfg, key.replace("-", "_"))
        need(v >= 1, key, v, "must be ≥ 1")
    need(
        cfg.checkpoint_every_samples >= 0,
        "checkpoint-every-samples",
        cfg.checkpoint_every_samples,
        "must be ≥ 0",
    )
    stop = cfg.inject_server_stop_round
    need(stop >= 0, "inject-server-stop-round", stop, "must be ≥ 0 (0: never)")
    need(
        not stop or os.environ.get("POWERFED_FAULT_INJECTION") == "1",
        "inject-server-stop-round",
        stop,
        "is for soak tests only (POWERFED_FAULT_INJECTION=1)",
    )
    need(cfg.profile_warmup >= 0, "profile-warmup", cfg.profile_warmup, "must be ≥ 0")
    need(cfg.seed >= 0, "seed", cfg.seed, "must be ≥ 0")
    need(cfg.round_timeout > 0, "round-timeout", cfg.round_timeout, "must be > 0 seconds")
    need(cfg.guard_window >= 1, "guard-window", cfg.guard_window, "must be ≥ 1")
    need(0 <= cfg.guard_tolerance < 1, "guard-tolerance", cfg.guard_tolerance, "must be in [0, 1)")
    need(cfg.cap_poll_s > 0, "cap-poll-s", cfg.cap_poll_s, "must be > 0 seconds")
    need(
        cfg.round_objective in ROUND_OBJECTIVES,
        "round-objective",
        cfg.round_objective,
        f"must be one of {', '.join(ROUND_OBJECTIVES)}",
    )
    need(
        cfg.round_deadline_s >= 0, "round-deadline-s", cfg.round_deadline_s, "must be ≥ 0 (0: the slowest's)"
    )
    need(cfg.cap_pause_timeout_s > 0, "cap-pause-timeout-s", cfg.cap_pause_timeout_s, "must be > 0 seconds")
    for key in ("fraction-train", "fraction-evaluate"):
        v = getattr(cfg, key.replace("-", "_"))
        need(0 <= v <= 1, key, v, "must be in [0, 1]")
    need(
        cfg.profile_source in PROFILE_SOURCES,
        "profile-source",
        cfg.profile_source,
        "must be measured or predicted",
    )
    need(0 <= cfg.real_share <= 1, "real-share", cfg.real_share, "must be in [0, 1]")
    cfg.method_list()
    cfg.seeds()
    cfg.batch_size_list()
    if cfg.results_dir:
        need(
            Path(cfg.results_dir).expanduser().is_absolute(),
            "results-dir",
            cfg.results_dir,
            "must be an absolute path (the ServerApp does not run in the folder flwr run started in)",
        )


def app_path(value: str, key: str) -> Path:
    """A file named in the run config: absolute, or relative to the app folder; it must exist."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = APP_DIR / path
    if not path.is_file():
        raise RunConfigError(f"run config {key!r}: no such file {path} (give an absolute path)")
    return path

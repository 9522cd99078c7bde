"""Injected failures for soak tests (a ClientApp raises, hangs or dies), only where
``POWERFED_FAULT_INJECTION=1``; each is drawn from (seed, node, round) and logged before it acts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from strategies.setting_kinds import FAULT_KINDS, parse_fault_spec
from strategies.settings import client_setting

SWITCH_ENV = "POWERFED_FAULT_INJECTION"
LOG_ENV = "POWERFED_FAULT_LOG"
KILL_EXIT_STATUS = 137


class FaultConfigError(PowerctlError):
    """Fault injection asked for where it is not allowed, or written wrongly."""


class InjectedFailure(RuntimeError):
    """An injected "raise": not a PowerctlError, so it leaves the handler as a bug does (error code 2)."""


@dataclass(frozen=True)
class Faults:
    probabilities: dict[str, float]
    seed: int = 0
    hang_s: float = 60.0

    def draw(self, node: str, server_round: int) -> str | None:
        """The failure for this node's train message of this round (None: none), repeatable."""
        blob = f"{self.seed}/{node}/{server_round}".encode()
        u = int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") / 2**64
        edges = accumulate(self.probabilities.get(kind, 0.0) for kind in FAULT_KINDS)
        return next((kind for kind, edge in zip(FAULT_KINDS, edges, strict=True) if u < edge), None)


def parse_faults(run_config: Any) -> Faults | None:
    """The run's fault injection, None when it asks for none; one FaultConfigError line otherwise."""
    setting = partial(client_setting, run_config, error=FaultConfigError)
    spec = setting("inject-failures")
    if not spec:
        return None
    if os.environ.get(SWITCH_ENV) != "1":
        raise FaultConfigError(
            f"run config 'inject-failures' is {spec!r} but this node does not allow fault injection "
            f"(set {SWITCH_ENV}=1 in a test or bench only)"
        )
    return Faults(parse_fault_spec(spec), setting("inject-seed"), setting("inject-hang-s"))


def _log_path() -> Path | None:
    value = os.environ.get(LOG_ENV)
    return Path(value) if value else None


def logged(node: str, server_round: int, fault: str) -> bool:
    """Whether the log already holds this fault for this node's work of this round."""
    path = _log_path()
    if path is None or not path.is_file():
        return False
    want = {"node": node, "round": server_round, "fault": fault}
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line that is not JSON is skipped
            if want.items() <= json.loads(line).items():
                return True
    return False


def log_fault(node: str, server_round: int, fault: str) -> None:
    """Append the decision, durably, before acting on it (a kill leaves no chance after)."""
    path = _log_path()
    if path is None:
        return
    line = json.dumps({"node": node, "round": server_round, "fault": fault, "pid": os.getpid()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def before_training(
    faults: Faults | None, node: str, server_round: int, after_samples: int
) -> Callable[[int, int], None] | None:
    """Act on a "raise" or "hang" now; for a "kill", the `on_step` that kills the fine-tune mid-way."""
    if faults is None:
        return None
    fault = faults.draw(node, server_round)
    if fault is None or (fault == "kill" and logged(node, server_round, "kill")):
        return None  # a node killed for this work does not die again when the work comes back
    if fault == "kill":
        return kill_after_checkpoint(node, server_round, after_samples)
    log_fault(node, server_round, fault)
    if fault == "raise":
        raise InjectedFailure(f"injected failure: {node} round {server_round}")
    time.sleep(faults.hang_s)
    return None


def kill_after_checkpoint(node: str, server_round: int, after_samples: int) -> Callable[[int, int], None]:
    """An `on_step` that ends the process (as SIGKILL), logged just before, once the fine-tune has passed
    `after_samples` (its first checkpoint)."""

    def on_step(steps: int, samples: int) -> None:
        if samples > after_samples:
            log_fault(node, server_round, "kill")
            os._exit(KILL_EXIT_STATUS)

    return on_step

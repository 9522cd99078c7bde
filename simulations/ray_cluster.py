"""Which Ray cluster Flower's `ray.init()` will join (`RAY_ADDRESS` or the last `ray start --head`'s),
found as Ray finds it and checked by a TCP connect (`preflight`): a dead one makes `flwr run` hang."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from powerctl import procs
from powerctl.errors import PowerctlError

PROBE_TIMEOUT_S = 1.0
RECORD_NAME = "ray_current_cluster"


class RayClusterError(PowerctlError):
    """The Ray cluster that `ray.init()` would join is dead or misnamed: Ray would hang or fail."""


@dataclass(frozen=True)
class RayTarget:
    """The cluster `ray.init()` will use: `address` None means it starts a new local one."""

    address: str | None
    source: str  # how Ray finds it, or why none

    def describe(self) -> str:
        if self.address is None:
            return f"Ray: a new local cluster will be started ({self.source})"
        return f"Ray: the live cluster at {self.address} will be used ({self.source})"


def record_file(env: Mapping[str, str]) -> Path:
    """Where `ray start --head` records its GCS address (ray._common.utils.get_ray_address_file)."""
    base = (
        env.get("RAY_TMPDIR") or (env.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    )
    return Path(base) / "ray" / RECORD_NAME


def read_record(path: Path) -> str | None:
    """The recorded address, or None when there is no record (Ray ignores an empty file too)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RayClusterError(f"cannot read the Ray cluster record {path}: {exc.strerror}") from None
    return text or None


def raylet_gcs_addresses() -> set[str]:
    """GCS addresses of the raylets running here (`RAY_ADDRESS=auto` joins one even without a record)."""
    found: set[str] = set()
    for entry in procs.PROC.iterdir():
        argv = procs.cmdline(int(entry.name)) if entry.name.isdigit() else []
        if argv and "raylet" in os.path.basename(argv[0]):
            values = (procs.option_value(argv, name) for name in ("--gcs-address", "--gcs_address"))
            found.update(v for v in values if v and v != "None")
    return found


def split_address(address: str) -> tuple[str, int] | None:
    """HOST:PORT (a `ray://` or other scheme stripped, IPv6 in brackets allowed) → (host, port)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def find_target(env: Mapping[str, str] | None = None) -> RayTarget:
    """Resolve the cluster as Ray's `ray.init()` does; RayClusterError if it would hang or fail."""
    env = os.environ if env is None else env
    record = record_file(env)
    given = env.get("RAY_ADDRESS", "")  # empty counts as unset, as in Ray
    if given == "local":
        return RayTarget(None, "RAY_ADDRESS=local")
    if given and given != "auto":
        return _checked(given, "RAY_ADDRESS", f"RAY_ADDRESS is {given}")
    recorded = read_record(record)
    in_record = f"a Ray cluster is recorded in {record} at {recorded}"
    if not given:
        if recorded is None:
            return RayTarget(None, f"RAY_ADDRESS unset; no cluster recorded in {record}")
        return _checked(recorded, f"recorded in {record}", in_record)
    # RAY_ADDRESS=auto: a raylet running here wins over the record, unless there are several
    running = sorted(raylet_gcs_addresses())
    if running and not (len(running) > 1 and recorded is not None):
        here = running[0]
        return _checked(here, "RAY_ADDRESS=auto: a raylet on this machine", f"a raylet here names {here}")
    if recorded is not None:
        return _checked(recorded, f"RAY_ADDRESS=auto: recorded in {record}", in_record)
    raise RayClusterError(
        f"RAY_ADDRESS is auto but no Ray cluster runs on this machine (none recorded in {record}, "
        "no raylet): start one with `ray start --head`, or unset RAY_ADDRESS to start a new local cluster"
    )


def _checked(address: str, source: str, found: str) -> RayTarget:
    where = split_address(address)
    if where is None:
        raise RayClusterError(
            f"{found}, which is not HOST:PORT: set RAY_ADDRESS to HOST:PORT of a live cluster, "
            "'local' for a new local cluster, or unset it"
        )
    if procs.connect_error(*where, PROBE_TIMEOUT_S) is not None:
        advice = (
            "start that cluster, set RAY_ADDRESS to a live one, or unset it to start a new local cluster"
            if source == "RAY_ADDRESS"
            else "remove that file (`ray stop` removes it too, but stops every Ray cluster on this machine), "
            "or set RAY_ADDRESS to a live cluster, or RAY_ADDRESS=local for a new local one"
        )
        raise RayClusterError(f"{found} but nothing answers there: {advice}")
    return RayTarget(address, source)


def preflight(env: Mapping[str, str] | None = None) -> None:
    """One RayClusterError line (what was found, what to do) when Ray would join a dead cluster."""
    find_target(env)

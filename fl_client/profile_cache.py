"""Profiles on disk, one per (board, model, input shape, batch sizes, profiler settings, code version);
an entry is trusted only if it loads as a valid profile carrying the key it was stored under."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from powerctl.errors import FileFormatError
from powerctl.files.cache import cache_dir as default_cache_dir
from powerctl.records.profile import Profile

log = logging.getLogger(__name__)

PROFILE_CACHE_VERSION = 1  # bump when a code change alters what a profile would measure


@dataclass(frozen=True)
class ProfileKey:
    """Everything that decides a profile's content."""

    device_kind: str  # backend and board, e.g. SimulatedBoard/jetson-nano
    model: str
    overrides: str
    num_classes: int
    input_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    order: str
    power_cap_w: float | None  # only for the orders that depend on the cap; None for the full grid
    samples: int
    warmup_steps: int
    measure_steps: int
    relation: str | None = None  # only for the fitted order: the (b, r_b) pairs as JSON
    step: str = ""  # "" for the built-in fine-tune's step, else the user's step key (`fl_client.session`)

    def digest(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        from powerfed.training.numerics import torch_minor

        fields = asdict(self)
        if fields["relation"] is None:
            del fields["relation"]  # keys of the other orders (and their cache entries) stay as they were
        if not fields["step"]:
            del fields["step"]  # the built-in step's keys stay as they were
        fields["cache_version"] = PROFILE_CACHE_VERSION
        try:  # a new release never trusts an older release's profiles
            fields["code_version"] = version("powerfed")
        except PackageNotFoundError:
            fields["code_version"] = "unknown"
        fields["torch"] = torch_minor()
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _path(key: ProfileKey, cache_dir: Path | None) -> tuple[Path, str]:
    digest = key.digest()
    return (cache_dir or default_cache_dir("profile")) / f"profile-{digest[:40]}.json", digest


def lookup(key: ProfileKey, cache_dir: Path | None = None) -> Profile | None:
    """The profile cached under `key`, or None (none, or one that cannot be trusted: one warning line)."""
    path, digest = _path(key, cache_dir)
    if not path.is_file():
        return None
    try:
        profile = Profile.load(path)
    except FileFormatError as exc:
        log.warning("profile cache: %s; profiling again", exc)
        return None
    board = key.device_kind.split("/", 1)[-1]
    if (
        profile.extra.get("cache_key") != digest
        or profile.model != key.model
        or profile.device != board
        or tuple(profile.input_shape) != key.input_shape
        or not set(profile.batch_sizes()) <= set(key.batch_sizes)
    ):
        log.warning("profile cache: %s does not match this device and model; profiling again", path)
        return None
    return profile


def store(key: ProfileKey, profile: Profile, cache_dir: Path | None = None) -> None:
    """Cache `profile` under `key` (with the key it was stored under and the device kind it is of)."""
    path, digest = _path(key, cache_dir)
    profile.extra["cache_key"] = digest
    profile.extra["device_kind"] = key.device_kind
    profile.save(path)


def cached_profile(
    key: ProfileKey, measure: Callable[[], Profile], cache_dir: Path | None = None
) -> tuple[Profile, bool]:
    """(profile, True) from the cache, or (measure(), False) after storing it under `key`."""
    if (profile := lookup(key, cache_dir)) is not None:
        return profile, True
    profile = measure()
    store(key, profile, cache_dir)
    return profile, False


MEASURED_ORDERS = ("grid", "efficient", "fitted")


def same_kind_profiles(
    device_kind: str, workload: dict[str, Any], cache_dir: Path | None = None
) -> list[tuple[Path, Profile]]:
    """Measured profiles of this board kind and workload in the cache, whatever their cap or order."""
    found = []
    for path in sorted((cache_dir or default_cache_dir("profile")).glob("profile-*.json")):
        try:
            profile = Profile.load(path)
        except FileFormatError:
            continue
        extra = profile.extra
        if (
            extra.get("device_kind") == device_kind
            and extra.get("workload") == workload
            and extra.get("order") in MEASURED_ORDERS
        ):
            found.append((path, profile))
    return sorted(found, key=lambda item: (-len(item[1].points), str(item[0])))

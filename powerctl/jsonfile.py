"""Reading and writing the versioned JSON files of DESIGN §5, with one-line errors."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from powerctl.errors import FileFormatError


def read_json(path: str | Path, schema: str) -> dict[str, Any]:
    """Load `path` and check its ``schema`` field; any problem is one FileFormatError line."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path}: is a folder; give the {schema} file") from None
    except OSError as exc:
        raise FileFormatError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FileFormatError(f"{path}: not a text file (not UTF-8); expected {schema} JSON") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise FileFormatError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FileFormatError(f'{path}: expected a JSON object with "schema": "{schema}"')
    if "schema" not in data:
        raise FileFormatError(f'{path}: has no "schema" field; expected a {schema} file')
    if data["schema"] != schema:
        raise FileFormatError(f"{path}: schema is {data['schema']!r}, expected {schema!r}")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number this file may hold")


def write_json(path: str | Path, data: dict[str, Any], *, durable: bool = False) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a file behind.

    `durable` also fsyncs the file and its folder, so that a power loss right after the call keeps it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; these files are meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Fields:
    """Typed access to a decoded JSON object; every failure names the file and the field."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def fail(self, msg: str) -> FileFormatError:
        return FileFormatError(f"{self.where}: {msg}")

    def get(self, key: str) -> Any:
        if key not in self.data:
            raise self.fail(f"missing field {key!r}")
        return self.data[key]

    def string(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str) or not v:
            raise self.fail(f"{key!r} must be a non-empty string")
        return v

    def number(self, key: str, *, positive: bool = False, minimum: float | None = 0.0) -> float:
        return check_number(self.get(key), key, self, positive=positive, minimum=minimum)

    def integer(self, key: str, *, minimum: int = 1) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(f"{key!r} must be an integer ≥ {minimum}, got {v!r}")
        return v

    def list_of(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise self.fail(f"{key!r} must be a list")
        return v


def check_number(
    v: Any, key: str, fields: Fields, *, positive: bool = False, minimum: float | None = 0.0
) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise fields.fail(f"{key!r} must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise fields.fail(f"{key!r} must be > 0, got {v!r}")
    if minimum is not None and v < minimum:
        raise fields.fail(f"{key!r} must be ≥ {minimum}, got {v!r}")
    return float(v)

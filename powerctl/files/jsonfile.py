"""Reading and writing the versioned JSON files of docs/reference/files.md, with one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from powerctl.errors import FileFormatError
from powerctl.files.mapping import MappingReader, Number
from powerctl.files.outputs import replacing
from powerctl.files.readfile import JSON_LIMIT, read_bytes


def read_json(path: str | Path, schema: str) -> dict[str, Any]:
    """Load `path` and check its ``schema`` field; any problem is one FileFormatError line."""
    try:
        raw = read_bytes(path, limit=JSON_LIMIT, what=f"the {schema} file", error=FileFormatError)
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
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, ValueError) as exc:
        raise FileFormatError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise FileFormatError(f"{path}: nested too deeply to be a {schema} file") from None
    if not isinstance(data, dict):
        raise FileFormatError(f'{path}: expected a JSON object with "schema": "{schema}"')
    if "schema" not in data:
        raise FileFormatError(f'{path}: has no "schema" field; expected a {schema} file')
    if data["schema"] != schema:
        raise FileFormatError(f"{path}: schema is {data['schema']!r}, expected {schema!r}")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose key is given twice is refused (json keeps the last silently: a second "samples"
    edited in would replace the first without a word), as the fleet file's YAML reader does."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object; keep one")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number this file may hold")


def write_json(path: str | Path, data: dict[str, Any], *, durable: bool = False) -> None:
    """Write atomically (`powerctl.files.outputs.replacing`: temp file + rename): a crash never leaves half a
    file behind, and a path that is not a regular file (a device, a FIFO) is never replaced.

    `durable` also fsyncs the file and its folder, so that a power loss right after the call keeps it.
    """
    with replacing(path, durable=durable) as tmp, tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")
        if durable:
            f.flush()
            os.fsync(f.fileno())


class Fields(MappingReader):
    """The one mapping reader (`powerctl.files.mapping`) over a decoded JSON object: errors are
    FileFormatError
    lines naming the file and the key."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        super().__init__(data, where, FileFormatError)


def check_number(
    v: Any, key: str, fields: Fields, *, positive: bool = False, minimum: float | None = 0.0
) -> float:
    """A number found inside `key` (a list entry), checked as `Fields.number` checks one."""
    return fields.check(key, v, Number(0.0, above=True) if positive else Number(minimum))

"""Reading and writing the versioned JSON files of docs/reference/files.md, with one-line errors."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from powerctl.errors import FileFormatError
from powerctl.files.mapping import MappingReader, shown
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
    except ValueError as exc:  # json.JSONDecodeError among them
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
    """An object whose key is given twice is refused (json would keep the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object; keep one")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number this file may hold")


def write_json(path: str | Path, data: dict[str, Any], *, durable: bool = False) -> None:
    """Write atomically (`outputs.replacing`); `durable` also fsyncs the file and its folder."""
    with replacing(path, durable=durable) as tmp, tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")
        if durable:
            f.flush()
            os.fsync(f.fileno())


class Fields(MappingReader):
    """The one mapping reader over a decoded JSON object: errors are FileFormatError lines."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        super().__init__(data, where, FileFormatError)


class FrozenJson(Mapping[str, Any]):
    """A JSON object that cannot change, for a frozen record; unlike `types.MappingProxyType` it pickles."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_items", {k: frozen_json(v) for k, v in (items or {}).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} cannot be changed; build a new record instead")

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._items,))


def frozen_json(value: Any) -> Any:
    """`value` (JSON) that cannot change: mappings as `FrozenJson`, lists as tuples, all the way down."""
    if isinstance(value, FrozenJson):
        return value
    if isinstance(value, Mapping):
        return FrozenJson(value)
    if isinstance(value, (list, tuple)):
        return tuple(frozen_json(v) for v in value)
    return value


def plain_json(value: Any) -> Any:
    """`value` as JSON holds it (dicts, lists, plain numbers); what JSON cannot hold raises TypeError."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {_key(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # np.float32, np.int64, np.bool_
        return plain_json(value.item())
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"{shown(value)} is not a JSON value")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key {shown(key)} is not text")
    return key

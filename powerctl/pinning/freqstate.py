"""The on-disk record of a board's knob state before a pin, one per physical board, and its lock (an flock
on ``KEY.lock``, dropped by the kernel when its holder dies). A record that outlives its process is put back
by the next command that opens the board; `powerctl freq --set` leaves a ``set`` record for `--restore`."""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from powerctl.errors import DeviceError, FileFormatError
from powerctl.files.cache import xdg_home
from powerctl.files.jsonfile import Fields, read_json, write_json
from powerctl.files.mapping import Choice, Integer, Text

STATE_SCHEMA = "powerctl.freqstate/2"
KIND_PIN = "pin"  # for the lifetime of a process's pin: if the record outlives the process, it crashed
KIND_SET = "set"  # by `powerctl freq --set`: the pin stays until `powerctl freq --restore`
KINDS = (KIND_PIN, KIND_SET)


class BoardBusyError(DeviceError):
    """Another live process holds the board's pin lock."""


class BadRecordError(FileFormatError):
    """Board `key`'s record is unusable, nothing written; one line: where, what is wrong, `freq --restore`."""

    def __init__(self, key: str, problem: str, spec: str | None = None) -> None:
        self.path, self.problem = record_path(key), problem
        release = f"`powerctl freq --device {spec or key.partition('@')[0]} --restore`"
        super().__init__(f"{self.path}: {problem}; {release} releases the board to its full range")


def state_dir() -> Path:
    """`POWERCTL_STATE_DIR`, else `$XDG_STATE_HOME/powerctl`, else `~/.local/state/powerctl`."""
    d = os.environ.get("POWERCTL_STATE_DIR")
    return Path(d) if d else xdg_home("state") / "powerctl"


def record_path(key: str) -> Path:
    """``KEY.json`` in `state_dir`; its lock is ``KEY.lock`` beside it."""
    return state_dir() / (re.sub(r"[^A-Za-z0-9_.@-]", "_", key) + ".json")


@dataclass(frozen=True)
class BoardRecord:
    """The state to put back on board `key`; `under` is a `set` record this pin was laid on top of."""

    key: str
    spec: str
    kind: str
    state: dict[str, Any]
    pid: int
    under: BoardRecord | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BoardRecord:
        if not isinstance(data, dict):
            raise FileFormatError(f"{where}: expected an object")
        f = Fields(data, where)
        kind = f.value("kind", Choice(KINDS))
        state = f.get("state")
        if not isinstance(state, dict):
            raise f.fail("'state' must be an object")
        under = data.get("under")
        return cls(
            key=f.value("key", Text()),
            spec=f.value("spec", Text()),
            kind=kind,
            state=dict(state),
            pid=f.value("pid", Integer(0)),
            under=None if under is None else cls.from_dict(under, f"{where}: under"),
        )


def read_record(key: str, spec: str | None = None) -> BoardRecord | None:
    """The record of board `key` (None: none); a bad one is one BadRecordError line."""
    path = record_path(key)
    if not os.path.lexists(path):
        return None
    try:
        record = BoardRecord.from_dict(read_json(path, STATE_SCHEMA), str(path))
    except FileFormatError as exc:
        raise BadRecordError(key, str(exc).removeprefix(f"{path}: "), spec) from None
    if record.key != key:
        raise BadRecordError(key, f"holds the record of {record.key!r}, not {key!r}", spec)
    return record


def set_aside(key: str) -> Path | None:
    """Move a record that cannot be used out of the way (``KEY.json.bad``); None when there is none."""
    path = record_path(key)
    aside = path.with_name(path.name + ".bad")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    return aside


def write_record(record: BoardRecord) -> None:
    """Atomically and durably (fsync)."""
    path = record_path(record.key)
    try:
        write_json(path, {"schema": STATE_SCHEMA, **asdict(record)}, durable=True)  # `under` nested
    except OSError as exc:
        raise DeviceError(
            f"cannot record the state of {record.spec} in {path.parent} ({exc.strerror or exc}); "
            "set POWERCTL_STATE_DIR to a writable folder"
        ) from None


def remove_record(key: str, under: BoardRecord | None = None) -> None:
    """Remove board `key`'s record, or put back the `set` record `under` it."""
    if under is not None:
        write_record(under)
    else:
        record_path(key).unlink(missing_ok=True)


def lock_board(key: str, spec: str) -> IO[bytes]:
    """A non-blocking exclusive flock on the board's lock file, held until closed; else BoardBusyError."""
    path = record_path(key).with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+b")  # noqa: SIM115 - held open for the pin's lifetime
    except OSError as exc:
        raise DeviceError(
            f"cannot lock {spec} through {path} ({exc.strerror or exc}); "
            "set POWERCTL_STATE_DIR to a writable folder"
        ) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        try:  # the pid in the record the lock's holder wrote, when it can be read
            record = read_record(key)
        except FileFormatError:
            record = None
        holder = None if record is None or record.kind != KIND_PIN else record.pid
        if holder == os.getpid():  # flock is per open file: a second pin in this very process
            raise BoardBusyError(
                f"{spec} is already pinned by this process (pid {holder}): one pin at a time per "
                "board — leave the first pin's `with` block (or release it) before pinning again"
            ) from None
        raise BoardBusyError(
            f"{spec} is pinned by another process{'' if holder is None else f' (pid {holder})'}; "
            "wait for it to finish (or stop it), then try again"
        ) from None
    return f

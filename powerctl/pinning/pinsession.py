"""From a device's first pin to its restore (`Device.pin_frequency` to `Device.restore`): the board's lock
and the on-disk record of its state, taken before the first write. `recover`, run when a device is opened,
puts back what a dead process left pinned. A device without a `physical_key` has no lock and no record."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import IO, Any, Protocol

from powerctl.pinning.freqstate import (
    KIND_PIN,
    KIND_SET,
    BadRecordError,
    BoardBusyError,
    BoardRecord,
    lock_board,
    read_record,
    record_path,
    remove_record,
    set_aside,
    write_record,
)

log = logging.getLogger(__name__)


class Pinnable(Protocol):
    """What a session needs of a board (a Protocol: `devices.base` imports this module)."""

    spec: str

    def physical_key(self) -> str | None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def apply_snapshot(self, state: dict[str, Any]) -> None: ...


class PinSession:
    """While a device is pinned: `state` (what restore puts back) and, with a `physical_key`, lock, record."""

    def __init__(
        self, state: dict[str, Any], lock: IO[bytes] | None = None, record: BoardRecord | None = None
    ) -> None:
        self.state, self._lock, self._record = state, lock, record

    @classmethod
    def start(cls, device: Pinnable) -> PinSession:
        """Lock the board, put back what a dead process left pinned, snapshot it and record the snapshot."""
        key = device.physical_key()
        if key is None:
            return cls(device.snapshot())
        lock = lock_board(key, device.spec)
        try:
            below = read_record(key, device.spec)  # a bad record refuses the pin, saying how to release
            if below is not None and below.kind == KIND_PIN:
                put_back(device, below)
                below = read_record(key, device.spec)
            record = BoardRecord(key, device.spec, KIND_PIN, device.snapshot(), os.getpid(), under=below)
            write_record(record)
        except BaseException:
            lock.close()
            raise
        return cls(record.state, lock, record)

    def finish(self, *, hand_over: bool = False) -> None:
        """After `state` was put back: drop our record (a `freq --set` record below it stays), unlock;
        `hand_over` (`freq --set`: the pin outlives us): it becomes a `set` record of the ORIGINAL state."""
        if self._lock is not None and self._record is not None:
            try:
                if hand_over:
                    write_record(self._record.under or replace(self._record, kind=KIND_SET))
                else:
                    remove_record(self._record.key, self._record.under)
            finally:
                self._lock.close()


def put_back(device: Pinnable, record: BoardRecord) -> str:
    """Apply a dead process's record (the caller holds the lock), keep what lay under it; one warning line."""
    device.apply_snapshot(record.state)
    remove_record(record.key, record.under)
    shown = ", ".join(f"{k}={v}" for k, v in record.state.items()) or "its defaults"
    message = (
        f"powerctl: restored {device.spec} ({record.key}) to {shown}: process {record.pid} pinned it "
        "and died without restoring it"
    )
    log.warning("%s", message)
    return message


def recover(device: Pinnable) -> str | None:
    """On opening a device: restore the state a dead process left pinned (the warning line), else None."""
    key = device.physical_key()
    if key is None or not record_path(key).exists():
        return None
    try:
        lock = lock_board(key, device.spec)
    except BoardBusyError:
        return None
    with lock:
        try:
            record = read_record(key, device.spec)
            return None if record is None or record.kind != KIND_PIN else put_back(device, record)
        except BadRecordError as exc:  # left for `freq --restore`; a pin is refused with this line
            log.debug("%s", exc)
            return None


def restore_saved(device: Pinnable) -> dict[str, Any] | None:
    """`powerctl freq --restore`: put back the recorded state; a record it cannot use: the knob's full
    range, the record moved aside."""
    key = device.physical_key()
    if key is None:
        return None
    with lock_board(key, device.spec):
        try:
            record = read_record(key, device.spec)
            if record is None:
                return None
            device.apply_snapshot(record.state)  # checks the state whole before writing any of it
        except BadRecordError as bad:
            device.apply_snapshot({})
            aside = set_aside(key)
            state = device.snapshot()
            shown = ", ".join(f"{k}={v}" for k, v in state.items())
            kept = f"; the record is kept as {aside}" if aside else ""
            what = (bad.path, bad.problem, device.spec, shown, kept)
            log.warning("powerctl: %s: %s; released %s to its full range instead (%s)%s", *what)
            return state
        remove_record(key)
        return record.state

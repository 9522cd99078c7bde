"""Malformed records the project wrote and someone edited, and a frequency table that is there but
garbage (issue 28): one line that says what is wrong and what to do; `powerctl freq --restore`
releases the board to its full range whatever the record holds, so a bad record never keeps a
board pinned; a broken table is an error for the board, never "no knob"."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from powerctl.cli.commands import main
from powerctl.pinning.freqstate import STATE_SCHEMA, read_record, state_dir
from powerfed.training.data import load_dataset
from powerfed.training.errors import DataError
from tests.fake_boards import NANO_DEVFREQ, NANO_FREQS, make_nano_tree, tree_snapshot

LOW, MID = NANO_FREQS[5], NANO_FREQS[7]


@pytest.fixture
def nano(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def _knob(root: Path) -> tuple[str, str, str]:
    node = root / NANO_DEVFREQ
    return tuple((node / f).read_text().strip() for f in ("min_freq", "max_freq", "governor"))  # type: ignore[return-value]


def _record() -> Path:
    [path] = state_dir().glob("*.json")
    return path


def _edit_state(**changes: Any) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        data = json.loads(path.read_text())
        for key, value in changes.items():
            if value is None:
                data["state"].pop(key, None)
            else:
                data["state"][key] = value
        path.write_text(json.dumps(data))

    return edit


def _set(**fields: Any) -> Callable[[Path], None]:
    return lambda path: path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _write(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


def _replace_with(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        path.unlink()
        make(path)

    return edit


STATE_PROBLEM = "'state': "
BAD_RECORDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "min_freq abc": (_edit_state(min_freq="abc"), "'state': 'min_freq' must be a frequency in Hz, got 'abc'"),
    "max_freq missing": (_edit_state(max_freq=None), "'state': 'max_freq' must be a frequency in Hz"),
    "min above max": (_edit_state(min_freq="921600000", max_freq="7"), "'state': min_freq 921600000 is"),
    "governor path": (_edit_state(governor="../../x"), "'state': 'governor' must be a devfreq governor"),
    "state a list": (_set(state=["76800000"]), "'state' must be an object"),
    "empty": (_write(""), "not valid JSON"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:40]), "not valid JSON"),
    "binary": (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not a text file"),
    "other schema": (_write(json.dumps({"schema": "powerctl.freqstate/1"})), "schema is"),
    "unknown kind": (_set(kind="zzz"), "'kind' must be one of"),
    "a folder": (_replace_with(lambda p: p.mkdir()), "is a folder"),
    "a FIFO": (_replace_with(os.mkfifo), "not a regular file (a FIFO)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_bad_set_record_refuses_a_new_pin_and_restore_releases_the_board(
    nano: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    edit, problem = BAD_RECORDS[case]
    before = tree_snapshot(nano)
    assert _run(capsys, "freq", "--device", "jetson", "--set", str(LOW))[0] == 0
    pinned = tree_snapshot(nano)
    assert _knob(nano)[:2] == (str(LOW), str(LOW))
    record = _record()
    edit(record)

    # a command that only looks at the board is not blocked by the record
    code, out, err = _run(capsys, "freq", "--device", "jetson")
    assert code == 0 and err == [] and "current:" in out

    code, out, err = _run(capsys, "freq", "--device", "jetson", "--set", str(MID))
    if problem.startswith(STATE_PROBLEM):
        # a record that reads but holds a state the board cannot take is only applied by --restore: a
        # new pin lays its own record over it, as over any `freq --set` record, and keeps it
        assert code == 0 and _knob(nano)[:2] == (str(MID), str(MID)), err
    else:
        # a record that cannot be read refuses a new pin in one line: the record, the problem, the way out
        assert code == 2 and out == "" and len(err) == 1, err
        assert str(record) in err[0] and problem in err[0]
        assert "`powerctl freq --device jetson --restore` releases the board to its full range" in err[0]
        assert tree_snapshot(nano) == pinned

    # --restore releases the pin: the whole table, the governor as it was; the record is kept aside
    code, out, err = _run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and len(err) == 1, err
    assert err[0].startswith(f"powerctl: {record}: ") and problem in err[0]
    assert (
        f"released jetson to its full range instead (governor=nvhost_podgov, min_freq={NANO_FREQS[0]}, "
        in err[0]
    )
    assert f"the record is kept as {record}.bad" in err[0]
    assert tree_snapshot(nano) == before  # the fake board starts at its full range: byte for byte back
    assert not os.path.lexists(record) and os.path.lexists(f"{record}.bad")

    # and the board is usable again
    assert _run(capsys, "freq", "--device", "jetson", "--set", str(MID))[0] == 0
    assert _run(capsys, "freq", "--device", "jetson", "--restore")[0] == 0
    assert tree_snapshot(nano) == before


def test_a_crash_record_with_a_bad_state_does_not_block_opening_the_board(
    nano: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `pin` record (a process that died pinned) holding a bad state: opening the board neither fails
    nor writes; pinning is refused with the way out; --restore releases."""
    before = tree_snapshot(nano)
    assert _run(capsys, "freq", "--device", "jetson", "--set", str(LOW))[0] == 0
    record = _record()
    data = json.loads(record.read_text())
    data.update(kind="pin", pid=2**22 + 1)
    data["state"]["max_freq"] = "12abc"
    record.write_text(json.dumps(data))
    pinned = tree_snapshot(nano)

    code, _, err = _run(capsys, "power", "--device", "jetson")
    assert code == 0 and err == [] and tree_snapshot(nano) == pinned
    code, _, err = _run(capsys, "freq", "--device", "jetson-nano", "--set", str(MID))
    assert code == 2 and len(err) == 1 and "'max_freq' must be a frequency in Hz, got '12abc'" in err[0]
    assert "`powerctl freq --device jetson-nano --restore`" in err[0] and tree_snapshot(nano) == pinned
    code, _, err = _run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and len(err) == 1 and "released jetson to its full range instead" in err[0]
    assert tree_snapshot(nano) == before


def test_a_record_edited_to_another_board_is_named(nano: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "freq", "--device", "jetson", "--set", str(LOW))[0] == 0
    record = _record()
    data = json.loads(record.read_text())
    key = data["key"]
    record.write_text(json.dumps({**data, "key": "jetson-nano@000000000000", "schema": STATE_SCHEMA}))
    code, _, err = _run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and "holds the record of 'jetson-nano@000000000000'" in err[0]
    assert read_record(key) is None and _knob(nano)[:2] == (str(NANO_FREQS[0]), str(NANO_FREQS[-1]))


def test_a_good_record_still_puts_back_exactly_what_it_holds(
    nano: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = nano / NANO_DEVFREQ
    (node / "max_freq").write_text(f"{NANO_FREQS[9]}\n")  # not the full range: the record must win
    before = tree_snapshot(nano)
    assert _run(capsys, "freq", "--device", "jetson", "--set", str(LOW))[0] == 0
    code, out, err = _run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and err == [] and out.startswith("restored jetson to ")
    assert tree_snapshot(nano) == before and not list(state_dir().glob("*.bad"))


# --------------------------------------------------------------------------- the frequency table

TABLE = f"{NANO_DEVFREQ}/available_frequencies"


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (b"garbage here\n", "is not a list of frequencies in Hz (> 0): 'garbage here'"),
        (b"", "is not a list of frequencies in Hz (> 0): ''"),
        (b"\n  \n", "is not a list of frequencies in Hz (> 0): ''"),
        (b"-5 76800000\n", "is not a list of frequencies in Hz (> 0): '-5 76800000'"),
        (b"\xff\xfe\xfd", "is not a list of frequencies in Hz"),
    ],
)
def test_a_garbage_frequency_table_is_an_error_for_the_board_not_no_knob(
    nano: Path, capsys: pytest.CaptureFixture[str], table: bytes, problem: str
) -> None:
    (nano / TABLE).write_bytes(table)
    before = tree_snapshot(nano)
    code, out, err = _run(capsys, "devices")
    [line] = [row for row in out.splitlines() if row.startswith("jetson ")]
    assert code == 2 and "error: " in line and problem in line and "no frequency knob" not in line
    assert "the GPU's devfreq node is broken" in line
    code, out, _ = _run(capsys, "devices", "--json")
    [board] = [d for d in json.loads(out) if d["kind"] == "jetson"]
    assert code == 2 and problem in board["error"] and board["board"] == "jetson-nano"
    for argv in (["freq", "--device", "jetson"], ["freq", "--device", "jetson", "--set", str(LOW)]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and len(err) == 1 and problem in err[0]
    assert _run(capsys, "power", "--device", "jetson")[0] == 0  # what does not need the table still works
    assert tree_snapshot(nano) == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "dangling link"])
def test_a_frequency_table_that_is_no_file_is_one_error_line(
    nano: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    table = nano / TABLE
    table.unlink()
    {
        "fifo": lambda: os.mkfifo(table),
        "dev-zero": lambda: table.symlink_to("/dev/zero"),
        "folder": table.mkdir,
        "dangling link": lambda: table.symlink_to(nano / "nowhere"),
    }[kind]()
    code, out, err = _run(capsys, "freq", "--device", "jetson")
    assert code == 2 and out == "" and len(err) == 1 and str(table) in err[0]
    code, out, _ = _run(capsys, "devices")
    assert code == 2 and "no frequency knob" not in next(
        r for r in out.splitlines() if r.startswith("jetson ")
    )


def test_a_board_with_no_devfreq_node_still_has_no_knob(
    nano: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(nano / "sys/devices")
    (nano / "sys/class/devfreq/57000000.gpu").unlink()
    code, out, _ = _run(capsys, "devices")
    assert code == 0 and "no frequency knob" in next(r for r in out.splitlines() if r.startswith("jetson "))


# --------------------------------------------------------------------------- npz labels

IMAGES = np.zeros((6, 3, 32, 32), np.uint8)


@pytest.mark.parametrize(
    ("arrays", "problem"),
    [
        ({"y": np.full(6, 1000)}, "every one of the 6 labels is 1000: accuracy would be meaningless"),
        (
            {"y": np.arange(6), "num_classes": np.int64(100_001)},
            "must be an integer in [2, 100000], got 100001",
        ),
        ({"y": np.array([0, 1, 2, 3, 4, 1000])}, "labels reach 1000 with only 6 samples"),
        ({"y": np.array([0, 1, 2, 3, 4, -1])}, "labels must be class indices 0..K-1, got -1"),
        ({"y": np.arange(6), "num_classes": np.int64(3)}, "labels must lie in 0..2 (num_classes 3), got 5"),
        (
            {"y": np.arange(6), "num_classes": np.int64(1)},
            "num_classes must be an integer in [2, 100000], got 1",
        ),
        ({"y": np.arange(6), "num_classes": np.array([10, 10])}, "num_classes must be one integer"),
        ({"y": np.arange(6), "num_classes": np.float64(10)}, "num_classes must be one integer"),
    ],
)
def test_npz_labels_that_are_not_class_indices_are_refused(
    tmp_path: Path, arrays: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=IMAGES, **arrays)
    with pytest.raises(DataError) as err:
        load_dataset(f"npz:{path}", split="all")
    assert str(err.value).startswith(f"{path}: ") and problem in str(err.value) and "\n" not in str(err.value)


def test_constant_labels_are_judged_over_the_whole_file_not_one_split(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x_train=IMAGES, y_train=np.arange(6) % 3, x_test=IMAGES[:2], y_test=np.array([2, 2]))
    test = load_dataset(f"npz:{path}", split="test")
    assert test.num_classes == 3 and test.y.tolist() == [2, 2]
    np.savez(path, x_train=IMAGES, y_train=np.full(6, 2), x_test=IMAGES[:2], y_test=np.array([2, 2]))
    with pytest.raises(DataError, match="every one of the 8 labels is 2"):
        load_dataset(f"npz:{path}", split="test")


def test_a_stored_num_classes_above_the_labels_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=IMAGES, y=np.arange(6), num_classes=np.int64(10))
    assert load_dataset(f"npz:{path}", split="all").num_classes == 10

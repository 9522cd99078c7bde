"""`powerctl fake-board`: the operator's fake Jetson, read and pinned by the real `jetson` device."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerctl.cli.commands import main
from powerctl.devices import open_device
from powerctl.devices.fakeboard import KINDS, NANO_FREQS, ORIN_NANO_FREQS, TX2NX_FREQS
from tests.fake_boards import tree_snapshot

EXPECTED = {
    # kind → (frequency table, total rail name, idle total power in W)
    "jetson-nano": (NANO_FREQS, "POM_5V_IN", 3.184),
    "jetson-tx2nx": (TX2NX_FREQS, "VDD_IN", 4.512),
    "jetson-orin-nano": (ORIN_NANO_FREQS, "VDD_IN", 5.048 * 1.192),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fake_board_is_the_jetson_device_and_a_pin_is_restored_byte_for_byte(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / kind
    assert main(["fake-board", str(root), "--kind", kind]) == 0
    out = capsys.readouterr().out
    assert f"POWERCTL_SYSFS_ROOT={root.resolve()}" in out

    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    freqs, total, watts = EXPECTED[kind]
    before = tree_snapshot(root)
    with open_device("jetson") as dev:
        assert dev.board == kind
        assert dev.frequencies() == freqs
        assert total in dev.rails()
        assert dev.read_power_w() == pytest.approx(watts, rel=1e-3)
        with dev.pinned(freqs[len(freqs) // 2]):
            assert tree_snapshot(root) != before  # min_freq/max_freq written under the root
    assert tree_snapshot(root) == before
    assert main(["devices"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["jetson", kind]


def test_fake_board_refuses_a_folder_with_files_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    assert main(["fake-board", str(folder), "--kind", "jetson-tx2nx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not an empty folder" in err[0] and str(folder) in err[0]
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_fake_board_unknown_kind_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fake-board", str(tmp_path / "x"), "--kind", "jetson-agx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice: 'jetson-agx'" in err[0]
    assert not (tmp_path / "x").exists()

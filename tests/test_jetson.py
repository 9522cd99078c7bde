"""The sysfs Jetson backend on fake Nano, TX2 NX and Orin trees (docs/design/devices.md)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from powerctl.devices import jetson, open_device
from powerctl.devices.jetson import JetsonBoard, board_name, open_jetson
from powerctl.errors import DeviceError, DevicePermissionError
from tests.fake_boards import (
    NANO_DEVFREQ,
    NANO_FREQS,
    ORIN_DEVFREQ,
    ORIN_NANO_FREQS,
    TX2NX_DEVFREQ,
    TX2NX_FREQS,
    make_nano_tree,
    make_orin_tree,
    make_tx2nx_tree,
    sigint_raises_keyboard_interrupt,
    tree_snapshot,
)

NOBODY = 65534


@pytest.fixture
def nano(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(tmp_path))
    return make_nano_tree(tmp_path)


def _at(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    return root


def _freqs(root: Path, devfreq: str = NANO_DEVFREQ) -> tuple[int, int]:
    d = root / devfreq
    return int((d / "min_freq").read_text()), int((d / "max_freq").read_text())


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every sysfs write as (file name, value), checking min ≤ max in the node after each one."""
    done: list[tuple[str, str]] = []
    real = jetson._write_sysfs

    def record(path: Path, value: str) -> None:
        real(path, value)
        done.append((path.name, value))
        lo, hi = int((path.parent / "min_freq").read_text()), int((path.parent / "max_freq").read_text())
        assert lo <= hi, f"after writing {value} to {path.name}: min {lo} > max {hi}"

    monkeypatch.setattr(jetson, "_write_sysfs", record)
    return done


# --- opening ----------------------------------------------------------------------------------

BOARDS: list[tuple[Callable[[Path], Path], str, list[int], str]] = [
    (make_nano_tree, "jetson-nano", NANO_FREQS, NANO_DEVFREQ),
    (make_tx2nx_tree, "jetson-tx2nx", TX2NX_FREQS, TX2NX_DEVFREQ),
    (make_orin_tree, "jetson-orin-nano", ORIN_NANO_FREQS, "sys/class/devfreq/17000000.gpu"),
]


@pytest.mark.parametrize(("make", "board", "table", "devfreq"), BOARDS)
@pytest.mark.parametrize("named", [False, True])
def test_open_by_spec_reads_board_and_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make, board, table, devfreq, named: bool
) -> None:
    root = _at(make(tmp_path), monkeypatch)
    spec = board if named else "jetson"
    dev = open_device(spec)
    assert isinstance(dev, JetsonBoard)
    assert (dev.spec, dev.board) == (spec, board)
    assert dev.frequencies() == table
    assert dev.current_frequency() == table[0]
    info = dev.describe()
    assert info["devfreq"] == str(root / devfreq)
    assert info["frequencies_hz"] == table
    assert info["model"].startswith("NVIDIA Jetson") and "\x00" not in info["model"]


def test_table_facts_match_the_design() -> None:
    assert len(NANO_FREQS) == 12 and NANO_FREQS[0] == 76800000 and NANO_FREQS[-1] == 921600000
    assert len(TX2NX_FREQS) == 13 and TX2NX_FREQS[0] == 114750000 and TX2NX_FREQS[-1] == 1300500000
    assert {b - a for a, b in itertools.pairwise(TX2NX_FREQS[:-1])} == {102000000}


def test_table_is_sorted_and_deduplicated(nano: Path) -> None:
    (nano / NANO_DEVFREQ / "available_frequencies").write_text("921600000 76800000 460800000 76800000\n")
    assert open_jetson("jetson").frequencies() == [76800000, 460800000, 921600000]


@pytest.mark.parametrize(
    "where", ["sys/devices/57000000.gpu/devfreq/57000000.gpu", "sys/class/devfreq/57000000.gpu"]
)
def test_nano_devfreq_at_its_other_paths(nano: Path, where: str) -> None:
    shutil.rmtree(nano / "sys/devices/gpu.0")
    (nano / "sys/class/devfreq/57000000.gpu").unlink()
    (nano / where).mkdir(parents=True)
    (nano / where / "available_frequencies").write_text("76800000 153600000\n")
    for name, value in [("cur_freq", 76800000), ("min_freq", 76800000), ("max_freq", 153600000)]:
        (nano / where / name).write_text(f"{value}\n")
    dev = open_jetson("jetson-nano")
    assert dev.devfreq == nano / where
    assert dev.frequencies() == [76800000, 153600000]


def test_orin_scan_skips_devfreq_nodes_that_are_not_the_gpu(tmp_path: Path, monkeypatch) -> None:
    root = _at(make_orin_tree(tmp_path), monkeypatch)
    dev = open_jetson("jetson")
    assert dev.devfreq is not None and dev.devfreq.name == "17000000.gpu"
    dev.pin_frequency(510000000)
    assert _freqs(root, ORIN_DEVFREQ) == (510000000, 510000000)
    assert (root / "sys/class/devfreq/15340000.vic/max_freq").read_text() == "729600000\n"
    dev.restore()


def test_missing_model_file_says_no_jetson_and_how_to_simulate(tmp_path: Path, monkeypatch) -> None:
    _at(tmp_path, monkeypatch)
    with pytest.raises(DeviceError) as err:
        open_device("jetson")
    msg = str(err.value)
    assert "no Jetson found under" in msg and str(tmp_path) in msg and "sim:jetson-nano" in msg
    assert "\n" not in msg


def test_a_board_that_is_not_a_jetson_is_refused(tmp_path: Path, monkeypatch) -> None:
    _at(tmp_path, monkeypatch)
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\x00")
    with pytest.raises(DeviceError, match="Raspberry Pi 4"):
        open_jetson("jetson")


def test_named_board_must_match_the_device_tree(nano: Path) -> None:
    with pytest.raises(DeviceError) as err:
        open_device("jetson-tx2nx")
    msg = str(err.value)
    assert "'jetson-tx2nx'" in msg and "jetson-nano" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("model", "compatible", "expected"),
    [
        ("NVIDIA Jetson Nano Developer Kit", [], "jetson-nano"),
        ("NVIDIA Jetson Nano 2GB Developer Kit", [], "jetson-nano"),
        ("jetson-nano", [], "jetson-nano"),
        ("NVIDIA Jetson TX2 NX Developer Kit", [], "jetson-tx2nx"),
        ("lanai-3636", ["nvidia,p3509-0000+p3636-0001", "nvidia,tegra186"], "jetson-tx2nx"),
        ("NVIDIA Jetson Orin Nano Developer Kit", [], "jetson-orin-nano"),
        ("NVIDIA Jetson Xavier NX Developer Kit", [], "jetson-xavier-nx"),
        ("NVIDIA Jetson AGX Orin Developer Kit", [], "jetson-agx-orin"),
        ("Jetson-AGX", [], "jetson-agx"),
        ("Raspberry Pi 4 Model B Rev 1.4", ["raspberrypi,4-model-b", "brcm,bcm2711"], None),
    ],
)
def test_board_names(model: str, compatible: list[str], expected: str | None) -> None:
    assert board_name(model, compatible) == expected


def test_root_is_read_at_open_time(tmp_path: Path, monkeypatch) -> None:
    a, b = make_nano_tree(tmp_path / "a"), make_tx2nx_tree(tmp_path / "b")
    _at(a, monkeypatch)
    nano_dev = open_jetson("jetson")
    _at(b, monkeypatch)
    assert open_jetson("jetson").board == "jetson-tx2nx"
    assert nano_dev.frequencies() == NANO_FREQS and nano_dev.read_power_w() == pytest.approx(3.184)


# --- sensors ----------------------------------------------------------------------------------


def test_nano_rails_in_watts_and_total_is_pom_5v_in(nano: Path) -> None:
    dev = open_jetson("jetson")
    assert dev.has_power_sensor
    assert dev.rails() == pytest.approx({"POM_5V_IN": 3.184, "POM_5V_GPU": 0.412, "POM_5V_CPU": 0.825})
    assert dev.read_power_w() == pytest.approx(3.184)
    assert dev.describe()["rails"] == ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]
    # A fresh reading every time: the sensor is not cached.
    (nano / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power0_input").write_text("7342\n")
    assert dev.read_power_w() == pytest.approx(7.342)


def test_tx2nx_total_is_vdd_in(tmp_path: Path, monkeypatch) -> None:
    _at(make_tx2nx_tree(tmp_path), monkeypatch)
    dev = open_jetson("jetson-tx2nx")
    assert dev.rails() == pytest.approx({"VDD_IN": 4.512, "VDD_CPU_GPU": 1.102, "VDD_SOC": 0.987})
    assert dev.read_power_w() == pytest.approx(4.512)


def test_orin_hwmon_power_is_millivolts_times_milliamps(tmp_path: Path, monkeypatch) -> None:
    _at(make_orin_tree(tmp_path), monkeypatch)
    dev = open_jetson("jetson")
    assert dev.rails() == pytest.approx(
        {"VDD_IN": 5.048 * 1.192, "VDD_CPU_GPU_CV": 5.040 * 0.420, "VDD_SOC": 5.040 * 0.360}
    )
    assert dev.read_power_w() == pytest.approx(6.017216)
    assert dev.describe()["total_rail"] == "VDD_IN"


def test_iio_chip_at_another_address_is_found(tmp_path: Path, monkeypatch) -> None:
    root = _at(make_nano_tree(tmp_path), monkeypatch)
    drivers = root / "sys/bus/i2c/drivers/ina3221x"
    (drivers / "6-0040").rename(drivers / "1-0041")
    assert open_jetson("jetson").read_power_w() == pytest.approx(3.184)


def test_without_a_recognised_total_rail_power_is_the_sum(nano: Path) -> None:
    iio = nano / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for channel, name in enumerate(["RAIL_A", "RAIL_B", "RAIL_C"]):
        (iio / f"rail_name_{channel}").write_text(f"{name}\n")
    assert open_jetson("jetson").read_power_w() == pytest.approx(3.184 + 0.412 + 0.825)


def test_board_without_rails_has_no_sensor(nano: Path) -> None:
    shutil.rmtree(nano / "sys/bus/i2c")
    dev = open_jetson("jetson")
    assert not dev.has_power_sensor and dev.rails() == {}
    with pytest.raises(DeviceError, match="no INA3221 power rails"):
        dev.read_power_w()
    with pytest.raises(DeviceError, match="no power sensor"):
        dev.power_sampler(100)


def test_sampler_reads_the_total_rail(nano: Path) -> None:
    sampler = open_jetson("jetson").power_sampler(500)
    sampler.start()
    time.sleep(0.01)
    samples = sampler.stop()
    assert len(samples) >= 2 and all(w == pytest.approx(3.184) for _, w in samples)


def test_memory_is_memtotal(nano: Path) -> None:
    assert open_jetson("jetson").memory_bytes() == 4059712 * 1024


def test_current_frequency_follows_cur_freq(nano: Path) -> None:
    dev = open_jetson("jetson")
    (nano / NANO_DEVFREQ / "cur_freq").write_text("614400000\n")
    assert dev.current_frequency() == 614400000


# --- pinning ----------------------------------------------------------------------------------


def test_lowering_writes_min_first(nano: Path, writes: list[tuple[str, str]]) -> None:
    dev = open_jetson("jetson")
    dev.pin_frequency(460800000)
    assert writes == [("min_freq", "460800000"), ("max_freq", "460800000")]
    assert (nano / NANO_DEVFREQ / "min_freq").read_bytes() == b"460800000\n"
    assert (nano / NANO_DEVFREQ / "max_freq").read_bytes() == b"460800000\n"


def test_raising_writes_max_first(nano: Path, writes: list[tuple[str, str]]) -> None:
    dev = open_jetson("jetson")
    dev.pin_frequency(230400000)
    writes.clear()
    dev.pin_frequency(844800000)
    assert writes == [("max_freq", "844800000"), ("min_freq", "844800000")]
    assert _freqs(nano) == (844800000, 844800000)


def test_pin_at_the_current_max_writes_min_first(nano: Path, writes: list[tuple[str, str]]) -> None:
    open_jetson("jetson").pin_frequency(921600000)
    assert writes == [("min_freq", "921600000"), ("max_freq", "921600000")]
    assert _freqs(nano) == (921600000, 921600000)


@pytest.mark.parametrize(("make", "board", "table", "devfreq"), BOARDS)
def test_pin_then_restore_gives_back_the_tree_byte_for_byte(
    tmp_path: Path, monkeypatch, make, board, table, devfreq
) -> None:
    root = _at(make(tmp_path), monkeypatch)
    before = tree_snapshot(root)
    dev = open_jetson(board)
    dev.pin_frequency(table[len(table) // 2])
    dev.pin_frequency(table[-1])
    dev.pin_frequency(table[1])
    assert tree_snapshot(root) != before
    dev.restore()
    assert tree_snapshot(root) == before
    assert not dev.is_pinned


def test_restore_raises_max_before_min_when_the_old_min_is_above_the_pin(
    nano: Path, writes: list[tuple[str, str]]
) -> None:
    node = nano / NANO_DEVFREQ
    (node / "min_freq").write_text("614400000\n")
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    dev.pin_frequency(153600000)
    writes.clear()
    dev.restore()
    assert writes == [("max_freq", "921600000"), ("min_freq", "614400000")]
    assert tree_snapshot(nano) == before


def test_restore_puts_the_governor_back_last(nano: Path, writes: list[tuple[str, str]]) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    dev.pin_frequency(384000000)
    (nano / NANO_DEVFREQ / "governor").write_text("performance\n")  # someone else changed it meanwhile
    writes.clear()
    dev.restore()
    assert [name for name, _ in writes] == ["min_freq", "max_freq", "governor"]
    assert tree_snapshot(nano) == before


def test_snapshot_is_raw_strings_and_restores_from_another_process(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    state = json.loads(json.dumps(dev.snapshot()))
    assert state == {"governor": "nvhost_podgov", "min_freq": "76800000", "max_freq": "921600000"}
    dev.pin_frequency(691200000)
    open_jetson("jetson-nano").apply_snapshot(state)  # e.g. `powerctl freq --restore` later
    assert tree_snapshot(nano) == before


def test_pin_outside_the_table_changes_nothing(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    with pytest.raises(DeviceError, match="not a frequency of jetson"):
        dev.pin_frequency(500000000)
    assert tree_snapshot(nano) == before and not dev.is_pinned


def test_board_without_devfreq_has_no_knob(nano: Path) -> None:
    shutil.rmtree(nano / "sys/devices")
    (nano / "sys/class/devfreq/57000000.gpu").unlink()
    dev = open_jetson("jetson")
    assert dev.frequencies() == [] and dev.current_frequency() is None and dev.describe()["devfreq"] is None
    with pytest.raises(DeviceError, match="no GPU frequency knob"):
        dev.pin_frequency(76800000)


def test_a_write_that_fails_otherwise_is_a_device_error(nano: Path) -> None:
    node = nano / NANO_DEVFREQ
    (node / "min_freq").unlink()
    (node / "min_freq").mkdir()  # writing a directory fails with EISDIR, not EACCES
    dev = open_jetson("jetson")
    with pytest.raises(DeviceError) as err:
        dev._write_pin(460800000)  # the primitive: a snapshot would already fail reading min_freq
    assert not isinstance(err.value, DevicePermissionError)
    assert "writing 460800000 to" in str(err.value) and "min_freq" in str(err.value)


# --- permissions: as a user who may not write the devfreq files -------------------------------


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A temp dir any user can traverse (pytest's own tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="powerctl-perm-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def public_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A POWERCTL_STATE_DIR any user may write: an ordinary user pins with a state folder of their own."""
    path = Path(tempfile.mkdtemp(prefix="powerctl-state-"))
    path.chmod(0o777)
    monkeypatch.setenv("POWERCTL_STATE_DIR", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """Run the block as an ordinary user: as root, by switching the effective uid to nobody."""
    if os.geteuid() != 0:
        yield
        return
    try:
        os.seteuid(NOBODY)
    except PermissionError:
        pytest.skip("root without CAP_SETUID: cannot test as an ordinary user")
    try:
        yield
    finally:
        os.seteuid(0)


def _readable_tree(root: Path) -> None:
    for dirpath, _, _ in os.walk(root):
        Path(dirpath).chmod(0o755)


def _give_to_nobody(node: Path) -> None:
    if os.geteuid() == 0:
        for f in node.iterdir():
            os.chown(f, NOBODY, -1)


def test_read_only_devfreq_is_a_permission_error_naming_root_and_udev(
    public_tmp: Path, public_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _at(make_nano_tree(public_tmp), monkeypatch)
    _readable_tree(root)
    for name in ("min_freq", "max_freq", "governor"):
        (root / NANO_DEVFREQ / name).chmod(0o444)
    before = tree_snapshot(root)
    dev = open_jetson("jetson")
    with unprivileged(), pytest.raises(DevicePermissionError) as err:
        dev.pin_frequency(460800000)
    msg = str(err.value)
    assert msg.startswith(f"writing {root / NANO_DEVFREQ / 'min_freq'} needs root")
    assert "sudo" in msg and "udev" in msg and "\n" not in msg
    assert tree_snapshot(root) == before


def test_half_done_pin_is_undone_when_the_second_write_is_refused(
    public_tmp: Path, public_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _at(make_nano_tree(public_tmp), monkeypatch)
    _readable_tree(root)
    node = root / NANO_DEVFREQ
    (node / "max_freq").write_text("460800000\n")
    _give_to_nobody(node)
    (node / "min_freq").chmod(0o444)  # max may be written, min may not
    before = tree_snapshot(root)
    dev = open_jetson("jetson")
    # Raising: max is written first (allowed), then min is refused; leaving the block restores max.
    with (
        unprivileged(),
        pytest.raises(DevicePermissionError, match="min_freq needs root"),
        dev.pinned(844800000),
    ):
        pytest.fail("the block must not run when the pin failed")
    assert tree_snapshot(root) == before and not dev.is_pinned


# --- restore on every exit path ---------------------------------------------------------------


def test_exception_inside_pinned_restores(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    with pytest.raises(RuntimeError, match="boom"), dev.pinned(307200000):
        assert _freqs(nano) == (307200000, 307200000)
        raise RuntimeError("boom")
    assert tree_snapshot(nano) == before


def test_sigterm_inside_pinned_restores(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    with pytest.raises(SystemExit) as exc, dev.pinned(768000000):
        assert _freqs(nano) == (768000000, 768000000)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this at once
    assert exc.value.code == 128 + signal.SIGTERM
    assert tree_snapshot(nano) == before


def test_sigint_inside_pinned_restores(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_jetson("jetson")
    with sigint_raises_keyboard_interrupt(), pytest.raises(KeyboardInterrupt), dev.pinned(153600000):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert tree_snapshot(nano) == before


def test_close_restores(nano: Path) -> None:
    before = tree_snapshot(nano)
    with open_jetson("jetson") as dev:
        dev.pin_frequency(537600000)
        assert _freqs(nano) == (537600000, 537600000)
    assert tree_snapshot(nano) == before

"""What several benches share (not a bench itself)."""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerctl.errors import FileFormatError
from powerctl.procs import descendants
from powerctl.records.pick import Pick
from powerctl.records.workload import Workload
from simulations.local_superlink import pids_listening_on

if TYPE_CHECKING:
    from fl_client.round import RoundWork
    from fl_server.run_config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]


def ints(text: str) -> list[int]:
    """A comma-separated flag's integers; empty items dropped (`--sizes ""`: none)."""
    return [int(s) for s in text.split(",") if s]


def names(text: str) -> list[str]:
    """A comma-separated flag's names; empty items dropped."""
    return [s for s in text.split(",") if s]


def workload_of(model: str) -> Workload:
    """The model's training FLOPs and memory per sample (built at seed 0)."""
    from powerfed.training.models import build_model, model_workload

    return model_workload(model, build_model(model, seed=0))


def predicted_s(pick: Pick) -> float:
    """A ranked pick's predicted seconds (`rank` and `select` predict every pair they rank)."""
    assert pick.predicted_s is not None, f"{pick} has no predicted seconds"
    return pick.predicted_s


def demo_boards(
    doc: str, out: str, argv: list[str] | None
) -> tuple[argparse.Namespace, ServerConfig, dict[str, RoundWork]]:
    """A bench of the demo's task on simulated boards: its flags (--boards, --seeds, --out: made), rows
    printed as measured, the demo's settings, and per board its round: unpinned, no cap, board noise seed 0
    (the whole grid profiled once per board, like every seeded run after it)."""
    from powerctl.selection.capsource import ConstantCap
    from simulations.demo import demo_work
    from simulations.demo_config import DemoConfig

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--boards", type=names, default="jetson-nano,jetson-tx2nx")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / out)
    args = p.parse_args(argv)
    line_buffered()
    args.out.mkdir(parents=True, exist_ok=True)
    base = DemoConfig()
    settings = base.settings()
    unpinned = {board: replace(base, device=f"sim:{board}", power_cap_w=None) for board in args.boards}
    works = {
        b: replace(demo_work(c, settings), caps=ConstantCap(None), device_seed=0) for b, c in unpinned.items()
    }
    return args, settings, works


def line_buffered() -> None:
    """Rows appear as they are measured, also when stdout is a log file."""
    assert isinstance(sys.stdout, io.TextIOWrapper), "stdout is a text stream (reconfigure)"
    sys.stdout.reconfigure(line_buffering=True)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0.0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mean_pm(values: Sequence[float], fmt: str = ".2f") -> str:
    """ "mean ± std" in `fmt`; one value alone when there is one."""
    if len(values) < 2:
        return format(values[0], fmt)
    mean, std = mean_std(values)
    return f"{format(mean, fmt)} ± {format(std, fmt)}"


def read_json(path: Path, hint: str) -> Any:
    """The JSON in `path`; unreadable: FileFormatError, one line ending in `hint` (what to give)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FileFormatError(f"cannot read {path}: {exc}; {hint}") from None


def rss_bytes(pid: int) -> int:
    """The resident memory of `pid` (0 when it is gone or not ours to read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Every `every_s`: the summed RSS of the processes listening on `port`, of those in `roots`, and of
    all their descendants (each process once), and the largest one's; `samples` holds (time, sum,
    largest) and `peak` the largest sum."""

    def __init__(self, port: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every_s, self.stop = port, every_s, threading.Event()
        self.roots: list[int] = []
        self.samples: list[tuple[float, int, int]] = []

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            tops = [*pids_listening_on(self.port), *self.roots]
            sizes = [rss_bytes(p) for p in sorted({p for top in tops for p in [top, *descendants(top)]})]
            self.samples.append((time.perf_counter(), sum(sizes), max(sizes, default=0)))

    @property
    def peak(self) -> int:
        return max((s[1] for s in self.samples), default=0)

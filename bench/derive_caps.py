"""Derive the state-of-practice table of every simulated board (boards.yaml: state_of_practice).

Per frequency, the largest peak power of the paper's model set at any batch size that fits (predicted,
noise-free profiles); `--write` rewrites the peak_training_power_w lines of boards.yaml.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench_common import ROOT, workload_of

from powerctl.devices.boards import load_boards
from powerctl.selection.caps import SOP_BATCH_SIZES, derive_peak_training_power

BOARDS_YAML = ROOT / "powerctl" / "data" / "boards.yaml"


def write(tables: dict[str, list[float]], path: Path = BOARDS_YAML) -> None:
    text = path.read_text(encoding="utf-8")
    for name, power in tables.items():
        start = text.index(f"\n{name}:\n")
        end = text.find("\n\n", start + 1)
        end = len(text) if end < 0 else end
        block = re.sub(
            r"peak_training_power_w: \[[^\]]*\]",
            f"peak_training_power_w: [{', '.join(f'{p:g}' for p in power)}]",
            text[start:end],
        )
        text = text[:start] + block + text[end:]
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite boards.yaml's tables")
    args = p.parse_args(argv)
    tables: dict[str, list[float]] = {}  # board name → its derived peak_training_power_w
    for name, b in load_boards().items():
        table = b.state_of_practice
        if table is None:
            continue
        workloads = [workload_of(n) for n in table.models]
        power = tables[name] = derive_peak_training_power(b, workloads, table.batch_sizes or SOP_BATCH_SIZES)
        print(f"{name}: peak training power per frequency (W), all models, all batch sizes that fit")
        for hz, w, sgemm in zip(b.frequencies_hz, power, b.full_load_power_w, strict=True):
            print(f"  {hz / 1e6:7.1f} MHz  {w:6.3f} W   (SGEMM full load {sgemm:.2f} W)")
    if args.write:
        write(tables)
        print(f"wrote {BOARDS_YAML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

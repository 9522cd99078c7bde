"""Where a test run's time goes: the tests over a threshold, from the JUnit XML that `make test` writes
(runs/tests.xml), beside an earlier run's for comparison. Prints the Markdown of docs/testing.md's table.

    python tests/durations.py runs/tests.xml [--before OLD.xml] [--min-seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def seconds_by_test(path: Path) -> dict[str, float]:
    """`module::test[param]` → seconds (setup, call and teardown, as pytest's JUnit report sums them)."""
    tests: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").removeprefix("tests.")
        tests[f"{module}::{case.get('name')}"] = float(case.get("time", 0.0))
    return tests


def table(after: dict[str, float], before: dict[str, float], min_seconds: float) -> list[str]:
    def cell(runs: dict[str, float], name: str) -> str:
        return f"{runs[name]:.0f}" if name in runs else "—"

    names = sorted(
        {n for runs in (after, before) for n, s in runs.items() if s >= min_seconds},
        key=lambda n: -max(after.get(n, 0.0), before.get(n, 0.0)),
    )
    lines = ["| test | before s | after s |", "|---|---:|---:|"]
    lines += [f"| `{n}` | {cell(before, n)} | {cell(after, n)} |" for n in names]
    lines.append(f"| tests | {len(before) or '—'} | {len(after)} |")
    lines.append(f"| sum of the tests' seconds | {sum(before.values()):.0f} | {sum(after.values()):.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", type=Path, help="JUnit XML of the run to show (make test: runs/tests.xml)")
    parser.add_argument("--before", type=Path, help="JUnit XML of an earlier run, for comparison")
    parser.add_argument("--min-seconds", type=float, default=20.0, help="show tests at least this long")
    args = parser.parse_args(argv)
    try:
        after = seconds_by_test(args.after)
        before = seconds_by_test(args.before) if args.before else {}
    except (OSError, ET.ParseError) as exc:
        print(f"durations: cannot read a JUnit report: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(after, before, args.min_seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

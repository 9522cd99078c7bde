"""The `powerctl` command as installed: powerctl's command line (which imports no training) with this
package's training step for `powerctl profile`; `python -m powerfed.training.powerctl_cli` runs it too."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from powerctl.cli import PROG
from powerctl.cli import commands as cli
from powerctl.cli.util import one_line_errors
from powerctl.records.workload import Workload


def _profiling_step(model_name: str, **options: Any) -> tuple[Workload, Callable[[int], Callable[[], None]]]:
    """`profiling_step_factory`, imported only when a profile is run: other commands load no torch."""
    from powerfed.training.profiling import profiling_step_factory

    return profiling_step_factory(model_name, **options)


@one_line_errors(PROG)  # cli.main is wrapped too: this makes the installed entry point one as well
def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, step_factory=_profiling_step)


if __name__ == "__main__":
    sys.exit(main())

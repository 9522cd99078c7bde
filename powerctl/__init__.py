"""Device side of power-aware training; no Flower, no training import. Its rooms by job (cli, profiling,
selection, devices, pinning, records, files; `errors`, `procs` and `progress` the ground) each import only
the rooms below them: docs/design/layout.md lists what each holds, tests/test_layers.py checks the order.
"""

from powerctl.errors import PowerctlError

__all__ = ["PowerctlError"]

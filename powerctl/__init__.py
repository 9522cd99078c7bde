"""Device side of power-aware training; no Flower, no training import (docs/design/layout.md).

Its rooms, by job, from the top: each imports only rooms below it (tests/test_layers.py checks it);
`errors`, `procs` and `progress` (the one progress bar) are the ground.

- `powerctl.cli`: the `powerctl` command, its shared one-line-error behaviour and its plots.
- `powerctl.profiling`: peak power and time per (batch size, GPU frequency) on a device: the profiler,
  its budget, the fitted order and the power monitor.
- `powerctl.selection`: choosing a pair under a cap: Algorithm 1, the baselines and the method
  registry, the time-energy front, caps that change and the guard that keeps under them.
- `powerctl.devices`: open a device (knobs + sensors): Jetson sysfs, NVML, simulated boards and their
  models, this host, and fake sysfs trees to rehearse on.
- `powerctl.pinning`: a pinned frequency is put back on every exit path, a crash's included.
- `powerctl.records`: what the rooms hand each other: the profile table, the relation vector, what a
  training step costs (workload) and a chosen pair (pick), with their file formats.
- `powerctl.files`: the files it reads and writes: bounded readers, the one mapping reader, versioned
  JSON, checked output paths, the cache folder and the bounds on every value.
"""

from powerctl.errors import PowerctlError

__all__ = ["PowerctlError"]

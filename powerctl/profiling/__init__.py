"""Profiling: peak power and time per (batch size, GPU frequency) for one training step, on a device:
`profiler` (grid, efficient, fitted orders), `budget` (a share of the training), `fit`, `monitor`."""

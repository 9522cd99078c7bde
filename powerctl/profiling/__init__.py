"""Profiling: peak power and time per (batch size, GPU frequency) for one training step, on a device.

`profiler` measures a grid or the efficient order, `budget` holds profiling to a share of the training
it serves, `fit` fits a few-parameter model to a few points (the fitted order), `monitor` samples power
during a block of work. What they produce is a `powerctl.records.profile.Profile`.
"""

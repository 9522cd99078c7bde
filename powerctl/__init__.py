"""Device side of power-aware training: devices (knobs + sensors), power monitor, profiler,
profile tables, selection and baselines. No Flower, no `training` import (docs/design/layout.md)."""

from powerctl.errors import PowerctlError

__all__ = ["PowerctlError"]

"""Device side of power-aware training; no Flower, no training import. Each room imports only the rooms
below it (docs/design/layout.md; tests/test_layers.py checks the order)."""

from powerctl.errors import PowerctlError

__all__ = ["PowerctlError"]

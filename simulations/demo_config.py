"""The demo's board, cap and run settings: plain data, light to import (the CLI's help shows them
without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_server.run_config import ServerConfig

DEMO_RUN = {
    "model": "resnet18-small",
    "relation_seeds": "0",
    "relation_max_samples": 6000,
    "checkpoint_every_samples": 0,
}
"""The demo's run settings where they differ from the app's defaults, by attribute (minutes on 2 cores)."""
DEMO_NODE = "demo"
"""The one node's name (its simulated board's noise seed derives from it)."""


@dataclass(frozen=True)
class DemoConfig:
    """One simulated board under a cap, and its run settings over `DEMO_RUN` (by attribute or key)."""

    device: str = "sim:jetson-nano"
    power_cap_w: float | None = 3.0
    run: dict[str, Any] = field(default_factory=dict)

    def run_config(self) -> dict[str, Any]:
        """`DEMO_RUN` under `run`, as a run config (its keys)."""
        from strategies.settings import key_of

        return {key_of(name): value for given in (DEMO_RUN, self.run) for name, value in given.items()}

    def settings(self) -> ServerConfig:
        from fl_server.run_config import parse_server_config

        return parse_server_config(self.run_config())

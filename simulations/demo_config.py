"""The demo's board, cap and run settings: plain data, light to import (the CLI's help shows them
without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_server.run_config import ServerConfig

DEMO_RUN = {
    "model": "resnet18-small",
    "relation-seeds": "0",
    "relation-max-samples": 6000,
    "checkpoint-every-samples": 0,
}
"""The demo's run settings where they differ from the app's defaults: a small ResNet, one proxy seed
(minutes on 2 cores), no checkpoints (nothing restarts it)."""
DEMO_NODE = "demo"
"""The one node's name (its simulated board's noise seed derives from it, as every node's does)."""


@dataclass(frozen=True)
class DemoConfig:
    """One simulated board under a cap, and the run settings (run-config keys, over `DEMO_RUN` and the
    app's defaults) its round uses."""

    device: str = "sim:jetson-nano"
    power_cap_w: float | None = 3.0
    run: dict[str, Any] = field(default_factory=dict)

    def run_config(self) -> dict[str, Any]:
        return {**DEMO_RUN, **self.run}

    def settings(self) -> ServerConfig:
        from fl_server.run_config import parse_server_config

        return parse_server_config(self.run_config())

"""What only the fleet runner's steps measure in a round, sent by the fleet's ClientApp beside the report
(a deployed board sends none) and read by the fleet's ServerApp into each results row."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from powerctl.files.mapping import Flag, Invalid, JsonObject, Maybe, Number, is_number, kind_field
from strategies.report import BesideReport

if TYPE_CHECKING:
    from fl_client.round import RoundOutcome


class SamplesByBatch(JsonObject):
    """Samples per batch size, as JSON text: a JSON object batch size → samples > 0."""

    def __call__(self, value: Any) -> dict[str, float]:
        items = super().__call__(json.dumps(value) if isinstance(value, dict) else value)
        for b, v in items.items():
            if not b.isdigit() or not (is_number(v) and v > 0):
                raise Invalid(f"must map batch sizes to samples > 0, got {b!r}: {v!r}")
        return items

    def to_config(self, value: Any) -> Any:
        return json.dumps(value, sort_keys=True)


@dataclass
class BenchReport(BesideReport):
    """What the fleet's steps measured; the results writer places its columns (`fl_server.results`)."""

    KEY: ClassVar[str] = "bench-report"

    stand_in: bool = kind_field(Flag(), False)
    """Scale mode: not trained, the board model charged the proxy's samples to target."""
    oracle_samples_to_target: dict[str, float] | None = kind_field(Maybe(SamplesByBatch()), None)  # noqa: RUF009
    """The oracle: samples to the target per batch size measured on the client's own data."""
    oracle_search_device_s: float | None = kind_field(Maybe(Number(0.0)), None)
    """The oracle: device seconds its own-data search took (reported apart, never charged)."""
    oracle_stopped_at_samples: dict[str, float] | None = kind_field(Maybe(SamplesByBatch()), None)  # noqa: RUF009
    """The oracle: batch sizes whose search run was stopped (`PRUNE_MARGIN`), with their samples."""


def measured(outcome: RoundOutcome) -> BenchReport | None:
    """What the fleet's steps measured in a round (None: none of them ran)."""
    searched = outcome.chosen.bench if isinstance(outcome.chosen.bench, BenchReport) else None
    if searched is None and not outcome.trained.stand_in:
        return None
    return replace(searched or BenchReport(), stand_in=outcome.trained.stand_in)

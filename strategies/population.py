"""A population larger than a round (simulation only): each round every board is available with its
chance (or as a trace says) and `clients-per-round` of them are sampled, both seeded by the run's `seed`
and the round over partition ids, so every method and rerun sees the same boards."""

from __future__ import annotations

import csv
import io
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from powerctl.errors import PowerctlError
from powerctl.files.jsonfile import write_json
from powerctl.files.readfile import TRACE_LIMIT, read_bytes
from strategies.fleet import app_path_of, load_fleet
from strategies.settings import RunSettings

log = logging.getLogger(__name__)
POPULATION_FILE = "population.json"  # beside a method's results.json: each round's draw
SCHEMA = "strategies.population/1"

_NODE_PARTITIONS: dict[int, int] = {}  # node id → partition id of this process's simulation


class PopulationError(PowerctlError):
    """A population that cannot be drawn (not a local simulation, no board available, a bad trace)."""


def record_nodes(mapping: Mapping[int, int]) -> None:
    """The simulation's virtual nodes, node id → partition id (Flower's `vce_api._register_nodes`)."""
    _NODE_PARTITIONS.clear()
    _NODE_PARTITIONS.update(mapping)


@dataclass(frozen=True)
class Draw:
    """One round's draw: the boards (partition ids) available, and those sampled among them."""

    round: int
    population: int
    available: list[int]
    sampled: list[int]

    def record(self) -> dict[str, Any]:
        """What results.json keeps: counts, the sampled boards and those NOT available (the shorter list)."""
        return {
            "round": self.round,
            "population": self.population,
            "available": len(self.available),
            "sampled": self.sampled,
            "unavailable": sorted(set(range(self.population)) - set(self.available)),
        }


# each row: a window of rounds (inclusive; last-round empty: to the end) a board (partition id) is there
TRACE_COLUMNS = ("board", "first-round", "last-round")
TRACE_HELP = (
    "a CSV with the header board,first-round,last-round and a row per window of rounds a board is "
    "available (docs/reference/files.md#availability-trace)"
)


@dataclass(frozen=True)
class AvailabilityTrace:
    """Which rounds each board is there; a board the trace does not name is never available."""

    path: str
    windows: Mapping[int, tuple[tuple[int, int | None], ...]]

    def available(self, board: int, server_round: int) -> bool:
        return any(
            first <= server_round and (last is None or server_round <= last)
            for first, last in self.windows.get(board, ())
        )


def read_availability_trace(path: str | Path) -> AvailabilityTrace:
    """The trace at `path` (`TRACE_COLUMNS`), or one `PopulationError` line naming the file and row."""
    what = "an availability trace (CSV)"
    try:
        text = read_bytes(path, limit=TRACE_LIMIT, what=what, error=PopulationError).decode("utf-8")
    except OSError as exc:
        raise PopulationError(f"{path}: cannot read the availability trace ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PopulationError(f"{path}: not UTF-8 text; give {TRACE_HELP}") from None
    rows = csv.reader(io.StringIO(text), strict=True)
    try:
        table = [[cell.strip() for cell in row] for row in rows]
    except csv.Error as exc:  # a NUL character, a quote left open
        raise PopulationError(f"{path}: line {rows.line_num}: not CSV ({exc}); give {TRACE_HELP}") from None
    header = table[0] if table else []
    if tuple(header) != TRACE_COLUMNS:
        raise PopulationError(f"{path}: line 1 is {','.join(header)!r}, not the header; give {TRACE_HELP}")
    windows: dict[int, list[tuple[int, int | None]]] = {}
    for line, cells in enumerate(table[1:], start=2):
        if not any(cells):
            continue
        try:
            board_cell, first_cell, last_cell = cells  # not three cells: a ValueError too
            board, first, last = int(board_cell), int(first_cell), int(last_cell) if last_cell else None
            if board < 0 or first < 1 or (last is not None and last < first):
                raise ValueError
        except ValueError:
            raise PopulationError(
                f"{path}: line {line}: {','.join(cells)!r} is not a board (0 or more), a first round (1 or "
                f"more) and a last round (empty, or not before the first); give {TRACE_HELP}"
            ) from None
        windows.setdefault(board, []).append((first, last))
    return AvailabilityTrace(str(path), {b: tuple(w) for b, w in windows.items()})


@dataclass(frozen=True)
class Population:
    """`clients-per-round` (0: every available board) and each board's chance to be there in a round."""

    clients_per_round: int = 0
    availability: float = 1.0
    seed: int = 0
    per_board: tuple[float | None, ...] = ()  # each board's own chance (i mod its length; None: the above)
    trace: AvailabilityTrace | None = None  # which rounds each board is there, instead of chances

    def __post_init__(self) -> None:
        if self.trace is not None and (self.availability < 1.0 or self._own()):
            raise PopulationError(
                "availability is given twice, as a chance ('availability', a group's 'availability') and "
                "as a trace ('availability-trace'): keep one"
            )

    @property
    def active(self) -> bool:
        return self.clients_per_round > 0 or self.availability < 1.0 or self._own() or self.trace is not None

    def _own(self) -> bool:
        return any(p is not None for p in self.per_board)

    def chance(self, board: int) -> float:
        own = self.per_board[board % len(self.per_board)] if self.per_board else None
        return self.availability if own is None else own

    def draw(self, server_round: int, boards: Iterable[int], population: int) -> Draw:
        """Round `server_round`'s draw over `boards` (partition ids connected), the same in every run."""
        rng = random.Random(f"powerfed-population/{self.seed}/{server_round}")
        boards = sorted(boards)
        if self.trace is not None:
            available = [b for b in boards if self.trace.available(b, server_round)]
        elif self._own() or self.availability < 1.0:  # one draw each, in partition order
            available = [b for b in boards if rng.random() < self.chance(b)]
        else:
            available = boards
        k = len(available) if self.clients_per_round == 0 else min(self.clients_per_round, len(available))
        return Draw(server_round, population, available, sorted(rng.sample(available, k)))


def check_population(population: Population, boards: int, rounds: int) -> None:
    """One PopulationError line, before any work, when the trace names boards the fleet lacks or no board
    is available in any of the `rounds` rounds."""
    if not population.active or boards < 1:
        return
    if population.trace and (beyond := sorted(b for b in population.trace.windows if b >= boards)):
        shown = ", ".join(map(str, beyond[:5])) + (" ..." if len(beyond) > 5 else "")
        raise PopulationError(
            f"the availability trace {population.trace.path} names board(s) {shown} the fleet does not have "
            f"(its {boards} boards are 0-{boards - 1}, in the fleet's order)"
        )
    if not any(population.draw(r, range(boards), boards).available for r in range(1, rounds + 1)):
        why = (
            f"the availability trace {population.trace.path} has no window in rounds 1-{rounds}"
            if population.trace is not None
            else f"availability {population.availability:g} and the groups' own chances drew none"
        )
        raise PopulationError(
            f"no board is available in any of the {rounds} round(s): {why}; raise the availability or "
            "give the boards windows in these rounds"
        )


def run_population(settings: RunSettings, per_board: tuple[float | None, ...] | None = None) -> Population:
    """The run's population from its settings and each board's own chance (default: as the `fleet` gives
    them, read afresh; only a fleet file's groups set one)."""
    if per_board is None:
        per_board = tuple(e.availability for e in load_fleet.__wrapped__(settings.fleet))
    trace_file = settings.availability_trace
    trace = read_availability_trace(app_path_of(trace_file)) if trace_file.strip() else None
    return Population(settings.clients_per_round, settings.availability, settings.seed, per_board, trace)


class _RoundGrid:
    """The grid as the inner strategy sees it in one round: only the sampled nodes exist."""

    def __init__(self, grid: Grid, node_ids: list[int]) -> None:
        self._grid, self._node_ids = grid, node_ids

    def get_node_ids(self) -> list[int]:
        return list(self._node_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


class PopulationSampled(Strategy):
    """The inner strategy, shown only the round's sampled nodes (node ids map to partitions through what
    the simulation registered, `record_nodes`). Each round's draw is logged and, given `path`, kept in that
    JSON file, rewritten each round."""

    def __init__(
        self,
        strategy: Strategy,
        population: Population,
        *,
        path: Path | None = None,
        partitions: Callable[[], dict[int, int]] = _NODE_PARTITIONS.copy,
    ) -> None:
        self.strategy, self.population, self.path = strategy, population, path
        self._partitions = partitions
        self._sampled: dict[int, list[int]] = {}  # round → the node ids sampled (drawn once a round)
        self.draws: list[dict[str, Any]] = []  # each round's Draw.record()

    def _configure(
        self, configure: Any, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Any:
        if server_round not in self._sampled:
            mapping = self._partitions()
            if not mapping:
                raise PopulationError(
                    "'clients-per-round' and 'availability' need a local simulation (the boards' node ids "
                    "are known there only): in a deployment each board joins and leaves by itself"
                )
            by_board = {mapping[n]: n for n in grid.get_node_ids() if n in mapping}
            draw = self.population.draw(server_round, by_board, len(mapping))
            self._sampled[server_round] = [by_board[b] for b in draw.sampled]
            self._record(draw)
        if not (nodes := self._sampled[server_round]):  # nobody: Flower's sampling would wait for ever
            return []
        return configure(server_round, arrays, config, cast(Grid, _RoundGrid(grid, nodes)))

    def _record(self, draw: Draw) -> None:
        counts = (draw.round, len(draw.available), draw.population, len(draw.sampled))
        log.info("population: round %d: %d of %d boards available, %d sampled", *counts)
        self.draws.append(draw.record())
        if self.path is not None:
            write_json(
                self.path,
                {
                    "schema": SCHEMA,
                    "clients_per_round": self.population.clients_per_round,
                    "availability": self.population.availability,
                    "availability_trace": self.population.trace.path if self.population.trace else "",
                    "seed": self.population.seed,
                    "rounds": self.draws,
                },
            )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._configure(self.strategy.configure_train, server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self._configure(self.strategy.configure_evaluate, server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()

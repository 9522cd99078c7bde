"""Progress lines of a run, so that no phase looks hung: a Grid that says how a round is going (Flower's
`send_and_receive` blocks until every reply is in), a pre-training's samples with the time left, and a
line when nothing else was heard for a while."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, cast

from flwr.app import Message

from powerctl.progress import Say

QUIET_S = 8.0  # the longest a phase goes without a line


@dataclass(eq=False)  # hashed by identity, as the Grid it stands for
class ProgressGrid:
    """Delegates to `grid`; `send_and_receive` is Flower's loop with progress lines."""

    grid: Any
    say: Say
    _: KW_ONLY
    every_s: float = 5.0
    poll_s: float = 0.5
    quiet_s: float = QUIET_S
    label: str = ""  # set by the caller, e.g. the method's name
    round: int = 0  # the server-round of the last train/evaluate messages sent
    started: float = field(default_factory=time.perf_counter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []  # nothing to wait for (a resumed run's rounds done before): no progress line
        kind = messages[0].metadata.message_type
        if "config" in messages[0].content.config_records:
            config = messages[0].content.config_records["config"]
            # server-round: an int in every config Flower sends
            self.round = int(cast(int, config.get("server-round", self.round)))
        total = len(messages)
        pending = set(self.grid.push_messages(messages))
        del messages
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        said, last = -1, 0.0
        while True:
            got = list(self.grid.pull_messages(pending))
            replies += got
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            now = time.perf_counter()
            done = total - len(pending)
            changed = done != said and (not pending or now - last >= self.every_s)
            if changed or now - last >= self.quiet_s:
                where = kind if kind == "query" else f"round {self.round} {kind}"
                self.say(
                    f"  [{self.label}] {where}: {done}/{total} clients done, "
                    f"{now - self.started:.0f} s elapsed"
                )
                said, last = done, now
            if not pending or (timeout is not None and time.time() >= end):
                return replies
            time.sleep(self.interval_s(len(pending)))

    def interval_s(self, pending: int) -> float:
        """The pull interval, scaled with what is pending (a pull costs O(pending)), up to Flower's 3 s."""
        return min(3.0, max(self.poll_s, pending / 500))


@dataclass
class SampleProgress:
    """`on_step(steps, samples)`: every `every_s` s at most, the samples done, the time so far and left."""

    say: Say
    what: str
    total: int
    every_s: float = 5.0
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        self.started = self.last = self.clock()

    def __call__(self, steps: int, samples: int) -> None:
        now = self.clock()
        if now - self.last < self.every_s or samples >= self.total:
            return  # the end is the caller's line (how long it took)
        self.last = now
        spent = now - self.started
        left = spent / max(samples, 1) * (self.total - samples)
        self.say(
            f"{self.what}: {samples} of {self.total} samples, {spent:.0f} s so far, about {left:.0f} s left"
        )


class Heartbeat:
    """A line when nothing was heard for `quiet_s` seconds ("still preparing, N s in all")."""

    def __init__(
        self,
        say: Say,
        what: str,
        started: float | None = None,
        *,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.say, self.what, self.quiet_s, self.clock = say, what, quiet_s, clock
        self.started = clock() if started is None else started
        self.last = clock()

    def heard(self, line: str) -> None:
        """Say `line` (the phase's own progress)."""
        self.say(line)
        self.last = self.clock()

    def tick(self) -> None:
        """Nothing new: a line if nothing was said for `quiet_s` seconds."""
        now = self.clock()
        if now - self.last >= self.quiet_s:
            self.say(f"  ... still {self.what}: {now - self.started:.0f} s in all")
            self.last = now

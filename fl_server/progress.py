"""A Grid that says how a round is going: which method, which round and phase, clients done, elapsed.

Flower's `send_and_receive` blocks until every reply is in (or the timeout), so nothing is heard of a
round of a large fleet until it ends. This wrapper pushes the messages and pulls replies itself,
printing a line when the count changes (at most every `every_s` seconds, and always at the end). It
polls every 0.5 s while few replies are pending (Flower waits 3 s between pulls: most of a small
fleet's round), less often for a large fleet (`interval_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from flwr.app import Message


class ProgressGrid:
    """Delegates to `grid`; `send_and_receive` is Flower's loop with progress lines."""

    def __init__(
        self, grid: Any, say: Callable[[str], None], *, every_s: float = 5.0, poll_s: float = 0.5
    ) -> None:
        self._grid, self._say = grid, say
        self.every_s, self.poll_s = every_s, poll_s
        self.started = time.perf_counter()
        self.label = ""
        """Set by the caller, e.g. the method's name."""
        self.round = 0
        """The round of the last train/evaluate messages sent (their config's server-round)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []  # nothing to wait for (a resumed run's rounds done before): no progress line
        kind = messages[0].metadata.message_type if messages else "?"
        if messages and "config" in messages[0].content.config_records:
            config = messages[0].content.config_records["config"]
            # server-round: an int in every config Flower sends
            self.round = int(cast(int, config.get("server-round", self.round)))
        total = len(messages)
        pending = set(self._grid.push_messages(messages))
        del messages
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        said, last = -1, 0.0
        while True:
            got = list(self._grid.pull_messages(pending))
            replies += got
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            now = time.perf_counter()
            done = total - len(pending)
            if done != said and (not pending or now - last >= self.every_s):
                where = kind if kind == "query" else f"round {self.round} {kind}"
                self._say(
                    f"  [{self.label}] {where}: {done}/{total} clients done, "
                    f"{now - self.started:.0f} s elapsed"
                )
                said, last = done, now
            if not pending or (timeout is not None and time.time() >= end):
                return replies
            time.sleep(self.interval_s(len(pending)))

    def interval_s(self, pending: int) -> float:
        """Each pull costs the SuperLink O(pending) and a round lasts O(fleet): a fixed interval makes a
        round's pulls O(fleet²). Scaling the interval with what is pending keeps them linear (0.5 s
        for up to 250 messages, 3 s — Flower's own interval — from 1,500)."""
        return min(3.0, max(self.poll_s, pending / 500))

"""Write the example availability trace in this folder (seeded: the same file every time): 250 boards
over 6 rounds, a third online for good, a third in one window of 2 to 4 rounds (charging overnight), a
third in two short windows (a phone on and off Wi-Fi)."""

from __future__ import annotations

import random
from pathlib import Path

BOARDS = 250
ROUNDS = 6
SEED = 0


def windows(board: int, rng: random.Random) -> list[tuple[int, int | None]]:
    kind = board % 3
    if kind == 0:
        return [(1, None)]
    if kind == 1:
        first = rng.randint(1, ROUNDS)
        return [(first, min(ROUNDS, first + rng.randint(1, 3)))]
    a = rng.randint(1, ROUNDS - 2)
    b = rng.randint(a + 2, ROUNDS)
    return [(a, a), (b, b)]


def main() -> None:
    rng = random.Random(SEED)
    rows = ["board,first-round,last-round"]
    for board in range(BOARDS):
        rows += [f"{board},{first},{'' if last is None else last}" for first, last in windows(board, rng)]
    (Path(__file__).parent / "online-250.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

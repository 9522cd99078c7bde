"""Write the example solar-like cap traces in this folder: a day compressed into `DAY_S` seconds, the cap
rising as sin(π t / day)^1.5 from the board's low cap to its high one, a cloud taking 45 % off between
55 % and 65 % of the day; a row every day / 60, rounded to 0.05 W."""

from __future__ import annotations

import math
from pathlib import Path

DAY_S = 600.0
ROWS = 60
BOARDS = {"solar-jetson-nano.csv": (2.4, 5.0), "solar-jetson-tx2nx.csv": (3.6, 7.5)}


def solar_w(t_s: float, low_w: float, high_w: float) -> float:
    sun = math.sin(math.pi * t_s / DAY_S) ** 1.5
    cloud = 0.55 if 0.55 * DAY_S <= t_s < 0.65 * DAY_S else 1.0
    return max(low_w, round((low_w + (high_w - low_w) * sun) * cloud / 0.05) * 0.05)


def main() -> None:
    here = Path(__file__).parent
    for name, (low, high) in BOARDS.items():
        rows = [f"{i * DAY_S / ROWS:g},{solar_w(i * DAY_S / ROWS, low, high):.2f}" for i in range(ROWS)]
        header = f"# {Path(__file__).name}: a compressed solar day, {low}-{high} W\nseconds,watts\n"
        (here / name).write_text(header + "\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Heat maps of a profile: files written, selection marked in the right cell, cap boundary, gaps hatched."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from powerctl.cli.plot import BOUNDARY_GID, SELECTION_CELL_GID, SELECTION_GID, plot_profile, profile_figures
from powerctl.errors import FileFormatError
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import select
from tests.test_selection import MHZ, make_profile, make_relation, point

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sample() -> tuple[Profile, RelationVector]:
    """3 batch sizes × 3 frequencies, (8, 300 MHz) not profiled. r_8 = 0.5, r_16 = 0.75, r_32 = 1.

    At a 5 W cap the feasible pairs and T_N·r_b are (32,100)=100, (16,100)=90, (16,200)=60, (8,100)=100,
    (8,200)=70: the method picks (16, 200 MHz).
    """
    profile = make_profile(
        [
            point(32, 100, 4.0, 100.0),
            point(32, 200, 6.0, 60.0),
            point(32, 300, 8.0, 45.0),
            point(16, 100, 3.0, 120.0),
            point(16, 200, 4.8, 80.0),
            point(16, 300, 6.5, 60.0),
            point(8, 100, 2.5, 200.0),
            point(8, 200, 3.9, 140.0),
        ]
    )
    return profile, make_relation({8: 1000.0, 16: 1500.0, 32: 2000.0})


def axes(fig: Figure) -> Axes:
    return fig.axes[0]  # the heat map; fig.axes[1] is its colorbar


def marked_cell(fig: Figure) -> tuple[str, str]:
    """(batch size, MHz) tick labels under the star, read back from the drawn figure."""
    ax = axes(fig)
    stars = [line for line in ax.lines if line.get_gid() == SELECTION_GID]
    assert len(stars) == 1
    x, y = stars[0].get_xdata()[0], stars[0].get_ydata()[0]
    col, row = round(x), round(y)
    outline = [p for p in ax.patches if p.get_gid() == SELECTION_CELL_GID]
    assert len(outline) == 1 and outline[0].get_xy() == (col - 0.5, row - 0.5)
    xlabels = [t.get_text() for t in ax.get_xticklabels()]
    ylabels = [t.get_text() for t in ax.get_yticklabels()]
    return ylabels[row], xlabels[col]


def test_writes_valid_pngs(tmp_path: Path) -> None:
    profile, relation = sample()
    out = tmp_path / "new" / "dir"
    assert list(profile_figures(profile)) == ["peak_power", "time"]  # no relation: no time-to-accuracy map
    paths = plot_profile(profile, out, power_cap_w=5.0, relation=relation)
    assert [p.name for p in paths] == ["peak_power.png", "time.png", "predicted_time_to_target.png"]
    for p in paths:
        data = p.read_bytes()
        assert p.parent == out and len(data) > 1000 and data.startswith(PNG_MAGIC)


def test_given_selection_is_marked_in_its_cell_on_every_map() -> None:
    profile, relation = sample()
    sel = Pick(32, 100 * MHZ, 100.0, 4.0)  # not what select would pick: the plot must mark what it is given
    figs = profile_figures(profile, power_cap_w=5.0, relation=relation, selection=sel)
    assert set(figs) == {"peak_power", "time", "predicted_time_to_target"}
    for fig in figs.values():
        assert marked_cell(fig) == ("32", "100")


def test_with_a_relation_the_selection_is_computed_and_marked() -> None:
    profile, relation = sample()
    sel = select(profile, relation, 5.0)
    assert (sel.batch_size, sel.frequency_hz) == (16, 200 * MHZ)  # worked out in sample()'s docstring
    for fig in profile_figures(profile, power_cap_w=5.0, relation=relation).values():
        assert marked_cell(fig) == ("16", "200")


def test_no_selection_no_star() -> None:
    profile, _ = sample()
    for fig in profile_figures(profile, power_cap_w=5.0).values():
        assert not [line for line in axes(fig).lines if line.get_gid() == SELECTION_GID]
    # Infeasible cap with a relation: no star, and the title says why.
    figs = profile_figures(profile, power_cap_w=1.0, relation=sample()[1])
    assert not [line for line in axes(figs["peak_power"]).lines if line.get_gid() == SELECTION_GID]
    assert "no pair is feasible" in axes(figs["peak_power"]).get_title(loc="left")


def boundary_segments(fig: Figure) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    cols = [c for c in axes(fig).collections if isinstance(c, LineCollection) and c.get_gid() == BOUNDARY_GID]
    if not cols:
        return []
    assert len(cols) == 1
    return sorted(tuple(sorted(tuple(map(float, v)) for v in seg)) for seg in cols[0].get_segments())


def test_cap_boundary_separates_feasible_from_infeasible_cells() -> None:
    profile, _ = sample()
    # Rows (bottom→top) 8, 16, 32; columns 100, 200, 300 MHz. At 5 W: feasible (32,100), (16,100), (16,200),
    # (8,100), (8,200); (8,300) is not profiled. Boundary edges between a feasible and an infeasible cell:
    #   (32,100)|(32,200) vertical at x=0.5, row 2      (16,200)|(16,300) vertical at x=1.5, row 1
    #   (16,200)/(32,200) horizontal at y=1.5, col 1
    want = sorted(
        [
            ((0.5, 1.5), (0.5, 2.5)),
            ((1.5, 0.5), (1.5, 1.5)),
            ((0.5, 1.5), (1.5, 1.5)),
        ]
    )
    assert boundary_segments(profile_figures(profile, power_cap_w=5.0)["peak_power"]) == want
    assert boundary_segments(profile_figures(profile)["peak_power"]) == []  # no cap, no boundary
    assert boundary_segments(profile_figures(profile, power_cap_w=100.0)["peak_power"]) == []  # all feasible


def test_missing_points_are_hatched() -> None:
    profile, _ = sample()
    ax = axes(profile_figures(profile)["time"])
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert [p.get_xy() for p in hatched] == [(2 - 0.5, 0 - 0.5)]  # (8, 300 MHz): column 2, row 0


def test_ticks_titles_and_colorbar_units() -> None:
    profile, relation = sample()
    figs = profile_figures(profile, power_cap_w=5.0, relation=relation)
    ax = axes(figs["peak_power"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "200", "300"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["8", "16", "32"]
    assert "GPU frequency (MHz)" in ax.get_xlabel()
    title = ax.get_title(loc="left")
    assert "jetson-nano" in title and "resnet18" in title and "5.00 W" in title
    assert "(W)" in figs["peak_power"].axes[1].get_ylabel()
    assert "(s)" in figs["time"].axes[1].get_ylabel()
    texts = {t.get_text() for t in ax.texts}
    assert {"4.0", "6.0", "2.5", "3.9"} <= texts  # annotated cell values


def test_selection_not_in_the_profile_is_a_one_line_error() -> None:
    profile, _ = sample()
    with pytest.raises(FileFormatError, match="not a profiled point"):
        profile_figures(profile, selection=Pick(8, 300 * MHZ, 1.0, 1.0))


def test_time_to_accuracy_rows_are_the_common_batch_sizes() -> None:
    profile, _ = sample()
    relation = make_relation({16: 1.0, 32: 2.0, 64: 1.0})
    ax = axes(profile_figures(profile, relation=relation)["predicted_time_to_target"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["16", "32"]

"""boards.yaml: every constant names its source, and a board's calibration is read as the paper's figures."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from powerctl.devices.boards import (
    CONSTANTS,
    SOURCE_KINDS,
    _raw_boards,
    board_model,
    board_names,
    parse_boards,
)
from powerctl.errors import DeviceError

RANK = {kind: i for i, kind in enumerate(SOURCE_KINDS)}
"""measured < derived < estimated: a constant is no better than the weakest of its inputs."""
DERIVE_INPUTS = {"full_load_power_w": ("energy_per_flop_factor", "idle_power_w", "gflops_per_ghz")}
"""This board's own inputs of a constant `powerctl.devices.boards._derive` computes, beyond the
reference's."""


def _rank(source: str) -> int:
    return RANK[source.split(" — ")[0].split(",")[0]]


def test_every_constant_of_every_board_names_its_source() -> None:
    raw = _raw_boards()
    for name in board_names():
        board = board_model(name)
        keys = [k for k in CONSTANTS if hasattr(board, k) or k in raw[name]]
        assert set(keys) <= set(board.sources), (name, set(keys) - set(board.sources))
        for key in keys:
            kind = board.source_kind(key)
            assert kind.split(",")[0] in SOURCE_KINDS, (name, key, board.sources[key])
            assert board.sources[key].partition(" — ")[2].strip(), (name, key)


def test_a_constant_computed_from_another_board_claims_no_more_than_its_inputs() -> None:
    # "derived" needs measured inputs only; a copy or scaling of the reference's estimate stays an estimate
    raw = _raw_boards()
    derived = [n for n in board_names() if "derived_from" in raw[n]]
    assert derived == ["jetson-tx2nx"]
    for name in derived:
        own, ref = board_model(name), board_model(raw[name]["derived_from"])
        for key in (k for k in own.sources if k not in raw[name] and k in ref.sources):
            inputs = [ref.sources[key]] + [own.sources[k] for k in DERIVE_INPUTS.get(key, ())]
            assert _rank(own.sources[key]) >= max(RANK["derived"], *map(_rank, inputs)), (
                key,
                own.sources[key],
            )


def _broken(change: Any) -> dict[str, Any]:
    raw = copy.deepcopy(_raw_boards())
    change(raw)
    return raw


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda r: r["jetson-nano"]["sources"].pop("launch_s"), "constant launch_s has no valid source"),
        (lambda r: r["jetson-nano"]["sources"].update(launch_s="guessed — by eye"), "launch_s"),
        (lambda r: r["jetson-nano"]["sources"].update(launch_s="estimated"), "launch_s"),
        # a derived board's computed constants need sources too
        (lambda r: r["jetson-tx2nx"]["sources"].pop("gflops_per_ghz"), "constant gflops_per_ghz"),
        (lambda r: r["jetson-tx2nx"].pop("sources"), "has no valid source"),
        (
            lambda r: r["jetson-tx2nx"]["calibration"].update(reference="jetson-orin"),
            "reference 'jetson-orin'",
        ),
        (lambda r: r["jetson-tx2nx"]["calibration"].update(reference="jetson-tx2nx"), "another board"),
        (lambda r: r["jetson-tx2nx"]["calibration"]["seconds"].update(svhn=[619]), "svhn: expected"),
        (lambda r: r["jetson-tx2nx"]["calibration"]["seconds"].update(svhn="61"), "svhn: expected"),
        (lambda r: r["jetson-tx2nx"]["calibration"]["seconds"].update(cinic=[783, 0]), "both > 0"),
        (lambda r: r["jetson-tx2nx"]["calibration"].update(seconds={}), "at least one target"),
    ],
)
def test_a_bad_board_entry_is_one_line_naming_the_board(change: Any, fragment: str) -> None:
    with pytest.raises(DeviceError) as err:
        parse_boards(_broken(change))
    msg = str(err.value)
    assert fragment in msg and "board 'jetson-" in msg and "\n" not in msg


def test_the_calibration_holds_the_papers_seconds() -> None:
    cal = board_model("jetson-tx2nx").calibration
    assert cal is not None and (cal.reference, cal.model, cal.batch_size) == ("jetson-nano", "resnet18", 128)
    # the paper's state of practice without a cap: Nano 619 s / 783 s, TX2 NX 302 s / 382 s
    assert cal.paper_time_ratio() == pytest.approx((619 / 302 + 783 / 382) / 2)
    assert board_model("jetson-nano").calibration is None

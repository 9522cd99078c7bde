"""The `Custom` kinds of the project's own values that run settings hold: each checks a value and says in
one line what it must be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powerctl.files.mapping import Choice, Custom, Invalid, Text, must_be
from powerctl.files.readfile import not_regular
from strategies.fleet import app_path_of, fleet_file, fleet_table

FAULT_KINDS = ("raise", "hang", "kill")
"""Injected failures (soak tests only, `fl_client.faults`)."""


def _model(value: Any) -> str:
    from powerfed.training.models import model_names

    return Choice(tuple(model_names()))(value)


def _dataset(value: Any) -> str:
    """A dataset spec, checked for its form by the loader's parser: the file itself lives on the clients."""
    from powerfed.training.data.load import _FILE_LOADERS, GENERATED, dataset_path
    from powerfed.training.errors import DataError

    text = value.strip() if isinstance(value, str) else ""
    try:
        dataset_path(text)  # "" is no spec
    except DataError:
        raise must_be(
            f"a dataset spec ({', '.join(GENERATED)}, or KIND:PATH with KIND in {', '.join(_FILE_LOADERS)})",
            value,
        ) from None
    return text


def _app_file(value: Any) -> str:
    """Empty, or a file that exists: absolute, or relative to the app folder (the ServerApp runs in
    Flower's copy of the app, not where `flwr run` started)."""
    text = Text(empty=True)(value)
    if text and (what := not_regular(path := app_path_of(text))) is not None:
        if what == "no such file":
            raise Invalid(f"names no such file: {path} (give an absolute path)")
        raise Invalid(f"names {path}, which is {what}, not a regular file; give a file")
    return text


def _torch_device(value: Any) -> str:
    """Where the server trains, checked for its form: only the machine that trains can say if it has it."""
    from powerctl.devices.torchdev import TORCH_SPEC_HELP, check_torch_spec
    from powerctl.errors import DeviceError

    try:
        return check_torch_spec(value)
    except DeviceError:
        raise must_be(TORCH_SPEC_HELP, value) from None


def _folder(value: Any) -> str:
    text = Text(empty=True)(value)
    if text and not Path(text).expanduser().is_absolute():
        raise must_be("an absolute folder (the apps do not run in the folder flwr run started in)", value)
    return text


def _fleet(value: Any) -> str:
    """A fleet table (parsed, every cap checked against its board) or a fleet file that exists."""
    text = Text()(value)
    if fleet_file(text) is None:
        fleet_table(text)
    return text


def parse_fault_spec(spec: str) -> dict[str, float]:
    """``raise:0.1,hang:0.05,kill:0.05`` → probabilities per kind (empty: none), or `Invalid`."""
    probabilities: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        kind, _, p = part.partition(":")
        try:
            value = float(p)
        except ValueError:
            value = -1.0
        if kind not in FAULT_KINDS or not 0.0 <= value <= 1.0:
            raise Invalid(
                f"holds {part!r}, which is not KIND:P (KIND in {', '.join(FAULT_KINDS)}, P in [0, 1])"
            )
        probabilities[kind] = value
    if sum(probabilities.values()) > 1.0:
        raise Invalid(f"has probabilities that add up to more than 1: {spec!r}")
    return probabilities


def _faults(value: Any) -> str:
    text = Text(empty=True)(value)
    parse_fault_spec(text)
    return text


MODEL = Custom(_model, "a model name", str)
DATASET = Custom(_dataset, "a dataset spec", str)
APP_FILE = Custom(_app_file, "a file (or empty)", str)
TORCH_DEVICE = Custom(_torch_device, "auto, cpu, cuda or cuda:INDEX", str)
FOLDER = Custom(_folder, "an absolute folder (or empty)", str)
FLEET = Custom(_fleet, "a fleet table or a fleet file", str)
FAULTS = Custom(_faults, "KIND:P, ... (or empty)", str)

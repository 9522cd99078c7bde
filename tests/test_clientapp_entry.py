"""The light `flwr-clientapp` a deployed SuperNode runs per message (`fl_client.clientapp_entry`): it takes
exactly Flower's arguments and calls `run_clientapp` with Flower's values, its process imports none of
the SuperNode's SQL state (nor torch, for a query), and any other Flower source gets Flower's own.

Flower's `run_clientapp` itself imports fastapi (`flwr.supercore.error`), so that one is not asserted
absent; sqlalchemy, alembic and `flwr.supernode.cli` are what the light script leaves out."""

from __future__ import annotations

import json
import logging
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fl_client import clientapp_entry
from fl_client.clientapp_entry import FLWR_CLIENTAPP_SHA256, flower_source, light_clientapp, write_script
from fl_client.supernode import child_env
from strategies.flower_source import text_fingerprint

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ARGVS = [
    ["--token", "ab12"],
    ["--token", " ab12 ", "--insecure", "--parent-pid", "4242"],
    ["--runtime-api-address", "127.0.0.1:19094", "--token-file", "TOKEN", "--root-certificates", "CA"],
    ["--runtime-api-address=[::1]:9094", "--token=ab", "--allow-runtime-dependency-installation"],
]


def _argv(argv: list[str], tmp_path: Path) -> list[str]:
    (tmp_path / "TOKEN").write_text("cd34\n")
    (tmp_path / "CA").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    return [str(tmp_path / a) if a in ("TOKEN", "CA") else a for a in argv]


def _flower() -> Any:
    """Flower's own `flwr_clientapp` module (its package exports the function under the same name)."""
    import importlib

    return importlib.import_module("flwr.supernode.cli.flwr_clientapp")


@pytest.fixture
def light(tmp_path: Path) -> dict[str, Any]:
    """The light script's namespace (its `if __name__ == "__main__"` not run)."""
    script = write_script(tmp_path)
    assert script is not None and os.access(script, os.X_OK)
    return runpy.run_path(str(script), run_name="light_flwr_clientapp")


def test_the_installed_flower_is_the_source_the_script_was_checked_against() -> None:
    path, text = flower_source()
    assert text is not None and text_fingerprint(text) == FLWR_CLIENTAPP_SHA256, path


@pytest.mark.parametrize("argv", ARGVS, ids=range(len(ARGVS)))
def test_the_light_script_parses_what_flowers_parses(
    light: dict[str, Any], tmp_path: Path, argv: list[str]
) -> None:
    flower = _flower()
    argv = _argv(argv, tmp_path)
    ours = light["_parse_args_run_flwr_clientapp"]().parse_args(argv)
    assert ours == flower._parse_args_run_flwr_clientapp().parse_args(argv)


@pytest.mark.parametrize("argv", [[], ["--token", "a", "--token-file", "f"], ["--token", "a", "--bogus"]])
def test_the_light_script_refuses_what_flower_refuses(light: dict[str, Any], argv: list[str]) -> None:
    flower = _flower()
    for parser in (light["_parse_args_run_flwr_clientapp"](), flower._parse_args_run_flwr_clientapp()):
        with pytest.raises(SystemExit) as refused:
            parser.parse_args(argv)
        assert refused.value.code == 2


@pytest.mark.parametrize("argv", [ARGVS[1], ARGVS[2]], ids=["insecure", "certificates"])
def test_the_light_script_calls_run_clientapp_with_flowers_values(
    light: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    flower = _flower()
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sys, "argv", ["flwr-clientapp", *_argv(argv, tmp_path)])
    monkeypatch.setattr(flower, "run_clientapp", lambda **kw: calls.append(kw))
    flower.flwr_clientapp()
    light["flwr_clientapp"].__globals__["run_clientapp"] = lambda **kw: calls.append(kw)  # run_path copies
    light["flwr_clientapp"]()
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[0]["token"] in ("ab12", "cd34")


def test_another_flower_source_gets_flowers_own_clientapp(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(clientapp_entry, "FLWR_CLIENTAPP_SHA256", "0" * 64)
    with caplog.at_level(logging.WARNING, "fl_client"), light_clientapp() as folder:
        assert folder is None
        env = child_env(str(BIN / "flower-supernode"), folder)
        assert shutil.which("flwr-clientapp", path=env["PATH"]) == str(BIN / "flwr-clientapp")
    lines = [r.getMessage() for r in caplog.records if r.name == "fl_client.clientapp_entry"]
    assert len(lines) == 1 and "is Flower's own" in lines[0] and "not the source" in lines[0], lines


@pytest.mark.parametrize(
    ("interpreter", "says"),
    [("/opt/my boards/.venv/bin/python", "white space"), ("/opt/" + "v" * 130 + "/bin/python", "longer")],
)
def test_an_interpreter_a_script_cannot_name_gets_flowers_own_clientapp(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, interpreter: str, says: str
) -> None:
    monkeypatch.setattr(sys, "executable", interpreter)
    with caplog.at_level(logging.WARNING, "fl_client"), light_clientapp() as folder:
        assert folder is None
    lines = [r.getMessage() for r in caplog.records if r.name == "fl_client.clientapp_entry"]
    assert len(lines) == 1 and says in lines[0], lines


def test_the_supernode_finds_the_light_script_first_while_it_runs() -> None:
    with light_clientapp() as folder:
        assert folder is not None
        env = child_env(str(BIN / "flower-supernode"), folder)
        assert shutil.which("flwr-clientapp", path=env["PATH"]) == str(folder / "flwr-clientapp")
        assert os.environ.get("PATH") != env["PATH"]  # only the SuperNode's environment has it
    assert not folder.exists()


QUERY_PROCESS = """
import json, runpy, sys

import flwr.supernode.runtime.run_clientapp as runtime

WATCHED = ("sqlalchemy", "alembic", "torch", "flwr.supernode.cli")


def answer_a_query(**kwargs):
    # what run_clientapp does with a query once it has pulled it: load the ClientApp, call it
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fl_client.app import app

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 3, 0
    node = {"device": "sim:jetson-nano", "power-cap-w": 5.0, "partition-id": 0, "num-partitions": 1}
    msg = Message(RecordDict({}), dst_node_id=3, message_type=MessageType.QUERY)
    ctx = Context(run_id=7, node_id=3, node_config=node, state=RecordDict(), run_config={"model": "cnn-tiny"})
    reply = app(message=msg, context=ctx)
    loaded = sorted(w for w in WATCHED if any(m == w or m.startswith(w + ".") for m in sys.modules))
    print(json.dumps({"token": kwargs["token"], "error": reply.has_error(), "loaded": loaded}))


runtime.run_clientapp = answer_a_query
sys.argv = [sys.argv[1], "--token", "ab12", "--insecure"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _query_process(script: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", QUERY_PROCESS, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_a_query_through_the_light_script_imports_no_sql_state_and_no_torch(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    assert script is not None
    ours = _query_process(script)
    assert ours == {"token": "ab12", "error": False, "loaded": []}
    flowers = _query_process(BIN / "flwr-clientapp")  # what the SuperNode ran before
    assert flowers["token"] == "ab12" and {"sqlalchemy", "alembic", "flwr.supernode.cli"} <= set(
        flowers["loaded"]
    )

"""`python -m fl_client.check` against real SuperLinks on 127.0.0.1: each cause named, good settings pass.

One TLS SuperLink with node authentication and one insecure SuperLink serve every case; the check runs
as an operator runs it (a subprocess), and its last line is the verdict.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flower_deploy import Deployment, free_port, make_certificates, make_ecdsa_key

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Deployment]]:
    """A TLS + node-auth SuperLink with one registered key, and an insecure SuperLink."""
    root = tmp_path_factory.mktemp("check")
    auth, plain = Deployment(root / "auth", mode="auth"), Deployment(root / "plain", mode="insecure")
    try:
        auth.start_superlink()
        auth.write_connection()
        _, pub = make_ecdsa_key(auth.root / "keys" / "board1")
        auth.register(pub)
        plain.start_superlink()
        yield {"auth": auth, "plain": plain}
    finally:
        left = {d.mode: d.stop() for d in (auth, plain)}
    assert left == {"auth": {}, "insecure": {}}, left


def check(*argv: str, flwr_home: Path | None = None) -> tuple[int, list[str]]:
    env = None
    if flwr_home is not None:
        import os

        env = {**os.environ, "FLWR_HOME": str(flwr_home)}
    proc = subprocess.run(
        [sys.executable, "-m", "fl_client.check", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc.returncode, lines


def test_good_settings_pass_and_the_key_is_released(links: dict[str, Deployment]) -> None:
    d = links["auth"]
    key = d.root / "keys" / "board1"
    rc, lines = check(
        "--superlink", d.address, "--root-certificates", str(d.ca), "--auth-supernode-private-key", str(key)
    )
    assert rc == 0, lines
    assert lines[-1].startswith("check: OK"), lines
    assert any("is registered (node id" in line for line in lines), lines
    # released: the same key activates again at once (a SuperNode started now would not be refused)
    rc, lines = check(
        "--superlink", d.address, "--root-certificates", str(d.ca), "--auth-supernode-private-key", str(key)
    )
    assert rc == 0, lines


def test_wrong_address(links: dict[str, Deployment]) -> None:
    rc, lines = check("--superlink", f"127.0.0.1:{free_port()}", "--insecure")
    assert rc == 1 and lines[-1].startswith("check: wrong address: nothing listens on 127.0.0.1:"), lines


def test_tls_mismatch_both_ways(links: dict[str, Deployment]) -> None:
    rc, lines = check("--superlink", links["auth"].address, "--insecure")
    assert rc == 1 and lines[-1].startswith("check: TLS mismatch: the SuperLink at"), lines
    assert "uses TLS" in lines[-1] and "drop --insecure" in lines[-1], lines
    rc, lines = check("--superlink", links["plain"].address, "--root-certificates", str(links["auth"].ca))
    assert rc == 1 and lines[-1].startswith("check: TLS mismatch:") and "does not speak TLS" in lines[-1], (
        lines
    )


def test_untrusted_certificate(links: dict[str, Deployment], tmp_path: Path) -> None:
    other_ca, _, _ = make_certificates(tmp_path / "other")
    rc, lines = check("--superlink", links["auth"].address, "--root-certificates", str(other_ca))
    assert rc == 1 and lines[-1].startswith("check: untrusted certificate:"), lines
    assert f"not trusted by CA {other_ca}" in lines[-1], lines
    rc, lines = check("--superlink", links["auth"].address)  # no CA: the system's do not know ours
    assert rc == 1 and lines[-1].startswith("check: untrusted certificate:"), lines


def test_unregistered_node_key(links: dict[str, Deployment], tmp_path: Path) -> None:
    d = links["auth"]
    stranger, _ = make_ecdsa_key(tmp_path / "stranger")
    rc, lines = check(
        "--superlink",
        d.address,
        "--root-certificates",
        str(d.ca),
        "--auth-supernode-private-key",
        str(stranger),
    )
    assert rc == 1 and lines[-1].startswith("check: unregistered node key:"), lines
    assert f"flwr supernode register {stranger}.pub" in lines[-1], lines
    # no key at all against a SuperLink with node authentication
    rc, lines = check("--superlink", d.address, "--root-certificates", str(d.ca))
    assert rc == 1 and lines[-1].startswith("check: unregistered node key:"), lines
    assert "runs with node authentication" in lines[-1], lines


def test_flwr_connection_side(links: dict[str, Deployment]) -> None:
    d = links["auth"]
    rc, lines = check("--connection", d.connection, flwr_home=d.flwr_home)
    assert rc == 0, lines
    assert any(line.startswith("Control API: answers; 1 SuperNode(s) registered") for line in lines), lines
    rc, lines = check("--connection", "nosuch", flwr_home=d.flwr_home)
    assert rc == 2 and len(lines) == 1 and "nosuch" in lines[0], lines


def test_bad_flags_are_one_line(tmp_path: Path) -> None:
    rc, lines = check("--superlink", "nohostport", "--insecure")
    assert rc == 2 and len(lines) == 1 and "HOST:PORT" in lines[0], lines
    rc, lines = check("--superlink", "127.0.0.1:1", "--root-certificates", str(tmp_path / "missing.crt"))
    assert rc in (1, 2) and len(lines) <= 2, lines
    bad_key = tmp_path / "bad"
    bad_key.write_text("not a key\n")
    rc, lines = check(
        "--superlink", "127.0.0.1:1", "--insecure", "--auth-supernode-private-key", str(bad_key)
    )
    assert rc == 2 and len(lines) == 1 and "not an ECDSA private key" in lines[0], lines  # files first

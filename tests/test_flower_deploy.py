"""The deployment helper itself (fast, no Flower): it stops every process of the trees it started, those
that left their process group and those whose parent exited included, by process id."""

from __future__ import annotations

import time
from pathlib import Path

from simulations.local_superlink import free_port
from tests.flower_deploy import Deployment, _start_time, make_certificates, wait_listening

# a shell whose child starts its own session (like the SuperLink's detached SuperExec) and whose
# grandchild outlives its parent (reparented to init, like an orphaned flwr-clientapp)
TREE = "setsid sleep 300 & (sleep 300 &) ; sleep 300"


def test_stop_ends_every_process_seen_in_the_trees(tmp_path: Path) -> None:
    d = Deployment(tmp_path / "d")
    proc = d.spawn("tree", ["sh", "-c", TREE])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(d.seen) < 4:
        time.sleep(0.1)
        d.sample()
    assert len(d.seen) >= 4, d.seen  # sh, the setsid sleep, the orphaned sleep, the foreground sleep
    pids = dict(d.seen)
    assert d.stop(grace_s=2.0) == {}
    assert not proc.alive()
    assert all(_start_time(pid) != start for pid, (start, _, _) in pids.items())
    assert d.remaining() == {}


def test_free_port_is_free_and_certificates_name_localhost(tmp_path: Path) -> None:
    from cryptography import x509

    port = free_port()
    assert port not in (9091, 9092, 9093, 9094, 39091, 39093)
    assert not wait_listening(port, 0.3)
    ca, cert, key = make_certificates(tmp_path)
    server = x509.load_pem_x509_certificate(cert.read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert server.issuer == x509.load_pem_x509_certificate(ca.read_bytes()).subject
    assert key.stat().st_mode & 0o077 == 0

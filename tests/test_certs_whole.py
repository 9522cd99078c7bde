"""`python -m fl_server.certs`: the four files are written whole or not at all, and a name a certificate
cannot hold is one line before anything is written (issue 28)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROG = "python -m fl_server.certs"
FILES = ("ca.crt", "ca.key", "server.pem", "server.key")


def certs(*argv: str) -> tuple[int, list[str], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fl_server.certs", *argv], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc.returncode, proc.stderr.strip().splitlines(), proc.stdout


def snapshot(folder: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry of `folder`: (inode, mode, content of a regular file)."""
    out = {}
    for entry in sorted(folder.iterdir()):
        st = os.lstat(entry)
        regular = entry.is_file() and not entry.is_symlink()
        out[entry.name] = (st.st_ino, st.st_mode, entry.read_bytes() if regular else None)
    return out


@pytest.fixture
def made(tmp_path: Path) -> Path:
    folder = tmp_path / "certs"
    rc, err, _ = certs("--out", str(folder))
    assert rc == 0 and err == [], err
    return folder


@pytest.mark.parametrize("blocker", ["folder", "link to a device", "fifo", "dangling link"])
@pytest.mark.parametrize("name", ["server.key", "ca.crt"])
def test_forced_set_with_one_bad_target_replaces_nothing(made: Path, name: str, blocker: str) -> None:
    (made / name).unlink()
    if blocker == "folder":
        (made / name).mkdir()
    elif blocker == "fifo":
        os.mkfifo(made / name)
    elif blocker == "link to a device":
        (made / name).symlink_to("/dev/null")
    else:
        (made / name).symlink_to(made / "nowhere")
    before = snapshot(made)
    rc, err, out = certs("--out", str(made), "--force")
    assert rc == 2 and len(err) == 1 and name in err[0] and out == "", err
    assert snapshot(made) == before  # no file replaced, no temporary file left


def test_forced_set_replaces_all_four_together(made: Path) -> None:
    from cryptography import x509

    old = {name: (made / name).read_bytes() for name in FILES}
    rc, err, _ = certs("--out", str(made), "--force", "--san", "coordinator.lan", "--san", "192.168.1.10")
    assert rc == 0 and err == [], err
    assert all((made / name).read_bytes() != old[name] for name in FILES)
    assert sorted(p.name for p in made.iterdir()) == sorted(FILES)  # no temporary file left
    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((made / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    assert (made / "ca.key").stat().st_mode & 0o077 == 0 and (made / "server.key").stat().st_mode & 0o077 == 0


def test_without_force_an_existing_set_is_one_line(made: Path) -> None:
    before = snapshot(made)
    rc, err, _ = certs("--out", str(made))
    assert rc == 2 and len(err) == 1 and "--force" in err[0], err
    assert snapshot(made) == before


@pytest.mark.parametrize(
    ("san", "says"),
    [
        ("bad name", "neither an IP address nor a host name"),
        ("", "neither an IP address nor a host name"),
        ("-lead.example", "neither an IP address nor a host name"),
        ("under_score.example", "neither an IP address nor a host name"),
        ("a..b", "neither an IP address nor a host name"),
        ("999.1.1.1", "neither an IP address"),
        ("fe80::1%eth0", "neither an IP address nor a host name"),
        ("bücher.example", "--san xn--bcher-kva.example"),
        ("x" * 64 + ".example", "over the 63"),
        (".".join(["abcdefghi"] * 26) + ".example", "over the 253"),
    ],
)
def test_a_san_a_certificate_cannot_hold_is_one_line_and_nothing_written(
    tmp_path: Path, san: str, says: str
) -> None:
    folder = tmp_path / "new" / "certs"
    rc, err, _ = certs("--out", str(folder), "--san", "localhost", f"--san={san}")
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "new").exists()


def test_a_long_valid_name_gets_a_certificate(tmp_path: Path) -> None:
    """A host name over the 64 characters of a common name is still a valid SAN: the SAN holds it (it
    is what clients check) and the subject gets a fixed name."""
    from cryptography import x509

    name = ".".join(["a" * 60, "b" * 20, "example"])
    rc, err, _ = certs("--out", str(tmp_path / "c"), "--san", name, "--san", "*.example.org")
    assert rc == 0 and err == [], err
    server = x509.load_pem_x509_certificate((tmp_path / "c" / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [name, "*.example.org"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--days", "40000"], "--days must be from 1 to 36500"),
        (["--out", "/dev/null"], "not a folder"),
    ],
)
def test_other_refusals_are_one_line(tmp_path: Path, argv: list[str], says: str) -> None:
    rc, err, _ = certs("--out", str(tmp_path / "c"), *argv)
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "c").exists()


def test_an_out_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "c").write_text("mine\n")
    rc, err, _ = certs("--out", str(tmp_path / "c"))
    assert rc == 2 and len(err) == 1 and "not a folder" in err[0], err
    assert (tmp_path / "c").read_text() == "mine\n"

"""`python -m fl_server.certs`: a CA and a SuperLink certificate whose SAN names the coordinator (clients
check both; docs/deployment.md, "TLS"), written as one set or not at all: ca.crt, ca.key (0600),
server.pem, server.key. ECDSA P-256 keys, SHA-256 signatures."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import itertools
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from powerctl.cli.util import OneLineParser, one_line_errors, positive_int, say
from powerctl.errors import PowerctlError
from powerctl.files.outputs import check_output_dir, replacing, writable_file

PROG = "python -m fl_server.certs"
FILES = ("ca.crt", "ca.key", "server.pem", "server.key")
DEFAULT_SANS = ("localhost", "127.0.0.1")
MAX_DAYS = 36500  # 100 years, far below X.509's last date
CN_MAX = 64  # the longest common name X.509 accepts (RFC 5280 ub-common-name)
FALLBACK_CN = "powerfed SuperLink"  # when the first SAN is too long for a common name (clients check SANs)
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _shown(name: str) -> str:
    """`--san 'NAME'` for a message, a long name cut in the middle."""
    return f"--san {name if len(name) <= 48 else name[:30] + '…' + name[-12:]!r}"


def _dns_name(name: str) -> str:
    """`name` as a DNS name a certificate can hold (ASCII A-labels of 1 to 63 characters, 253 in all, a
    leading `*.` allowed), else a PowerctlError saying what is wrong."""
    if not name.isascii():
        try:
            hint = f"give its ASCII form (A-label): --san {name.encode('idna').decode('ascii')}"
        except UnicodeError:
            hint = "give a host name in ASCII (A-labels, e.g. xn--bcher-kva.example)"
        raise PowerctlError(f"{_shown(name)} is not an ASCII host name; {hint}")
    if len(name) > 253:
        raise PowerctlError(f"{_shown(name)} is {len(name)} characters, over the 253 a host name may have")
    labels = name.split(".")
    if labels[0] == "*" and len(labels) > 2:
        labels = labels[1:]
    for label in labels:
        if len(label) > 63:
            raise PowerctlError(
                f"{_shown(name)} has a part of {len(label)} characters between dots, over the 63 a DNS "
                "label may have"
            )
        if not _LABEL.match(label):
            raise PowerctlError(
                f"{_shown(name)} is neither an IP address nor a host name (each part between dots: "
                "letters, digits and inner hyphens, 1 to 63 characters)"
            )
    if labels[-1].isdigit():
        raise PowerctlError(f"{_shown(name)} is neither an IP address (four numbers 0-255) nor a host name")
    return name


def _san_entry(name: str) -> object:
    from cryptography import x509

    if "%" not in name:  # a scoped IPv6 address (fe80::1%eth0) cannot be written in a certificate
        with contextlib.suppress(ValueError):
            return x509.IPAddress(ipaddress.ip_address(name))
    if ":" in name or "%" in name:
        raise PowerctlError(f"{_shown(name)} is neither an IP address nor a host name")
    return x509.DNSName(_dns_name(name))


def write_set(folder: Path, files: dict[str, tuple[bytes, bool]]) -> None:
    """Write `files` ({name: (data, private)}) into `folder` whole or not at all: every temporary file
    filled, then all renamed; on failure they are removed, and the folders made for them."""
    created = list(itertools.takewhile(lambda f: not f.exists(), [folder, *folder.parents]))
    try:
        with contextlib.ExitStack() as stack:
            for name, (data, private) in files.items():
                tmp = stack.enter_context(replacing(folder / name, "--out", shared=not private))
                tmp.write_bytes(data)
    except OSError as exc:
        for f in created:
            with contextlib.suppress(OSError):
                f.rmdir()
        raise PowerctlError(f"cannot write the certificates to {folder}: {exc.strerror or exc}") from None


def make_certificates(
    folder: Path, sans: Sequence[str] = DEFAULT_SANS, days: int = 365, overwrite: bool = False
) -> tuple[Path, Path, Path]:
    """Write the CA and a server certificate for `sans` into `folder`: (ca.crt, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not sans:
        raise PowerctlError("give at least one --san (the coordinator's host name or IP address)")
    if not 1 <= days <= MAX_DAYS:
        raise PowerctlError(f"--days must be from 1 to {MAX_DAYS} (100 years), got {days}")
    names = [_san_entry(n) for n in sans]
    check_output_dir(folder, "--out")  # every target checked before anything is written
    existing = [name for name in FILES if writable_file(folder / name, "--out").exists()]
    if existing and not overwrite:
        raise PowerctlError(f"{folder} already holds {', '.join(existing)}: choose another --out, or --force")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "powerfed CA")])
    unused = ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement")
    usage = dict.fromkeys((*unused, "encipher_only", "decipher_only"), False)
    key = ec.generate_private_key(ec.SECP256R1())

    def builder(subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        valid = (now - dt.timedelta(minutes=5), now + dt.timedelta(days=days))
        b = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
        return (
            b.serial_number(x509.random_serial_number()).not_valid_before(valid[0]).not_valid_after(valid[1])
        )

    ca = (
        builder(ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    common_name = sans[0] if 1 <= len(sans[0]) <= CN_MAX else FALLBACK_CN
    server = (
        builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    write_set(
        folder,
        {
            "ca.crt": (ca.public_bytes(pem), False),
            "ca.key": (ca_key.private_bytes(pem, pkcs8, serialization.NoEncryption()), True),
            "server.pem": (server.public_bytes(pem), False),
            "server.key": (key.private_bytes(pem, pkcs8, serialization.NoEncryption()), True),
        },
    )
    return folder / "ca.crt", folder / "server.pem", folder / "server.key"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Make a CA and a SuperLink certificate whose SAN holds the coordinator's names and IPs.",
        epilog="example: %(prog)s --out certs --san coordinator.lan --san 192.168.1.10 --san localhost",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="folder for ca.crt, ca.key, server.pem, server.key"
    )
    p.add_argument(
        "--san",
        action="append",
        metavar="NAME_OR_IP",
        help="a host name or IP that SuperNodes and flwr connect to (repeat; default localhost, 127.0.0.1)",
    )
    p.add_argument("--days", type=positive_int, default=365, help="validity in days (default 365)")
    p.add_argument("--force", action="store_true", help="replace certificates already in --out")
    return p


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # a bad flag: one line and exit 2 (OneLineParser)
    sans = args.san or list(DEFAULT_SANS)
    ca, cert, key = make_certificates(args.out, sans, args.days, args.force)
    say(f"wrote {ca} (for SuperNodes and flwr), {cert} and {key} (the SuperLink's), {ca.parent / 'ca.key'}")
    say(f"the certificate names: {', '.join(sans)}; valid for {args.days} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())

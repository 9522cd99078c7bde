"""`python -m fl_server.certs`: a CA and a SuperLink certificate whose SAN names the coordinator.

Flower's SuperNodes and `flwr` check the SuperLink's certificate against the CA given to them
(`--root-certificates`, `root-certificates = ...`) AND that it names the address they connect to: a
certificate without a SAN for that name or IP is refused (docs/deployment.md, "TLS"). Written:
ca.crt (give it to every SuperNode and to `flwr`), ca.key (keep it on the coordinator, 0600: it signs
new certificates), server.pem and server.key (the SuperLink's `--ssl-certfile`/`--ssl-keyfile`;
`--ssl-ca-certfile ca.crt`). ECDSA P-256 keys, SHA-256 signatures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path

from powerctl.cliutil import OneLineParser, one_line_errors, positive_int
from powerctl.errors import PowerctlError

PROG = "python -m fl_server.certs"
FILES = ("ca.crt", "ca.key", "server.pem", "server.key")
DEFAULT_SANS = ("localhost", "127.0.0.1")


def _san_entry(name: str) -> object:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name or any(c.isspace() or c in "/,:" for c in name):
        raise PowerctlError(f"SAN entry {name!r} is neither an IP address nor a host name")
    return x509.DNSName(name)


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
    names = [_san_entry(n) for n in sans]
    existing = [f for f in FILES if (folder / f).exists()]
    if existing and not overwrite:
        raise PowerctlError(f"{folder} already holds {', '.join(existing)}: choose another --out, or --force")
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "powerfed CA")])
    usage = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement"), False
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
                **usage,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data, private in (
            ("ca.crt", ca.public_bytes(pem), False),
            ("ca.key", ca_key.private_bytes(pem, pkcs8, serialization.NoEncryption()), True),
            ("server.pem", server.public_bytes(pem), False),
            ("server.key", key.private_bytes(pem, pkcs8, serialization.NoEncryption()), True),
        ):
            path = folder / name
            path.write_bytes(data)
            if private:
                path.chmod(0o600)
    except OSError as exc:
        raise PowerctlError(f"cannot write the certificates to {folder}: {exc.strerror or exc}") from None
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
    print(f"wrote {ca} (for SuperNodes and flwr), {cert} and {key} (the SuperLink's), {ca.parent / 'ca.key'}")
    print(f"the certificate names: {', '.join(sans)}; valid for {args.days} days")
    return 0


if __name__ == "__main__":
    sys.exit(main())

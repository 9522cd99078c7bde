"""What `python -m fl_client.check` connects to (`Target`), how a problem is named (`CheckFailed`), and the
network layers it checks first: the address resolves and listens, and TLS is what the flags say."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from powerctl.errors import PowerctlError
from strategies.flower_source import read_small


class CheckFailed(Exception):
    """A named cause, what was seen, and what to do: printed as one line."""

    def __init__(self, cause: str, seen: str, fix: str) -> None:
        super().__init__(f"{cause}: {seen}; {fix}")
        self.cause = cause


@dataclass(frozen=True)
class Target:
    """Where and how to connect: the SuperNode's flags, or a `flwr` connection's fields."""

    host: str
    port: int
    insecure: bool
    root_certificates: Path | None = None
    node_key: Path | None = None
    connection: str | None = None  # the `flwr` connection's name (the `flwr run` side)

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; anything else is a PowerctlError naming the value."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PowerctlError(f"SuperLink address must be HOST:PORT (e.g. 192.168.1.10:9092), got {text!r}")
    return host, int(port)


def check_reachable(t: Target, timeout_s: float) -> str:
    """A TCP connection to the address: wrong name, refused, or no answer."""
    try:
        with socket.create_connection((t.host, t.port), timeout=timeout_s):
            pass
    except socket.gaierror:
        raise CheckFailed(
            "wrong address", f"{t.host!r} does not resolve", "check the host name in the SuperLink address"
        ) from None
    except ConnectionRefusedError:
        raise CheckFailed(
            "wrong address",
            f"nothing listens on {t.address} (connection refused)",
            "check the port (the SuperLink's --port) and that the SuperLink is running",
        ) from None
    except TimeoutError:
        raise CheckFailed(
            "wrong address",
            f"no answer from {t.address} in {timeout_s:g} s",
            "check the host (and any firewall between here and the SuperLink)",
        ) from None
    except OSError as exc:
        raise CheckFailed(
            "wrong address", f"{t.address}: {exc.strerror or exc}", "check the address and the network"
        ) from None
    return f"reachable: {t.address} accepts TCP connections"


def _peer_certificate(t: Target, timeout_s: float) -> bytes | None:
    """The server's certificate from a handshake that trusts anything; None if it does not speak TLS."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((t.host, t.port), timeout=timeout_s) as sock:
        try:
            with ctx.wrap_socket(sock, server_hostname=t.host) as tls:
                return tls.getpeercert(binary_form=True)
        except (ssl.SSLError, ConnectionResetError):
            return None


def _describe(der: bytes) -> tuple[str, str, str]:
    """(subject, issuer, names in the SAN) of a DER certificate, for the messages."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
        names += [f"IP:{ip}" for ip in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    return cert.subject.rfc4514_string(), cert.issuer.rfc4514_string(), ", ".join(names) or "none"


CA_LIMIT = 1 << 20  # a CA file holds a few PEM certificates


def load_ca(path: Path) -> str:
    """The CA certificate(s) in `path` as PEM text, checked as Flower (and OpenSSL) will load them."""
    data = read_small(path, CA_LIMIT, "the CA certificate (PEM)")
    try:
        text = data.decode("ascii")
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ValueError("no certificate")
        ssl.create_default_context(cadata=text)
    except (UnicodeDecodeError, ssl.SSLError, ValueError):
        raise PowerctlError(
            f"{path} is not a CA certificate in PEM form (-----BEGIN CERTIFICATE-----); give the ca.crt the "
            "SuperLink's --ssl-ca-certfile names"
        ) from None
    return text


def check_tls(t: Target, timeout_s: float) -> str:
    """Both sides agree on TLS, and the SuperLink's certificate is trusted and names the address."""
    try:
        der = _peer_certificate(t, timeout_s)
    except OSError as exc:
        raise CheckFailed(
            "wrong address",
            f"{t.address} closed the connection at once ({exc.strerror or exc})",
            "check that this is the SuperLink's address",
        ) from None
    if t.insecure:
        how = "--insecure" if t.connection is None else "insecure = true"  # the flag, or config.toml's key
        if der is not None:
            raise CheckFailed(
                "TLS mismatch",
                f"the SuperLink at {t.address} uses TLS and {how} connects without it "
                "(a SuperNode then retries forever and neither side logs why)",
                "drop --insecure and pass --root-certificates CA.crt (the CA that signed the SuperLink's "
                "certificate)"
                if t.connection is None
                else f"in connection {t.connection!r} replace insecure = true by root-certificates = CA.crt",
            )
        return f"TLS: none on either side ({how}; traffic is not encrypted)"
    if der is None:
        raise CheckFailed(
            "TLS mismatch",
            f"the SuperLink at {t.address} does not speak TLS (it runs with --insecure) and this side "
            "expects TLS",
            "connect with --insecure (insecure = true in a flwr connection), or start the SuperLink with "
            "--ssl-ca-certfile, --ssl-certfile and --ssl-keyfile",
        )
    # what Flower verifies with: the given CA file, else the system's trust store
    ctx = ssl.create_default_context(
        cadata=None if t.root_certificates is None else load_ca(t.root_certificates)
    )
    subject, issuer, names = _describe(der)
    trusted_by = f"CA {t.root_certificates}" if t.root_certificates else "this system's CAs (no CA given)"
    try:
        with (
            socket.create_connection((t.host, t.port), timeout=timeout_s) as sock,
            ctx.wrap_socket(sock, server_hostname=t.host),
        ):
            pass
    except ssl.SSLCertVerificationError as exc:
        code = exc.verify_code
        if code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            raise CheckFailed(
                "certificate name mismatch",
                f"the SuperLink's certificate names {names}, not {t.host}",
                f"connect by a name it holds, or remake it with a SAN for {t.host} "
                "(python -m fl_server.certs --san ...)",
            ) from None
        if code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
            raise CheckFailed(
                "untrusted certificate",
                f"the SuperLink's certificate ({subject}) has expired",
                "make a new one (python -m fl_server.certs) and restart the SuperLink with it",
            ) from None
        raise CheckFailed(
            "untrusted certificate",
            f"the SuperLink's certificate ({subject}, issued by {issuer}) is not trusted by {trusted_by}: "
            f"{exc.verify_message}",
            "pass the CA that signed it (the file the SuperLink's --ssl-ca-certfile names) as "
            + ("--root-certificates" if t.connection is None else "root-certificates"),
        ) from None
    except ssl.SSLError as exc:
        raise CheckFailed(
            "TLS mismatch",
            f"the TLS handshake with {t.address} failed: {exc.reason or exc}",
            "check both sides",
        ) from None
    return f"TLS: the SuperLink's certificate ({subject}; SAN {names}) is trusted by {trusted_by}"

"""`python -m fl_client.check`: can this machine reach the SuperLink as a SuperNode or `flwr run` does,
and if not, why (docs/deployment.md). Exit status: 0 all good, 1 a problem (its line last), 2 bad input."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fl_client.check_network import CheckFailed, Target, check_reachable, check_tls, load_ca, parse_address
from powerctl.cli.util import OneLineParser, one_line_errors, positive_float, say
from powerctl.errors import PowerctlError
from strategies.flower_source import read_flwr_connection, read_small

PROG = "python -m fl_client.check"
HEARTBEAT_WINDOW_S = 60.0  # how long Flower keeps a crashed SuperNode online: 2 × its heartbeat interval


def _http_error(exc: Exception) -> tuple[int | None, int | None, str]:
    """(HTTP status, Flower error code, message) of a failed Flower HTTP call."""
    import httpx
    from flwr.supercore.error import FlowerError

    if isinstance(exc, httpx.HTTPStatusError):
        err = FlowerError.from_json(exc.response.text)
        if err is not None:
            return exc.response.status_code, err.code, err.message
        return exc.response.status_code, None, exc.response.text[:200].strip()
    return None, None, str(exc)


def _not_flower(t: Target, what: str, exc: Exception) -> CheckFailed:
    status, code, message = _http_error(exc)
    if status == 404:
        return CheckFailed(
            "wrong address",
            f"{t.address} answers HTTP but has no Flower {what} (404)",
            "this is not a Flower 1.41 SuperLink: check the address and port",
        )
    where = f"HTTP {status}" if status else "no HTTP answer"
    return CheckFailed(
        "SuperLink error",
        f"{what} at {t.address}: {where}" + (f", Flower error {code}" if code else "") + f": {message}",
        "see the SuperLink's log",
    )


KEY_LIMIT = 64 << 10  # a node key is a few hundred bytes


def load_node_key(path: Path) -> Any:
    """The SuperNode's ECDSA private key, read as flower-supernode reads it (OpenSSH format, no
    passphrase); anything else is one line saying what to give."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    data = read_small(path, KEY_LIMIT, "the node key")
    try:
        key = load_ssh_private_key(data, None)
    except TypeError:  # "Key is password-protected, but password was not provided."
        raise PowerctlError(
            f"the node key {path} is protected by a passphrase, and flower-supernode can only read an "
            f'unencrypted key: remove the passphrase (ssh-keygen -p -N "" -f {path})'
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PowerctlError(
            f"{path} is not an ECDSA private key in OpenSSH format "
            '(make one with: ssh-keygen -t ecdsa -b 384 -N "" -f KEY)'
        )
    return key


def control_nodes(t: Target) -> list[Any]:
    """Every SuperNode the SuperLink knows (Flower's `ListNodes`, as `flwr supernode ls` asks)."""
    from flwr.proto.control_pb2 import ListNodesRequest
    from flwr.supercore.control import ControlHttpClient

    with contextlib.closing(_http_client(t, ControlHttpClient, "flwr CLI")) as client:
        return list(client.ListNodes(ListNodesRequest()).nodes_info)


def node_with_key(t: Target, public_key: bytes) -> Any | None:
    """The SuperLink's record of the node with this public key (None: not registered)."""
    nodes = control_nodes(t)
    return next((n for n in nodes if n.public_key == public_key and n.status != "unregistered"), None)


def _http_client(t: Target, client: Any, component: str, *interceptors: Any) -> Any:
    """A Flower HTTP client for the target, as Flower's `component` makes one."""
    from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor

    ca = None if t.root_certificates is None else str(t.root_certificates)
    version = RuntimeVersionHttpInterceptor(component_name=component)
    return client.from_server_address(t.address, t.insecure, ca, interceptors=[version, *interceptors])


def _fleet_client(t: Target, private_key: Any) -> Any:
    from flwr.supernode.fleet_http_client import FleetHttpClient
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    auth = NodeAuthHttpInterceptor(private_key, private_key.public_key())
    return _http_client(t, FleetHttpClient, "SuperNode", auth)


def _online_for_s(node: Any) -> float:
    """Seconds until the SuperLink counts this node offline (0 if it does not)."""
    if node.status != "online" or not node.HasField("online_until"):
        return 0.0
    return max(0.0, float(node.online_until) - time.time())


def release_stale_node(t: Target, say: Callable[[str], None]) -> bool:
    """If the SuperLink still counts this key's node online (its SuperNode crashed), mark it offline,
    signed with the key, so a restarted SuperNode is accepted at once; False when nothing was released."""
    from flwr.proto.fleet_pb2 import DeactivateNodeRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    if t.node_key is None:  # no key: the SuperNode registers a fresh one, nothing to release
        return False
    private_key = load_node_key(t.node_key)
    try:
        node = node_with_key(t, public_key_to_bytes(private_key.public_key()))
    except Exception:
        return False
    if node is None or _online_for_s(node) <= 0:
        return False
    with contextlib.closing(_fleet_client(t, private_key)) as client:
        try:
            client.DeactivateNode(DeactivateNodeRequest(node_id=node.node_id))
        except Exception:
            return False
    say(
        f"released node {node.node_id}: the SuperLink still counted it online "
        f"({_online_for_s(node):.0f} s left of Flower's heartbeat window; its SuperNode crashed)"
    )
    return True


def check_node_key(t: Target) -> str:
    """Activate the node with the key and release it at once, as a SuperNode starting and stopping."""
    import httpx
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL
    from flwr.proto.fleet_pb2 import ActivateNodeRequest, DeactivateNodeRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    assert t.node_key is not None
    private_key = load_node_key(t.node_key)
    public_key = public_key_to_bytes(private_key.public_key())
    with contextlib.closing(_fleet_client(t, private_key)) as client:
        try:
            node_id = client.ActivateNode(
                ActivateNodeRequest(public_key=public_key, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL)
            ).node_id
        except httpx.HTTPError as exc:
            raise _refused_key(t, exc, public_key) from None
        try:
            client.DeactivateNode(DeactivateNodeRequest(node_id=node_id))
        except httpx.HTTPError as exc:
            raise _not_flower(t, "Fleet API", exc) from None
    return f"node key: {t.node_key} is registered (node id {node_id}); activated and released again"


def _refused_key(t: Target, exc: Exception, public_key: bytes) -> CheckFailed:
    """Why ActivateNode was refused: not registered, still online, or a signature out of time."""
    status, code, _ = _http_error(exc)
    pub = f"{t.node_key}.pub"
    if status == 401:
        return CheckFailed(
            "node key refused",
            "the SuperLink refused this node's signed request (401): its timestamp is outside Flower's "
            "tolerance",
            "check this machine's clock (`date`; a board without a clock battery needs NTP)",
        )
    if code != 2004:  # FLEET_NODE_ACTIVATION_FAILED
        return _not_flower(t, "Fleet API", exc)
    try:
        node = node_with_key(t, public_key)
    except Exception:
        return CheckFailed(
            "node key not activated",
            f"the SuperLink refused to activate the node with key {pub} (Flower error 2004) and its Control "
            "API does not say why",
            f"register it on the coordinator (flwr supernode register {pub} CONNECTION); if it is "
            "registered, a SuperNode with this key runs, or crashed less than "
            f"{HEARTBEAT_WINDOW_S:.0f} s ago",
        )
    if node is None:
        return CheckFailed(
            "unregistered node key",
            f"the SuperLink has no SuperNode with the public key {pub}",
            f"register it on the coordinator: flwr supernode register {pub} CONNECTION",
        )
    return CheckFailed(
        "node key in use",
        f"node {node.node_id} with this key is online for {_online_for_s(node):.0f} s more: a SuperNode with "
        f"this key is running, or crashed less than {HEARTBEAT_WINDOW_S:.0f} s ago",
        "stop the other one, or start this one with python -m fl_client.supernode (it releases a crashed "
        "node's registration first)",
    )


def check_self_registration(t: Target) -> str:
    """Without a key a SuperNode registers a fresh one: do that with a throwaway key, then undo it."""
    import httpx
    from flwr.proto.fleet_pb2 import RegisterNodeFleetRequest, UnregisterNodeFleetRequest
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

    private_key, public_key = generate_key_pairs()
    with contextlib.closing(_fleet_client(t, private_key)) as client:
        try:
            node_id = client.RegisterNode(
                RegisterNodeFleetRequest(public_key=public_key_to_bytes(public_key))
            ).node_id
            client.UnregisterNode(UnregisterNodeFleetRequest(node_id=node_id))
        except httpx.HTTPError as exc:
            if _http_error(exc)[1] == 2001:  # FLEET_SUPERNODE_REGISTRATION_DISABLED
                raise CheckFailed(
                    "unregistered node key",
                    "the SuperLink runs with node authentication and this side gives no key",
                    'make one (ssh-keygen -t ecdsa -b 384 -N "" -f KEY), register KEY.pub on the coordinator '
                    "(flwr supernode register KEY.pub CONNECTION) and pass --auth-supernode-private-key KEY",
                ) from None
            raise _not_flower(t, "Fleet API", exc) from None
    return "node key: none given; the SuperLink accepts SuperNodes without registration"


def check_control(t: Target) -> str:
    """What `flwr run` needs: the Control API answers; how many SuperNodes are online now."""
    import httpx

    try:
        nodes = control_nodes(t)
    except httpx.HTTPError as exc:
        status = _http_error(exc)[0]
        if status in (401, 403):
            raise CheckFailed(
                "login needed",
                f"the Control API at {t.address} refused this side (HTTP {status})",
                f"log in first: flwr login {t.connection or 'CONNECTION'}",
            ) from None
        raise _not_flower(t, "Control API", exc) from None
    online = sorted(n.node_id for n in nodes if n.status == "online")
    registered = [n for n in nodes if n.status != "unregistered"]
    return f"Control API: answers; {len(registered)} SuperNode(s) registered, {len(online)} online"


def run_checks(t: Target, timeout_s: float = 5.0, say: Callable[[str], None] = say) -> None:
    """Every layer in order, a line for each that passed; the first failure raises CheckFailed."""
    say(check_reachable(t, timeout_s))
    say(check_tls(t, timeout_s))
    if t.connection is not None:
        say(check_control(t))
    elif t.node_key is not None:
        say(check_node_key(t))
    else:
        say(check_self_registration(t))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Connect to a SuperLink as a SuperNode (--superlink, the SuperNode's own flags) or as "
        "flwr run (--connection) does, and name what is wrong: wrong address, TLS mismatch, untrusted "
        "certificate, unregistered node key.",
        epilog="examples: %(prog)s --superlink coordinator:9092 --root-certificates ca.crt "
        "--auth-supernode-private-key board1;  %(prog)s --connection deploy",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--superlink", metavar="HOST:PORT", help="the SuperLink, as a SuperNode is given it")
    where.add_argument(
        "--connection",
        metavar="NAME",
        nargs="?",
        const="",
        help="a flwr connection in $FLWR_HOME/config.toml (no NAME: the default one), checked as flwr run",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", help="connect without TLS (as the SuperNode flag)")
    tls.add_argument("--root-certificates", type=Path, metavar="CA", help="the CA certificate (PEM) to trust")
    p.add_argument(
        "--auth-supernode-private-key", type=Path, metavar="KEY", help="the SuperNode's private key"
    )
    p.add_argument(
        "--timeout", type=positive_float, default=5.0, metavar="S", help="per connection (default 5)"
    )
    return p


def target_from_args(args: argparse.Namespace) -> Target:
    """The SuperNode's flags, or a `flwr` connection in $FLWR_HOME/config.toml ('': the default one)."""
    if args.connection is not None:
        if args.insecure or args.root_certificates or args.auth_supernode_private_key:
            raise PowerctlError(
                "--connection takes TLS settings from config.toml: give no other flags with it"
            )
        conn = read_flwr_connection(args.connection or None)
        if not conn.address:
            raise PowerctlError(f"flwr connection {conn.name!r} has no address (a simulation connection?)")
        host, port = parse_address(conn.address)
        ca = Path(conn.root_certificates).expanduser() if conn.root_certificates else None
        return Target(host, port, bool(conn.insecure), ca, connection=conn.name)
    host, port = parse_address(args.superlink)
    return Target(host, port, args.insecure, args.root_certificates, args.auth_supernode_private_key)


def check_files(t: Target) -> None:
    """The CA certificate and node key, read as Flower will."""
    if t.root_certificates is not None:
        load_ca(t.root_certificates)
    if t.node_key is not None:
        load_node_key(t.node_key)


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # a bad flag: one line and exit 2 (OneLineParser)
    target = target_from_args(args)
    check_files(target)
    try:
        run_checks(target, args.timeout)
    except CheckFailed as failed:
        say(f"check: {failed}")
        return 1
    side = f"flwr connection {target.connection!r}" if target.connection else "this SuperNode"
    say(f"check: OK: the SuperLink at {target.address} accepts {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Message dispatch in O(messages) per pass, not Flower 1.41's O(nodes × messages): `IndexedLinkState`
indexes message ids by destination node and the dispatch loop asks only nodes that may have one. Installed
in the `flwr-simulation` of a run this project starts, while the Flower source it copies is unchanged."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections import UserDict
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from pathlib import Path
from queue import Queue
from typing import TYPE_CHECKING, Any, Self

from powerctl.errors import PowerctlError
from strategies.flower_source import text_fingerprint, write_python_script

if TYPE_CHECKING:  # Flower is imported only where the adapter runs
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

SUPPORTED_FLOWER = ("1.41.", "1.42.")  # any other release is refused
COPIED_SOURCES = {
    "InMemoryLinkState.get_message_ins": "8079cc56cb2bf1a7c2ac2e742f283298e38e5b93801e5644dc30f6e68c0b3260",
    "vce_api.add_messages_to_queue": "90669a453e0877556bd5640c89c6340a5f1f2f824ad4808a6a26b4e81a0c76f4",
    "vce_api._register_node_info_stores": "14d7260df16871401fea5f05d08ce2bf97c7b886c8def3c4a3da3137ce86b89d",
}
INDEX_ENV = "POWERFED_MESSAGE_INDEX"  # 0 in a run's environment: Flower's own dispatch
WRAPPED_COMMAND = "flwr-simulation"  # what the SuperExec runs for a simulation (found on PATH)
INSTALLED_LINE = "powerfed: simulation messages indexed by destination node (simulations.linkstate_index)"


class LinkStateIndexError(PowerctlError):
    """The installed Flower is not one this adapter was written for; nothing was started."""


def flower_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flwr")
    except PackageNotFoundError:
        return "none"


def check_flower_version(found: str | None = None) -> str:
    """The installed Flower's version when the adapter supports it; else one LinkStateIndexError line."""
    found = flower_version() if found is None else found
    if not found.startswith(SUPPORTED_FLOWER):
        wanted = ", ".join(f"{s}*" for s in SUPPORTED_FLOWER)
        raise LinkStateIndexError(
            f"flwr {found} is installed, but the simulation's message index (simulations.linkstate_index) "
            f"was written for flwr {wanted}: install flwr[simulation] {wanted} (pyproject.toml)"
        )
    return found


def changed_flower_sources() -> list[str]:
    """The names in COPIED_SOURCES whose installed Flower source is not the one the index copies."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    owners = {"InMemoryLinkState": InMemoryLinkState, "vce_api": vce_api}
    changed = []
    for name, digest in COPIED_SOURCES.items():
        owner, attribute = name.split(".")
        try:
            if text_fingerprint(inspect.getsource(getattr(owners[owner], attribute))) == digest:
                continue
        except (OSError, TypeError):  # no source to read (a compiled or patched build): not the same
            pass
        changed.append(name)
    return changed


class IndexedStore(UserDict[str, Any]):
    """Flower's `message_ins_store` (message id → Message) that also keeps each destination node's
    message ids in storage order, and the nodes that may hold an undelivered message. A UserDict: every
    way it can change goes through `__setitem__` / `__delitem__` (`|=` too, below)."""

    def __init__(self, items: Iterable[tuple[str, Any]] = ()) -> None:
        self.by_node: dict[int, dict[str, None]] = {}
        self.pending: set[int] = set()
        super().__init__(items)

    def __setitem__(self, key: str, message: Any) -> None:
        node = message.metadata.dst_node_id
        old = self.data.get(key)
        self.data[key] = message
        if old is not None and (old_node := old.metadata.dst_node_id) != node:
            self._unindex(key, old_node)
            # the key keeps its place in the dict: rebuild the node's order (Flower never does this)
            self.by_node[node] = {k: None for k, m in self.data.items() if m.metadata.dst_node_id == node}
        else:
            self.by_node.setdefault(node, {})[key] = None
        self.pending.add(node)

    def __delitem__(self, key: str) -> None:
        self._unindex(key, self.data.pop(key).metadata.dst_node_id)

    def _unindex(self, key: str, node: int) -> None:
        ids = self.by_node.get(node)
        if ids is not None:
            ids.pop(key, None)
            if not ids:
                del self.by_node[node]
                self.pending.discard(node)

    # UserDict's own `|=` writes to `data`, past the index; typeshed's has the same ignore
    def __ior__(self, other: Any) -> Self:  # type: ignore[override, misc]
        self.update(other)
        return self


@functools.cache
def indexed_state_class() -> type[InMemoryLinkState]:
    """The adapter class (built on first use: Flower is imported only where it runs)."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore import log as flwr_log
    from flwr.supercore.date import now

    class IndexedLinkState(InMemoryLinkState):
        """Flower 1.41's `InMemoryLinkState`, its `get_message_ins` reading the node's own messages."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._index = IndexedStore(self.message_ins_store.items())
            # the same store, a mapping to Flower's own methods
            self.message_ins_store = self._index  # type: ignore[assignment]
            flwr_log(INFO, INSTALLED_LINE)

        def get_message_ins(self, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Any]:
            """Flower's `get_message_ins`, line for line, over `node_id`'s messages instead of all."""
            if limit is not None and limit < 1:
                raise AssertionError("`limit` must be >= 1")
            store = self._index
            found: list[Any] = []
            with self.lock:
                ids = list(store.by_node.get(node_id, ()))  # in storage order; a copy, as expired ones go
                for msg_id in ids:
                    self._check_stored_messages({msg_id})
                    if (
                        (msg_ins := store.get(msg_id))
                        and msg_ins.metadata.dst_node_id == node_id
                        and (run_id is None or msg_ins.metadata.run_id == run_id)
                        and msg_ins.metadata.delivered_at == ""
                    ):
                        found.append(msg_ins)
                    if limit and len(found) == limit:
                        break
                taken = {id(m) for m in found}
                if not any(
                    (m := store.get(k)) is not None and m.metadata.delivered_at == "" and id(m) not in taken
                    for k in ids
                ):
                    store.pending.discard(node_id)  # nothing left for this node until a new message
            delivered_at = now().isoformat()
            for msg_ins in found:
                msg_ins.metadata.delivered_at = delivered_at
            return found

        def pending_nodes(self) -> list[int]:
            """Nodes that may hold an undelivered message (a superset: never one fewer)."""
            with self.lock:
                return list(self._index.pending)

    return IndexedLinkState


def add_messages_to_queue(
    state: Any, queue: Queue[Any], nodes_mapping: dict[int, int], f_stop: threading.Event
) -> None:
    """Flower's dispatch loop (`vce_api.add_messages_to_queue`) asking only the nodes that may have a
    message, in the engine's node order."""
    pending = getattr(state, "pending_nodes", None)
    position = {node: i for i, node in enumerate(nodes_mapping)}
    while not f_stop.is_set():
        nodes = pending() if pending is not None else list(nodes_mapping)
        for node_id in sorted((n for n in nodes if n in position), key=position.__getitem__):
            for msg in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(msg)
        f_stop.wait(0.1)


def install(index: bool = True) -> None:
    """Make this process's simulation record its virtual nodes (`strategies.population.record_nodes`)
    and, with `index` and Flower's copied source unchanged, build `IndexedLinkState` and dispatch
    through `add_messages_to_queue`."""
    check_flower_version()
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import linkstate_factory
    from flwr.supercore import log as flwr_log

    from strategies.population import record_nodes

    if index and (changed := changed_flower_sources()):
        flwr_log(
            WARNING,
            "powerfed: the message index is not used (Flower's own dispatch is): flwr %s's %s differ "
            "from the source simulations.linkstate_index copies",
            flower_version(),
            ", ".join(changed),
        )
        index = False

    register = vce_api._register_nodes

    def register_and_record(*args: Any, **kwargs: Any) -> dict[int, int]:
        mapping = register(*args, **kwargs)
        record_nodes(mapping)
        return mapping

    vce_api._register_nodes = register_and_record
    if index:
        # the name the factory looks up (imported there from in_memory_linkstate), so it builds ours
        linkstate_factory.InMemoryLinkState = indexed_state_class()  # type: ignore[attr-defined]
        vce_api.add_messages_to_queue = add_messages_to_queue
        vce_api._register_node_info_stores = config_read_once(vce_api._register_node_info_stores)


def config_read_once(register_stores: Callable[..., dict[int, Any]]) -> Callable[..., dict[int, Any]]:
    """Flower's `vce_api._register_node_info_stores`, reading and fusing the app's run config
    (`get_fused_config_from_dir`) once for every node, not once per node; each node gets its own dict."""
    from flwr.compat.client import run_info_store

    def register(nodes_mapping: Any, run: Any, app_dir: str | None = None) -> dict[int, Any]:
        # swapped where run_info_store looks it up (imported there from flwr.common.config; not re-exported)
        read = run_info_store.get_fused_config_from_dir  # type: ignore[attr-defined]
        fused: dict[tuple[str, int], dict[str, Any]] = {}

        def once(project_dir: Path, override_config: dict[str, Any]) -> dict[str, Any]:
            key = (str(project_dir), id(override_config))
            if key not in fused:
                fused[key] = read(project_dir, override_config)
            return dict(fused[key])

        run_info_store.get_fused_config_from_dir = once  # type: ignore[attr-defined]
        try:
            return register_stores(nodes_mapping, run, app_dir)
        finally:
            run_info_store.get_fused_config_from_dir = read  # type: ignore[attr-defined]

    return register


def install_script(folder: Path) -> Path:
    """Write FOLDER/flwr-simulation, this interpreter running `main`: first on a run's PATH, the
    SuperExec starts it for the simulation instead of Flower's own script."""
    return write_python_script(
        folder / WRAPPED_COMMAND,
        "import sys\n"
        "from simulations.linkstate_index import main\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main())\n",
    )


def main() -> int | None:
    """`flwr-simulation` with `install` done (the index unless $POWERFED_MESSAGE_INDEX=0)."""
    try:
        install(index=os.environ.get(INDEX_ENV, "1") != "0")
    except LinkStateIndexError as exc:
        print(f"powerfed: error: {exc}", file=sys.stderr)
        return 2
    from flwr.simulation.app import flwr_simulation

    flwr_simulation()
    return None

"""The default run's starting point, shipped with the package: its pre-trained weights and relation vector.

Made by `make shipped`, listed with recipe (not the CPU) and SHA-256 in `shipped/manifest.json` (weights
base64: a FAB holds only text); a file that does not match is one warning, and the run trains instead."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powerctl.cli.util import OneLineParser, one_line_errors, say
from powerctl.errors import FileFormatError
from powerctl.files.jsonfile import read_json, write_json
from powerctl.files.outputs import replacing

log = logging.getLogger(__name__)
"""`fl_server.shipped`: a shipped file that does not match its manifest (WARNING)."""

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
MANIFEST = "manifest.json"
SCHEMA = "fl_server.shipped/1"
WRITE_COMMAND = ".venv/bin/python -m fl_server.shipped --write"
WEIGHTS_SCHEMA = "fl_server.shipped-weights/1"  # the safetensors file's bytes, base64


def normal(recipe: dict[str, Any]) -> Any:
    """`recipe` as JSON reads it back (tuples as lists, others as their repr): what is compared."""
    return json.loads(json.dumps(recipe, sort_keys=True, default=repr))


def _manifest(folder: Path) -> dict[str, Any]:
    if not (path := folder / MANIFEST).exists():
        return {}
    try:
        data = read_json(path, SCHEMA)
        if not isinstance(data.get("files"), list):
            raise FileFormatError(f"{path}: 'files' is not a list")
    except FileFormatError as exc:
        log.warning("%s; nothing shipped is used: run %s", exc, WRITE_COMMAND)
        return {}
    return data


def shipped_bytes(kind: str, recipe: dict[str, Any], folder: Path | None = None) -> bytes | None:
    """The bytes of the shipped file of `kind` (weights, relation) made from `recipe`, checked against
    the manifest's SHA-256; None when none ships for it or its bytes do not match (one warning)."""
    folder = folder or SHIPPED_DIR
    wanted = normal(recipe)
    for entry in _manifest(folder).get("files", []):
        if not isinstance(entry, dict) or entry.get("kind") != kind or entry.get("recipe") != wanted:
            continue
        path = folder / str(entry.get("file", ""))
        try:
            if kind == "weights":
                packed = read_json(path, WEIGHTS_SCHEMA)
                data = base64.b64decode(str(packed["safetensors_base64"]), validate=True)
            else:
                data = path.read_bytes()
        except (OSError, ValueError, KeyError, FileFormatError) as exc:  # binascii.Error is a ValueError
            log.warning("shipped %s %s: unreadable (%s); training it instead", kind, path, exc)
            return None
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            log.warning(
                "shipped %s %s: its bytes do not match the manifest's SHA-256 (changed or damaged); "
                "training it instead (restore it from git, or remake it: %s)",
                kind,
                path,
                WRITE_COMMAND,
            )
            return None
        return data
    return None


def unpacked_weights(recipe: dict[str, Any], into: Path, folder: Path | None = None) -> Path | None:
    """The shipped weights for `recipe` unpacked once into the folder `into` as a safetensors file
    named by their hash; None when none ship for it or they do not match."""
    data = shipped_bytes("weights", recipe, folder)
    if data is None:
        return None
    digest = hashlib.sha256(data).hexdigest()
    path = into / f"shipped-{recipe.get('model', 'model')}-{digest[:32]}.safetensors"
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:
        return path
    with replacing(path) as tmp:  # the folder made if needed
        tmp.write_bytes(data)
    return path


def write_shipped(folder: Path, tell: Callable[[str], None] = say) -> dict[str, Any]:
    """Make the default run's weights and relation vector as the ServerApp does (on the CPU) into `folder`."""
    import torch

    from fl_server.app import pretrain_recipe, relation_recipe, relation_vector, train_weights
    from fl_server.run_config import parse_server_config
    from powerfed.training.numerics import numerics_key

    cfg = dataclasses.replace(parse_server_config({}), server_device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = train_weights(cfg, Path(tmp) / "weights.safetensors", say=tell)
        data = weights.read_bytes()
        relation = relation_vector(cfg, weights, say=tell, shipped=False)
        relation_file = f"relation-{cfg.model}.json"
        relation.save(folder / relation_file)
        recipes = (pretrain_recipe(cfg), relation_recipe(cfg, weights))
    weights_file = f"weights-{cfg.model}.json"
    packed = {"schema": WEIGHTS_SCHEMA, "safetensors_base64": base64.b64encode(data).decode("ascii")}
    (folder / weights_file).write_text(json.dumps(packed) + "\n", encoding="utf-8")
    files = {weights_file: data, relation_file: (folder / relation_file).read_bytes()}
    manifest = {
        "schema": SCHEMA,
        "made_by": WRITE_COMMAND,
        "made_on": normal(numerics_key(torch.get_num_threads())),
        "files": [
            {"kind": kind, "file": name, "sha256": hashlib.sha256(raw).hexdigest(), "recipe": normal(recipe)}
            for kind, (name, raw), recipe in zip(("weights", "relation"), files.items(), recipes, strict=True)
        ],
    }
    write_json(folder / MANIFEST, manifest)
    return manifest


PROG = "python -m fl_server.shipped"


@one_line_errors(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="pre-train, estimate and write the files")
    parser.add_argument(
        "--dir", type=Path, default=SHIPPED_DIR, help="where to write them (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if not args.write:
        parser.print_usage(sys.stderr)
        say(f"{parser.prog}: error: nothing to do: give --write", file=sys.stderr)
        return 2
    manifest = write_shipped(args.dir)
    for entry in manifest["files"]:
        say(f"wrote {args.dir / entry['file']} (sha256 {entry['sha256']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

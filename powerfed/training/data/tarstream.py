"""Stream the regular files of a .tar / .tar.gz, fast enough for archives of 60,000 tiny images (where
tarfile's per-member header parsing is most of the load time): ustar/GNU/pax headers parsed by slicing,
gzip inflated in large chunks, the caller may stop early. Other compressions go through tarfile."""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from powerctl.files.readfile import DATA_LIMIT, open_regular, too_large
from powerfed.training.errors import DataError

BLOCK = 512
CHUNK = 1 << 20


class _Inflater:
    """A readable byte stream over a file, gunzipping it (all gzip members) when it is gzip."""

    def __init__(self, f: BinaryIO, gzipped: bool, where: Path) -> None:
        self.f, self.gzipped, self.where = f, gzipped, where
        self.z = zlib.decompressobj(31) if gzipped else None
        self.buf, self.pos, self.eof = b"", 0, False
        self.total = 0

    def _fill(self, need: int) -> None:
        parts, have = [self.buf[self.pos :]], len(self.buf) - self.pos
        while have < need and not self.eof:
            raw = self.f.read(CHUNK)
            data = raw if self.z is None else (self._inflate(raw) if raw else self.z.flush())
            self.eof = not raw
            parts.append(data)
            have += len(data)
            self.total += len(data)
            if self.total > DATA_LIMIT:  # a small .tar.gz may unpack to anything
                raise DataError(too_large(self.where, DATA_LIMIT, "an image archive, unpacked"))
        self.buf, self.pos = b"".join(parts), 0

    def _inflate(self, raw: bytes) -> bytes:
        """`raw` gunzipped through every gzip member that ends in it: members can be far smaller than a
        chunk (bgzip and `pigz --independent` write many), so one chunk may end and begin any number."""
        assert self.z is not None
        parts = [self.z.decompress(raw)]
        while self.z.eof and self.z.unused_data:  # the next member starts in what this one left over
            rest = self.z.unused_data
            self.z = zlib.decompressobj(31)
            parts.append(self.z.decompress(rest))
        return b"".join(parts)

    def read(self, n: int) -> bytes:
        if len(self.buf) - self.pos < n:
            self._fill(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += len(out)
        return out


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for large sizes
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _cstr(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    """Parse pax records 'LEN key=value\\n'."""
    out, i = {}, 0
    while i < len(data):
        space = data.index(b" ", i)
        length = int(data[i:space])
        key, _, value = data[space + 1 : i + length - 1].partition(b"=")
        out[key.decode()] = value.decode("utf-8", "surrogateescape")
        i += length
    return out


def _members(stream: _Inflater, where: Path) -> Iterator[tuple[str, bytes]]:
    pending: dict[str, str] = {}
    while True:
        head = stream.read(BLOCK)
        if len(head) < BLOCK or head == bytes(BLOCK):
            if head and head != bytes(BLOCK):
                raise DataError(f"{where}: the archive is truncated; re-copy the file")
            return
        stored = _octal(head[148:156])
        if stored != sum(head[:148]) + 256 + sum(head[156:]):
            raise DataError(f"{where}: bad tar header checksum; the file is corrupt or not a tar")
        kind = head[156:157]
        name = _cstr(head[:100])
        if head[257:263] == b"ustar\0" and head[345] != 0:
            name = _cstr(head[345:500]) + "/" + name
        size = int(pending.get("size", _octal(head[124:136])))
        name = pending.get("path", name)
        if size > DATA_LIMIT:  # read whole below: said before asking for the memory
            raise DataError(too_large(f"{where}:{name}", DATA_LIMIT, "an archive member"))
        data = stream.read(size)
        if len(data) < size:
            raise DataError(f"{where}: the archive is truncated inside {name!r}; re-copy the file")
        stream.read(-size % BLOCK)
        if kind == b"x":
            pending = _pax(data)
            continue
        if kind == b"L":
            pending = {"path": _cstr(data)}
            continue
        pending = {}
        if kind in (b"0", b"\0", b"7"):
            yield name, data


def iter_tar_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of every regular file, in archive order; stop iterating to stop reading."""
    try:
        what = "an image archive (.tar, .tar.gz)"
        with open_regular(path, limit=DATA_LIMIT, what=what, error=DataError) as f:
            head = f.read(BLOCK)
            f.seek(0)
            gzipped = head[:2] == b"\x1f\x8b"
            if gzipped or (len(head) == BLOCK and head[257:262] == b"ustar"):
                yield from _members(_Inflater(f, gzipped=gzipped, where=path), path)
                return
        yield from _tarfile_members(path)
    except zlib.error as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc}); re-copy the file") from None
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot read the archive ({exc}); the file is corrupt or not a tar"
        ) from None


def _tarfile_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """bz2/xz/other tars, through the standard library."""
    try:
        with tarfile.open(path, "r|*") as tf:
            total = 0
            for member in tf:
                total += member.size if member.isfile() else 0
                if total > DATA_LIMIT:  # a small .tar.bz2 may unpack to anything
                    raise DataError(too_large(path, DATA_LIMIT, "an image archive, unpacked"))
                if member.isfile():
                    fh = tf.extractfile(member)
                    yield member.name, fh.read() if fh is not None else b""
    except (tarfile.TarError, EOFError) as exc:
        raise DataError(
            f"{path}: cannot read the archive ({exc}); the file is corrupt or not a tar"
        ) from None

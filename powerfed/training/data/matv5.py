"""A minimal reader for MATLAB level-5 MAT-files (SVHN's *_32x32.mat), without scipy: the numeric arrays
(compressed or not), in MATLAB's column-major order and class, as scipy.io.loadmat gives them; cells,
structs, chars and sparse are skipped."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Literal

import numpy as np

from powerctl.files.readfile import DATA_LIMIT, read_bytes, too_large
from powerfed.training.errors import DataError

Endian = Literal["<", ">"]
"""The byte order of a MAT-file, as struct and numpy write it."""

# data element types (miXXX) → numpy dtype
_MI_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
MI_MATRIX = 14
MI_COMPRESSED = 15
# array classes (mxXXX) → numpy dtype; 1 cell, 2 struct, 3 object, 4 char, 5 sparse are skipped
_MX_DTYPES = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}


class _Reader:
    def __init__(self, buf: bytes | memoryview, endian: Endian, path: Path) -> None:
        self.buf, self.e, self.path, self.pos = memoryview(buf), endian, path, 0

    def fail(self, what: str) -> DataError:
        return DataError(f"{self.path}: corrupt MAT-file ({what}); re-save it with MATLAB/scipy as v5 or v7")

    def tag(self) -> tuple[int, int, memoryview]:
        """Read one data element: (type, byte count, payload), moving past its 8-byte padding."""
        if self.pos + 8 > len(self.buf):
            raise self.fail("truncated element tag")
        word, nbytes = struct.unpack_from(self.e + "II", self.buf, self.pos)
        if word >> 16:  # small data element: type and size share the first word, data in the second
            mtype, nbytes = word & 0xFFFF, word >> 16
            if nbytes > 4:
                raise self.fail("bad small element")
            data = self.buf[self.pos + 4 : self.pos + 4 + nbytes]
            self.pos += 8
            return mtype, nbytes, data
        start = self.pos + 8
        if start + nbytes > len(self.buf):
            raise self.fail("element runs past the end of the file")
        self.pos = start + (nbytes if word == MI_COMPRESSED else (nbytes + 7) // 8 * 8)
        return word, nbytes, self.buf[start : start + nbytes]

    def numeric(self, mtype: int, data: memoryview) -> np.ndarray:
        if mtype not in _MI_DTYPES:
            raise self.fail(f"unsupported data type {mtype}")
        return np.frombuffer(data, dtype=np.dtype(_MI_DTYPES[mtype]).newbyteorder(self.e))


def _read_matrix(r: _Reader, body: memoryview) -> tuple[str, np.ndarray] | None:
    sub = _Reader(body, r.e, r.path)
    _, _, flags = sub.tag()
    mx_class = struct.unpack_from(r.e + "I", flags)[0] & 0xFF
    complex_ = bool(struct.unpack_from(r.e + "I", flags)[0] & 0x0800)
    dtype, _, dims_raw = sub.tag()
    dims = tuple(int(d) for d in r.numeric(dtype, dims_raw))
    _, _, name_raw = sub.tag()
    name = bytes(name_raw).decode("ascii", "replace")
    if mx_class not in _MX_DTYPES or complex_:
        return None
    rtype, _, real = sub.tag()
    values = r.numeric(rtype, real)
    if values.size != int(np.prod(dims)):
        raise r.fail(f"array {name!r} holds {values.size} values for dimensions {dims}")
    out_dtype = np.dtype(_MX_DTYPES[mx_class])
    if values.dtype != out_dtype:
        values = values.astype(out_dtype)
    return name, values.reshape(dims, order="F")


def _check_header(head: bytes, path: Path) -> Endian:
    """The 128-byte header: text, version 0x0100 and the endian indicator 'MI'/'IM'."""
    if head.startswith(b"MATLAB 7.3"):
        raise DataError(
            f"{path}: MATLAB v7.3 (HDF5) files are not supported; re-save as v7 (save -v7) or convert to npz"
        )
    if len(head) < 128 or not head.startswith(b"MATLAB 5.0 MAT-file"):
        raise DataError(f"{path}: not a MATLAB 5 MAT-file (no 'MATLAB 5.0 MAT-file' header); check the file")
    if head[126:128] == b"IM":
        return "<"
    if head[126:128] == b"MI":
        return ">"
    raise DataError(f"{path}: MAT-file header has no endian indicator; the file is corrupt")


def read_mat_v5(path: str | Path, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """Numeric arrays of a v5 MAT-file by variable name (only `names`, when given)."""
    path = Path(path)
    try:
        raw = read_bytes(path, limit=DATA_LIMIT, what="a MATLAB v5 MAT-file", error=DataError)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}; check the path") from None
    endian = _check_header(raw[:128], path)
    r = _Reader(raw, endian, path)
    r.pos = 128
    out: dict[str, np.ndarray] = {}
    while r.pos < len(r.buf) and (names is None or not names.issubset(out)):
        mtype, _, body = r.tag()
        if mtype == MI_COMPRESSED:
            try:
                unzip = zlib.decompressobj()
                body = memoryview(unzip.decompress(body, DATA_LIMIT + 1))  # bounded: a bomb stops here
            except zlib.error as exc:
                raise r.fail(f"compressed element: {exc}") from None
            if len(body) > DATA_LIMIT:
                raise DataError(too_large(path, DATA_LIMIT, "a MAT-file element, unpacked"))
            inner = _Reader(body, endian, path)
            mtype, _, body = inner.tag()
        if mtype != MI_MATRIX:
            continue
        item = _read_matrix(r, body)
        if item is not None and (names is None or item[0] in names):
            out[item[0]] = item[1]
    return out

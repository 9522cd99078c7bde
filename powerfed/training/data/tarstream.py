"""Stream the regular files of a .tar (plain, gzip, bz2 or xz) through tarfile; the caller may stop early."""

from __future__ import annotations

import gzip
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from powerctl.files.readfile import DATA_LIMIT, open_regular, too_large
from powerfed.training.errors import DataError


def iter_tar_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of every regular file, in archive order; stop iterating to stop reading."""
    what = "an image archive (.tar, .tar.gz)"
    try:
        with open_regular(path, limit=DATA_LIMIT, what=what, error=DataError) as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            # GzipFile reads every gzip member (bgzip, `pigz --independent`); tarfile reads only the first
            with tarfile.open(fileobj=gzip.GzipFile(fileobj=f) if gzipped else f, mode="r|*") as tf:
                total = 0
                for member in tf:
                    if not member.isfile():
                        continue
                    total += member.size
                    if total > DATA_LIMIT:  # a small .tar.gz may unpack to anything
                        raise DataError(too_large(path, DATA_LIMIT, "an image archive, unpacked"))
                    fh = tf.extractfile(member)
                    yield member.name, fh.read() if fh is not None else b""
    except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc}); re-copy the file") from None
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot read the archive ({exc}); the file is corrupt or not a tar"
        ) from None

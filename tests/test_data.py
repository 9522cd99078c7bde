"""Dataset loaders on real bytes: the shared CIFAR-10 JPEG tar and text corpora, and small files in
each real format (CIFAR pickles, idx, MATLAB v5, npz, image folders and tars) written here."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from powerfed.training.data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    Dataset,
    decode,
    load_dataset,
    save_npz,
    train_test_split,
)
from powerfed.training.errors import DataError
from powerfed.training.synthetic import synthetic_image, synthetic_text
from powerfed.training.tasks import VOCAB, VOCAB_SIZE

MEAN = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)


def class_counts(ds: Dataset) -> list[int]:
    """Samples per label (length num_classes)."""
    return np.bincount(ds.labels(), minlength=ds.num_classes).tolist()


def pixels(ds: Dataset) -> torch.Tensor:
    """Undo the fixed normalisation: back to 0..255."""
    return (ds.x * STD + MEAN) * 255


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


# --------------------------------------------------------------------------- the shared CIFAR-10 JPEG tar


@pytest.fixture
def cifar_tar(shared_data: Path) -> Path:
    path = shared_data / "cifar10_jpeg" / "cifar10-jpg.tar.gz"
    assert path.is_file(), f"missing {path}"
    return path


def test_cifar10_jpeg_tar_limited_read(cifar_tar: Path) -> None:
    ds = load_dataset(f"cifar10-jpeg:{cifar_tar}", split="test", limit=100)
    assert ds.task == "image" and ds.num_classes == 10 and ds.classes == CIFAR10_CLASSES
    assert ds.x.shape == (100, 3, 32, 32) and ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
    assert class_counts(ds) == [10] * 10  # class-balanced limit
    assert ds.y.tolist() == sorted(ds.y.tolist())
    px = pixels(ds)
    assert px.min() > -0.01 and px.max() < 255.01 and 60 < px.mean() < 200
    assert ds.x.mean().abs() < 0.5 and 0.5 < ds.x.std() < 1.5  # normalised


def test_cifar10_jpeg_pixels_and_labels_match_the_files(cifar_tar: Path) -> None:
    ds = load_dataset(f"cifar10-jpeg:{cifar_tar}", split="test", limit=20)
    wanted = {"cifar10-jpg/test/airplane/0000.jpg": 0, "cifar10-jpg/test/automobile/0001.jpg": 3}
    found = {}
    with tarfile.open(cifar_tar, "r|gz") as tf:
        for m in tf:
            if m.name in wanted:
                found[m.name] = np.asarray(Image.open(io.BytesIO(tf.extractfile(m).read())).convert("RGB"))
            if len(found) == len(wanted):
                break
    for name, row in wanted.items():
        expected = torch.from_numpy(found[name].transpose(2, 0, 1).astype(np.float32))
        assert torch.allclose(pixels(ds)[row], expected, atol=1e-3)
        assert CIFAR10_CLASSES[int(ds.y[row])] == name.split("/")[2]


@pytest.mark.slow
def test_cifar10_jpeg_train_split_and_full_load(cifar_tar: Path) -> None:
    train = load_dataset(f"cifar10-jpeg:{cifar_tar}", split="train", limit=200)
    assert class_counts(train) == [20] * 10
    full = load_dataset(f"cifar10-jpeg:{cifar_tar}", split="test")
    assert len(full) == 10_000 and class_counts(full) == [1000] * 10
    mean = (full.x * STD + MEAN).mean(dim=(0, 2, 3))
    assert torch.allclose(mean, torch.tensor(CIFAR10_MEAN), atol=0.01)


# --------------------------------------------------------------------------- image folders and tars


def _image_tree(root: Path, per_class: int = 3) -> dict[str, np.ndarray]:
    """{train,test}/{airplane,cat}/NNNN.png with known pixels; returns pixels by relative path."""
    rng = np.random.default_rng(0)
    written = {}
    for split in ("train", "test"):
        for cls in ("airplane", "cat"):
            (root / split / cls).mkdir(parents=True)
            for i in range(per_class):
                arr = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / cls / f"{i:04d}.png")
                written[f"{split}/{cls}/{i:04d}.png"] = arr
    return written


def test_image_folder_layout(tmp_path: Path) -> None:
    written = _image_tree(tmp_path / "data")
    ds = load_dataset(f"cifar10-jpeg:{tmp_path / 'data'}", split="train")
    assert len(ds) == 6 and ds.y.tolist() == [0, 0, 0, 3, 3, 3]
    assert torch.allclose(
        pixels(ds)[4], torch.from_numpy(written["train/cat/0001.png"].transpose(2, 0, 1)).float(), atol=1e-3
    )
    assert len(load_dataset(f"cifar10-jpeg:{tmp_path / 'data'}", split="all")) == 12
    # a limit is shared out over the ten CIFAR classes: 2 per class, of which two classes exist here
    assert load_dataset(f"cifar10-jpeg:{tmp_path / 'data'}", split="test", limit=20).y.tolist() == [
        0,
        0,
        3,
        3,
    ]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("mode", ["w:gz", "w", "w:bz2"])
def test_image_tar_formats(tmp_path: Path, fmt: int, mode: str) -> None:
    """Archives written by Python's tarfile in every header format, with long member names."""
    deep = "d" * 60 + "/" + "e" * 60  # > 100 characters of path: needs pax/GNU/ustar-prefix names
    written = _image_tree(tmp_path / "src" / deep)
    arc = tmp_path / "imgs.tar"
    with tarfile.open(arc, mode, format=fmt) as tf:
        tf.add(tmp_path / "src", arcname="top")
    ds = load_dataset(f"cifar10-jpeg:{arc}", split="test")
    assert ds.y.tolist() == [0, 0, 0, 3, 3, 3]
    assert torch.allclose(
        pixels(ds)[0],
        torch.from_numpy(written["test/airplane/0000.png"].transpose(2, 0, 1)).float(),
        atol=1e-3,
    )


def _gzip_members(raw: bytes, members: int) -> bytes:
    """`raw` as `members` independent gzip members, concatenated (as bgzip and pigz --independent write)."""
    cut = [len(raw) * i // members for i in range(members + 1)]
    return b"".join(gzip.compress(raw[a:b]) for a, b in itertools.pairwise(cut))


def test_a_multi_member_gzip_archive_loads_every_image(cifar_tar: Path, tmp_path: Path) -> None:
    """600 real CIFAR-10 JPEGs written as one gzip member and as 48: both load whole, the same."""
    plain = io.BytesIO()
    with tarfile.open(cifar_tar, "r|gz") as src, tarfile.open(fileobj=plain, mode="w") as dst:
        for member in src:
            if member.isfile() and member.name.endswith(".jpg"):
                dst.addfile(member, src.extractfile(member))
                if len(dst.getmembers()) == 600:
                    break
    one, many = tmp_path / "one.tar.gz", tmp_path / "many.tar.gz"
    one.write_bytes(gzip.compress(plain.getvalue()))
    many.write_bytes(_gzip_members(plain.getvalue(), 48))
    whole = load_dataset(f"cifar10-jpeg:{one}", split="all")
    split = load_dataset(f"cifar10-jpeg:{many}", split="all")
    assert len(whole) == len(split) == 600
    assert torch.equal(whole.x, split.x) and torch.equal(whole.y, split.y)


def test_hundreds_of_tiny_gzip_members_are_all_read(tmp_path: Path) -> None:
    """Member ends at every offset: every file of the archive comes back whole."""
    from powerfed.training.data.images import iter_tar_files

    files = {f"top/f{i:03d}.bin": os.urandom(i * 7 % 300) for i in range(120)}
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    arc = tmp_path / "tiny.tar.gz"
    arc.write_bytes(_gzip_members(plain.getvalue(), len(plain.getvalue()) // 97))
    assert dict(iter_tar_files(arc)) == files


def test_cinic10_has_a_valid_split(tmp_path: Path) -> None:
    root = tmp_path / "cinic"
    for split in ("train", "valid", "test"):
        (root / split / "ship").mkdir(parents=True)
        Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(root / split / "ship" / "n01.png")
    ds = load_dataset(f"cinic10:{root}", split="valid")
    assert len(ds) == 1 and ds.y.tolist() == [8] and ds.name == "cinic10"
    assert len(load_dataset(f"cinic10:{root}", split="all")) == 3


def test_corrupt_images_and_archives_are_data_errors(tmp_path: Path) -> None:
    root = tmp_path / "bad"
    (root / "train" / "cat").mkdir(parents=True)
    (root / "train" / "cat" / "0.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match="cannot decode") as err:
        load_dataset(f"cifar10-jpeg:{root}")
    one_line(err)
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(root / "train" / "cat" / "0.jpg", format="JPEG")
    with pytest.raises(DataError, match="expected 32x32"):
        load_dataset(f"cifar10-jpeg:{root}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no images found"):
        load_dataset(f"cifar10-jpeg:{empty}")
    _image_tree(tmp_path / "ok")
    good = tmp_path / "ok.tar.gz"
    with tarfile.open(good, "w:gz") as tf:
        tf.add(tmp_path / "ok", arcname="ok")
    truncated = tmp_path / "trunc.tar.gz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(DataError, match=r"trunc\.tar\.gz"):
        load_dataset(f"cifar10-jpeg:{truncated}", split="all")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(DataError, match=r"junk\.tar"):
        load_dataset(f"cifar10-jpeg:{junk}")


# --------------------------------------------------------------------------- CIFAR python pickles


def _cifar_batch(path: Path, n: int, start: int, label_key: bytes = b"labels", classes: int = 10) -> None:
    data = (np.arange(n * 3072, dtype=np.int64).reshape(n, 3072) + start) % 251
    batch = {
        b"batch_label": b"testing batch",
        label_key: [(start + i) % classes for i in range(n)],
        b"data": data.astype(np.uint8),
        b"filenames": [f"img{start + i}.png".encode() for i in range(n)],
    }
    with path.open("wb") as f:
        pickle.dump(batch, f, protocol=2)


def _cifar10_dir(root: Path) -> Path:
    root.mkdir()
    for i in range(1, 6):
        _cifar_batch(root / f"data_batch_{i}", 4, 4 * (i - 1))
    _cifar_batch(root / "test_batch", 3, 100)
    with (root / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CIFAR10_CLASSES], b"num_vis": 3072}, f, protocol=2)
    return root


def test_cifar10_pickles(tmp_path: Path) -> None:
    root = _cifar10_dir(tmp_path / "cifar-10-batches-py")
    train = load_dataset(f"cifar10:{tmp_path}")  # the parent folder works too
    assert len(train) == 20 and train.y.tolist() == [i % 10 for i in range(20)]
    assert train.classes == CIFAR10_CLASSES
    row = (np.arange(3072) + 3072) % 251  # sample 1: R plane, then G, then B, each row-major 32×32
    assert torch.allclose(pixels(train)[1], torch.from_numpy(row.reshape(3, 32, 32)).float(), atol=1e-3)
    test = load_dataset(f"cifar10:{root}", split="test")
    assert len(test) == 3 and test.y.tolist() == [0, 1, 2]
    assert len(load_dataset(f"cifar10:{root}", split="all")) == 23
    assert load_dataset(f"cifar10:{root}", limit=3).y.tolist() == [0, 1, 2]


def test_cifar100_pickles(tmp_path: Path) -> None:
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    _cifar_batch(root / "train", 6, 95, label_key=b"fine_labels", classes=100)
    _cifar_batch(root / "test", 2, 0, label_key=b"fine_labels", classes=100)
    ds = load_dataset(f"cifar100:{root}")
    assert ds.num_classes == 100 and ds.y.tolist() == [95, 96, 97, 98, 99, 0]


def test_cifar_missing_and_corrupt_batches(tmp_path: Path) -> None:
    root = _cifar10_dir(tmp_path / "c")
    (root / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3") as err:
        load_dataset(f"cifar10:{root}")
    one_line(err)
    (root / "data_batch_3").write_bytes(b"\x80\x02garbage")
    with pytest.raises(DataError, match="not a CIFAR python batch"):
        load_dataset(f"cifar10:{root}")
    with (root / "data_batch_3").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataError, match=r"uint8 \[N, 3072\]"):
        load_dataset(f"cifar10:{root}")
    with pytest.raises(DataError, match="data_batch_1"):
        load_dataset(f"cifar10:{tmp_path}")


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {_Exploit.target}",))


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    root = _cifar10_dir(tmp_path / "c")
    _Exploit.target = str(tmp_path / "pwned")
    with (root / "test_batch").open("wb") as f:
        pickle.dump({b"data": _Exploit(), b"labels": []}, f)
    with pytest.raises(DataError, match="not allowed"):
        load_dataset(f"cifar10:{root}", split="test")
    assert not (tmp_path / "pwned").exists()


# --------------------------------------------------------------------------- Fashion-MNIST idx


def _idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    code = {np.uint8: 0x08}[arr.dtype.type]
    raw = (
        struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    )
    if gz:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)


def _fashion_dir(root: Path) -> Path:
    root.mkdir()
    rng = np.random.default_rng(1)
    _idx(root / "train-images-idx3-ubyte", rng.integers(1, 256, (5, 28, 28), dtype=np.uint8), gz=True)
    _idx(root / "train-labels-idx1-ubyte", np.array([9, 0, 1, 2, 3], np.uint8), gz=True)
    _idx(root / "t10k-images-idx3-ubyte", rng.integers(1, 256, (2, 28, 28), dtype=np.uint8), gz=False)
    _idx(root / "t10k-labels-idx1-ubyte", np.array([4, 5], np.uint8), gz=False)
    return root


def test_fashion_mnist_idx_padded_to_32_rgb(tmp_path: Path) -> None:
    root = _fashion_dir(tmp_path / "fm")
    ds = load_dataset(f"fashion-mnist:{root}")
    assert ds.x.shape == (5, 3, 32, 32) and ds.y.tolist() == [9, 0, 1, 2, 3] and ds.classes[9] == "ankle boot"
    px = pixels(ds)
    assert torch.allclose(px[:, 0], px[:, 1], atol=1e-3) and torch.allclose(px[:, 0], px[:, 2], atol=1e-3)
    assert px[:, :, :2].abs().max() < 1e-3 and px[:, :, :, 30:].abs().max() < 1e-3  # 2-pixel black frame
    assert px[:, :, 2:30, 2:30].min() > 0.5
    raw = gzip.decompress((root / "train-images-idx3-ubyte.gz").read_bytes())
    first = np.frombuffer(raw, np.uint8, 28 * 28, 16).reshape(28, 28).copy()
    assert torch.allclose(px[0, 0, 2:30, 2:30], torch.from_numpy(first).float(), atol=1e-3)
    assert load_dataset(f"fashion-mnist:{root}", split="test").y.tolist() == [4, 5]


def test_fashion_mnist_bad_files(tmp_path: Path) -> None:
    root = _fashion_dir(tmp_path / "fm")
    raw = (root / "t10k-labels-idx1-ubyte").read_bytes()
    (root / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x07" + raw[4:])
    with pytest.raises(DataError, match="bad magic") as err:
        load_dataset(f"fashion-mnist:{root}", split="test")
    one_line(err)
    (root / "t10k-labels-idx1-ubyte").write_bytes(raw[:-1])
    with pytest.raises(DataError, match="corrupt"):
        load_dataset(f"fashion-mnist:{root}", split="test")
    (root / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load_dataset(f"fashion-mnist:{root}", split="test")


# --------------------------------------------------------------------------- SVHN .mat (MATLAB level 5)


def _svhn_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8), rng.integers(1, 11, (n, 1)).astype(
        np.float64
    )


def _svhn_file(path: Path, n: int, seed: int = 0, compress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    x, y = _svhn_arrays(n, seed)
    y[0, 0] = 10.0  # digit 0
    scipy.io.savemat(path, {"note": "other variables are skipped", "X": x, "y": y}, do_compression=compress)
    return x, y


@pytest.mark.parametrize("compress", [True, False])
def test_svhn_mat_file(tmp_path: Path, compress: bool) -> None:
    x, y = _svhn_file(tmp_path / "train_32x32.mat", 7, compress=compress)
    ds = load_dataset(f"svhn:{tmp_path / 'train_32x32.mat'}")
    assert ds.x.shape == (7, 3, 32, 32) and ds.num_classes == 10
    assert ds.y.tolist() == [0] + [int(v) % 10 for v in y[1:, 0]]
    n, c, r, col = 3, 2, 5, 17  # X(r, col, c, n) in MATLAB is image n, channel c, row r, column col
    assert abs(float(pixels(ds)[n, c, r, col]) - x[r, col, c, n]) < 1e-3
    with pytest.raises(DataError, match="no test split"):
        load_dataset(f"svhn:{tmp_path / 'train_32x32.mat'}", split="test")


def test_svhn_folder_splits(tmp_path: Path) -> None:
    _svhn_file(tmp_path / "train_32x32.mat", 5)
    _svhn_file(tmp_path / "test_32x32.mat", 2, seed=1)
    assert len(load_dataset(f"svhn:{tmp_path}")) == 5
    assert len(load_dataset(f"svhn:{tmp_path}", split="test")) == 2
    assert len(load_dataset(f"svhn:{tmp_path}", split="all")) == 7


def test_svhn_bad_files(tmp_path: Path) -> None:
    v73 = tmp_path / "v73.mat"
    v73.write_bytes(b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(512, b" "))
    with pytest.raises(DataError, match=r"v7\.3") as err:
        load_dataset(f"svhn:{v73}")
    one_line(err)
    junk = tmp_path / "junk.mat"
    junk.write_bytes(b"\x89HDF\r\n" + os.urandom(300))
    with pytest.raises(DataError, match="corrupt or not a MATLAB v5/v7 MAT-file") as err:
        load_dataset(f"svhn:{junk}")
    one_line(err)
    x, _ = _svhn_arrays(2, 0)
    nolabels = tmp_path / "nolabels.mat"
    scipy.io.savemat(nolabels, {"X": x})
    with pytest.raises(DataError, match="no variables X and y"):
        load_dataset(f"svhn:{nolabels}")
    good = tmp_path / "good.mat"
    _svhn_file(good, 3)
    cut = tmp_path / "cut.mat"
    cut.write_bytes(good.read_bytes()[:-50])
    with pytest.raises(DataError, match="corrupt or not a MATLAB v5/v7 MAT-file") as err:
        load_dataset(f"svhn:{cut}")
    one_line(err)


@pytest.mark.parametrize(
    "zeros",
    [
        {"X": np.zeros((32, 32, 3, 100), np.uint8), "y": np.ones((100, 1))},
        # 3,073 values, 24,584 bytes once unpacked: the bound is in bytes, as loadmat allocates them
        {"X": np.zeros((32, 32, 3, 1)), "y": np.ones((1, 1))},
    ],
    ids=["uint8", "float64"],
)
def test_a_mat_file_that_unpacks_past_the_limit_is_refused(
    zeros: dict[str, np.ndarray], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scipy.io.savemat(tmp_path / "train_32x32.mat", zeros, do_compression=True)
    assert (tmp_path / "train_32x32.mat").stat().st_size < 10_000
    monkeypatch.setattr("powerfed.training.data.images.DATA_LIMIT", 10_000)
    with pytest.raises(DataError, match="limit for a MAT-file, unpacked") as err:
        load_dataset(f"svhn:{tmp_path / 'train_32x32.mat'}")
    one_line(err)


# --------------------------------------------------------------------------- text


@pytest.fixture
def shakespeare(shared_data: Path) -> Path:
    path = shared_data / "tinyshakespeare" / "input.txt"
    assert path.is_file(), f"missing {path}"
    return path


def test_text_on_tinyshakespeare(shakespeare: Path) -> None:
    text = shakespeare.read_text()
    ids = np.array([VOCAB.index(c) for c in text if c in VOCAB])
    train = load_dataset(f"text:{shakespeare}")
    test = load_dataset(f"text:{shakespeare}", split="test")
    assert train.task == "text" and train.num_classes == VOCAB_SIZE and train.x.dtype == torch.int64
    cut = int(len(ids) * 0.9)
    assert len(train) == (cut - 1) // 64 and len(test) == (len(ids) - cut - 1) // 64
    assert decode(train.x[0]) == text[:64]
    assert torch.equal(train.x[0], torch.from_numpy(ids[:64])) and torch.equal(
        test.x[0], torch.from_numpy(ids[cut : cut + 64])
    )
    assert torch.equal(train.y[:, :-1], train.x[:, 1:])  # targets are the inputs shifted by one
    assert torch.equal(train.y[:-1, -1], train.x[1:, 0])  # windows continue each other (stride 64)
    assert int(train.x.max()) < VOCAB_SIZE and int(train.x.min()) >= 0
    small = load_dataset(f"text:{shakespeare}", seq_len=16, limit=10)
    assert small.x.shape == (10, 16)


def test_text_drops_characters_outside_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("Caf\u00e9 au lait,\r\n\tto go!\r\n" * 40, encoding="utf-8")
    with pytest.warns(UserWarning, match="dropped"):
        ds = load_dataset(f"text:{path}", split="all", seq_len=8)
    assert ds.info["dropped_chars"] == 80  # é and the tab; CRLF became LF
    assert decode(ds.x[0]) == "Caf au l" and decode(ds.y[0]) == "af au la"
    assert "\r" not in decode(ds.x.reshape(-1))


def test_text_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found") as err:
        load_dataset(f"text:{tmp_path / 'missing.txt'}")
    one_line(err)
    (tmp_path / "bin.txt").write_bytes(b"abc\x00\x01\x02" * 100)
    with pytest.raises(DataError, match="binary"):
        load_dataset(f"text:{tmp_path / 'bin.txt'}")
    (tmp_path / "latin.txt").write_bytes("caf\u00e9 ".encode("latin-1") * 100)
    with pytest.raises(DataError, match="not UTF-8"):
        load_dataset(f"text:{tmp_path / 'latin.txt'}")
    (tmp_path / "short.txt").write_text("tiny")
    with pytest.raises(DataError, match="too short"):
        load_dataset(f"text:{tmp_path / 'short.txt'}")
    (tmp_path / "none.txt").write_text("\u00e9\u00e8" * 50)
    with pytest.raises(DataError, match="no characters of the vocabulary"):
        load_dataset(f"text:{tmp_path / 'none.txt'}")


# --------------------------------------------------------------------------- npz


def test_npz_round_trip_image_and_text(tmp_path: Path) -> None:
    img = synthetic_image(20)
    save_npz(img, tmp_path / "img.npz")
    back = load_dataset(f"npz:{tmp_path / 'img.npz'}")
    assert (
        back.task == "image"
        and torch.equal(back.x, img.x)
        and torch.equal(back.y, img.y)
        and back.num_classes == 10
    )
    txt = synthetic_text(5_000, seq_len=16)
    save_npz(txt, tmp_path / "txt.npz")
    back = load_dataset(f"npz:{tmp_path / 'txt.npz'}", split="all", limit=5)
    assert back.task == "text" and torch.equal(back.x, txt.x[:5]) and torch.equal(back.y, txt.y[:5])


def test_npz_uint8_channels_last_and_own_splits(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    np.savez(
        tmp_path / "a.npz", x_train=x, y_train=np.array([0, 1, 2, 3]), x_test=x[:1], y_test=np.array([3])
    )
    train = load_dataset(f"npz:{tmp_path / 'a.npz'}")
    assert train.x.shape == (4, 3, 32, 32) and train.num_classes == 4
    assert torch.allclose(pixels(train)[2], torch.from_numpy(x[2].transpose(2, 0, 1)).float(), atol=1e-3)
    assert load_dataset(f"npz:{tmp_path / 'a.npz'}", split="test").y.tolist() == [3]
    assert len(load_dataset(f"npz:{tmp_path / 'a.npz'}", split="all")) == 5


def test_npz_errors(tmp_path: Path) -> None:
    np.savez(tmp_path / "only.npz", x=np.zeros((2, 3, 32, 32), np.float32), y=np.array([0, 1]))
    with pytest.raises(DataError, match="no x_test") as err:
        load_dataset(f"npz:{tmp_path / 'only.npz'}", split="test")
    one_line(err)
    np.savez(tmp_path / "wrong.npz", a=np.zeros(3))
    with pytest.raises(DataError, match="needs arrays x and y"):
        load_dataset(f"npz:{tmp_path / 'wrong.npz'}")
    (tmp_path / "corrupt.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="not a readable"):
        load_dataset(f"npz:{tmp_path / 'corrupt.npz'}")
    np.savez(tmp_path / "ids.npz", x=np.full((2, 4), 200), y=np.zeros((2, 4), np.int64))
    with pytest.raises(DataError, match="character ids"):
        load_dataset(f"npz:{tmp_path / 'ids.npz'}")
    with pytest.raises(DataError, match="not found"):
        load_dataset(f"npz:{tmp_path / 'missing.npz'}")


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "kind", ["cifar10", "cifar100", "cifar10-jpeg", "cinic10", "svhn", "fashion-mnist", "npz", "text"]
)
def test_missing_paths_are_one_line_data_errors(tmp_path: Path, kind: str) -> None:
    with pytest.raises(DataError, match="nope") as err:
        load_dataset(f"{kind}:{tmp_path / 'nope'}")
    assert "check the path" in one_line(err) or "check the folder" in one_line(err)


def test_unknown_spec_split_and_missing_argument() -> None:
    with pytest.raises(DataError, match="synthetic-image") as err:
        load_dataset("imagenet:/data")
    one_line(err)
    with pytest.raises(DataError, match="needs a path"):
        load_dataset("cifar10")
    with pytest.raises(DataError, match="unknown split"):
        load_dataset("synthetic-image", split="valid")
    with pytest.raises(DataError, match="unknown split"):
        load_dataset("text:/x", split="dev")


# --------------------------------------------------------------------------- synthetic data


def test_synthetic_image_is_seeded_and_split() -> None:
    a, b = synthetic_image(50, seed=3), synthetic_image(50, seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert a.x.shape == (50, 3, 32, 32) and class_counts(a) == [5] * 10
    test = synthetic_image(50, seed=3, split="test")
    assert not torch.equal(test.x, a.x)
    assert abs(float(a.x.mean())) < 0.3 and 0.7 < float(a.x.std()) < 1.3
    other_task = synthetic_image(50, seed=4)
    assert not torch.equal(other_task.x, a.x)


def test_synthetic_text_is_seeded_with_a_known_ceiling() -> None:
    a, b = synthetic_text(20_000, seq_len=32), synthetic_text(20_000, seq_len=32)
    assert torch.equal(a.x, b.x) and a.x.shape[1] == 32
    assert 0.4 < a.info["accuracy_ceiling"] < 0.7
    chars = set(decode(a.x.reshape(-1)))
    assert " " in chars and chars <= set("etaoinshrdlcumwf ,.\n")
    assert torch.equal(a.y[:, :-1], a.x[:, 1:])
    assert not torch.equal(synthetic_text(20_000, seq_len=32, seed=1).x[:10], a.x[:10])


def test_load_dataset_synthetic_sizes() -> None:
    assert len(load_dataset("synthetic-image", split="test")) == 1000  # train: 4000
    assert len(load_dataset("synthetic-image", split="test", limit=30)) == 30
    both = load_dataset("synthetic-image", split="all", limit=100)
    assert len(both) == 100 and both.info["split"] == "all"
    text = load_dataset("synthetic-text", seq_len=16, limit=12)
    assert text.x.shape == (12, 16)


# --------------------------------------------------------------------------- splits


def test_train_test_split_images_is_stratified_and_reproducible() -> None:
    ds = synthetic_image(200)
    tr, te = train_test_split(ds, seed=1)
    assert len(te) == 40 and len(tr) == 160 and class_counts(te) == [4] * 10
    _, te2 = train_test_split(ds, seed=1)
    assert torch.equal(te.x, te2.x)
    _, te3 = train_test_split(ds, seed=2)
    assert not torch.equal(te.x, te3.x)
    joined = torch.cat([tr.x, te.x])
    assert len(torch.unique(joined.reshape(200, -1), dim=0)) == 200  # disjoint, complete
    with pytest.raises(DataError):
        train_test_split(ds, test_fraction=1.5)


def test_train_test_split_text_takes_the_tail() -> None:
    ds = synthetic_text(20_000, seq_len=16)
    tr, te = train_test_split(ds)
    assert len(te) == round(0.1 * len(ds)) and torch.equal(te.x, ds.x[len(tr) :])


def test_subset_and_labels() -> None:
    ds = synthetic_text(5_000, seq_len=8)
    sub = ds.subset([3, 1])
    assert torch.equal(sub.x, ds.x[[3, 1]]) and sub.labels().tolist() == ds.y[[3, 1], 0].tolist()
    with pytest.raises(DataError):
        Dataset("bad", "image", torch.zeros(2, 3, 32, 32), torch.zeros(3, dtype=torch.int64), 10)

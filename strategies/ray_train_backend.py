"""Ray Train's torch backend, its ranks first made ready for hetbench's group (cluster/collective.py):
gloo on the interface toward rank 0, or hetbench's TCP group between operating systems. Ray Train
calls init_process_group itself, in the backend's on_start, before our loop runs."""

from __future__ import annotations

from dataclasses import dataclass

from ray.train._internal.utils import get_address_and_port
from ray.train.torch.config import TorchConfig, _TorchBackend

from hetbench.cluster.collective import BACKEND, prepare


class _TowardRankZero(_TorchBackend):
    def on_start(self, worker_group, backend_config: CollectiveTorchConfig) -> None:
        master, _ = worker_group.execute_single(0, get_address_and_port)  # Ray Train's own choice of rank 0's
        c = backend_config
        worker_group.execute(prepare, master, c.collective, c.joined, c.connect_timeout_s)
        super().on_start(worker_group, backend_config)


@dataclass
class CollectiveTorchConfig(TorchConfig):
    """TorchConfig whose ranks form hetbench's group, on the backend `collective` chooses."""

    backend: str = BACKEND
    collective: str = "auto"  # cluster.collective
    joined: bool = False  # a cluster someone started: the TCP group listens on its fixed ports
    connect_timeout_s: float = 30.0  # bound on forming the group

    @property
    def backend_cls(self):
        return _TowardRankZero

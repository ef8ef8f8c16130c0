"""The actors and the paths benchmarks/transports.py times a parameter server's round trip by.

Imported once Ray's process defaults are set: Ray reads them when it is imported."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace

import ray
import torch

from hetbench.clock import cv, median
from hetbench.cluster.collective import use_interface_toward
from hetbench.cluster.ray_connection import on_driver_node, placement
from hetbench.floor import floor_ranks, measure_floor
from hetbench.gradients import count_parameters
from hetbench.transport.direct import Channel, Listener, hello
from hetbench.workload import Net

WARMUP = 5  # round trips that warm every path up, untimed
TIMEOUT_S = 30.0  # no round trip of 4.8 MB takes this long, even at 10 Mbit


class End:
    """What both actors share: the model-sized buffer, and the gloo interface toward the server."""

    def __init__(self, numel: int) -> None:
        torch.set_num_threads(1)
        self.buffer = torch.randn(numel)
        self.channel: Channel | None = None

    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def use_interface_toward(self, master: str) -> str | None:
        return use_interface_toward(master)


@ray.remote(num_cpus=0)
class Worker(End):
    def gradient(self, _step: int = 0) -> torch.Tensor:
        return self.buffer

    @ray.method(tensor_transport="gloo")
    def gradient_rdt(self, _step: int = 0) -> torch.Tensor:
        return self.buffer

    def take(self, weights: torch.Tensor) -> float:
        return float(weights[0])  # the weights are here: one value read from them

    def connect(self, address: tuple, secret: bytes) -> None:
        self.channel = Channel.connect(tuple(address), hello(secret, "worker"), TIMEOUT_S)
        if self.channel is None:
            raise ConnectionError(f"cannot reach the server at {address}")

    def direct_step(self, tag: int) -> float:
        """Send the gradient up the channel and wait for the weights coming back down."""
        self.channel.send(tag, self.buffer.numpy())
        return float(self.channel.receive(tag)[0])


@ray.remote(num_cpus=0)
class Server(End):
    def update(self, gradient: torch.Tensor) -> torch.Tensor:
        self.buffer[0] = gradient[0]  # the gradient is here: the weights now depend on it
        return self.buffer

    @ray.method(tensor_transport="gloo")
    def update_rdt(self, gradient: torch.Tensor) -> torch.Tensor:
        return self.update(gradient)

    def listen(self, host: str) -> tuple:
        self.listener = Listener(host, 0, TIMEOUT_S)
        return self.listener.address, self.listener.secret

    def echo(self, count: int) -> None:
        """As a server sends weights for each gradient: in a thread, so this actor serves calls meanwhile."""

        def serve() -> None:
            (channel,) = self.listener.accept(["worker"]).values()
            for tag in range(count):
                gradient = channel.receive(tag)
                self.buffer[0] = float(gradient[0])
                channel.send(tag, self.buffer.numpy())

        threading.Thread(target=serve, daemon=True).start()


def timed(step, iterations: int) -> list[float]:
    """Seconds of each of `iterations` round trips, after WARMUP untimed ones."""
    times = []
    for i in range(WARMUP + iterations):
        start = time.perf_counter()
        step(i)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def object_store(worker, server, iterations: int) -> list[float]:
    return timed(lambda i: ray.get(worker.take.remote(server.update.remote(worker.gradient.remote(i)))), iterations)


def rdt_gloo(worker, server, iterations: int) -> list[float]:
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    master = ray.get(server.node_ip.remote())
    ray.get([end.use_interface_toward.remote(master) for end in (server, worker)])
    group = create_collective_group([server, worker], backend="torch_gloo")
    try:
        return timed(
            lambda i: ray.get(worker.take.remote(server.update_rdt.remote(worker.gradient_rdt.remote(i)))), iterations
        )
    finally:
        destroy_collective_group(group)


def direct_tcp(worker, server, iterations: int) -> list[float]:
    address, secret = ray.get(server.listen.remote(ray.get(server.node_ip.remote())))
    ray.get(server.echo.remote(WARMUP + iterations))
    ray.get(worker.connect.remote(address, secret))
    return timed(lambda i: ray.get(worker.direct_step.remote(i)), iterations)


PATHS = {"object store": object_store, "rdt-gloo": rdt_gloo, "direct tcp": direct_tcp}


def measure(cfg, iterations: int) -> dict:
    """Each path's round trips between fresh actors on the floor's two nodes, then the floors."""
    numel = count_parameters(Net())
    far = cfg.workers[floor_ranks(cfg.workers)[1]]
    figures = {}
    for name, path in PATHS.items():
        server = Server.options(**on_driver_node()).remote(numel)
        worker = Worker.options(**placement(far)).remote(numel)
        try:
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            times = path(worker, server, iterations)
            figures[name] = {"roundtrip_s": median(times), "roundtrip_cv": cv(times), "times": times}
        except Exception as e:  # an alpha or beta API that does not work here: its reason, not the run's end
            figures[name] = {"failed": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
        finally:
            for actor in (worker, server):
                ray.kill(actor)
    floor = replace(cfg.floor, iterations=iterations)
    gloo, ps = measure_floor(floor, cfg.cluster, cfg.workers, cfg.link, numel)
    figures["ps-floor (no Ray call)"] = {"roundtrip_s": ps.get("roundtrip_s"), "roundtrip_cv": ps.get("roundtrip_cv")}
    figures["gloo-floor (one all-reduce)"] = {"roundtrip_s": gloo["allreduce_s"], "roundtrip_cv": gloo["allreduce_cv"]}
    figures["path"] = gloo["path"]
    return figures

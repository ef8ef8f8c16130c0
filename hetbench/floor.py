"""The floors: what moving the model between two nodes costs at the least, with nothing of ours.

`gloo-floor`: a raw torch.distributed all-reduce of the model's flat buffer, the all-reduce
strategies' limit, over the backend they use between these two nodes (cluster/collective.py: gloo,
or hetbench's TCP group between operating systems; the record says which). `ps-floor`: the buffer
sent up a direct TCP channel and echoed back down, a parameter server's limit (the gradient up, the
weights down), over the path ray-ps's workers take.

Two processes, placed like workers (cluster/placed.py): one on the reference worker's node, one on
the first worker on another node (a desk and a Mac: across their link; in local-multinode across the
emulated one; on one box, two processes there). The one on the driver's machine, where a parameter
server runs, listens for both floors.
The same number of floats as the CNN; each strategy's sync overhead is judged against its own
pattern's floor, measured in the same run. The records say which path that was.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict

from hetbench.clock import cv, median
from hetbench.cluster.collective import join_group, operating_system, rendezvous
from hetbench.cluster.nodes import direct_port
from hetbench.cluster.place import place
from hetbench.config import ClusterConfig, FloorConfig, LinkConfig, WorkerConfig
from hetbench.errors import RunFailed
from hetbench.transport.direct import Channel, Listener, hello

FLOOR_NAME = "gloo-floor"
PS_FLOOR_NAME = "ps-floor"
FLOORS = (FLOOR_NAME, PS_FLOOR_NAME)
WARMUP = 5  # transfers that warm the connection up, untimed


def allreduce_times(
    rank: int, master: str, port: int, numel: int, iterations: int, timeout_s: float, cluster: ClusterConfig, store=None
) -> dict:
    """The seconds of each timed all-reduce, the interface this end's gloo used and the backend the
    group formed on (rank 0 passes its rendezvous store)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    joined = join_group(
        master,
        port,
        rank,
        2,
        timeout_s,
        store,
        collective=cluster.collective,
        joined=bool(cluster.ray_address),
        connect_timeout_s=timeout_s,  # the floor's own bound: its two ends may start far apart on a busy host
        device="cpu",
    )
    try:
        buffer = torch.randn(numel)
        times = []
        for i in range(WARMUP + iterations):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        return {"times": times, "interface": joined.interface, "collective": joined.collective}
    finally:
        dist.destroy_process_group()


class FloorEnd:
    """One end of the floors' transfers, in a process on a worker's node."""

    listener: Listener | None = None  # the ps-floor's server end, between listen and echo
    store = None  # the gloo-floor's rendezvous, on the first end, between rendezvous and allreduce_times

    def setup(self, workers: tuple[WorkerConfig, ...], rank: int, threads_share: int) -> dict:
        spec = workers[rank]
        return {"name": spec.name, "node": spec.node, "host": socket.gethostname(), "os": operating_system()}

    def rendezvous(self, master: str, timeout_s: float) -> int:
        """The gloo-floor's rendezvous, held open at `master`; the port the other end joins at."""
        self.store = rendezvous(master, 2, timeout_s)
        return self.store.port

    def allreduce_times(self, *args) -> dict:
        try:
            return allreduce_times(*args, store=self.store)
        finally:
            self.store = None

    def listen(self, host: str, port: int, timeout_s: float) -> tuple:
        """The server's end of the ps-floor: its address and the secret the other end must say."""
        self.listener = Listener(host, port, timeout_s)
        return self.listener.address, self.listener.secret

    def echo(self, count: int) -> None:
        """Send each of `count` buffers back as it arrives, as a server sends weights for a gradient."""
        channels = self.listener.accept([PS_FLOOR_NAME])
        self.listener.close()
        if not channels:
            raise ConnectionError("the ps-floor's other end did not connect")
        (channel,) = channels.values()
        try:
            for tag in range(count):
                channel.send(tag, channel.receive(tag))
        finally:
            channel.close()

    def roundtrip_times(self, address: tuple, secret: bytes, numel: int, iterations: int, timeout_s: float) -> list:
        """The seconds of each timed round trip of `numel` float32s to the echoing end and back."""
        import numpy as np

        channel = Channel.connect(tuple(address), hello(secret, PS_FLOOR_NAME), timeout_s)
        if channel is None:
            raise ConnectionError(f"cannot reach {address[0]}:{address[1]} (docs/deployment.md: Ports)")
        try:
            buffer = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
            times = []
            for tag in range(WARMUP + iterations):
                start = time.perf_counter()
                channel.send(tag, buffer)
                channel.receive(tag)
                if tag >= WARMUP:
                    times.append(time.perf_counter() - start)
            return times
        finally:
            channel.close()


def floor_ranks(workers: tuple[WorkerConfig, ...]) -> list[int]:
    """The two workers whose nodes the floor runs between: the first, and the first on another node
    (else the second; a lone worker's node twice)."""
    other = [r for r, w in enumerate(workers) if w.node != workers[0].node]
    return [0, (other or [min(1, len(workers) - 1)])[0]]


def measure_floor(
    floor: FloorConfig, cluster: ClusterConfig, workers: tuple[WorkerConfig, ...], link: LinkConfig, numel: int
) -> tuple[dict, dict]:
    """The gloo-floor's and the ps-floor's figures (median and CV of one all-reduce, of one round
    trip, of `numel` float32s) between the two workers' nodes, from the same two processes. Either
    may fail alone (a group that cannot form; a ps-floor that cannot connect: the driver's machine
    must let the other in on 6386 in a joined cluster, docs/deployment.md: Ports): that one is a failed record,
    the other's figures stand."""
    ends = place(cluster, workers, FloorEnd, FLOOR_NAME, workers, ranks=floor_ranks(workers))
    try:
        try:
            measured, allreduce_failure = measure_allreduces(ends, cluster, floor, numel), None
        except RunFailed as e:
            measured, allreduce_failure = None, {"status": "failed", "reason": str(e)}
        try:
            roundtrips, failure = measure_roundtrips(ends, floor, bool(cluster.ray_address), numel), None
        except RunFailed as e:
            roundtrips, failure = None, {"status": "failed", "reason": str(e)}
    finally:
        ends.close()
    common = {
        "numel": numel,
        "bytes": numel * 4,
        "iterations": floor.iterations,
        "path": {
            "between": [i["name"] for i in ends.info],
            "nodes": [i["node"] for i in ends.info],
            "ips": [i["node_ip"] for i in ends.info],
            "interfaces": [m["interface"] for m in measured] if measured else None,
            "systems": [i["os"] for i in ends.info],
            "driver_end": _driver_end(ends, otherwise=None),
        },
        "link": {key: value for key, value in asdict(link).items() if value} or None,
    }
    if measured is None:
        allreduce = allreduce_failure
    else:
        # A collective ends when the slower rank has its result: take the max per iteration.
        per_iteration = [max(a, b) for a, b in zip(*(m["times"] for m in measured))]
        allreduce = {"allreduce_s": median(per_iteration), "allreduce_cv": cv(per_iteration)}
        allreduce["collective"] = measured[0]["collective"]
    ps = failure or {"roundtrip_s": median(roundtrips), "roundtrip_cv": cv(roundtrips)}
    return {**allreduce, **common}, {**ps, **common}


def measure_allreduces(ends, cluster: ClusterConfig, floor: FloorConfig, numel: int) -> list[dict]:
    """The gloo-floor: both ends in one group of the backend the all-reduce rows use between them,
    each timing every all-reduce; in end order. Group rank 0, which holds the rendezvous on a port
    the kernel picks, is the end on the driver's machine (the desktop, as torch-ddp's rank 0 is):
    the other machine may be the reference (fastest alone), and a Mac opens only the fixed ports
    to the desktop (docs/deployment.md: Ports), so a rendezvous there could not be reached."""
    order = [first := _driver_end(ends), 1 - first]  # group rank -> end
    master = ends.info[first]["node_ip"]
    (port,) = ends.results([ends.call(first, "rendezvous", master, floor.timeout_s)], "opening the rendezvous")
    args = (master, port, numel, floor.iterations, floor.timeout_s, cluster)
    handles = [ends.call(end, "allreduce_times", rank, *args) for rank, end in enumerate(order)]
    by_rank = ends.results(handles, "measuring the all-reduce")
    return [by_rank[order.index(end)] for end in (0, 1)]


def _driver_end(ends, otherwise: int | None = 0) -> int | None:
    """The end on the driver's machine, where a joined cluster opens its listening ports; else `otherwise`."""
    return next((end for end in (0, 1) if ends.on_driver_host(end)), otherwise)


def measure_roundtrips(ends, floor: FloorConfig, joined: bool, numel: int) -> list[float]:
    """The ps-floor: the end on the driver's node listens where a parameter server would (ray-ps's
    runs there; a joined cluster opens 6386 there only) and echoes; the other times round trips.
    Where neither end is on the driver's node, end 0 listens. `joined`: a Ray cluster someone started."""
    iterations, timeout_s = floor.iterations, floor.timeout_s
    server = _driver_end(ends)
    host = ends.info[server]["node_ip"]
    listening = ends.call(server, "listen", host, direct_port(joined), timeout_s)
    ((address, secret),) = ends.results([listening], "listening for the ps-floor")
    echoed = ends.call(server, "echo", WARMUP + iterations)
    timed = ends.call(1 - server, "roundtrip_times", address, secret, numel, iterations, timeout_s)
    _, roundtrips = ends.results([echoed, timed], "measuring the ps-floor")
    return roundtrips

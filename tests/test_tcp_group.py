"""hetbench's TCP process group (transport/tcp_group.py) and the backend choice (cluster/collective.py):
the collectives against their definitions, with ranks as threads of this process over loopback; the
bounds on every wait; DDP over it; and why gloo alone cannot join a Linux rank to a Mac's."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hetbench.cluster.collective import choose
from hetbench.transport import tcp_group
from hetbench.transport.tcp_group import TcpProcessGroup, form


def groups(size: int, timeout_s: float = 10.0, connect_timeout_s: float = 10.0, cls=TcpProcessGroup) -> list:
    """`size` ranks of one group, each formed in a thread of its own over loopback."""
    store = dist.HashStore()
    with ThreadPoolExecutor(size) as pool:
        meshes = list(pool.map(lambda r: form(store, r, size, "127.0.0.1", None, connect_timeout_s), range(size)))
    return [cls(rank, size, peers, timeout_s) for rank, peers in enumerate(meshes)]


def on_every_rank(pgs: list, collective) -> list:
    """`collective(pg, rank)` on every rank at once (each issues its own), their results in rank order."""
    with ThreadPoolExecutor(len(pgs)) as pool:
        return list(pool.map(lambda r: collective(pgs[r], r), range(len(pgs))))


def shut(pgs: list) -> None:
    for pg in pgs:
        pg.shutdown()


def reduce_opts(op) -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    return opts


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 7, 1_199_882])
def test_all_reduce_sums_every_rank_s_tensor_and_every_rank_ends_with_the_same_bits(size, numel):
    pgs = groups(size)
    try:
        inputs = [torch.randn(numel, generator=torch.Generator().manual_seed(r)) for r in range(size)]
        tensors = [t.clone() for t in inputs]
        on_every_rank(pgs, lambda pg, r: pg.allreduce([tensors[r]], reduce_opts(dist.ReduceOp.SUM)).wait())
        assert torch.allclose(tensors[0], sum(inputs), atol=1e-5)
        assert all(torch.equal(t, tensors[0]) for t in tensors)  # each chunk reduced once, then passed round
    finally:
        shut(pgs)


REDUCED = [(dist.ReduceOp.MAX, 3), (dist.ReduceOp.MIN, 1), (dist.ReduceOp.PRODUCT, 6)]


@pytest.mark.parametrize(("op", "expected"), REDUCED)
def test_all_reduce_takes_max_min_and_product_in_any_dtype(op, expected):
    pgs = groups(3)
    try:
        for dtype in (torch.int64, torch.bfloat16, torch.float16):
            tensors = [torch.full((5,), r + 1, dtype=dtype) for r in range(3)]
            on_every_rank(pgs, lambda pg, r, tensors=tensors: pg.allreduce([tensors[r]], reduce_opts(op)).wait())
            assert all(torch.equal(t, torch.full((5,), expected, dtype=dtype)) for t in tensors)
    finally:
        shut(pgs)


def test_broadcast_all_gather_and_barrier_as_torch_defines_them():
    pgs = groups(3)
    try:
        tensors = [torch.arange(6) * (r + 1) for r in range(3)]
        opts = dist.BroadcastOptions()
        opts.rootRank = 2
        on_every_rank(pgs, lambda pg, r: pg.broadcast([tensors[r]], opts).wait())
        assert all(torch.equal(t, torch.arange(6) * 3) for t in tensors)

        outputs = [[[torch.empty(2) for _ in range(3)]] for _ in range(3)]
        on_every_rank(pgs, lambda pg, r: pg.allgather(outputs[r], [torch.full((2,), float(r))]).wait())
        assert all([o.tolist() for o in out[0]] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]] for out in outputs)

        flat = [torch.empty(6) for _ in range(3)]
        on_every_rank(pgs, lambda pg, r: pg._allgather_base(flat[r], torch.full((2,), float(r))).wait())
        assert all(f.tolist() == [0, 0, 1, 1, 2, 2] for f in flat)

        on_every_rank(pgs, lambda pg, r: pg.barrier().wait())
    finally:
        shut(pgs)


def test_a_collective_returns_at_once_and_its_future_completes_in_issue_order():
    pgs = groups(2)
    try:

        def issue(pg, r):
            tensors = [torch.full((1000,), float(i)) for i in range(5)]
            works = [pg.allreduce([t], reduce_opts(dist.ReduceOp.SUM)) for t in tensors]  # none waited on yet
            futures = [w.get_future() for w in works]
            torch.futures.wait_all(futures)
            return [f.value()[0][0].item() for f in futures]

        assert on_every_rank(pgs, issue) == [[0.0, 2.0, 4.0, 6.0, 8.0]] * 2
    finally:
        shut(pgs)


def test_a_callback_may_issue_the_next_collective_and_wait_on_it_as_powersgd_s_hook_does():
    pgs = groups(2)
    try:

        def chained(pg, r):
            first, second = torch.ones(4), torch.full((4,), 10.0)

            def then(_):
                return pg.allreduce([second], reduce_opts(dist.ReduceOp.SUM)).get_future().wait()[0]

            return pg.allreduce([first], reduce_opts(dist.ReduceOp.SUM)).get_future().then(then).wait().tolist()

        assert on_every_rank(pgs, chained) == [[20.0] * 4] * 2
    finally:
        shut(pgs)


def test_ranks_that_issue_different_collectives_fail_in_one_sentence_and_stay_failed():
    pgs = groups(2)
    try:
        sizes = [10, 12]
        works = on_every_rank(pgs, lambda pg, r: pg.allreduce([torch.ones(sizes[r])], reduce_opts(dist.ReduceOp.SUM)))
        for work in works:
            with pytest.raises(Exception, match="the ranks issued different collectives"):
                work.wait()
        later = pgs[0].allreduce([torch.ones(3)], reduce_opts(dist.ReduceOp.SUM))
        with pytest.raises(Exception, match="issued different collectives"):  # the group is broken for good
            later.wait()
    finally:
        shut(pgs)


def test_a_collective_issued_after_shutdown_fails_at_once():
    pgs = groups(2)
    shut(pgs)
    with pytest.raises(Exception, match="the group was shut down"):
        pgs[0].allreduce([torch.ones(3)], reduce_opts(dist.ReduceOp.SUM)).wait()


def test_a_rank_that_never_comes_ends_the_forming_within_its_bound():
    store = dist.HashStore()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="did not form"):
        form(store, 0, 2, "127.0.0.1", None, connect_timeout_s=0.5)
    assert time.monotonic() - started < 5


def test_a_silent_peer_fails_a_collective_within_the_group_timeout():
    pgs = groups(2, timeout_s=0.5)
    try:
        started = time.monotonic()
        work = pgs[0].allreduce([torch.ones(100)], reduce_opts(dist.ReduceOp.SUM))  # rank 1 issues nothing
        with pytest.raises(Exception, match=tcp_group.NAME):
            work.wait()
        assert time.monotonic() - started < 5
    finally:
        shut(pgs)


def test_a_peer_that_goes_away_fails_the_collective_rather_than_hanging_it():
    pgs = groups(2, timeout_s=30)
    try:
        work = pgs[0].allreduce([torch.ones(100)], reduce_opts(dist.ReduceOp.SUM))
        threading.Timer(0.2, pgs[1].shutdown).start()
        started = time.monotonic()
        with pytest.raises(Exception, match="closed"):
            work.wait()
        assert time.monotonic() - started < 10
    finally:
        shut(pgs)


def test_a_stranger_s_connection_is_dropped_and_the_group_still_forms():
    store, size = dist.HashStore(), 2

    def stranger():  # dials rank 0 as soon as it publishes where it listens, without the secret
        store.wait([f"{tcp_group.STORE_KEYS[1]}0"])
        host, port = store.get(f"{tcp_group.STORE_KEYS[1]}0").decode().rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(tcp_group.HELLO.pack(b"\0" * 16, 1))
            time.sleep(0.5)

    def rank(r):
        if r == 1:
            time.sleep(0.3)  # after the stranger
        return form(store, r, size, "127.0.0.1", None, 10)

    with ThreadPoolExecutor(3) as pool:
        intruder = pool.submit(stranger)
        meshes = list(pool.map(rank, range(size)))
        intruder.result()
    pgs = [TcpProcessGroup(r, size, peers, 10) for r, peers in enumerate(meshes)]
    try:
        tensors = [torch.ones(4), torch.ones(4)]
        on_every_rank(pgs, lambda pg, r: pg.allreduce([tensors[r]], reduce_opts(dist.ReduceOp.SUM)).wait())
        assert tensors[0].tolist() == [2.0] * 4
    finally:
        shut(pgs)


def test_ports_come_from_the_range_a_firewall_opens():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        first = taken.getsockname()[1]
        listener = tcp_group._listen("127.0.0.1", (first, first + 5))  # the first is taken: the next free one
        try:
            assert first < listener.getsockname()[1] <= first + 5
        finally:
            listener.close()
        with pytest.raises(ConnectionError, match=f"no free port in {first}-{first}"):
            tcp_group._listen("127.0.0.1", (first, first))


def test_auto_takes_gloo_only_where_every_rank_runs_one_system_on_a_device_gloo_takes():
    assert choose("auto", ["Linux", "Linux"], [True, True]) == "gloo"
    assert choose("auto", ["Linux", "Darwin"], [True, True]) == "tcp"
    assert choose("auto", ["Darwin", "Darwin"], [False, True]) == "tcp"  # MPS: gloo takes none of its tensors
    assert choose("tcp", ["Linux", "Linux"], [True, True]) == "tcp"
    assert choose("gloo", ["Linux", "Linux"], [True, True]) == "gloo"
    with pytest.raises(RuntimeError, match="gloo cannot form a group between Darwin and Linux .*use auto or tcp"):
        choose("gloo", ["Linux", "Darwin"], [True, True])


class StagingOnlyGroup(TcpProcessGroup):
    """A recording group that takes no caller's tensor onto the wire as it is, as if every one lived on
    a device the wire cannot read (MPS, for gloo): each must reach the wire as a CPU copy the group
    made. It records every collective and the devices it was handed."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.calls: list[tuple[str, str]] = []
        self.copies: set[int] = set()
        self.unstaged: list[str] = []

    def wire_takes(self, tensor):
        return False

    def _queue(self, tensors, result, work, written=None):
        self.calls.append((sys._getframe(1).f_code.co_name, ",".join(sorted({t.device.type for t in tensors}))))
        return super()._queue(tensors, result, work, written)

    def _send(self, peer, tensor):
        if tensor is not None and tensor.untyped_storage().data_ptr() not in self.copies:
            self.unstaged.append(self.calls[self.current - 1][0])
        super()._send(peer, tensor)


@pytest.fixture
def staging_copies(monkeypatch):
    """Every CPU copy the groups make, by its storage's address."""
    made: set[int] = set()
    to_host = tcp_group._to_host

    def recorded(tensor):
        copy = to_host(tensor)
        made.add(copy.untyped_storage().data_ptr())
        return copy

    monkeypatch.setattr(tcp_group, "_to_host", recorded)
    return made


def test_three_ddp_steps_reach_the_wire_only_through_the_group_s_own_staging(staging_copies):
    pgs = groups(2, cls=StagingOnlyGroup)
    for pg in pgs:
        pg.copies = staging_copies
    batches = [torch.randn(8, 12, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))

    models = [model() for _ in range(2)]  # here: threads would interleave their draws from the seeded RNG

    def train(pg, r):
        ddp = DistributedDataParallel(models[r], process_group=pg)  # its own broadcast of the weights included
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            ddp(batches[r]).square().mean().backward()
            optimizer.step()
        return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])

    try:
        trained = on_every_rank(pgs, train)
    finally:
        shut(pgs)
    assert torch.equal(trained[0], trained[1])
    called = {name for pg in pgs for name, _ in pg.calls}
    # DDP's own collectives (its shape check, weight broadcast, bucket rebuild) come with the parameters'
    # tensors, past any comm hook: only staging inside the group reaches them
    assert called - {"allreduce"} and called <= {"allreduce", "broadcast", "allgather", "_allgather_base", "barrier"}
    assert [pg.unstaged for pg in pgs] == [[], []]
    reference = model()  # DDP's mean over both ranks: one step of the union batch
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        (sum(reference(b).square().mean() for b in batches) / 2).backward()
        optimizer.step()
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    assert torch.allclose(trained[0], expected, atol=1e-6)


MAC_LAYOUT = """
import re, sys
from datetime import timedelta
import torch.distributed as dist

rank, port, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


class AsAMacPublishes(dist.Store):
    '''Rank 1's published gloo address rewritten as macOS lays out a sockaddr: a length byte, then a
    one-byte family (BSD), where Linux has a two-byte family.'''

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        if rank == 1:  # AF_INET (2) as two bytes, a port, 127.0.0.1: its first sockaddr
            bsd = lambda found: b"\\x10\\x02" + found.group(1)
            value = re.sub(rb"\\x02\\x00(..\\x7f\\x00\\x00\\x01)", bsd, value, count=1, flags=re.S)
        self.inner.set(key, value)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key):
        return self.inner.get(key)

    def wait(self, keys, timeout=timedelta(seconds=10)):
        return self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def add(self, key, n):
        return self.inner.add(key, n)


store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=10))
if backend == "gloo":
    dist.ProcessGroupGloo(AsAMacPublishes(store), rank, 2, timedelta(seconds=10))
else:
    from hetbench.transport.tcp_group import TcpProcessGroup, form

    peers = form(AsAMacPublishes(store), rank, 2, "127.0.0.1", None, 10)
    import torch
    pg = TcpProcessGroup(rank, 2, peers, 10)
    t = torch.ones(3)
    pg.allreduce([t]).wait()
    assert t.tolist() == [2.0] * 3
    pg.shutdown()
print("formed")
"""


@pytest.mark.parametrize("backend", ["gloo", "tcp"])
def test_a_mac_s_address_bytes_break_gloo_on_linux_and_not_the_tcp_group(tmp_path, backend):
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    script = tmp_path / "layout.py"
    script.write_text(MAC_LAYOUT)
    env = {"GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(port), backend],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    outputs = []
    try:
        for proc in procs:  # where gloo fails, the rank that refused ends the other's wait
            outputs.append(proc.communicate(timeout=60)[0])
            if proc.returncode:
                break
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    if backend == "tcp":
        assert [p.returncode for p in procs] == [0, 0] and all("formed" in o for o in outputs), outputs
    else:  # the Linux rank reads the Mac's family as 528 (0x0210): gloo's own enforce names it
        assert any(re.search(r"ss_family == ss2\.ss_family\. 2 vs 528", o) for o in outputs), outputs

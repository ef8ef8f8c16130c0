"""The far worker's streamed step on its own: what its wall time holds beyond its reported compute.

    python benchmarks/streamed_step_probe.py [-c CONFIG] [--set key=value ...] [--steps 30] [--rounds 2]

ray-ps's worker off the server's node (the config's last worker, slowed as configured) runs
`Replica.streamed_step` in this one process, with nothing else training on the host, three ways:
its gradient's parts handed to nothing; copied in the wire dtype as ray-ps copies them; copied and
posted on a direct channel to a process that reads and drops them (ray-ps's path, without a server).
Medians over the steps after 3 warm-up ones, each way `--rounds` times in turn. What is left with
nothing sent is the hand-offs' own cost (the clock read around each emulated wait, the hooks).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from statistics import median, quantiles

from script_cluster import HETERO_LOCAL_SPLIT, run_script

from hetbench.config import load_config
from hetbench.errors import UserError
from hetbench.gradients import to_wire
from hetbench.strategies import registry
from hetbench.strategies.roles import Replica
from hetbench.transport.direct import Channel

WARMUP = 3
SINK = "import socket,sys\ns=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=30)\n" + (
    "b=bytearray(1<<20)\nwhile s.recv_into(b):\n    pass\n"
)


def far_worker(path: str, overrides: list[str]) -> Replica:
    """The config's last worker as ray-ps sets it up, on hetero-local's split as its runs settle it."""
    job = load_config(path, [*HETERO_LOCAL_SPLIT, *overrides], registry.declared()).job("ray-ps")
    replica = Replica()
    replica.setup(job, len(job.workers) - 1, len(job.workers))
    replica.reset(job.run.seed)
    return replica


def gaps(replica: Replica, send, steps: int) -> list[float]:
    """Per step after the warm-up: wall seconds less the compute the step reports."""
    out = []
    for step in range(WARMUP + steps):
        started = time.perf_counter()
        compute_s = replica.streamed_step(step, send)
        if step >= WARMUP:
            out.append(time.perf_counter() - started - compute_s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default="benchmarks/configs/hetero-local.yaml", help="(default: %(default)s)")
    parser.add_argument("--set", action="append", default=[], help="key=value, as `hetbench run --set`")
    parser.add_argument("--steps", type=int, default=30, help="timed steps each way (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="each way this many times (default: %(default)s)")
    args = parser.parse_args()
    if args.steps < 3 or args.rounds < 1:
        raise UserError("--steps must be at least 3 and --rounds at least 1")
    replica = far_worker(args.config, args.set)
    wire = replica.job.run.wire_dtype
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(listener.getsockname()[1])])
    channel = None
    try:
        channel = Channel(listener.accept()[0], 30)
        ways = {
            "nothing sent": lambda offset, grad: None,
            "copied": lambda offset, grad: to_wire(grad, wire).copy(),
            "copied and posted": lambda offset, grad: channel.post(0, to_wire(grad, wire).copy(), offset),
        }
        print(f"{replica.spec.name}: batch {replica.batches[-1]}, slowed {replica.spec.slowdown:g}x, wire {wire}")
        for _ in range(args.rounds):
            for name, send in ways.items():
                ms = [g * 1000 for g in gaps(replica, send, args.steps)]
                p25, _, p75 = quantiles(ms)
                print(f"  {name:18s} wall - compute {median(ms):5.2f} ms (p25-p75 {p25:.2f}-{p75:.2f})", flush=True)
    finally:
        if channel:
            channel.close()
        listener.close()
        sink.kill()
        sink.wait(10)


if __name__ == "__main__":
    run_script(main)

"""A parameter server's round trip by each way Ray offers, against hetbench's own channel.

    python benchmarks/transports.py [-c CONFIG] [--set key=value ...] [--iterations 30] [--out FILE]

One worker actor and one server actor, on the same two nodes the floors use (one node by default; a
config with `cluster.mode: local-multinode` puts the worker across an emulated link, shaped where
`link` says). Each step the driver asks the worker for a gradient (the model's 4.8 MB of float32),
hands it to the server, and the server's weights back to the worker, as ray-ps's driver does:

- object store: plain actor calls; the tensors go through Ray's object store;
- rdt-gloo: the same calls with `@ray.method(tensor_transport="gloo")` (Ray Direct Transport, alpha):
  the tensors go actor to actor over a gloo group, the object store carries only a reference;
- direct tcp: one call to the worker, which sends its gradient up hetbench's TCP channel
  (transport/direct.py) and waits for the weights the server sends back: ray-ps's cross-node path.

A Compiled Graph of the same three calls (`experimental_compile`, beta) is not here: on this machine
(Ray 2.60, CPU actors) compiling it never returned, and the process hung past every bound after it.
Beside them, in the same run, the ps-floor (the same channel with no Ray call: floor.py). Prints the
median and CV of each round trip and writes a JSON record (results/transports.md keeps the figures).
The actors and paths are in transport_paths.py, imported once Ray's process defaults are set.
"""

from __future__ import annotations

import argparse
import json

from script_cluster import cluster_of, run_script

from hetbench.cluster.ray_connection import use_ray_defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=None, help="a run config (default: two workers on this node)")
    parser.add_argument("--set", action="append", default=[], help="key=value, as `hetbench run --set`")
    parser.add_argument("--iterations", type=int, default=30, help="timed round trips per path (default: 30)")
    parser.add_argument("--out", default=None, help="where to write the JSON record (default: print only)")
    args = parser.parse_args()
    use_ray_defaults()  # as the CLI does, before Ray is imported (it reads them then): token auth
    from transport_paths import measure

    from hetbench.config import load_config
    from hetbench.results.records import environment
    from hetbench.strategies import registry

    overrides = args.set or (["workers=[{name: a}, {name: b}]"] if not args.config else [])
    cfg = load_config(args.config, overrides, registry.declared())
    with cluster_of(cfg) as cluster_cfg:
        figures = measure(cluster_cfg, args.iterations)
    ps_floor = figures["ps-floor (no Ray call)"]["roundtrip_s"]
    print(f"between {' and '.join(figures['path']['between'])} ({', '.join(figures['path']['ips'])}), link {cfg.link}")
    for name, f in figures.items():
        if name == "path":
            continue
        if "failed" in f:
            print(f"  {name:28s} failed: {f['failed']}")
        else:
            vs = f" ({f['roundtrip_s'] / ps_floor:.2f}x the ps-floor)" if ps_floor else ""
            print(f"  {name:28s} {f['roundtrip_s'] * 1000:8.2f} ms  CV {f['roundtrip_cv']:.1%}{vs}")
    if args.out:
        record = {"figures": figures, "iterations": args.iterations, "env": environment(), "config": cfg.as_dict()}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, default=str)


if __name__ == "__main__":
    run_script(main)

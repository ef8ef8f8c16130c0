"""The reference rows are measured where the comparison is fair: `single` on the reference worker's
node, device and thread budget; the gloo floor between the workers' nodes."""

import json
import os

from helpers import small_config
from hetbench.cores import usable_cores
from hetbench.floor import floor_ranks
from hetbench.runner import run
from hetbench.scenarios import reference_first

MAC_FIRST = "workers=[{name: m, node: mac, batch: 16}, {name: d, node: desktop, batch: 8}]"


def test_the_baseline_and_the_floor_run_on_the_workers_nodes_not_the_driver(tmp_path, shared_cluster):
    cfg = small_config(
        tmp_path,
        *shared_cluster.overrides,
        MAC_FIRST,
        "strategies=[single]",
        "steps=2",
        "warmup_steps=0",
        "repeats=1",
        "eval_every=2",
        "floor.iterations=3",
    )
    single, floor, ps_floor = json.loads(run(cfg).path.read_text())
    (worker,) = single["workers"]
    # the driver is on the head (`desktop`) node: the baseline ran in its own process on `mac`
    assert (worker["name"], worker["node_id"], worker["batch"]) == ("m", shared_cluster.node_ids["mac"], 24)
    assert worker["pid"] != os.getpid()
    # the threads `m` has in the distributed rows: in a joined cluster, its node's cores (it is alone there)
    assert worker["threads"] == usable_cores()
    assert (worker["precision"], worker["cudnn_benchmark"]) == ("fp32", False)  # the math it trained in
    assert single["reference"] == {"worker": "m", "chosen_by": "first configured worker"}
    assert floor["status"] == "ok" and floor["allreduce_s"] > 0
    assert floor["path"]["between"] == ["m", "d"] and floor["path"]["nodes"] == ["mac", "desktop"]
    assert ps_floor["status"] == "ok" and ps_floor["path"] == floor["path"]


def test_the_reference_worker_is_the_fastest_alone_and_the_floor_crosses_to_another_node(tmp_path):
    cfg = small_config(
        tmp_path,
        "workers=[{name: a, node: desktop}, {name: b, node: desktop}, {name: c, node: mac}, {name: d, node: mac}]",
    )
    reordered, reference = reference_first(cfg, {"a": 100.0, "b": 300.0, "c": 300.0, "d": 50.0})
    assert [w.name for w in reordered.workers] == ["b", "a", "c", "d"]  # the first of equals
    assert reference == {"worker": "b", "chosen_by": "fastest alone in this run"}
    assert [w.name for w in cfg.workers] == ["a", "b", "c", "d"]  # the run's config is left as it was
    assert reference_first(cfg, None)[1] == {"worker": "a", "chosen_by": "first configured worker"}
    assert floor_ranks(cfg.workers) == [0, 2]  # desktop <-> mac, not two desktop workers
    assert floor_ranks(small_config(tmp_path, "workers=[{name: a}, {name: b}]").workers) == [0, 1]
    assert floor_ranks(small_config(tmp_path, "workers=[{name: a}]").workers) == [0, 0]


def test_a_worker_has_its_hosts_cores_split_among_the_training_processes_there(tmp_path):
    from hetbench.cluster.placed import workers_per_host

    cfg = small_config(tmp_path, "workers=[{name: a, node: desktop}, {name: b, node: desktop}, {name: c, node: mac}]")
    desk, _, mac = cfg.workers

    def per_host(joined: bool) -> list[int]:
        return [workers_per_host(cfg.cluster, cfg.workers, w, joined_cluster=joined) for w in (desk, mac)]

    assert per_host(joined=False) == [3, 3]  # one box for all
    assert per_host(joined=True) == [2, 1]  # per labelled node


def test_the_floors_listen_on_the_drivers_machine_when_the_reference_is_the_other():
    """The Mac may be the reference (fastest alone) and so end 0; it opens only its fixed ports to
    the desktop, so the all-reduce's rendezvous (a port the kernel picks) must be the desktop's."""
    from unittest.mock import create_autospec

    from hetbench.cluster.placed import Placed
    from hetbench.config import ClusterConfig, FloorConfig
    from hetbench.floor import measure_allreduces, measure_roundtrips

    ends = create_autospec(Placed, instance=True)
    ends.info = [{"node_ip": "192.168.1.20"}, {"node_ip": "192.168.1.10"}]  # the mac, the desk
    ends.on_driver_host.side_effect = lambda end: end == 1
    ends.call.side_effect = lambda end, method, *args: (end, method, args)

    def results(handles, doing):
        if doing == "opening the rendezvous":
            return [29500]
        if doing == "listening for the ps-floor":
            return [(("192.168.1.10", 6386), b"secret")]
        if doing == "measuring the ps-floor":
            return [None, [0.01]]
        return [{"end": end, "rank": args[0]} for end, _, args in handles]  # each end's figures

    ends.results.side_effect = results
    floor = FloorConfig()
    measured = measure_allreduces(ends, ClusterConfig(), floor, numel=10)
    calls = [c.args for c in ends.call.call_args_list]
    assert calls[0] == (1, "rendezvous", "192.168.1.10", floor.timeout_s)  # held on the desk
    joins = {c[0]: c[2:] for c in calls[1:]}
    assert joins[1][:2] == (0, "192.168.1.10") and joins[0][:2] == (1, "192.168.1.10")  # the desk is rank 0
    assert measured == [{"end": 0, "rank": 1}, {"end": 1, "rank": 0}]  # back in end order

    ends.call.reset_mock()
    measure_roundtrips(ends, floor, joined=True, numel=10)
    assert ends.call.call_args_list[0].args[:3] == (1, "listen", "192.168.1.10")

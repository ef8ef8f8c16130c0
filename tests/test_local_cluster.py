"""Unequal machines on one box: a real multi-node Ray + Dask cluster, placement by label, slow workers,
speed-proportional batches, link emulation, and nothing left running afterwards."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import CAN_PIN, REPO, hetbench, processes_mentioning, run_child, sets, stop_a_run
from hetbench.errors import UserError

# quick.yaml on two local nodes, the mac's worker 3x slower: a few steps, accuracy on 300 images
UNEQUAL = [
    "workers=[{name: desk, node: desktop}, {name: mac, node: mac, slowdown: 3}]",
    "cluster.mode=local-multinode",
    "batch_size=96",
    "steps=4",
    "warmup_steps=1",
    "repeats=1",
    "eval_every=5",
    "standalone_steps=2",
    "download=false",
    "test_samples=300",
    "eval_samples=300",
    "floor.iterations=5",
]


def run_on_two_nodes(results: Path, *settings: str, env=None, timeout=280):
    """`hetbench run` of quick.yaml on UNEQUAL's two local nodes, then `settings`, in its own process."""
    args = ["-c", "benchmarks/configs/quick.yaml", *sets(*UNEQUAL, *settings), "--results-dir", str(results)]
    return hetbench("run", *args, env=env, timeout=timeout)


def records_of(results: Path) -> list[dict]:
    """The run's records so far ([] before the first: the file is reserved empty)."""
    files = list((results / "raw").glob("*.json")) if (results / "raw").is_dir() else []
    text = files[0].read_text() if files else ""
    return json.loads(text) if text else []


def cluster_addresses(records: list[dict]) -> list[str]:
    cluster = records[0]["config"]["cluster"]
    return [cluster["ray_address"], cluster["dask_scheduler"].split("//")[1]]


@pytest.mark.slow
def test_workers_run_on_their_labelled_nodes_balanced_by_measured_speed_and_nothing_is_left(tmp_path):
    home = tmp_path / "home"  # a stale Ray token from another install must not matter
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("a-stale-token-from-another-install\n")
    result = run_on_two_nodes(
        tmp_path,
        "strategies=[single, ray-ps, dask-sync]",
        "balance=[equal, auto]",
        env={"HOME": str(home)},
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path)
    by_scenario = {(r["strategy"], r.get("balance")): r for r in records}
    assert set(by_scenario) == {
        ("single", None),
        ("ray-ps", "equal"),
        ("ray-ps", "auto"),
        ("dask-sync", "equal"),
        ("dask-sync", "auto"),
        ("gloo-floor", None),
        ("ps-floor", None),
    }
    assert all(r["status"] == "ok" for r in records)
    ps = by_scenario[("ray-ps", "equal")]["workers"]
    assert ps[0]["node_id"] != ps[1]["node_id"]  # two Ray nodes, one per label
    dask = by_scenario[("dask-sync", "equal")]["workers"]
    assert dask[0]["dask_worker"] != dask[1]["dask_worker"]
    # only the head node's worker shares the server's memory: the mac node stands for another machine
    assert [w["transport"] for w in ps] == ["shared memory", "direct tcp"]
    assert [w["transport"] for w in dask] == ["shared memory", "tcp"]
    auto = by_scenario[("ray-ps", "auto")]
    standalone = {w["name"]: w["standalone_samples_per_s"] for w in auto["workers"]}
    assert standalone["desk"] > standalone["mac"]  # the emulated 3x slowdown is real
    assert sum(auto["split"]) == 96 and auto["split"][0] > auto["split"][1]
    assert by_scenario[("ray-ps", "equal")]["split"] == [48, 48]
    assert 0 < auto["scaling_efficiency"] == pytest.approx(auto["samples_per_s"] / sum(standalone.values()))
    # the reference brackets each row: each worker timed alone just before and just after it, and
    # rows run back to back share the timing between them
    timings = auto["standalone_timings"]
    assert {name: [len(t["before"]), len(t["after"])] for name, t in timings.items()} == {"desk": [1, 1], "mac": [1, 1]}
    assert standalone["mac"] == pytest.approx(statistics.median(timings["mac"]["before"] + timings["mac"]["after"]))
    assert by_scenario[("dask-sync", "equal")]["standalone_timings"]["mac"]["before"] == timings["mac"]["after"]
    md = (tmp_path / "quick.md").read_text()
    title = "Each worker alone, samples/s (timed just before and after each row it judges, in run order):\n\n"
    table = md.split(title)[1].split("\n\n")[0]
    assert [c.strip() for c in table.split("\n")[0].split("|")[1:-1]] == ["timed", "desk", "mac"]
    assert table in result.stderr  # the same table
    assert "| ray-ps" in md and "auto" in md and "(slowed 3x)" in md and "![quick-throughput]" in md
    for plot in ("throughput", "step", "accuracy"):
        assert (tmp_path / f"quick-{plot}.png").read_bytes()[:4] == b"\x89PNG"
    assert processes_mentioning(*cluster_addresses(records)) == {}


@pytest.mark.slow
def test_sigterm_mid_run_stops_the_cluster_and_keeps_the_records(tmp_path):
    settings = ["strategies=[single, dask-sync]", "steps=60", "standalone_steps=0"]  # dask-sync runs ~20 s of them
    args = ["-c", "benchmarks/configs/quick.yaml", *sets(*UNEQUAL, *settings)]
    started = []

    def dask_sync_running() -> bool:  # single is recorded, then dask-sync runs for 3 s
        if not started and records_of(tmp_path):
            started.append(time.monotonic())
        return bool(started) and time.monotonic() - started[0] > 3

    try:
        code, err = stop_a_run(tmp_path, args, dask_sync_running, within_s=200)
    finally:
        records = records_of(tmp_path)
        left = processes_mentioning(*cluster_addresses(records)) if records else {}
        for pid in left:  # a failing run must not leave its cluster behind for the next tests
            os.kill(pid, signal.SIGKILL)
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert records[0]["strategy"] == "single" and records[0]["status"] == "ok"
    assert left == {}


def test_link_emulation_without_root_is_one_clear_sentence(monkeypatch):
    from hetbench.cluster import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="link emulation .* needs root"):
        netns.check_can_emulate()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="link emulation needs root (network namespaces, tc)")


@pytest.mark.slow
@needs_root
def test_the_floors_cross_the_emulated_link_between_the_worker_nodes_and_it_is_removed():
    from hetbench.cluster.multinode import cluster_for_run
    from hetbench.config import load_config
    from hetbench.floor import measure_floor

    cfg = load_config(
        None,
        [
            "workers=[{name: desk, node: desktop}, {name: mac, node: mac}]",
            "cluster.mode=local-multinode",
            "link.rate=20mbit",
            "floor.iterations=3",
            "download=false",
        ],
    )
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, _, cluster):
        link = cluster.links["mac"]
        figures, ps = measure_floor(cfg.floor, joined, cfg.workers, cfg.link, 250_000)  # 1 MB each way per all-reduce
    # 1 MB over a 20 Mbit/s link cannot take less than 0.4 s: the shaping is there, on the workers' path;
    # the ps-floor sends it up, then back down: 0.8 s
    assert figures["allreduce_s"] > 0.3 and figures["link"] == {"rate": "20mbit"}
    assert ps["roundtrip_s"] > 0.7 and ps["path"] == figures["path"] and ps["bytes"] == 1_000_000
    assert figures["path"] == {
        "between": ["desk", "mac"],
        "nodes": ["desktop", "mac"],
        "ips": [link.host_ip, link.ns_ip],
        "interfaces": [link.host_dev, link.ns_dev],  # the link's ends, as the nodes' starter chose
        "systems": ["Linux", "Linux"],  # both ends' operating systems: the group formed on gloo
        "driver_end": 0,  # the desk, on the head node with the driver: where a parameter server runs
    }
    assert figures["collective"] == "gloo"
    assert link.name not in namespaces()


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


@needs_root
def test_links_avoid_held_subnets_and_remove_what_killed_runs_left():
    from hetbench.cluster.netns import Link, open_links

    no_such_pid = Path("/proc/sys/kernel/pid_max").read_text().strip()  # pids stay below it
    killed_run = Link(0, "20mbit", no_such_pid)  # never closed, as after a SIGKILL
    live_run = Link(1, "20mbit", str(os.getppid()))  # another run's, still going
    links = {}
    try:
        links = open_links(["mac", "laptop"], "20mbit")
        assert [link.host_ip for link in links.values()] == ["10.231.0.1", "10.231.2.1"]
        assert killed_run.name not in namespaces() and live_run.name in namespaces()
    finally:
        for link in [killed_run, live_run, *links.values()]:
            link.close()
    assert "10.231." not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout


@needs_root
def test_a_closed_link_ends_what_is_left_inside_it_even_an_orphan():
    from hetbench.cluster.netns import open_links
    from hetbench.cluster.processes import alive

    link = open_links(["mac"], "20mbit")["mac"]
    try:  # as a raylet Ray declared dead leaves its agents: running inside, their parent gone
        background = [*link.prefix(), "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"]
        started = subprocess.run(background, capture_output=True, text=True, timeout=10)
        orphan = int(started.stdout)
        assert alive(orphan) and link.processes() == [orphan]
    finally:
        link.close()
    assert not alive(orphan) and link.name not in namespaces()


@pytest.mark.slow
@needs_root
def test_nodes_behind_an_emulated_link_train_and_the_floor_uses_the_link(tmp_path):
    result = run_on_two_nodes(
        tmp_path,
        "link.rate=200mbit",
        "strategies=[ray-ps, dask-sync]",
        "standalone_steps=0",
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path)
    assert [r["status"] for r in records] == ["ok"] * 4
    ps, dask, floor, ps_floor = records
    # the head listens on the host end of the veth pair, the mac node inside its namespace
    assert (ps["workers"][0]["node_ip"], ps["workers"][1]["node_ip"]) == ("10.231.0.1", "10.231.0.2")
    assert dask["workers"][1]["dask_worker"].startswith("tcp://10.231.0.2:")
    # the mac's gradients and weights cross the link; the desk's, on the server's host, do not
    assert [w["transport"] for w in ps["workers"]] == ["shared memory", "direct tcp"]
    assert [w["transport"] for w in dask["workers"]] == ["shared memory", "tcp"]
    assert floor["link"] == {"rate": "200mbit"} and floor["path"]["ips"] == ["10.231.0.1", "10.231.0.2"]
    assert ps_floor["link"] == floor["link"] and ps_floor["path"] == floor["path"]  # the same path, the same link
    assert "200mbit" in (tmp_path / "quick.md").read_text()
    assert processes_mentioning(*cluster_addresses(records)) == {}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert "hb" not in names


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill, settings",
    [
        ("node", []),
        # Ray's health checks find the node gone; Dask's step timeout does
        pytest.param("link", ["link.rate=1gbit", "cluster.step_timeout_s=60"], marks=needs_root),
    ],
)
def test_a_lost_node_is_survived_and_comes_back_for_the_next_scenario(tmp_path, kill, settings):
    result = run_on_two_nodes(
        tmp_path,
        *settings,
        "strategies=[ray-ps, dask-sync]",
        "steps=8",
        f"faults=[{{at_step: 3, kill: {kill}, target: mac}}]",
        "floor.enabled=false",
        "standalone_steps=0",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path)
    assert [(r["strategy"], r["status"]) for r in records] == [("ray-ps", "ok"), ("dask-sync", "ok")]
    for record in records:  # the node was there again for dask-sync, and lost again
        assert record["events"][0]["injected"] == f"kill {kill} mac" and record["events"][0]["step"] == 3
        lost = record["events"][1]
        assert lost["lost"] == "mac" and lost["node"] == "mac" and lost["split"] == {"desk": 96}
    assert processes_mentioning(*cluster_addresses(records)) == {}
    assert not [n for n in namespaces().split() if n.startswith("hb")]


def listening_addresses(port: int) -> set[str]:
    """The addresses something listens on at TCP `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                found.add(".".join(str(b) for b in reversed(raw)) if width == 8 else raw.hex())
    return found


def test_the_dask_of_a_local_cluster_listens_on_loopback_only_and_idles_quietly(shared_cluster):
    import dask
    from distributed import Client

    scheduler = shared_cluster.dask_scheduler  # started by local-multinode, as a run starts its own
    assert listening_addresses(int(scheduler.rsplit(":", 1)[1])) == {"127.0.0.1"}
    with Client(scheduler, timeout=30) as client:  # DASK_NODE_ENV reached both workers
        assert list(client.run(dask.config.get, "distributed.worker.profile.enabled").values()) == [False] * 2
        assert list(client.run(dask.config.get, "distributed.admin.tick.interval").values()) == ["1s"] * 2


def test_compose_starts_dask_with_the_environment_local_nodes_get():
    import yaml

    from hetbench.cluster.nodes import DASK_NODE_ENV

    environment = yaml.safe_load((REPO / "compose.yaml").read_text())["x-node"]["environment"]
    assert {key: environment.get(key) for key in DASK_NODE_ENV} == DASK_NODE_ENV


TWO_CLUSTERS = """
import signal
import sys
from pathlib import Path
from hetbench.cluster.multinode import cluster_for_run
from hetbench.cluster.ray_connection import RayConnection
from helpers import LABELLED, small_config

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped (helpers.stop_child): through the finally
for _ in range(2):  # a new cluster each time, as for each of the benchmark suite's links and worker counts
    # a cold Ray head on this 2-core box has taken over connect_timeout_s's 30 s default under load
    cfg = small_config(Path(sys.argv[1]), LABELLED, "cluster.mode=local-multinode", "download=false",
                       "cluster.connect_timeout_s=90")
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (joined, *_):
        connection = RayConnection(joined, {"desktop", "mac"})
        try:
            print(joined.ray_address, sorted(k for k in connection.ray.cluster_resources()
                                                           if k in ("desktop", "mac")))
        finally:
            connection.close()
"""


@pytest.mark.slow
def test_one_process_joins_one_local_cluster_after_another(tmp_path):
    """Ray keeps the token a process first joined with: every cluster a process starts shares it."""
    result = run_child([sys.executable, "-c", TWO_CLUSTERS, str(tmp_path)], {"PYTHONPATH": str(REPO / "tests")}, 240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")[:2]
    assert [line.split()[1:] for line in lines] == [["['desktop',", "'mac']"]] * 2
    assert lines[0].split()[0] != lines[1].split()[0]  # two clusters, not one


@pytest.mark.slow
def test_two_workers_per_node_each_get_their_own_dask_worker(tmp_path):
    """Two replicas on one single-threaded Dask worker waited on each other in shared memory for good."""
    four = (
        "workers=[{name: d0, node: desktop}, {name: d1, node: desktop}, {name: m0, node: mac, slowdown: 3},"
        " {name: m1, node: mac, slowdown: 3}]"
    )
    result = run_on_two_nodes(
        tmp_path,
        four,
        "strategies=[dask-sync]",
        "balance=[equal]",
        "standalone_steps=0",
        "floor.enabled=false",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = records_of(tmp_path)
    workers = record["workers"]
    assert record["status"] == "ok" and len({w["dask_worker"] for w in workers}) == 4
    assert [w["transport"] for w in workers] == ["shared memory"] * 2 + ["tcp"] * 2
    assert processes_mentioning(*cluster_addresses([record])) == {}


def affinities(pid: int) -> dict[int, list[int]]:
    """The cores each process of `pid`'s tree may run on (those that ended meanwhile left out)."""
    import psutil

    found = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            found[proc.pid] = sorted(proc.cpu_affinity())
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not CAN_PIN, reason="needs CPU affinity, taskset and more than one core")
def test_pinned_nodes_run_on_cores_of_their_own_and_the_driver_on_the_heads_until_the_end():
    from hetbench.cluster.multinode import cluster_for_run
    from hetbench.config import load_config

    two = "workers=[{name: desk, node: desktop}, {name: mac, node: mac}]"
    cfg = load_config(None, [two, "cluster.mode=local-multinode", "cluster.pin_nodes=true", "download=false"])
    own = os.sched_getaffinity(0)
    with cluster_for_run(cfg.cluster, cfg.workers, cfg.link) as (_, _, cluster):
        desk, mac = cluster.cores["desktop"], cluster.cores["mac"]
        assert sorted(desk + mac) == sorted(own) and not set(desk) & set(mac)
        assert os.sched_getaffinity(0) == set(desk)
        for label, procs in cluster.node_procs.items():  # each Ray node (raylet, GCS, ...) and Dask worker
            for proc in procs:
                tree = affinities(proc.pid)
                assert len(tree) > 1 or "dask" in " ".join(proc.args)
                assert tree == dict.fromkeys(tree, cluster.cores[label]), (label, proc.args[:4])
        (scheduler,) = [p for p in cluster.procs if "dask_scheduler" in " ".join(p.args)]
        assert affinities(scheduler.pid)[scheduler.pid] == desk
    assert os.sched_getaffinity(0) == own


@pytest.mark.slow
@pytest.mark.skipif(not CAN_PIN, reason="needs CPU affinity, taskset and more than one core")
def test_workers_on_pinned_nodes_train_on_their_nodes_cores(tmp_path):
    from hetbench.cores import core_shares

    result = run_on_two_nodes(
        tmp_path, "cluster.pin_nodes=true", "strategies=[ray-ps, dask-sync]", "balance=[equal]", "floor.enabled=false"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path)
    shares = [len(cores) for cores in core_shares(2)]
    assert [r["strategy"] for r in records] == ["ray-ps", "dask-sync"] and all(r["status"] == "ok" for r in records)
    for record in records:  # Ray's actors and Dask's workers alike, one training process per node
        assert [(w["cores"], w["threads"]) for w in record["workers"]] == [(n, n) for n in shares]
    assert records[0]["config"]["cluster"]["pin_nodes"] is True
    assert processes_mentioning(*cluster_addresses(records)) == {}


@pytest.mark.slow
def test_a_stand_in_mac_forms_every_group_over_tcp_and_gloo_forced_is_refused_in_a_sentence(tmp_path):
    # the mac node's gloo fails as a real Mac's does against Linux (no tcp transport), and it says Darwin
    groups = "strategies=[torch-ddp, ray-train]"
    result = run_on_two_nodes(tmp_path / "auto", groups, "cluster.macos_nodes=[mac]", "standalone_steps=0")
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path / "auto")
    assert [r["status"] for r in records] == ["ok"] * 4
    ddp, train, floor, ps_floor = records
    for row in (ddp, train):
        joined = {w["name"]: (w["os"], w["collective"]) for w in row["workers"]}
        assert joined == {"desk": ("Linux", "tcp"), "mac": ("Darwin", "tcp")}
    assert floor["collective"] == "tcp" and floor["path"]["systems"] == ["Linux", "Darwin"]
    assert floor["allreduce_s"] > 0 and ps_floor["roundtrip_s"] > 0
    assert "collective" in (tmp_path / "auto" / "quick.md").read_text()

    forced = run_on_two_nodes(
        tmp_path / "gloo",
        "strategies=[torch-ddp]",
        "cluster.macos_nodes=[mac]",
        "cluster.collective=gloo",
        "standalone_steps=0",
    )
    assert forced.returncode == 1
    failed, gloo_floor, ps_floor = records_of(tmp_path / "gloo")
    assert failed["status"] == gloo_floor["status"] == "failed" and ps_floor["status"] == "ok"  # each floor alone
    for record in (failed, gloo_floor):
        assert "gloo cannot form a group between Darwin and Linux" in record["reason"], record["reason"]
    assert processes_mentioning(*cluster_addresses(records)) == {}


@pytest.mark.slow
def test_a_stand_in_mac_draws_floats_as_a_macs_cpu_does_so_a_workload_drawing_them_is_refused(tmp_path):
    # torch.randn's last bits come from the CPU's vector kernels, which the stand-in lacks as an arm64
    # Mac does: its copy of tiny_workload's data differs from the desk's; workloads/example.py draws integers
    one_row = ("strategies=[ray-ps]", "balance=[equal]", "standalone_steps=0", "floor.enabled=false")
    on_a_mac = (*one_row, "cluster.macos_nodes=[mac]")
    refused = run_on_two_nodes(tmp_path / "floats", *on_a_mac, "workload=tiny_workload:build")
    assert refused.returncode == 2 and "the workers would train on different data: desk has " in refused.stderr
    assert "floats drawn on one CPU differ on another" in refused.stderr and records_of(tmp_path / "floats") == []
    assert run_on_two_nodes(tmp_path / "linux", *one_row, "workload=tiny_workload:build").returncode == 0
    drawn = run_on_two_nodes(tmp_path / "integers", *on_a_mac, "workload=workloads.example:build")
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    (row,) = records_of(tmp_path / "integers")
    assert row["status"] == "ok" and row["workload"]["name"] == "example-mlp"
    assert {w["name"]: w["os"] for w in row["workers"]} == {"desk": "Linux", "mac": "Darwin"}


@pytest.mark.slow
def test_a_stand_in_mac_whose_copy_of_the_workload_differs_by_one_line_is_refused_naming_the_file(tmp_path):
    # each machine imports its own copy (the Mac: worker.sh --workload-path); the stand-in Mac its own folder
    source = (REPO / "workloads" / "example.py").read_text()
    for name, text in (("desk", source), ("mac", source.replace("lr=1e-3", "lr=2e-3"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mymodel.py").write_text(text)
    settings = ("strategies=[ray-ps]", "balance=[equal]", "standalone_steps=0", "floor.enabled=false")
    settings += (
        "cluster.macos_nodes=[mac]",
        f"cluster.macos_workload_path={tmp_path / 'mac'}",
        "workload=mymodel:build",
    )
    desk = {"PYTHONPATH": str(tmp_path / "desk")}
    refused = run_on_two_nodes(tmp_path / "differs", *settings, env=desk)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "the workers would train different code: mymodel.py differs: desk runs workload mymodel:build" in (
        refused.stderr
    )
    assert records_of(tmp_path / "differs") == []
    (tmp_path / "mac" / "mymodel.py").write_text(source)  # the same copy: it trains
    same = run_on_two_nodes(tmp_path / "same", *settings, env=desk)
    assert same.returncode == 0, same.stderr[-3000:]
    (row,) = records_of(tmp_path / "same")
    assert row["status"] == "ok" and {w["name"]: w["os"] for w in row["workers"]} == {"desk": "Linux", "mac": "Darwin"}


@pytest.mark.slow
def test_a_stand_in_macs_ray_node_refuses_to_join_without_rays_macos_flag_as_a_macs_does(tmp_path):
    # what a Mac's Ray does unless told: no node joins another (hetbench's process defaults tell it)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    one_row = ("strategies=[single]", "standalone_steps=0", "floor.enabled=false", "cluster.macos_nodes=[mac]")
    refused = run_on_two_nodes(tmp_path, *one_row, env=env, timeout=120)
    assert refused.returncode == 2 and "exited with 1 while starting (logs: " in refused.stderr
    logs = Path(refused.stderr.split("(logs: ")[1].split(")")[0])
    try:
        assert "Multi-node Ray clusters are not supported on Windows and OSX" in (logs / "ray-mac.log").read_text()
        assert "not supported" not in (logs / "ray-desktop.log").read_text()  # the Linux head's Ray starts
    finally:
        shutil.rmtree(logs, ignore_errors=True)

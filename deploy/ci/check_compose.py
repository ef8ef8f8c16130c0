"""The compose smoke test's checks (deploy/ci/compose-smoke.sh), through the Docker SDK:

gpu-policy FILE   every service of `compose config --format json` that trains reserves the GPU
run ...           the runner finished cleanly; its newest records hold the given strategies, the
                  distributed ones on the desktop and the mac node, the reference rows on the
                  workers' nodes; tables and plots were written; the Ray token is nowhere else
                  (--gloo-interfaces: the gloo groups formed, each node's end on the interface toward
                  the other, though the desk's host name resolves to 127.0.1.1 in its containers)
woke ...          after the mac's worker was stopped (a sleep) and continued, it joined again or
                  ended in one sentence: it did not hang
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import docker

SERVICES = ("ray-head", "dask-scheduler", "dask-worker", "runner")
DISTRIBUTED = ("ray-ps", "dask-sync", "ray-train")
FLOORS = ("gloo-floor", "ps-floor")
# what a service's command starts when it trains (or checks the device training needs)
TRAINS = ("ray start", "distributed.cli.dask_worker", "hetbench devices")


def fail(message: str, runner=None) -> None:
    if runner is not None:
        print(runner.logs(tail=60).decode(errors="replace"), file=sys.stderr)
    sys.exit(f"check_compose: {message}")


def gpu_policy(args) -> None:
    services = json.loads(Path(args.file).read_text())["services"]
    checked = []
    for name, service in services.items():
        command = " ".join(service.get("command") or [])
        if not any(start in command for start in TRAINS):
            continue
        devices = ((service.get("deploy") or {}).get("resources") or {}).get("reservations", {}).get("devices") or []
        if not any("gpu" in (d.get("capabilities") or []) for d in devices):
            fail(f"service {name} trains ({command.split()[0]} ...) but reserves no GPU")
        checked.append(name)
    if not checked:
        fail("no service of the compose file trains: the policy checked nothing")
    print(f"check_compose: ok: {', '.join(checked)} reserve the GPU")
    for name, service in services.items():  # Ray opens sockets and files per worker process
        nofile = (service.get("ulimits") or {}).get("nofile") or {}
        if min(nofile.get("soft", 0), nofile.get("hard", 0)) < 65536:
            fail(f"service {name} may open fewer than 65,536 files ({nofile or 'the engine default'})")
    print("check_compose: ok: every service may open 65,536 files")


GROUPS = ("torch-ddp", "ray-train")  # the rows that form a torch.distributed group


def check_collective(records: list[dict], expected: str) -> None:
    """Every group (the rows' and the all-reduce floor's) formed on `expected` on every rank."""
    used = {}
    for r in records:
        if r["strategy"] in GROUPS:
            used.update({(r["strategy"], w["node"]): w.get("collective") for w in r["workers"]})
        if r["strategy"] == "gloo-floor":
            used[("gloo-floor", "both")] = r.get("collective")
    wrong = {key: collective for key, collective in used.items() if collective != expected}
    if not used or wrong:
        fail(f"groups formed on {wrong or 'nothing recorded'}, not on {expected}")
    print(f"check_compose: ok: every group formed on {expected}: {sorted(used)}")


def check_records(records: list[dict], strategies: list[str], floor: bool) -> None:
    failed = [(r["strategy"], r.get("balance"), r.get("reason")) for r in records if r["status"] != "ok"]
    if failed:
        fail(f"records not ok: {failed}")
    for strategy in (s for s in strategies if s in DISTRIBUTED):
        rows = [r for r in records if r["strategy"] == strategy and r["status"] == "ok"]
        if not rows:
            fail(f"no ok {strategy} record: {[(r['strategy'], r['status'], r.get('reason')) for r in records]}")
        nodes = {w["node"] for r in rows for w in r["workers"]}
        if nodes != {"desktop", "mac"}:
            fail(f"{strategy} ran on nodes {sorted(nodes)}, not desktop and mac")
    if "ray-ps" in strategies:
        ps = next(r for r in records if r["strategy"] == "ray-ps")["workers"]
        if ps[0]["node_id"] == ps[1]["node_id"]:
            fail("ray-ps's desktop and mac workers ran on one Ray node")
        mac = next(w for w in ps if w["node"] == "mac")
        if mac["transport"] != "direct tcp":  # the Mac connects out to the head's port 6386
            fail(f"ray-ps's mac worker used the {mac['transport']}, not its own connection to the server")
    if "single" in strategies:
        single = next(r for r in records if r["strategy"] == "single")
        (worker,) = single["workers"]
        (spec,) = [w for w in single["config"]["workers"] if w["name"] == single["reference"]["worker"]]
        if worker["node"] != spec["node"] or not worker["device"].startswith(spec["device"].replace("auto", "")):
            fail(f"the baseline ran on {worker}, not on the reference worker's node and device ({spec})")
    for name in FLOORS if floor else ():  # the ps-floor: the Mac connects out to the desk's 6386, as ray-ps's workers
        row = next((r for r in records if r["strategy"] == name), {})
        if row.get("status") != "ok" or sorted(row["path"]["nodes"]) != ["desktop", "mac"]:
            fail(f"the {name} did not run between the desktop and the mac: {row.get('path') or row.get('reason')}")


HOST_NAME_ADDRESS = "import socket; print(socket.gethostbyname(socket.gethostname()))"


def check_gloo_interfaces(head, records: list[dict], expected: dict[str, str]) -> None:
    """The trap is set (the desk's host name resolves to 127.0.1.1, what gloo would advertise without
    GLOO_SOCKET_IFNAME), and every gloo group formed on each node's interface toward the other."""
    resolved = head.exec_run(["python3", "-c", HOST_NAME_ADDRESS]).output.decode().strip()
    if resolved != "127.0.1.1":
        fail(f"the desk's host name resolves to {resolved!r} in ray-head, not 127.0.1.1: the check proves nothing")
    used = {}
    for r in records:
        if r["strategy"] == "ray-train":
            used.update({(r["strategy"], w["node"]): w.get("gloo_interface") for w in r["workers"]})
        if r["strategy"] == "gloo-floor":
            used.update({(r["strategy"], n): i for n, i in zip(r["path"]["nodes"], r["path"]["interfaces"])})
    wrong = {key: interface for key, interface in used.items() if interface != expected[key[1]]}
    if not used or wrong:
        fail(f"gloo ran on {wrong or 'no recorded interface'}, not on {expected}")
    print(f"check_compose: ok: the desk's host name resolves to 127.0.1.1 and gloo formed on {expected}")


def check_token_kept(client, services: dict, results: Path, token: str, worker_log: Path) -> None:
    """The token only in its file: not in records, logs, any container's environment or the image's history."""
    places = {str(p): p.read_text(errors="replace") for p in results.rglob("*") if p.suffix in (".json", ".md", ".csv")}
    places["the mac's worker log"] = worker_log.read_text(errors="replace")
    for name, container in services.items():
        places[f"{name}'s environment (docker inspect)"] = "\n".join(container.attrs["Config"]["Env"] or [])
        places[f"{name}'s log"] = container.logs().decode(errors="replace")
    image = services["runner"].image
    places["the image's history"] = json.dumps(image.history())
    leaked = [where for where, text in places.items() if token in text]
    if leaked:
        fail(f"the Ray token appears in {', '.join(leaked)}")


def run(args) -> None:
    client = docker.from_env(timeout=60)
    label = f"com.docker.compose.project={args.project}"
    services = {
        c.labels["com.docker.compose.service"]: c for c in client.containers.list(all=True, filters={"label": label})
    }
    for name in SERVICES:
        if name not in services:
            fail(f"service {name} has no container (have: {', '.join(sorted(services))})")
    runner = services["runner"]
    try:
        status = runner.wait(timeout=args.timeout)["StatusCode"]
    except Exception as e:  # requests' ReadTimeout, or the engine going away
        fail(f"the runner did not finish within {args.timeout:g} s ({type(e).__name__})", runner)
    if status != 0:
        fail(f"the runner exited with {status}", runner)
    for name in ("ray-head", "dask-scheduler", "dask-worker"):
        services[name].reload()
        if services[name].status != "running":
            fail(f"service {name} is {services[name].status}, not running")

    results = Path(args.results)
    files = sorted((results / "raw").glob("*-desktop-mac-*.json"))
    if not files:
        fail(f"no desktop-mac records under {results / 'raw'}", runner)
    records = json.loads(files[-1].read_text())
    strategies = args.strategies.split(",")
    # each strategy once per balance (desktop-mac.yaml: equal and auto), the baseline once
    if sorted({r["strategy"] for r in records if r["strategy"] not in FLOORS}) != sorted(strategies):
        fail(f"the records hold {[r['strategy'] for r in records]}, not {strategies}")
    check_records(records, strategies, args.floor)
    if args.workload:  # a user's module, mounted into the desk's containers and on the Mac's path
        trained = {r["strategy"]: r["workload"]["spec"] for r in records if r["strategy"] not in FLOORS}
        if set(trained.values()) != {args.workload}:
            fail(f"the rows trained {trained}, not {args.workload}")
    if args.collective:
        check_collective(records, args.collective)
    if args.gloo_interfaces:
        expected = dict(pair.split("=") for pair in args.gloo_interfaces.split(","))
        check_gloo_interfaces(services["ray-head"], records, expected)
    for table in ("desktop-mac.md", "desktop-mac.csv", "desktop-mac-throughput.png"):
        if not (results / table).is_file():
            fail(f"{table} was not written")
    owner = results.stat().st_uid
    if any(p.stat().st_uid != owner for p in results.rglob("*")):
        fail("some results are not owned by the results directory's owner")
    check_token_kept(client, services, results, Path(args.token_file).read_text().strip(), Path(args.worker_log))
    print(
        f"check_compose: ok: {len(records)} records: {', '.join(strategies)}{' and the floor' * args.floor}"
        f"{f' on {args.workload}' if args.workload else ''}, on the nodes they belong on; tables written; the "
        "token only in its file"
    )


def woke(args) -> None:
    """Joined again (and still up a while later), or ended with one error line: either, within the timeout."""
    log = Path(args.worker_log)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if not _alive(args.worker_pid):
            errors = [line for line in text.splitlines() if line.startswith("hetbench: error: ")]
            if len(errors) != 1 or "Traceback" in text:
                fail(f"the mac's worker ended after the sleep without one sentence:\n{text[-2000:]}")
            print(f"check_compose: ok: after the sleep the mac's worker ended in one sentence: {errors[0]}")
            return
        if "joining" in text and "again" in text:
            time.sleep(20)  # and stays: its Ray node came back up
            if not _alive(args.worker_pid):
                fail(f"the mac's worker joined again after the sleep, then ended:\n{text[-2000:]}")
            print("check_compose: ok: after the sleep the mac's worker joined the head again")
            return
        time.sleep(1)
    fail(f"the mac's worker neither joined again nor ended within {args.timeout:g} s of waking: it hangs")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    policy = sub.add_parser("gpu-policy")
    policy.add_argument("file", help="`docker compose config --format json` of compose.yaml")
    policy.set_defaults(func=gpu_policy)
    ran = sub.add_parser("run")
    ran.add_argument("--project", required=True, help="compose project name")
    ran.add_argument("--results", required=True, help="the runner's bind-mounted results directory")
    ran.add_argument("--token-file", required=True, help="the Ray token's file")
    ran.add_argument("--worker-log", required=True, help="the mac's worker.sh output")
    ran.add_argument("--timeout", type=float, default=900, help="seconds to wait for the runner")
    ran.add_argument("--strategies", required=True, help="the strategies the run has, comma-separated")
    ran.add_argument(
        "--floor", action="store_true", help="the run has the floors' rows (gloo-floor, ps-floor), across the link"
    )
    ran.add_argument("--collective", help="the backend every group (rows and the all-reduce floor) formed on")
    ran.add_argument("--workload", help="the module:function every row must have trained")
    ran.add_argument("--gloo-interfaces", help="node=interface,...: where each node's gloo must have run")
    ran.set_defaults(func=run)
    slept = sub.add_parser("woke")
    slept.add_argument("--worker-pid", type=int, required=True)
    slept.add_argument("--worker-log", required=True)
    slept.add_argument("--timeout", type=float, default=120)
    slept.set_defaults(func=woke)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()

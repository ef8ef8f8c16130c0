"""The compose smoke test's checks, through the Docker SDK: the runner finished cleanly, its records
show work on both the desktop and the mac node, the tables and plots were written, no token leaked."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import docker


def fail(message: str, runner=None) -> None:
    if runner is not None:
        print(runner.logs(tail=60).decode(errors="replace"), file=sys.stderr)
    sys.exit(f"check_compose: {message}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--project", required=True, help="compose project name")
    ap.add_argument("--results", required=True, help="the runner's bind-mounted results directory")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for the runner")
    args = ap.parse_args()

    client = docker.from_env(timeout=60)
    label = f"com.docker.compose.project={args.project}"
    services = {
        c.labels["com.docker.compose.service"]: c for c in client.containers.list(all=True, filters={"label": label})
    }
    for name in ("ray-head", "dask-scheduler", "dask-worker", "runner"):
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
    for strategy in ("ray-ps", "dask-sync"):
        rows = [r for r in records if r["strategy"] == strategy and r["status"] == "ok"]
        if not rows:
            fail(f"no ok {strategy} record: {[(r['strategy'], r['status'], r.get('reason')) for r in records]}")
        nodes = {w["node"] for r in rows for w in r["workers"]}
        if nodes != {"desktop", "mac"}:
            fail(f"{strategy} ran on nodes {sorted(nodes)}, not desktop and mac")
    ps = next(r for r in records if r["strategy"] == "ray-ps")["workers"]
    if ps[0]["node_id"] == ps[1]["node_id"]:
        fail("ray-ps's desktop and mac workers ran on one Ray node")
    for table in ("desktop-mac.md", "desktop-mac.csv", "desktop-mac-throughput.png"):
        if not (results / table).is_file():
            fail(f"{table} was not written")
    token = os.environ.get("RAY_AUTH_TOKEN") or next(
        (
            line.split("=", 1)[1]
            for line in (Path(args.results).parent / "ci.env").read_text().splitlines()
            if line.startswith("RAY_AUTH_TOKEN=")
        ),
        "",
    )
    if token and any(token in p.read_text() for p in results.rglob("*") if p.suffix in (".json", ".md", ".csv")):
        fail("the Ray token appears in the results")
    print(f"check_compose: ok: {len(records)} records, ray-ps and dask-sync on desktop and mac, tables written")


if __name__ == "__main__":
    main()

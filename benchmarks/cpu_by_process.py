"""Which processes took this box's CPU while a race ran: `record` samples every process's CPU ticks
from /proc every 5 s (for a bounded time, beside `hetbench run`); `summary` splits the samples into
windows by which process kind was busiest (Ray Train's ranks, or hetbench's long-lived hosts) and
prints each kind's cores. Linux only (/proc).

    python benchmarks/cpu_by_process.py record --seconds 3600 --out /tmp/cpu.jsonl &
    python benchmarks/cpu_by_process.py summary /tmp/cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

TICKS = os.sysconf("SC_CLK_TCK")
BUSY = {"ray::RayTrainWo": "Ray Train's ranks", "ray::Host": "hetbench's hosts"}  # the kinds of window


def sample() -> dict[str, tuple[str, int]]:
    """pid -> (name, user + system ticks) of every process that has run."""
    seen = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:  # it ended between the listing and the read
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        seen[pid] = (name, int(rest[11]) + int(rest[12]))
    return seen


def record(seconds: float, out: str) -> None:
    end = time.monotonic() + seconds
    with open(out, "a") as f:
        while time.monotonic() < end:
            f.write(json.dumps({"t": time.time(), "p": sample()}) + "\n")
            f.flush()
            time.sleep(5)


def summary(path: str) -> None:
    samples = [json.loads(line) for line in open(path)]
    cores, seconds = defaultdict(lambda: defaultdict(float)), defaultdict(float)
    for a, b in zip(samples, samples[1:]):
        dt, used = b["t"] - a["t"], defaultdict(float)
        for pid, (name, ticks, *_) in b["p"].items():
            if pid in a["p"] and a["p"][pid][0] == name:  # the same process (a pid may be reused)
                used[name.split(".")[0]] += (ticks - a["p"][pid][1]) / TICKS  # ray::Host.invoke: ray::Host
        kind = next((label for name, label in BUSY.items() if used[name] > 0.5 * dt), "other")
        seconds[kind] += dt
        for name, s in used.items():
            cores[kind][name] += s
    for kind, by_name in cores.items():
        print(f"{kind}: {seconds[kind]:.0f} s, {sum(by_name.values()) / seconds[kind]:.2f} cores")
        for name, s in sorted(by_name.items(), key=lambda x: -x[1]):
            if s / seconds[kind] >= 0.005:
                print(f"  {s / seconds[kind]:.3f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--seconds", type=float, required=True)
    rec.add_argument("--out", required=True)
    sub.add_parser("summary").add_argument("path")
    args = parser.parse_args()
    record(args.seconds, args.out) if args.command == "record" else summary(args.path)


if __name__ == "__main__":
    main()

"""`hetbench`: run, report, worker, devices, strategies, settings.

Bad input: one line on stderr, exit 2 (-v: traceback)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from dataclasses import replace

from hetbench.cluster.nodes import HEAD_DASK_PORT, HEAD_RAY_PORT
from hetbench.cluster.ray_connection import use_ray_defaults
from hetbench.errors import INTERRUPTED, RunFailed, UserError, interrupt

EXIT_BAD_INPUT = 2


def cmd_run(args) -> int:
    from hetbench.config import load_config
    from hetbench.runner import resume_run, run
    from hetbench.strategies import registry

    if args.resume:
        if args.config or args.set:
            raise UserError("--resume continues a run with the config it was started with: give no -c or --set")
        out = resume_run(args.resume, args.results_dir or "results")
        print(f"\nrecords: {out.path}", file=sys.stderr)
        return 0
    if not args.config:
        raise UserError("hetbench run needs a config (-c CONFIG) or a run to continue (--resume RUN)")
    cfg = load_config(args.config, args.set or [], registry.declared())
    if args.results_dir:
        cfg = replace(cfg, run=replace(cfg.run, results_dir=args.results_dir))
    out = run(cfg)
    print(f"\nrecords: {out.path}\ntables:  {cfg.run.results_dir}/{cfg.run.name}.md, .csv", file=sys.stderr)
    return 0


def cmd_plan(args) -> int:
    from pathlib import Path

    from hetbench.config import load_config
    from hetbench.planning import plan
    from hetbench.strategies import registry

    cfg = load_config(args.config, args.set or [], registry.declared())
    text = plan(cfg)
    print(text)
    out = Path(args.results_dir or cfg.run.results_dir) / f"{cfg.run.name}-plan.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"plan: {out}", file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    from pathlib import Path

    from hetbench.results.records import read_records
    from hetbench.results.report import markdown, write_tables

    files = args.files or sorted(str(p) for p in Path(args.results_dir, "raw").glob("*.json"))[-1:]
    if not files:
        raise UserError(f"no record files given and none under {args.results_dir}/raw")
    if args.links:
        from hetbench.results.links import by_link, links_markdown, write_links

        runs = by_link([read_records([f]) for f in files])
        print(links_markdown(runs))
        if args.name:
            print(f"\ntables: {write_links(runs, args.results_dir, args.name)}", file=sys.stderr)
        return 0
    records = read_records(files)
    if args.against:
        from hetbench.results.whatif import against

        checked = against(records, read_records(args.against))
        if not checked:
            raise UserError(
                "--against needs a run over an emulated link (its gloo-floor row names the rate) and, in "
                "the records given, a floor and the same rows with each worker's speed alone"
            )
        print(checked)
        return 0
    print(markdown(records, wide=args.wide))
    if args.name:
        md, csv = write_tables(records, args.results_dir, args.name)
        print(f"\ntables: {md}, {csv}", file=sys.stderr)
    return 0


def cmd_worker(args) -> int:
    from hetbench.cluster.worker import run_worker

    return run_worker(
        args.head,
        args.label,
        args.name or args.label,
        args.ray_port,
        args.dask_port,
        args.timeout,
        args.device,
        args.workload_path,
    )


def cmd_devices(args) -> int:
    from hetbench.device_check import require
    from hetbench.devices import available_devices, describe, resolve_device

    if args.require:  # a container's start: refuse at once where the device it was given cannot train
        for line in require(args.require, precision=args.precision):
            print(line)
    if args.head:  # ... and a desktop the Mac could not reach (WSL2 in NAT mode, a wrong HEAD_HOST)
        from hetbench.cluster.wsl import check_this_desktop

        check_this_desktop(args.head)
    print(f"auto -> {resolve_device('auto')}")
    for name in available_devices():
        print(f"  {describe(resolve_device(name))}")
    return 0


def cmd_settings(args) -> int:
    from hetbench.config import described
    from hetbench.strategies import registry

    print(described(registry.declared()), end="")
    return 0


def cmd_strategies(args) -> int:
    from hetbench.strategies.registry import availability

    for name, reason in availability().items():
        print(f"{name:16} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    top = argparse.ArgumentParser(
        prog="hetbench",
        formatter_class=fmt,
        description="Benchmark data-parallel training strategies across unequal machines.",
    )
    top.add_argument("-v", "--verbose", action="store_true", help="verbose logs and full tracebacks")
    sub = top.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", formatter_class=fmt, help="run the strategies of a config; write records and tables")
    run.add_argument("-c", "--config", default=None, help="YAML config, e.g. benchmarks/configs/quick.yaml")
    run.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key (dotted, e.g. workers.0.batch=32); repeatable",
    )
    run.add_argument("--results-dir", default=None, help="override the config's results_dir")
    run.add_argument(
        "--resume",
        default=None,
        metavar="RUN",
        help="continue an interrupted run (results/raw/RUN.json, or RUN) from its checkpoints",
    )
    run.set_defaults(func=cmd_run)

    plan = sub.add_parser(
        "plan",
        formatter_class=fmt,
        help="predict every row of a config from a short measurement (alone speeds, floors), before racing",
    )
    plan.add_argument("-c", "--config", required=True, help="YAML config, e.g. benchmarks/configs/hetero-local.yaml")
    plan.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key; repeatable")
    plan.add_argument("--results-dir", default=None, help="where NAME-plan.md goes (default: the config's)")
    plan.set_defaults(func=cmd_plan)
    report = sub.add_parser("report", formatter_class=fmt, help="comparison tables from record files")
    report.add_argument("files", nargs="*", help="record JSON files (default: the newest under RESULTS_DIR/raw)")
    report.add_argument("--results-dir", default="results", help="where raw/ records and tables live")
    report.add_argument("--name", default=None, help="also write RESULTS_DIR/NAME.md and .csv")
    view = report.add_mutually_exclusive_group()
    view.add_argument(
        "--links", action="store_true", help="each file one run over its own link: the runs side by side (NAME.md)"
    )
    view.add_argument("--wide", action="store_true", help="print every column (the CSV's), not the 10 that answer")
    view.add_argument(
        "--against",
        nargs="+",
        default=None,
        metavar="LINKED",
        help="check the what-if model: predict these records (a run over an emulated link) from FILES",
    )
    report.set_defaults(func=cmd_report)

    worker = sub.add_parser(
        "worker", formatter_class=fmt, help="join a head's Ray and Dask as a labelled node (the Mac's one command)"
    )
    worker.add_argument("--head", required=True, help="the head's address as this machine reaches it")
    worker.add_argument("--label", default="mac", help="placement label this node advertises")
    worker.add_argument("--name", default=None, help="Dask worker name (default: the label)")
    worker.add_argument("--ray-port", type=int, default=HEAD_RAY_PORT, help="the head's Ray (GCS) port")
    worker.add_argument("--dask-port", type=int, default=HEAD_DASK_PORT, help="the head's Dask scheduler port")
    worker.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the head to answer")
    worker.add_argument(
        "--device",
        default=os.environ.get("MAC_DEVICE") or "mps",
        help="what this machine trains on, checked with a forward and backward pass before it joins "
        "(MAC_DEVICE; cpu: join without MPS)",
    )
    worker.add_argument(
        "--workload-path",
        default=None,
        metavar="DIR",
        help="the folder your workload's module is imported from (as on the desktop: `mypkg.mymodel:build` "
        "is DIR/mypkg/mymodel.py); the checkout is on the path already",
    )
    worker.set_defaults(func=cmd_worker)

    devices = sub.add_parser("devices", formatter_class=fmt, help="the devices this machine has")
    devices.add_argument(
        "--require", default=None, help="exit 2 in one sentence unless the model trains on this device (e.g. cuda) here"
    )
    devices.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "tf32", "bf16", "fp16"],
        help="with --require: the run's precision, which the model must train in there",
    )
    devices.add_argument(
        "--head",
        default=None,
        help="the desktop's LAN address (HEAD_HOST): exit 2 in one sentence unless it is this machine's "
        "and, on WSL2, networking is mirrored",
    )
    devices.set_defaults(func=cmd_devices)
    strategies = sub.add_parser("strategies", formatter_class=fmt, help="registered strategies and availability")
    strategies.set_defaults(func=cmd_strategies)
    settings = sub.add_parser(
        "settings", formatter_class=fmt, help="every config key with its default and what it does, as YAML"
    )
    settings.set_defaults(func=cmd_settings)
    return top


def _unraisable(unraisable, default=sys.__unraisablehook__) -> None:
    # An interrupt landing in a finalizer is dropped by Python; the runner stops on INTERRUPTED instead,
    # so the user sees one line, not a traceback.
    if not (unraisable.exc_type is KeyboardInterrupt and INTERRUPTED.is_set()):
        default(unraisable)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a test's capture swaps it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _) -> None:
        pass


def configure_logging(verbose: bool) -> None:
    """hetbench's own lines (progress, notices) as the user reads them, its debug lines with -v; a
    library's warnings with their level and name (all their lines with -v)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    ours, handler = logging.getLogger("hetbench"), _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    ours.handlers[:] = [handler]
    ours.setLevel(logging.DEBUG if verbose else logging.INFO)
    ours.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    sys.unraisablehook = _unraisable
    use_ray_defaults()
    configure_logging(args.verbose)
    try:
        return args.func(args)
    except UserError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"hetbench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunFailed as e:
        if args.verbose:
            traceback.print_exc()
        print(f"hetbench: run failed: {e} (records so far are kept)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hetbench: interrupted; records written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

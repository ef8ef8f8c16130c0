"""`hetbench plan`'s arithmetic: every row of a config predicted from a short measurement.

What it predicts from (planning.measure_plan measures it on the race's own cluster, and `hetbench run` the
same at its start): each worker training alone at two global batches (a step's fixed cost and its
cost per sample, on that device) and, at the smaller, with every worker training at once, in
lockstep and each at its own pace (what sharing one box's cores costs a row), and the two floors
over the real link. From those and each strategy's pattern: a synchronous step waits for the slowest
share, then moves the model `floor_transfers` times at the floor's all-reduce time (local SGD: once
a round of `sync_every` steps); an asynchronous worker runs at its own pace, its gradient up and its
weights down each step (the ps-floor's round trip, for a worker off the server's node), the faster
ones held back by max_staleness. What a strategy spends beyond its floor is not known before it
runs, so each prediction is its pattern at the floor: the race's rows record how far each is off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from tabulate import tabulate

from hetbench.clock import median
from hetbench.config import Config
from hetbench.gradients import WIRE_DTYPES, powersgd_fraction
from hetbench.scenarios import balanced, planned
from hetbench.step_rate import in_float32, samples_per_s, smallest_sync_every
from hetbench.strategies import registry
from hetbench.workload import load_workload

CLEAR = 1.05  # a row pays (or not) "likely" only where its whole range is this far past the best alone
SHARED_CORES = 1.05  # a step together at least this much longer than alone: the workers share one box's
# cores (two machines' workers step as fast together as alone, within their timings' noise)


def second_batch(batch: int, workers: int) -> int:
    """The second batch each worker is timed alone at: the equal split's share. Every equal row
    trains each worker at it and auto's shares lie on either side, so the line through it and the
    global batch is drawn where the rows train: a sample's cost moves with the batch (the ResNet on
    the emulated mac here: 17.1 ms in a batch of 64, 17.0 at 128, 19.2 at 256), which a line from a
    batch the rows never train at misses."""
    return max(batch // max(workers, 2), 1)


@dataclass(frozen=True)
class Alone:
    """One worker training alone: its seconds a step at two global batches, every timing of each;
    and at the smaller while every other worker trained too (standalone.measure_alone_and_together:
    on separate machines as alone, on one shared box slower)."""

    name: str
    small: int  # samples a step
    large: int
    small_s: tuple[float, ...]  # seconds a step, each timing
    large_s: tuple[float, ...]
    free_s: tuple[float, ...] = ()  # seconds a step of `small`, every worker training at once at its own pace
    lockstep_s: tuple[float, ...] = ()  # the same with every step started together, one figure a step

    def sharing(self, synchronous: bool) -> float:
        """How much longer a step takes while the others train too: in lockstep, as a synchronous
        row's workers step after each sync, or each at its own pace, as an asynchronous row's (1: no
        slower, or not timed)."""
        beside = self.lockstep_s if synchronous else self.free_s
        if not beside or not self.small_s:
            return 1.0
        return max(median(beside) / median(self.small_s), 1.0)

    def beside_others(self, synchronous: bool) -> Alone:
        """These timings as the worker computes in a row, every other worker computing at once."""
        return self._stretched(self.sharing(synchronous))

    def step_s(self, batch: int, pick=median) -> float:
        """A step at `batch` on this worker: the line through the two batches' timings (`pick` of
        each: median, min for its fastest, max for its slowest); through zero if only one was timed.
        Where a sample costs less in a small batch than in a large one (the ResNet on this host's
        CPU: 17.0 ms a sample at 128, 19.2 at 256), the line meets zero above it: below the small
        batch a step is then the small one's cost a sample."""
        large = pick(self.large_s)
        if not self.small_s or self.small >= self.large:
            return large * batch / self.large
        small = pick(self.small_s)
        per_sample = max((large - small) / (self.large - self.small), 0.0)
        line = large - per_sample * (self.large - batch)
        return max(line, small * batch / self.small) if batch < self.small else line

    def timed(self) -> str:
        """Its median step at each batch timed: "a step of 256 in 1,344 ms, of 128 in 610 ms; beside
        the others 658 in lockstep, 640 at its own pace"."""
        steps = [(self.large, self.large_s), (self.small, self.small_s)]
        said = "a step " + ", ".join(f"of {b} in {median(s) * 1e3:,.0f} ms" for b, s in steps if s)
        if self.lockstep_s and self.free_s:
            ms = [median(s) * 1e3 for s in (self.lockstep_s, self.free_s)]
            said += f"; beside the others {ms[0]:,.0f} in lockstep, {ms[1]:,.0f} at its own pace"
        return said

    def at_speed(self, samples_per_s: float) -> Alone:
        """These timings with every step stretched alike so that the global batch runs at
        `samples_per_s`: the same machine timed faster or slower at another hour."""
        return self._stretched(self.large / samples_per_s / median(self.large_s))

    def _stretched(self, factor: float) -> Alone:
        def each(timings):
            return tuple(s * factor for s in timings)

        timings = ("small_s", "large_s", "free_s", "lockstep_s")
        return replace(self, **{name: each(getattr(self, name)) for name in timings})


@dataclass(frozen=True)
class Measured:
    """What a plan predicts from: measured on the race's cluster, over its real link."""

    alone: tuple[Alone, ...]  # in configured worker order
    allreduce_s: float | None  # the gloo-floor: one all-reduce of the model's float32 buffer (None: failed)
    roundtrip_s: float | None  # the ps-floor: the buffer up and back down
    model_bytes: int  # float32
    seconds: float = 0.0  # what measuring took, the cluster's start included
    cut: str = ""  # what the budget (plan.seconds) left out, if anything
    ready: tuple[tuple[float, int], ...] = ()  # each gradient: (the fraction of a step at which it is
    # ready, its float32 bytes), in that order (LoadedWorkload.gradients_ready); empty: not measured
    beside_server: frozenset[str] = frozenset()  # workers whose round trips to a parameter server
    # cross no link (planning.beside_server): no ps-floor is charged to them
    waits: float = 1.0  # a synchronous step's compute over its slowest worker's (lockstep_wait); 1: alone

    def in_a_row(self, synchronous: bool) -> Measured:
        """What a row's workers compute at: each one's timings stretched by its sharing, and a
        synchronous step by its wait for whichever worker is slowest in it."""
        waits = lockstep_wait(self.alone) if synchronous else 1.0
        return replace(self, alone=tuple(a.beside_others(synchronous) for a in self.alone), waits=waits)


def lockstep_wait(alone: tuple[Alone, ...]) -> float:
    """How much longer a step in lockstep is than its slowest worker's median step: each waits for
    whichever worker was slowest in it, and workers that jitter (one box's cores shared) are slow
    by turns, which each one's median misses (on the stand-in pair: 5-7 ms of a 58 ms step). Timed
    at the start: the median over the lockstep steps of the slowest figure in each; 1 where not timed."""
    steps = list(zip(*(a.lockstep_s for a in alone)))
    if len(alone) < 2 or not steps:
        return 1.0
    return max(median([max(step) for step in steps]) / max(median(a.lockstep_s) for a in alone), 1.0)


@dataclass(frozen=True)
class RowPlan:
    """One row predicted: samples/s at its split, and against the best machine alone at the same batch."""

    strategy: str
    balance: str | None
    split: tuple[int, ...]
    compute_s: float  # the slowest share's step in the row (median timings; a synchronous row's with its waits)
    sync_s: float  # the link's share of a step at the floor
    samples_per_s: tuple[float, float, float]  # slowest, median, fastest timings
    vs_alone: tuple[float, float, float]  # the same, each over the best alone (its fastest for the lowest)
    verdict: str
    note: str = ""
    synchronous: bool = True  # a barrier each step: its samples/s say its time to a target, as single's do
    exposed_s: float | None = None  # of sync_s, what is left after backward where buckets go out during it
    shares_s: tuple[float, ...] = ()  # each worker's step at its share, as compute_s (in measured.alone's order)
    unseen_cost: str = ""  # what the strategy runs on the workers' shared cores that the timings leave out
    # (sharing_note; "": nothing, or the workers have cores of their own)

    @property
    def label(self) -> str:
        return self.strategy if self.balance is None else f"{self.strategy} [{self.balance}]"


PICKS = (max, median, min)  # each timing's slowest, median and fastest seconds: the predictions' range


def best_alone(measured: Measured, batch: int) -> tuple[Alone, tuple[float, float, float]]:
    """The fastest worker alone at `batch` (by median), and its samples/s at each pick."""
    best = min(measured.alone, key=lambda a: a.step_s(batch))
    return best, spread([batch / best.step_s(batch, pick) for pick in PICKS])


def spread(figures: list[float]) -> tuple[float, float, float]:
    """(lowest, the median timings', highest): a line through two batches' slowest timings need not be
    the slowest at every batch, so the range is the extremes of the three."""
    return min(figures), figures[1], max(figures)


def slowest_s(measured: Measured, split: list[int], pick=median) -> float:
    """The slowest share's step at `split`, and the wait for whichever is slowest each step (in a
    row: Measured.in_a_row): what a synchronous step waits for before its sync."""
    return max(a.step_s(b, pick) for a, b in zip(measured.alone, split)) * measured.waits


def link_s(measured: Measured, transfers: float, width: int) -> float:
    """A step's time on the link at the floor: `transfers` all-reduces of the model, in a wire dtype of
    `width` bytes."""
    return in_float32(transfers, width) * (measured.allreduce_s or 0.0)


FIRST_BUCKET, BUCKET = 1 << 20, 25 << 20  # DDP's: its first bucket closes past 1 MiB, the others past 25


def buckets(ready: tuple[tuple[float, int], ...]) -> list[tuple[float, int]]:
    """DDP's buckets in the order the gradients are ready (as DDP rebuilds them after its first
    step): (the fraction of a step at which the last of a bucket's gradients is ready, its bytes)."""
    out, at, size, cap = [], 0.0, 0, FIRST_BUCKET
    for fraction, nbytes in ready:
        at, size = max(at, fraction), size + nbytes
        if size >= cap:
            out.append((at, size))
            size, cap = 0, BUCKET
    return out + [(at, size)] if size else out


def overlapped_s(
    compute_s: float, link: float, ready: tuple[tuple[float, int], ...], overlap: str = "buckets"
) -> float:
    """A step whose transfers go out while backward runs. "buckets": DDP's, each all-reduced once the
    slowest share has it ready and the one before is through, its bytes' part of `link`.
    "parameters": a streaming parameter server's, each gradient up as backward has it, then down
    once stepped, each way its bytes' part of `link` (up and down at once: the link's two
    directions). The rest of the step (the optimizer's) follows the last. The CNN's 4.7 MB fc1 is
    ready halfway through a step, so most of its transfer hides behind the convs' backward."""
    parts = buckets(ready) if overlap == "buckets" else list(ready)
    total = sum(b for _, b in parts)
    at = [fraction * compute_s for fraction, _ in parts]
    for _ in range(1 if overlap == "buckets" else 2):  # a parameter server's: up, then down
        through, done = 0.0, []
        for start, (_, nbytes) in zip(at, parts):
            through = max(through, start) + link * nbytes / total
            done.append(through)
        at = done
    return max(compute_s, at[-1] + (1 - parts[-1][0]) * compute_s)


def async_rate(measured: Measured, split: list[int], width: int, pick, max_staleness: int | None) -> float:
    """Samples/s of an asynchronous parameter server: each worker at its own pace, a round trip to
    the server after each step (none beside it). While the slowest makes one update the others may
    start at most `max_staleness` versions past it, so they make at most max_staleness + their number
    (each one in flight finishes): past that they wait, and run at that share of their pace."""
    trip = in_float32(1.0, width) * (measured.roundtrip_s or 0.0)
    working = [
        (b, a.step_s(b, pick) + (0.0 if a.name in measured.beside_server else trip))
        for a, b in zip(measured.alone, split)
        if b
    ]
    slowest_b, slowest_s = working.pop(max(range(len(working)), key=lambda i: working[i][1]))
    meanwhile = sum(slowest_s / cycle for _, cycle in working)  # the others' updates in one of its cycles
    held = 1.0
    if max_staleness is not None and meanwhile > max_staleness + len(working):
        held = (max_staleness + len(working)) / meanwhile
    return slowest_b / slowest_s + held * sum(b / cycle for b, cycle in working)


def step_rate(measured: Measured, split: list[int], transfers: float, width: int, pick, overlap: str = "") -> float:
    """Samples/s of a synchronous step at `split`: `transfers` floor all-reduces a step, in a wire
    dtype of `width` bytes; `overlap`: the strategy's, during backward where measured.ready says when."""
    compute, link = slowest_s(measured, split, pick), link_s(measured, transfers, width)
    if overlap and measured.ready:  # a parameter server's two transfers are its up and down
        each = link / transfers if overlap == "parameters" else link
        return samples_per_s(sum(split), overlapped_s(compute, each, measured.ready, overlap))
    return samples_per_s(sum(split), compute, 1.0, link)


def predict(cfg: Config, measured: Measured) -> list[RowPlan]:
    """Every distributed row of `cfg` predicted from `measured`, split as the race would split it
    (`auto` by the speeds measured alone); the baseline is the best alone. A row with no link to
    cross, or whose floor failed, has none."""
    speeds = {a.name: cfg.run.batch_size / a.step_s(cfg.run.batch_size) for a in measured.alone}
    rows = []
    for scenario in planned(cfg):
        if scenario.strategy != registry.BASELINE:
            split = [w.batch for w in balanced(cfg, scenario.balance, speeds).workers]
            rows.append(predict_row(cfg, measured, scenario.strategy, scenario.balance, split))
    return [r for r in rows if r]


def predict_row(cfg: Config, measured: Measured, name: str, balance: str | None, split: list[int]) -> RowPlan | None:
    """Strategy `name`'s row at `split` (each worker's batch, in measured.alone's order)."""
    batch = sum(split)
    best, alone = best_alone(measured, batch)
    strategy = registry.load(name)(cfg.job(name))
    measured = measured.in_a_row(strategy.synchronous)  # the best alone trains alone; a row's workers beside each other
    transfers, width = strategy.floor_transfers, WIRE_DTYPES[strategy.wire_dtype].itemsize
    if transfers is None and strategy.synchronous:
        return None  # no link crossed (nothing to predict it by)
    if (measured.allreduce_s if transfers is not None else measured.roundtrip_s) is None:
        return None  # its floor failed: markdown says so
    overlap = strategy.overlap if measured.ready and not shares_cores(measured, strategy.synchronous) else ""
    if transfers is None:  # asynchronous: each worker at its own pace
        rate = partial(async_rate, measured, split, width, max_staleness=strategy.max_staleness)
    else:
        rate = partial(step_rate, measured, split, transfers, width, overlap=overlap)
    rates = spread([rate(pick=pick) for pick in PICKS])
    vs = (rates[0] / alone[2], rates[1] / alone[1], rates[2] / alone[0])
    shares = tuple(a.step_s(b) for a, b in zip(measured.alone, split))
    compute, sync = slowest_s(measured, split), link_s(measured, transfers or 0.0, width)
    exposed = sum(split) / rates[1] - compute if overlap else None
    return RowPlan(
        name,
        balance,
        tuple(split),
        compute,
        sync,
        rates,
        vs,
        verdict(vs, compute, sync, transfers, measured, best, batch),
        note(cfg, strategy, measured, split, alone[1], batch, overlap),
        strategy.synchronous,
        exposed,
        shares,
        sharing_note(strategy, measured),
    )


def verdict(vs, compute: float, sync: float, transfers, measured: Measured, best: Alone, batch: int) -> str:
    """The race's words: likely pays, too close to call, or will not pay and why."""
    if vs[0] >= CLEAR:
        return "likely pays"
    if vs[2] * CLEAR > 1:
        return "too close to call: race it"
    alone_ms, mb = best.step_s(batch) * 1e3, f"{measured.model_bytes / 1e6:.1f} MB"
    if transfers is None:
        trip = (measured.roundtrip_s or 0.0) * 1e3
        return (
            f"will not pay: each step waits {trip:.0f} ms for the {mb} up and back "
            f"({best.name} alone: {alone_ms:.0f} ms a step)"
        )
    if compute * 1e3 < alone_ms:  # the shares beat it alone: the link loses it
        what = f"all-reduce of {mb} takes" if transfers <= 1 else f"{transfers:g} transfers of {mb} take"
        return (
            f"will not pay: the {what} {sync * 1e3:.0f} ms against {compute * 1e3:.0f} ms of compute "
            f"({best.name} alone: {alone_ms:.0f} ms a step)"
        )
    return (
        f"will not pay: the slowest share takes {compute * 1e3:.0f} ms, {best.name} the whole batch {alone_ms:.0f} ms"
    )


def note(cfg: Config, strategy, measured: Measured, split: list[int], alone: float, batch: int, overlap: str) -> str:
    """What would turn the row around: local SGD's smallest sync interval that beats the best alone;
    torch-ddp's bfloat16 wire and PowerSGD; for an asynchronous row, what it cannot say."""
    options = cfg.options.get(strategy.name, {})
    if "sync_every" in options:
        return sync_interval_note(measured, split, alone, batch, strategy)
    if not strategy.synchronous:
        return "samples/s only: its stale gradients may cost steps to the target, which only a race shows"
    if options.get("compression") == "none":  # torch-ddp's
        fraction = powersgd_fraction(load_workload(cfg.run).build_model(0), options["powersgd_rank"])
        bf16 = step_rate(measured, split, 1.0, 2, median, overlap) / alone
        powersgd = step_rate(measured, split, fraction, 4, median) / alone
        return f"bfloat16 wire: {bf16:.2f}x; PowerSGD rank {options['powersgd_rank']}: {powersgd:.2f}x"
    return ""


def shares_cores(measured: Measured, synchronous: bool) -> bool:
    """Whether the workers slowed each other computing together: one box's cores, not two machines'.
    There moving the model takes the cores backward runs on (gloo's all-reduce, a server's sums and
    sends), so no transfer hides behind backward: on the stand-in pair, 4-7 ms a step that the
    overlap would have hidden, the whole of what the rows measured beyond compute."""
    return max(a.sharing(synchronous) for a in measured.alone) >= SHARED_CORES


def sharing_note(strategy, measured: Measured) -> str:
    """Where the workers slowed each other computing together (one box's cores, not two machines'),
    the strategy's own busy processes there take from the same cores, which the timings leave out."""
    shared = max(a.sharing(strategy.synchronous) for a in measured.alone)
    if not strategy.beside_workers or shared < SHARED_CORES:
        return ""
    return (
        f"expect it slower: its workers share cores (a step together {shared:.2f}x one alone) with "
        f"{strategy.beside_workers}, which the plan does not time"
    )


def sync_interval_note(measured: Measured, split: list[int], alone: float, batch: int, strategy) -> str:
    """The smallest sync_every at which a round of local steps beats the best alone."""
    width = WIRE_DTYPES[strategy.wire_dtype].itemsize
    per_round = link_s(measured, strategy.floor_transfers * strategy.exchange_every, width)
    spare = batch / alone - slowest_s(measured, split)  # what a step may spend on the link and still beat alone
    if spare <= 0:
        return "no sync_every beats the best alone: its slowest share alone takes longer than the whole batch there"
    return f"beats the best alone from sync_every {smallest_sync_every(per_round, spare)}"


def worth_racing(rows: list[RowPlan], n: int = 2) -> list[RowPlan]:
    """The rows to race: of those that may pay, the `n` predicted fastest, one a strategy; synchronous
    ones first (another's samples/s do not say its steps to the target: stale or averaged updates),
    and of those the ones with no unseen cost (it would run slower than predicted)."""
    hopeful = [r for r in rows if not r.verdict.startswith("will not pay")]
    best: dict[str, RowPlan] = {}
    for row in sorted(hopeful, key=lambda r: (not r.synchronous, bool(r.unseen_cost), -r.vs_alone[1])):
        best.setdefault(row.strategy, row)
    return list(best.values())[:n]


def to_race(rows: list[RowPlan]) -> list[RowPlan]:
    """The rows a race confirms the plan by: those worth racing, else the one closest to paying."""
    return worth_racing(rows) or ([max(rows, key=lambda r: r.vs_alone[1])] if rows else [])


def markdown(cfg: Config, measured: Measured, rows: list[RowPlan]) -> str:
    batch = cfg.run.batch_size
    best, alone = best_alone(measured, batch)
    lines = [f"# Plan: {cfg.run.name} ({cfg.run.workload}, global batch {batch})", ""]
    workers = [f"{a.name} {batch / a.step_s(batch):,.0f} samples/s alone ({a.timed()})" for a in measured.alone]
    floors = [
        f"all-reduce of {measured.model_bytes / 1e6:.1f} MB {fmt_ms(measured.allreduce_s)}",
        f"parameter-server round trip {fmt_ms(measured.roundtrip_s)}",
    ]
    lines.append(f"Measured in {measured.seconds:.0f} s: {'; '.join(workers)}; {'; '.join(floors)}.")
    if measured.cut:
        lines.append(f"Cut to the budget (plan.seconds {cfg.plan.seconds:g}): {measured.cut}.")
    lines.append("")
    body = [
        [
            r.label,
            "/".join(map(str, r.split)),
            f"{r.compute_s * 1e3:.0f} + {r.sync_s * 1e3:.0f}"
            if r.exposed_s is None
            else f"{r.compute_s * 1e3:.0f} + {r.exposed_s * 1e3:.0f} of {r.sync_s * 1e3:.0f}",
            f"{r.samples_per_s[1]:,.0f} ({r.samples_per_s[0]:,.0f}-{r.samples_per_s[2]:,.0f})",
            f"{r.vs_alone[1]:.2f}x ({r.vs_alone[0]:.2f}-{r.vs_alone[2]:.2f})",
            r.verdict,
            "; ".join(filter(None, [r.note, r.unseen_cost])),
        ]
        for r in rows
    ]
    step_ms = best.step_s(batch) * 1e3
    body.insert(0, [f"single ({best.name})", str(batch), f"{step_ms:.0f} + 0", f"{alone[1]:,.0f}", "1.00x", "", ""])
    headers = ["row", "split", "ms a step: compute + link", "samples/s", "vs best alone", "verdict", "what changes it"]
    lines += [tabulate(body, headers=headers, tablefmt="github", disable_numparse=True), ""]
    race = to_race(rows)
    if race and worth_racing(rows):
        names = ", ".join(["single", *dict.fromkeys(r.strategy for r in race)])
        lines.append(f'Worth racing: {", ".join(r.label for r in race)} (`--set "strategies=[{names}]"`).')
    elif race:
        closest = race[0]
        lines.append(
            f"No row is predicted to beat {best.name} alone: train there. The closest, to confirm it by a "
            f'race: {closest.label} (`--set "strategies=[single, {closest.strategy}]"`).'
        )
    lines += [
        "",
        "Predictions, not measurements: each strategy at its floor (what it spends beyond the floor is not "
        "known before it runs); the ranges go from the alone timings' slowest to their fastest. 'compute + X of Y': "
        "of the link's Y ms, the X left after backward (DDP's buckets, a streaming server's parts, go out during it).",
    ]
    return "\n".join(lines) + "\n"


def fmt_ms(seconds: float | None) -> str:
    return "failed" if seconds is None else f"{seconds * 1e3:.0f} ms"

"""The verdict: derived from the records, the answer first, one reason per losing row."""

from helpers import typed
from hetbench.results import verdict as verdicts
from hetbench.results.record import from_json


def verdict(records):
    return verdicts.verdict(typed(records))


def what_would_change_it(best, base, floor):
    return verdicts.what_would_change_it(from_json(best), from_json(base), from_json(floor))


def why_it_loses(record, floor):
    return verdicts.why_it_loses(from_json(record), from_json(floor))


FLOOR = {"strategy": "gloo-floor", "status": "ok", "allreduce_s": 0.010, "workers": []}


def row(strategy, samples_per_s, step, balance="auto", transfers=1.0, cv=0.02, **extra):
    workers = [
        {"name": "desk", "device": "cuda", "batch": 192, "standalone_samples_per_s": 3000.0},
        {"name": "mac", "device": "mps", "batch": 64, "standalone_samples_per_s": 1000.0},
    ]
    return {
        "strategy": strategy,
        "status": "ok",
        "balance": balance,
        "samples_per_s": samples_per_s,
        "samples_per_s_cv": cv,
        "step": step,
        "floor_transfers": transfers,
        "workers": workers,
        "config": {"batch_size": 256},
        "target_accuracy": 0.97,
        **extra,
    }


SINGLE = {
    "strategy": "single",
    "status": "ok",
    "samples_per_s": 3000.0,
    "samples_per_s_cv": 0.02,
    "split": [256],
    "workers": [{"name": "desk", "device": "cuda", "batch": 256}],
    "reference": {"worker": "desk", "chosen_by": "fastest alone in this run"},
    "time_to_target_s": 40.0,
}
# step times (s): 0.064 compute for 256 samples split 3:1; what is added differs per row
ALLREDUCE = row(
    "ray-train", 3500.0, {"total_s": 0.073, "sync_overhead_s": 0.009, "wait_s": 0.001}, time_to_target_s=35.0
)
WAITING = row("dask-sync", 2000.0, {"total_s": 0.128, "sync_overhead_s": 0.030, "wait_s": 0.060}, balance="equal")
LINK = row("ray-ps", 2600.0, {"total_s": 0.098, "sync_overhead_s": 0.022, "wait_s": 0.002}, transfers=2.0)
OVERHEAD = row("ray-ps-async", 2200.0, {"total_s": 0.116, "sync_overhead_s": 0.052, "wait_s": 0.001}, transfers=2.0)


def test_a_strategy_that_beats_the_best_machine_alone_is_named_with_its_figures():
    lines = verdict([SINGLE, FLOOR, ALLREDUCE, WAITING, LINK, OVERHEAD])
    assert lines[0] == (
        "Verdict: use ray-train [auto] on desk (cuda, batch 192) + mac (mps, batch 64): 97% test accuracy "
        "after 35 s of training against 40 s for desk alone; 3,500 samples/s, 1.17x desk alone (3,000)."
    )
    reasons = {line.split(":")[0].strip(): line for line in lines[1:]}
    assert "waits for the slow worker" in reasons["dask-sync [equal]"]
    assert "link-bound" in reasons["ray-ps [auto]"]
    assert "overhead" in reasons["ray-ps-async [auto]"]


def test_a_row_that_ends_under_the_baselines_accuracy_says_by_how_much():
    base = {**SINGLE, "final_accuracy": 0.937}
    stale = {**OVERHEAD, "final_accuracy": 0.916}
    kept = {**ALLREDUCE, "final_accuracy": 0.933}  # 0.4 points under: the same model, as far as we claim
    lines = verdict([base, FLOOR, kept, stale])
    assert lines[0].startswith("Verdict: use ray-train [auto]")
    assert lines[1].endswith("; it ends 2.1 points less accurate than desk alone")


def test_when_nothing_beats_one_machine_it_says_so_and_what_would_change_it():
    lines = verdict([SINGLE, FLOOR, WAITING, LINK])
    assert lines[0].startswith("Verdict: keep to desk alone (3,000 samples/s): no strategy reaches 97% sooner here")
    # the desk alone at 3,000 and both at 4,000 samples/s save 1/3000 - 1/4000 s a sample: one 10 ms
    # all-reduce pays from 120 samples a step; at 256, an all-reduce under 21 ms pays
    assert "a global batch above 120 (now 256)" in lines[1] and "takes under 21 ms" in lines[1]


def test_a_gain_within_the_repeats_ranges_is_no_gain_where_nothing_reached_the_target():
    alone = {**SINGLE, "time_to_target_s": None, "repeat_samples_per_s": [2900.0, 3000.0, 3100.0]}
    close = row("ray-train", 3050.0, ALLREDUCE["step"], repeat_samples_per_s=[3000.0, 3050.0, 3150.0])
    assert verdict([alone, FLOOR, close])[0].startswith(
        "Verdict: keep to desk alone (3,000 samples/s): no strategy beats it beyond the repeats' ranges here "
        "(best samples/s: ray-train [auto], 1.02x)."
    )


def test_no_verdict_without_the_baseline_or_a_distributed_row():
    assert verdict([FLOOR, LINK]) == [] and verdict([SINGLE, FLOOR]) == []


def test_machines_that_add_no_speed_are_told_so():
    slow = row("ray-ps", 1000.0, LINK["step"])
    for w in slow["workers"]:
        w["standalone_samples_per_s"] = 1000.0
    assert "add no speed" in what_would_change_it(slow, {**SINGLE, "samples_per_s": 2000.0}, FLOOR)[0]
    assert why_it_loses({"strategy": "ray-ps", "step": {}}, FLOOR) == "no step timings in its record"


def test_what_if_predicts_other_links_and_batches_from_this_runs_measurements():
    from hetbench.results.whatif import floor_on, whatif

    floor = {**FLOOR, "bytes": 4_800_000, "link": None}
    # no emulated link: the whole measured 10 ms is the fixed part; 100 Mbit/s adds 4.8 MB x 8 / 1e8 = 384 ms
    assert floor_on(from_json(floor), 100e6) == 0.010 + 0.384
    # emulated at 100mbit and measured 394 ms: the same fixed 10 ms, so 10 Gbit/s takes 10 + 3.84 ms
    emulated = {**floor, "allreduce_s": 0.394, "link": {"rate": "100mbit"}}
    assert abs(floor_on(from_json(emulated), 10e9) - 0.01384) < 1e-9
    text = whatif(typed([SINGLE, floor, ALLREDUCE]))
    # 256 samples split by speed (4,000 samples/s together): 64 ms, plus one all-reduce a step
    (row,) = [line for line in text.splitlines() if line.replace(" ", "").startswith("|ray-train[auto]|256|")]
    assert [cell.strip() for cell in row.split("|")[3:7]] == [
        "3,289 (1.10x)",
        "2,278 (0.76x)",
        "962 (0.32x)",
        "559 (0.19x)",
    ]
    # its own link and batch, by the model (no plan in this record): 3,459 predicted against 3,500 measured
    assert checked_rows(text)["ray-train [auto]"] == ["3,459", "model", "3,500", "-1%", "-", "-"]
    assert text.startswith("What if (predictions from this run's measurements, not measured)")
    assert whatif(typed([SINGLE, ALLREDUCE])) == ""  # no floor: nothing to predict from


def test_the_plans_check_says_which_worker_and_which_side_of_the_step_it_missed_on():
    from hetbench.results.whatif import whatif

    floor = {**FLOOR, "bytes": 4_800_000, "link": None}
    step = {"compute_s": 0.072, "total_s": 0.080, "sync_overhead_s": 0.008, "wait_s": 0.001}
    # predicted 4,000 samples/s: a step of 64 ms, 60 of them the slowest share's compute alone
    plan = {"samples_per_s": 4000.0, "low": 3800.0, "high": 4100.0, "compute_s": 0.060}
    older = row("dask-sync", 3200.0, step, plan=plan)  # from before each worker's compute was kept
    each = {
        "worker_compute_s": {"desk": 0.055, "mac": 0.060},
        "timed_alone_s": {"desk": [0.08, 0.04], "mac": [0.25, 0.12]},
    }
    # at the speeds timed at the run's start; at the workers' speeds around the row, 3,040 samples/s
    planned = row("torch-ddp", 3200.0, step, plan={**plan, **each, "at_row_samples_per_s": 3040.0})
    # a record whose check was taken at the row's speeds (d054204 to c78365f) kept the start's beside it
    at_row = row("ray-train", 3200.0, step, plan={**plan, **each, "at_row": True, "at_start_samples_per_s": 3040.0})
    unsplit = row("ray-ps-async", 3000.0, step, plan={"samples_per_s": 2850.0, "low": 2800.0, "high": 2900.0, **each})
    older_unsplit = row("ray-ps-async", 3000.0, step, balance="equal", plan=unsplit["plan"] | {"worker_compute_s": {}})
    for record in (planned, at_row, unsplit, older_unsplit):
        record["workers"] = [{**w, "compute_s": s} for w, s in zip(record["workers"], (0.050, 0.072))]
    text = whatif(typed([SINGLE, floor, older, planned, at_row, unsplit, older_unsplit]))
    said = " ".join(text.split())  # the notes under the table, however wrapped
    # the line each prediction ran through: each worker's step alone at the start at 256 and at 128
    assert "Their steps alone at the start, the global batch's/the equal share's, ms: desk 80/40, mac 250/120." in said
    rows = checked_rows(text)  # one prediction a row, which one said, and where the step went
    # +25% over measured: 60 ms of compute against 72, and 4 ms of the rest against 8; the mac's share missed
    assert rows["dask-sync [auto]"] == ["4,000", "plan", "3,200", "+25%", "60/72", "4/8"]
    assert rows["torch-ddp [auto]"][3:] == ["+25%", "desk 55/50, mac 60/72", "4/8"]
    assert rows["ray-train [auto]"][3:] == ["+25%", "desk 55/50, mac 60/72", "4/8"]
    assert rows["ray-ps-async [auto]"][3:] == ["-5%", "desk 55/50, mac 60/72", "-"]  # no synchronous step: no rest
    # an asynchronous row from before each worker's compute was kept: no compute, no rest
    assert rows["ray-ps-async [equal]"][3:] == ["-5%", "-", "-"]
    # the same plan at the other speeds kept: around the row, or (older records) at the start
    assert "The same plan with each worker at the row's speeds: torch-ddp [auto] -5%." in said
    assert "The same plan with each worker at the start's speeds: ray-train [auto] -5%." in said
    assert all(len(line) <= 400 for line in text.splitlines())  # a table and short lines, no wall of prose


def checked_rows(text: str) -> dict[str, list[str]]:
    """The what-if's table of each row against its prediction: row label -> its other cells."""
    table = text.split("Each row against a prediction of it")[1]
    lines = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| row ")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_what_if_predicts_each_row_at_its_own_split():
    from hetbench.results.whatif import predicted

    floor = {**FLOOR, "bytes": 4_800_000, "link": None}
    equal = row("dask-sync", 1500.0, {"total_s": 0.17, "sync_overhead_s": 0.012, "wait_s": 0.002}, balance="equal")
    equal["workers"] = [{**w, "batch": 128} for w in equal["workers"]]
    # 128 samples on the mac at 1,000 samples/s: 128 ms, not the 64 ms of a split by speed; + 10 ms floor
    assert predicted(from_json(equal), from_json(floor), 256, None) == 256 / (0.128 + 0.010)


def test_what_if_is_checked_against_a_run_over_an_emulated_link():
    from hetbench.results.whatif import against

    floor = {**FLOOR, "bytes": 4_800_000, "link": None}
    linked_floor = {**floor, "allreduce_s": 0.400, "link": {"rate": "100mbit"}}
    linked = row("ray-train", 500.0, {"total_s": 0.5, "sync_overhead_s": 0.4, "wait_s": 0.0})
    text = against(typed([SINGLE, floor, ALLREDUCE]), typed([linked_floor, linked]))
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:6]] for line in text.splitlines()[4:]}
    # the floor: 10 ms fixed + 384 ms at 100 Mbit/s, against 400 measured
    assert lines["gloo-floor"] == ["-", "394 ms", "400 ms", "-2%"]
    # 256 / (0.064 + 0.394 + 0 own overhead) = 559 predicted, 500 measured
    assert lines["ray-train"] == ["auto", "559", "500", "+12%"]
    assert against(typed([SINGLE, floor, ALLREDUCE]), typed([linked])) == ""  # the linked run names no rate


def test_times_to_target_within_the_runs_resolution_and_spread_are_said_to_match():
    # accuracy checked every 25 steps of 256 samples: at 3,000 samples/s one interval is 2.1 s
    config = {"batch_size": 256, "eval_every": 25}
    base = {**SINGLE, "config": config}
    close = {**ALLREDUCE, "config": config, "time_to_target_s": 38.5}
    assert verdict([base, FLOOR, close])[0] == (
        "Verdict: keep to desk alone (3,000 samples/s): ray-train [auto] reaches 97% test accuracy in the "
        "same training time as desk alone, as far as this run can tell (38 s and 40 s: within 2.1 s)."
    )
    # 5 s apart is beyond 2.1 s, unless the repeats' own times spread wider
    apart = {**ALLREDUCE, "config": config, "time_to_target_s": 35.0}
    assert "after 35 s of training against 40 s for desk alone, beyond 2.1 s;" in verdict([base, FLOOR, apart])[0]
    spread = {**apart, "repeat_time_to_target_s": [31.0, 35.0, 39.0]}
    assert "as far as this run can tell (35 s and 40 s: within 9.8 s)" in verdict([base, FLOOR, spread])[0]


def test_the_checks_around_the_crossing_set_the_resolution_and_steps_stand_beside_the_seconds():
    # fine checks near the target: the crossing lay within 0.3 s (the driver's widest bracket), not
    # within one eval_every interval (2.1 s here), so 1.5 s apart is a gain this run can tell
    # (the two on other seeds: their repeats are not paired)
    config = {"batch_size": 256, "eval_every": 25}
    fine = {"repeat_target_bracket_s": [0.3, 0.2, 0.25], "repeat_time_to_target_s": [38.5, 38.5, 38.5]}
    base = {**SINGLE, **fine, "config": {**config, "seed": 0}, "steps_to_target": 47}
    row = {**ALLREDUCE, **fine, "config": {**config, "seed": 1}, "time_to_target_s": 38.5, "steps_to_target": 46}
    assert (
        "97% test accuracy after 38 s (46 steps) of training against 40 s (47 steps) for desk alone, beyond"
        in (verdict([base, FLOOR, row])[0])
    )
    # the base's own repeats spread 2 s: the same 1.5 s is within it
    spread = {**base, "repeat_time_to_target_s": [39.0, 40.0, 41.0]}
    assert (
        "as far as this run can tell (38 s (46 steps) and 40 s (47 steps): within 2.3 s)"
        in verdict([spread, FLOOR, row])[0]
    )


def paired(times, brackets, time_to_target, **extra):
    """A row's (or the baseline's) evaluated repeats on seeds 0, 1, 2 of one run."""
    return {
        "repeat_time_to_target_s": times,
        "repeat_target_bracket_s": brackets,
        "time_to_target_s": time_to_target,
        "config": {"batch_size": 256, "eval_every": 25, "seed": 0},
        **extra,
    }


def test_repeats_on_the_same_seeds_are_compared_pair_by_pair():
    # the baseline's repeats spread 6 s, wider than the 2 s gain: unpaired, the times would match;
    # the pairs' gains (2, 1.5, 2.5 s) spread 1 s, and the checks around the crossings 0.5 s
    base = {**SINGLE, **paired([37.0, 40.0, 43.0], [0.5, 0.5, 0.5], 40.0)}
    row = {**ALLREDUCE, **paired([35.0, 38.5, 40.5], [0.5, 0.5, 0.5], 38.5)}
    assert (
        ": 97% test accuracy after 38 s of training against 40 s for desk alone: 2.0 s sooner, the median "
        "of 3 repeats on the same seeds, beyond 1.5 s;"
    ) in verdict([base, FLOOR, row])[0]
    # later in each pair: said so, not hidden as a match, and not recommended for its samples/s
    slow = {**ALLREDUCE, **paired([39.0, 42.0, 45.0], [0.5, 0.5, 0.5], 42.0)}
    assert verdict([base, FLOOR, slow])[2] == "  ray-train [auto]: 1.17x the samples/s, but 2.0 s later to 97%"


def test_a_paired_gain_within_the_checks_and_the_pairs_spread_makes_the_times_match():
    # one crossing of the baseline known only to 2 s: 2.0 s sooner is within 2 s + the gains' 1 s spread
    base = {**SINGLE, **paired([37.0, 40.0, 43.0], [0.5, 2.0, 0.5], 40.0)}
    row = {**ALLREDUCE, **paired([35.0, 38.5, 40.5], [0.5, 0.5, 0.5], 38.5)}
    assert verdict([base, FLOOR, row])[0].endswith(
        " reaches 97% test accuracy in the same training time as desk alone, as far as this run can tell "
        "(38 s and 40 s: +2.0 s, the median of 3 repeats on the same seeds, within 3.0 s)."
    )
    # every pair sooner, but by gains that spread wider than their median
    spread = {**ALLREDUCE, **paired([33.0, 38.5, 42.5], [0.1, 0.1, 0.1], 38.5)}
    assert (
        "(38 s and 40 s: +1.5 s, the median of 3 repeats on the same seeds, within 3.6 s)"
        in (verdict([{**base, "repeat_target_bracket_s": [0.1, 0.1, 0.1]}, FLOOR, spread])[0])
    )


def test_more_repeats_resolve_a_smaller_paired_gain():
    # nine pairs with one outlier each way: their range (2.4 s) would hide the 1.1 s gain; the 75%
    # interval for their median, the 3rd to the 7th of nine, is 1.0-1.2 s
    gains = [0.2, 0.9, 1.0, 1.0, 1.1, 1.1, 1.2, 1.3, 2.6]
    times = [30.0 + i for i in range(9)]
    base = {**SINGLE, **paired(times, [0.3] * 9, 34.0)}
    row = {**ALLREDUCE, **paired([t - g for t, g in zip(times, gains)], [0.3] * 9, 32.9)}
    assert (
        ": 97% test accuracy after 33 s of training against 34 s for desk alone: 1.1 s sooner, the median "
        "of 9 repeats on the same seeds, beyond 0.5 s;"
    ) in verdict([base, FLOOR, row])[0]
    # the first three alone: their range (0.8 s) stays in the margin, and the times match
    three = {key: value[:3] if isinstance(value, list) else value for key, value in row.items()}
    said = verdict([{**base, **paired(times[:3], [0.3] * 3, 31.0)}, FLOOR, three])[0]
    assert "+0.9 s, the median of 3 repeats on the same seeds, within 1.1 s" in said


def test_repeats_that_cannot_be_paired_fall_back_to_the_runs_resolution_and_spread():
    from hetbench.results.verdict import seeded_pairs

    base = {**SINGLE, **paired([37.0, 40.0, 43.0], [0.5, 0.5, 0.5], 40.0)}
    row = {**ALLREDUCE, **paired([35.0, 38.5, 40.5], [0.5, 0.5, 0.5], 38.5)}
    assert seeded_pairs(from_json(row), from_json(base)) == [
        (35.0, 37.0, 0.5, 0.5),
        (38.5, 40.0, 0.5, 0.5),
        (40.5, 43.0, 0.5, 0.5),
    ]
    assert (
        seeded_pairs(from_json({**row, "config": {**row["config"], "seed": 7}}), from_json(base)) is None
    )  # other seeds
    assert (
        seeded_pairs(from_json({**row, "repeat_time_to_target_s": [35.0, 38.5]}), from_json(base)) is None
    )  # other counts
    assert (
        seeded_pairs(from_json({**row, "repeat_time_to_target_s": [35.0, None, 40.5]}), from_json(base)) is None
    )  # not reached
    assert (
        seeded_pairs(from_json({**row, "repeat_target_bracket_s": None}), from_json(base)) is None
    )  # records before brackets
    one = {**row, "repeat_time_to_target_s": [35.0], "repeat_target_bracket_s": [0.5]}
    assert seeded_pairs(from_json(one), from_json({**base, **one})) is None  # one pair is no comparison
    unpaired = {**row, "config": {**row["config"], "seed": 7}}
    assert "as far as this run can tell (38 s and 40 s: within 6.5 s)" in verdict([base, FLOOR, unpaired])[0]


# The rule (docs/design.md, "The verdict's rule"): sooner to the target, as accurate; else keep to one machine.
TIMED = {"config": {"batch_size": 256, "eval_every": 25}, "target_accuracy": 0.9}
TOLERANT_BASE = {**SINGLE, **TIMED, "time_to_target_s": 7.0, "final_accuracy": 0.943}


def test_a_throughput_win_that_is_later_to_the_target_is_not_recommended_and_says_why():
    later = {
        **row("torch-ddp", 3120.0, ALLREDUCE["step"]),
        **paired([8.8, 8.9, 8.7], [0.3, 0.3, 0.3], 8.8),
        "target_accuracy": 0.9,
        "final_accuracy": 0.943,
        "config": {
            "batch_size": 256,
            "eval_every": 25,
            "seed": 0,
            "torch-ddp": {"compression": "powersgd", "powersgd_rank": 4},
        },
    }
    base = {**TOLERANT_BASE, **paired([7.0, 7.1, 6.9], [0.3, 0.3, 0.3], 7.0)}
    lines = verdict([base, FLOOR, later])
    assert lines[0] == (
        "Verdict: keep to desk alone (3,000 samples/s): no strategy reaches 90% sooner here "
        "(best samples/s: torch-ddp [auto], 1.04x)."
    )
    assert lines[2] == "  torch-ddp [auto]: 1.04x the samples/s, but 1.8 s later to 90% (PowerSGD rank 4)"


def test_a_throughput_win_that_loses_accuracy_is_not_recommended_even_when_sooner():
    stale = {**row("ray-ps-async", 3600.0, OVERHEAD["step"]), **TIMED, "time_to_target_s": 2.0, "final_accuracy": 0.922}
    lines = verdict([TOLERANT_BASE, FLOOR, stale])
    assert lines[0].startswith("Verdict: keep to desk alone (3,000 samples/s): no strategy reaches 90% sooner here")
    assert lines[2] == "  ray-ps-async [auto]: 1.20x the samples/s, but 2.1 points less accurate (stale gradients)"
    # a setting: at a 3-point tolerance the same row is the answer
    lenient = {**TOLERANT_BASE, "config": {**TIMED["config"], "accuracy_tolerance": 0.03}}
    assert verdict([lenient, FLOOR, stale])[0].startswith("Verdict: use ray-ps-async [auto]")


def test_a_gain_within_the_resolution_keeps_to_one_machine_and_says_the_times_match():
    close = {**row("torch-ddp", 3300.0, ALLREDUCE["step"]), **TIMED, "time_to_target_s": 6.0, "final_accuracy": 0.943}
    # one check interval: 25 steps of 256 samples at 3,000 samples/s, 2.1 s
    assert verdict([TOLERANT_BASE, FLOOR, close])[0] == (
        "Verdict: keep to desk alone (3,000 samples/s): torch-ddp [auto] reaches 90% test accuracy in the same "
        "training time as desk alone, as far as this run can tell (6 s and 7 s: within 2.1 s)."
    )


def test_a_clear_win_sooner_and_as_accurate_is_recommended_with_its_figures():
    clear = {
        **row("ray-localsgd", 3900.0, ALLREDUCE["step"]),
        **TIMED,
        "time_to_target_s": 3.0,
        "final_accuracy": 0.941,
    }
    assert verdict([TOLERANT_BASE, FLOOR, clear]) == [
        "Verdict: use ray-localsgd [auto] on desk (cuda, batch 192) + mac (mps, batch 64): 90% test accuracy after "
        "3 s of training against 7 s for desk alone, beyond 2.1 s; 3,900 samples/s, 1.30x desk alone (3,000)."
    ]


def test_where_no_row_reaches_the_target_samples_per_s_decide_beyond_the_repeats_ranges():
    base = {**TOLERANT_BASE, "time_to_target_s": None, "repeat_samples_per_s": [2950.0, 3000.0, 3050.0]}
    ahead = {
        **row("ray-ps", 3400.0, LINK["step"], transfers=2.0),
        **TIMED,
        "time_to_target_s": None,
        "final_accuracy": 0.943,
        "repeat_samples_per_s": [3300.0, 3400.0, 3500.0],
    }
    assert verdict([base, FLOOR, ahead])[0] == (
        "Verdict: use ray-ps [auto] on desk (cuda, batch 192) + mac (mps, batch 64): 3,400 samples/s, 1.13x desk "
        "alone (3,000), beyond the repeats' ranges; no row reached 90% in this run."
    )
    overlapping = {**ahead, "repeat_samples_per_s": [3000.0, 3400.0, 3500.0]}  # its slowest repeat ties
    assert verdict([base, FLOOR, overlapping])[0] == (
        "Verdict: keep to desk alone (3,000 samples/s): no strategy beats it beyond the repeats' ranges here "
        "(best samples/s: ray-ps [auto], 1.13x)."
    )


def test_a_second_row_that_also_pays_says_so_and_by_how_much_less_than_the_answer():
    sooner = row("torch-ddp", 3600.0, ALLREDUCE["step"], time_to_target_s=30.0)
    lines = verdict([SINGLE, FLOOR, ALLREDUCE, sooner])
    assert lines[0].startswith("Verdict: use torch-ddp [auto]")
    assert lines[1] == (
        "  ray-train [auto]: 1.17x, also pays (5.0 s sooner to 97%; the answer: 10.0 s); link-bound: moving "
        "the model 1.0x a step takes 9 ms of each 73 ms step at the floor's 10.0 ms"
    )


def test_a_row_measured_while_a_machine_slowed_is_flagged_in_the_verdict_and_the_table():
    from hetbench.results.report import markdown

    hot = {"desk": {"before": [3000.0], "after": [3010.0]}, "mac": {"before": [1000.0], "after": [820.0]}}
    noisy = {"desk": {"before": [3000.0, 2500.0], "after": [2900.0, 3500.0]}}  # +18%, its passes each way
    records = [SINGLE, {**ALLREDUCE, "standalone_timings": hot}, {**LINK, "standalone_timings": noisy}, FLOOR]
    lines = verdict(records)
    assert lines[0].startswith("Verdict: use ray-train [auto]")
    assert lines[0].endswith("(flagged: mac slowed 18% during this row).")
    assert not any("flagged" in line for line in lines[1:])  # desk: one pass slower, one faster
    table = markdown(typed(records))
    assert "| ok (mac -18%) " in table and table.count("(mac ") == 1


PLAIN_DROPOUT = {
    "name": "tiny-mlp",
    "spec": "tiny_workload:plain",
    "parameters": 676,
    "code": "0123456789ab",
    "exact": False,
    "inexact": "its dropout (2) draws from each process's own random stream",
}


def test_a_workload_whose_dropout_is_not_keyed_is_not_paired_by_seed_and_says_so():
    from hetbench.results.verdict import seeded_pairs

    base = {**SINGLE, **paired([37.0, 40.0, 43.0], [0.5, 0.5, 0.5], 40.0), "workload": PLAIN_DROPOUT}
    row = {**ALLREDUCE, **paired([35.0, 38.5, 40.5], [0.5, 0.5, 0.5], 38.5), "workload": PLAIN_DROPOUT}
    assert seeded_pairs(from_json(row), from_json(base)) is None  # their trajectories part at the first step
    lines = verdict([base, FLOOR, row])
    assert "(38 s and 40 s: within 6.5 s)" in lines[0]  # by the repeats' spread and the checks, not by pairs
    assert lines[-1] == (
        "  Not exact (tiny-mlp): its dropout (2) draws from each process's own random stream; "
        "compared by repeats, not paired by seed."
    )


def test_what_would_change_it_speaks_of_the_workload_its_bytes_and_each_devices_compute():
    facts = {**PLAIN_DROPOUT, "name": "shapes-resnet", "parameters": 308_650, "exact": True, "inexact": None}
    floor = {**FLOOR, "bytes": 308_650 * 4}
    said, *on_this_link = what_would_change_it({**LINK, "workload": facts}, SINGLE, floor)
    assert said.startswith(
        "shapes-resnet moves 1.2 MB a step and computes a sample in desk (cuda) 0.33 ms, mac (mps) 1.00 ms alone: "
    )
    assert said.endswith("or at this batch a link whose all-reduce of its 1.2 MB takes under 21 ms")
    assert on_this_link == []  # a 10 ms floor: this link pays already at this batch


def test_what_would_change_it_names_the_sync_interval_and_the_byte_cut_that_pay_on_this_link():
    # 256 samples at 3,000/s alone or 4,000/s together: the other machine saves 21.3 ms of compute a step
    facts = {**PLAIN_DROPOUT, "name": "shapes-resnet", "parameters": 308_650, "exact": True, "inexact": None}
    row = {**LINK, "workload": facts}
    floor = {**FLOOR, "allreduce_s": 0.110, "bytes": 1_234_600, "link": {"rate": "100mbit"}}  # 98.8 ms of bytes
    said = what_would_change_it(row, SINGLE, floor)
    assert said[0].endswith("takes under 21 ms") and said[1:] == [
        "one all-reduce every 6 steps (ray-localsgd's sync_every), or 9.8x fewer bytes (a bfloat16 wire halves them)"
    ]
    latency = {**floor, "allreduce_s": 0.130, "link": {"rate": "1gbit"}}  # 9.9 ms of bytes, 120 ms fixed
    assert what_would_change_it(row, SINGLE, latency)[1:] == [
        "one all-reduce every 7 steps (ray-localsgd's sync_every); no fewer bytes would do: this link's fixed "
        "120 ms alone is more"
    ]
    unemulated = {**floor, "link": None}  # no rate to split the floor by: the interval alone
    assert what_would_change_it(row, SINGLE, unemulated)[1:] == [
        "one all-reduce every 6 steps (ray-localsgd's sync_every)"
    ]

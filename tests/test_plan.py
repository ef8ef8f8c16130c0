"""`hetbench plan`: the predictions' arithmetic against hand-made measurements, then the command on the
session's cluster."""

import re
from dataclasses import replace

import pytest

from helpers import sets, small_config
from hetbench import planning
from hetbench.clock import median
from hetbench.config import WorkerConfig
from hetbench.errors import UserError
from hetbench.plan import (
    Alone,
    Measured,
    async_rate,
    buckets,
    lockstep_wait,
    markdown,
    overlapped_s,
    predict,
    predict_row,
    second_batch,
    step_rate,
    to_race,
    worth_racing,
)
from hetbench.results.record import FloorPath, from_json

ALL = "strategies=[single, ray-ps, ray-ps-async, ray-train, dask-sync, ray-localsgd, torch-ddp]"
PAIR = "workers=[{name: desk}, {name: mac, slowdown: 3.0}]"


def desk_and_mac(mac_times: float = 3.0, allreduce_s: float = 0.05, roundtrip_s: float = 0.1) -> Measured:
    """A desk taking 20 ms a step plus 1 ms a sample, a mac `mac_times` as long, the CNN's bytes."""
    desk = Alone("desk", 64, 256, (0.083, 0.085, 0.084), (0.275, 0.277, 0.276))
    mac = Alone("mac", 64, 256, tuple(t * mac_times for t in desk.small_s), tuple(t * mac_times for t in desk.large_s))
    return Measured((desk, mac), allreduce_s, roundtrip_s, 1_199_882 * 4)


def floor_records(measured: Measured) -> list:
    """The race's two floors as its records hold them: desk_and_mac's all-reduce and round trip."""
    return [
        from_json(
            {
                "strategy": "gloo-floor",
                "status": "ok",
                "allreduce_s": measured.allreduce_s,
                "bytes": measured.model_bytes,
            }
        ),
        from_json({"strategy": "ps-floor", "status": "ok", "roundtrip_s": measured.roundtrip_s}),
    ]


def config(tmp_path, *overrides):
    return small_config(
        tmp_path, ALL, PAIR, "batch_size=256", "balance=[equal, auto]", "standalone_steps=2", *overrides
    )


def test_a_step_alone_is_the_line_through_the_two_batches():
    desk = desk_and_mac().alone[0]
    assert desk.step_s(256) == pytest.approx(0.276) and desk.step_s(64) == pytest.approx(0.084)
    assert desk.step_s(0) == pytest.approx(0.020) and desk.step_s(128) == pytest.approx(0.148)
    assert desk.step_s(256, min) == pytest.approx(0.275) and desk.step_s(256, max) == pytest.approx(0.277)
    only_large = Alone("desk", 64, 256, (), (0.276,))  # the budget cut the small batch: no fixed cost
    assert only_large.step_s(128) == pytest.approx(0.138)
    assert desk.timed() == "a step of 256 in 276 ms, of 64 in 84 ms" and only_large.timed() == "a step of 256 in 276 ms"
    # the ResNet's "mac" on this host: a sample costs 10.4 ms in a batch of 64, 12.8 ms in one of 256;
    # between the two the line holds (its zero is at 13 samples); below 64, the small batch's cost a sample
    resnet = Alone("mac", 64, 256, (0.667,), (3.28,))
    assert resnet.step_s(68) == pytest.approx(0.667 + 4 * (3.28 - 0.667) / 192) and resnet.step_s(256) == 3.28
    assert resnet.step_s(32) == pytest.approx(0.667 / 2) and resnet.step_s(0) == 0


def test_a_row_s_workers_compute_as_much_slower_as_timed_beside_each_other(tmp_path):
    measured = desk_and_mac()
    desk, mac = measured.alone
    # on one box the two share its cores. Timed together, each step started with the other's (as a
    # synchronous row's after its sync), both steps of 64 took 10% longer; each at its own pace the
    # desk's took 5% longer, the mac's less than alone
    desk = replace(desk, lockstep_s=(0.0923, 0.0924, 0.0931), free_s=(0.0882,))
    shared = replace(measured, alone=(desk, replace(mac, lockstep_s=(0.2772, 0.2771, 0.2790), free_s=(0.2500,))))
    assert [a.sharing(True) for a in shared.alone] == pytest.approx([1.1, 1.1])
    assert [a.sharing(False) for a in shared.alone] == pytest.approx([1.05, 1.0])  # faster: noise
    said = "a step of 256 in 828 ms, of 64 in 252 ms; beside the others 277 in lockstep, 250 at its own pace"
    assert shared.alone[1].timed() == said
    assert shared.alone[1].at_speed(256 / 1.656).sharing(True) == pytest.approx(1.1)  # an hour's drift keeps it
    cfg = config(tmp_path, "strategies=[single, dask-sync, ray-ps-async]")
    rows, plain = ({r.label: r for r in predict(cfg, m)} for m in (shared, measured))
    auto = rows["dask-sync [auto]"]
    (fast, slow) = auto.split
    assert auto.compute_s == pytest.approx(mac.step_s(slow) * 1.1) and auto.compute_s > desk.step_s(fast)
    assert auto.shares_s == pytest.approx((desk.step_s(fast) * 1.1, mac.step_s(slow) * 1.1))  # each worker's
    # the best alone trains alone: only the row's side moved
    assert auto.vs_alone[1] == pytest.approx(auto.samples_per_s[1] / (256 / desk.step_s(256)))
    assert auto.split == plain["dask-sync [auto]"].split  # auto splits by the speeds alone, as a race does
    # an asynchronous row's workers at their own pace: the desk's steps 5% longer, the mac's as alone
    cfg, alone = config(tmp_path, "strategies=[single, ray-ps-async]"), measured.alone[0]
    at_own_pace = replace(measured, alone=(alone.at_speed(256 / alone.step_s(256) / 1.05), mac))
    split = list(rows["ray-ps-async [auto]"].split)
    expected = predict_row(cfg, at_own_pace, "ray-ps-async", "auto", split).samples_per_s
    assert rows["ray-ps-async [auto]"].samples_per_s == pytest.approx(expected)


def test_a_step_in_lockstep_waits_for_whichever_worker_is_slowest_in_it(tmp_path):
    # two workers slow by turns: each one's median step says 100 ms, yet four steps of five wait 130
    a = Alone("a", 32, 64, (0.1,) * 3, (0.2,) * 3, lockstep_s=(0.1, 0.13, 0.1, 0.1, 0.13))
    b = Alone("b", 32, 64, (0.1,) * 3, (0.2,) * 3, lockstep_s=(0.13, 0.1, 0.1, 0.13, 0.1))
    assert lockstep_wait((a, b)) == pytest.approx(1.3)
    assert lockstep_wait((a,)) == 1.0 and lockstep_wait((replace(a, lockstep_s=()), b)) == 1.0
    measured = Measured((a, b), 0.0, 0.0, 4)
    synchronous = measured.in_a_row(True)
    assert synchronous.waits == pytest.approx(1.3) and measured.in_a_row(False).waits == 1.0
    # the synchronous step: its slowest share stretched by its sharing (1.3 / 1.0), then by the wait
    assert step_rate(synchronous, [32, 32], 1.0, 4, median) == pytest.approx(64 / (0.1 * 1.0 * 1.3))


def test_the_second_batch_is_the_equal_split_s_share():
    assert [second_batch(256, n) for n in (1, 2, 3, 4)] == [128, 128, 85, 64]
    assert second_batch(3, 4) == 1


def test_a_race_checks_each_row_against_the_plan_made_at_its_start_and_at_its_speed_around_it(tmp_path):
    measured = desk_and_mac()
    desk, mac = measured.alone
    slower = mac.at_speed(128.0)  # timed at 309 samples/s at the start, 128 around the row
    assert slower.step_s(256) == pytest.approx(2.0) and slower.step_s(0) == pytest.approx(mac.step_s(0) * 2 / 0.828)
    floors = floor_records(measured)
    speeds = {"desk": 256 / 0.276, "mac": 128.0}
    workers = [{"name": n, "device": "cpu", "batch": 128, "standalone_samples_per_s": v} for n, v in speeds.items()]
    row = {"strategy": "torch-ddp", "status": "ok", "balance": "equal", "samples_per_s": 200.0, "workers": workers}
    row["standalone_timings"] = {n: {"before": [v], "after": [v]} for n, v in speeds.items()}
    cfg = config(tmp_path)
    ((_, checked),) = planning.planned_rows(cfg, (measured.alone, ()), floors, [from_json(row)])
    # what a plan made before the race said: the mac's share at its speed as timed at the start (the
    # split as the race split it), then the all-reduce
    assert checked.plan.samples_per_s == pytest.approx(256 / (mac.step_s(128) + 0.05))
    assert checked.plan.compute_s == pytest.approx(mac.step_s(128)) and not checked.plan.at_row
    # and at the mac's speed around the row, which its brackets timed slower
    assert checked.plan.at_row_samples_per_s == pytest.approx(256 / (slower.step_s(128) + 0.05))
    assert checked.plan.at_start_samples_per_s is None  # the older records' name for the start's, beside the row's
    del row["standalone_timings"]  # not timed around the row: nothing to rescale to
    ((_, unbracketed),) = planning.planned_rows(cfg, (measured.alone, ()), floors, [from_json(row)])
    assert unbracketed.plan.samples_per_s == pytest.approx(checked.plan.samples_per_s)
    assert unbracketed.plan.at_row_samples_per_s is None


def test_a_row_whose_repeats_ended_at_different_splits_is_predicted_at_each(tmp_path):
    measured = desk_and_mac()
    floors = floor_records(measured)
    workers = [{"name": "mac", "batch": 52}, {"name": "desk", "batch": 204}]  # as the last repeat ended
    row = {"strategy": "ray-train", "status": "ok", "balance": "auto", "split": [195, 61], "workers": workers}
    row |= {"samples_per_s": 660.0, "repeat_samples_per_s": [695.0, 630.0, 660.0]}
    # auto re-split the first repeat's warm-up to 189/67 and the last's to 204/52; the second kept 195/61
    row["events"] = [
        {"step": 4, "rebalanced": {"desk": 189, "mac": 67}, "in_warmup": True, "repeat": 0},
        {"step": 4, "rebalanced": {"desk": 204, "mac": 52}, "in_warmup": True, "repeat": 2},
    ]
    record = from_json(row)
    ends = [{"desk": 189, "mac": 67}, {"desk": 195, "mac": 61}, {"desk": 204, "mac": 52}]
    assert record.repeat_splits(["desk", "mac"]) == ends
    ((_, checked),) = planning.planned_rows(config(tmp_path), (measured.alone, ()), floors, [record])
    desk, mac = measured.alone
    each = [256 / (max(desk.step_s(d), mac.step_s(m)) + 0.05) for d, m in ((189, 67), (195, 61), (204, 52))]
    assert checked.plan.samples_per_s == pytest.approx(sorted(each)[1]) and len(set(each)) == 3
    # a record from before events named their repeat: every repeat at the last batches
    for event in row["events"]:
        del event["repeat"]
    assert from_json(row).repeat_splits(["desk", "mac"]) == [{"desk": 204, "mac": 52}] * 3


def test_a_synchronous_row_waits_for_the_slowest_share_then_moves_the_model(tmp_path):
    measured = desk_and_mac()
    rows = {r.label: r for r in predict(config(tmp_path), measured)}
    assert "single" not in rows and len(rows) == 12  # six strategies, two splits each
    desk, mac = measured.alone
    equal = rows["torch-ddp [equal]"]
    assert equal.split == (128, 128) and equal.compute_s == pytest.approx(mac.step_s(128))
    assert equal.samples_per_s[1] == pytest.approx(256 / (mac.step_s(128) + 0.05))
    assert equal.vs_alone[1] == pytest.approx(equal.samples_per_s[1] / (256 / desk.step_s(256)))
    assert equal.verdict.startswith("will not pay: the slowest share takes")
    # auto splits by the speeds alone; the parameter server moves the model twice a step
    auto = rows["ray-ps [auto]"]
    assert auto.split == (192, 64) and auto.sync_s == pytest.approx(0.1)
    assert auto.samples_per_s[1] == pytest.approx(256 / (max(desk.step_s(192), mac.step_s(64)) + 0.1))
    low, mid, high = auto.samples_per_s
    assert low < mid < high  # from the timings' slowest to their fastest
    # local SGD moves it twice a round of sync_every (8) steps
    assert rows["ray-localsgd [auto]"].sync_s == pytest.approx(2 * 0.05 / 8)
    # asynchronous: each worker at its own pace, a round trip after each of its steps
    expected = 192 / (desk.step_s(192) + 0.1) + 64 / (mac.step_s(64) + 0.1)
    assert rows["ray-ps-async [auto]"].samples_per_s[1] == pytest.approx(expected)
    assert "stale" in rows["ray-ps-async [auto]"].note


def test_an_asynchronous_worker_beside_the_server_pays_no_trip_and_waits_for_the_slowest(tmp_path):
    measured = replace(desk_and_mac(roundtrip_s=1.0), beside_server=frozenset({"desk"}))
    desk, mac = measured.alone
    mac_cycle = mac.step_s(64) + 1.0  # over the link; the desk's round trips are on loopback
    assert async_rate(measured, [192, 64], 4, median, None) == pytest.approx(64 / mac_cycle + 192 / desk.step_s(192))
    # max_staleness 2: while the mac makes one update the desk makes 3 (it starts at most 2 versions
    # past the mac's, and finishes the one in hand), not the 5.9 its pace would
    assert mac_cycle / desk.step_s(192) > 3
    assert async_rate(measured, [192, 64], 4, median, 2) == pytest.approx((64 + 3 * 192) / mac_cycle)
    rows = {r.label: r for r in predict(config(tmp_path), measured)}  # ray-ps-async's default bound: 2
    assert rows["ray-ps-async [auto]"].samples_per_s[1] == pytest.approx((64 + 3 * 192) / mac_cycle)


def test_only_workers_on_the_servers_node_across_a_link_are_beside_it():
    workers = (WorkerConfig(name="desk", node="desktop"), WorkerConfig(name="mac", node="mac"))
    linked = FloorPath(["desk", "mac"], ["desktop", "mac"], ["10.231.0.1", "10.231.0.2"], driver_end=0)
    assert planning.beside_server(workers, linked) == {"desk"}
    assert planning.beside_server(workers, replace(linked, driver_end=1)) == {"mac"}
    # one machine's loopback for both ends: the trip measured is every worker's
    assert planning.beside_server(workers, replace(linked, ips=["192.0.2.2", "192.0.2.2"])) == frozenset()
    assert (
        planning.beside_server(workers, replace(linked, driver_end=None))
        == planning.beside_server(workers, None)
        == frozenset()
    )


# The CNN's gradients as measured on this host: fc2's and fc1's (4.7 MB) ready halfway through a step,
# the convs' at backward's end, the optimizer's step after them (LoadedWorkload.gradients_ready)
CNN_READY = ((0.46, 40), (0.46, 5_120), (0.49, 512), (0.49, 4_718_592), (0.95, 256), (0.95, 73_728), (0.97, 128))
CNN_READY += ((0.97, 1_152),)


def test_ddp_rows_all_reduce_a_bucket_while_backward_fills_the_next(tmp_path):
    assert buckets(CNN_READY) == [(0.49, 4_724_264), (0.97, 75_264)]  # the first closes past 1 MiB
    total = 4_799_528
    fc1_through = 0.49 * 0.2 + 0.2 * 4_724_264 / total  # sent while the convs' backward runs
    expected = max(fc1_through, 0.97 * 0.2) + 0.2 * 75_264 / total + 0.03 * 0.2  # then the optimizer
    assert overlapped_s(0.2, 0.2, CNN_READY) == pytest.approx(expected)
    assert overlapped_s(0.2, 0.002, CNN_READY) == pytest.approx(0.2, rel=1e-3)  # a fast link hides behind backward
    # a streaming server: fc1 up from 49% of the step, then down; the convs' parts after it each way
    up = 0.49 * 0.2 + 0.2 * (512 + 4_718_592) / total
    down = up + 0.2 * 4_718_592 / total + 0.2 * (256 + 73_728 + 128 + 1_152) / total
    assert overlapped_s(0.2, 0.2, CNN_READY, "parameters") == pytest.approx(down + 0.03 * 0.2)
    measured = desk_and_mac()
    measured = Measured(measured.alone, 0.05, 0.1, measured.model_bytes, ready=CNN_READY)
    rows = {r.label: r for r in predict(config(tmp_path), measured)}
    mac = measured.alone[1]
    ddp = rows["torch-ddp [equal]"]
    assert ddp.samples_per_s[1] == pytest.approx(256 / overlapped_s(mac.step_s(128), 0.05, CNN_READY))
    assert ddp.samples_per_s[1] > 256 / (mac.step_s(128) + 0.05)  # sooner than all of it after backward
    assert rows["ray-train [equal]"].samples_per_s == ddp.samples_per_s  # its ranks are torch-ddp's
    assert ddp.exposed_s == pytest.approx(256 / ddp.samples_per_s[1] - ddp.compute_s) and ddp.exposed_s < ddp.sync_s
    # ray-ps streams each gradient up as backward has it and each weight down once stepped (one floor
    # each way); dask-sync moves the whole gradient after backward; PowerSGD's one bucket waits for its end
    streamed = overlapped_s(mac.step_s(128), 0.05, CNN_READY, "parameters")
    assert rows["ray-ps [equal]"].samples_per_s[1] == pytest.approx(256 / streamed)
    assert 256 / streamed > rows["dask-sync [equal]"].samples_per_s[1] == pytest.approx(256 / (mac.step_s(128) + 0.1))
    whole = {r.label: r for r in predict(config(tmp_path, "ray-ps.stream=false"), measured)}
    assert whole["ray-ps [equal]"].samples_per_s == rows["dask-sync [equal]"].samples_per_s
    squeezed = {r.label: r for r in predict(config(tmp_path, "torch-ddp.compression=powersgd"), measured)}
    powersgd = squeezed["torch-ddp [equal]"]
    assert powersgd.samples_per_s[1] == pytest.approx(256 / (mac.step_s(128) + powersgd.sync_s))


def test_the_cnns_gradients_are_ready_in_backwards_order_and_each_counted_once():
    from hetbench.config import RunConfig
    from hetbench.workload import load_workload

    ready = load_workload(RunConfig(dataset="synthetic")).gradients_ready(RunConfig(dataset="synthetic"))
    assert sum(nbytes for _, nbytes in ready) == 1_199_882 * 4 and len(ready) == 8
    at = {nbytes: fraction for fraction, nbytes in ready}
    assert 0 < at[5_120] <= at[4_718_592] < at[73_728] <= at[1_152] < 1  # fc2, fc1, conv2, conv1, then the step


def test_the_verdict_says_which_pays_and_why_one_does_not(tmp_path):
    cfg = config(tmp_path)
    even = {r.label: r for r in predict(cfg, desk_and_mac(mac_times=1.0, allreduce_s=0.005))}
    assert even["torch-ddp [auto]"].verdict == "likely pays"  # two equal machines, a fast link: ~1.8x
    race = worth_racing(list(even.values()))  # the two predicted fastest synchronous strategies, a row each
    assert len(race) == 2 and race[0].strategy != race[1].strategy and race[0].vs_alone[1] >= race[1].vs_alone[1]
    synchronous = [r for r in even.values() if r.synchronous and r.strategy not in {x.strategy for x in race}]
    assert all(r.vs_alone[1] <= race[1].vs_alone[1] for r in synchronous) and all(r.synchronous for r in race)
    assert not even["ray-ps-async [auto]"].synchronous and not even["ray-localsgd [auto]"].synchronous
    slow_link = {r.label: r for r in predict(cfg, desk_and_mac(mac_times=1.0, allreduce_s=1.0, roundtrip_s=1.0))}
    assert slow_link["torch-ddp [auto]"].verdict.startswith("will not pay: the all-reduce of 4.8 MB takes 1000 ms")
    assert slow_link["ray-ps [auto]"].verdict.startswith("will not pay: the 2 transfers of 4.8 MB take 2000 ms")
    assert slow_link["ray-ps-async [auto]"].verdict.startswith("will not pay: each step waits 1000 ms for the 4.8 MB")
    assert worth_racing(list(slow_link.values())) == []
    # none worth racing: the race confirms the plan by the closest
    assert to_race(list(slow_link.values())) == [max(slow_link.values(), key=lambda r: r.vs_alone[1])]


def test_what_would_turn_a_row_around(tmp_path):
    cfg = config(tmp_path)
    measured = desk_and_mac(mac_times=1.0, allreduce_s=1.0)
    rows = {r.label: r for r in predict(cfg, measured)}
    note = rows["ray-localsgd [auto]"].note
    every = int(note.rsplit(" ", 1)[1])
    alone = 256 / measured.alone[0].step_s(256)
    split = list(rows["ray-localsgd [auto]"].split)
    assert step_rate(measured, split, 2 / every, 4, median) > alone
    assert every == 1 or step_rate(measured, split, 2 / (every - 1), 4, median) <= alone
    ddp = rows["torch-ddp [auto]"].note
    assert ddp.startswith("bfloat16 wire: ") and "PowerSGD rank 4: " in ddp
    # a slower machine whose share alone takes longer than the whole batch on the best: no interval helps
    lopsided = {r.label: r for r in predict(cfg, desk_and_mac(mac_times=3.0, allreduce_s=1.0))}
    assert lopsided["ray-localsgd [equal]"].note.startswith("no sync_every beats the best alone")


def test_a_strategy_s_own_busy_processes_are_named_where_the_workers_share_cores(tmp_path):
    measured = desk_and_mac()
    desk, mac = measured.alone
    # the desk's step of 64 took 10% longer beside the mac's: one box's cores, which Ray Train's
    # controller and helper actors would share too
    shared = replace(measured, alone=(replace(desk, lockstep_s=(0.0924,), free_s=(0.0841,)), mac))
    cfg = config(tmp_path, "strategies=[single, ray-train, dask-sync, ray-ps-async]")
    rows = {r.label: r for r in predict(cfg, shared)}
    said = (
        "expect it slower: its workers share cores (a step together 1.10x one alone) with Ray Train's "
        "controller and helper actors, which the plan does not time"
    )
    assert rows["ray-train [auto]"].unseen_cost == said and rows["ray-train [equal]"].unseen_cost == said
    assert rows["dask-sync [auto]"].unseen_cost == ""  # nothing of its own beyond Ray's processes
    # predicted alike, dask-sync is raced first: it has no cost the plan cannot see
    alike = [replace(rows[label], vs_alone=(1.2, 1.3, 1.4), verdict="likely pays") for label in rows]
    assert [r.label for r in worth_racing(alike, 1)] == ["dask-sync [equal]"]
    # two machines: each as fast beside the other as alone, nothing to add
    assert all(r.unseen_cost == "" for r in predict(cfg, measured))
    assert "controller" in markdown(cfg, shared, list(rows.values()))


def test_plan_needs_two_machines(tmp_path):
    with pytest.raises(UserError, match="two workers or more"):
        planning.plan(small_config(tmp_path))


def test_plan_measures_on_the_cluster_and_answers_in_the_race_s_words(cli, tmp_path, shared_cluster):
    workers = "workers=[{name: desk, node: desktop}, {name: mac, node: mac, slowdown: 3.0}]"
    settings = [ALL, workers, "batch_size=64", "balance=[auto]", "plan.steps=2", "floor.iterations=3"]
    settings += ["download=false", *shared_cluster.overrides]
    result = cli("plan", "-c", "benchmarks/configs/quick.yaml", *sets(*settings), "--results-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("# Plan: quick (mnist-cnn, global batch 64)") and "all-reduce of 4.8 MB " in out
    # each worker timed at the global batch and at the equal split's share, where the equal rows train
    assert re.search(r"desk [\d,]+ samples/s alone \(a step of 64 in [\d,]+ ms, of 32 in [\d,]+ ms", out)
    # and with every worker at once, in lockstep and at its own pace
    assert re.search(r"mac [^;]* ms; beside the others [\d,]+ in lockstep, [\d,]+ at its own pace\)", out)
    assert "failed" not in out and "desk " in out and "mac " in out
    for name in ("ray-ps", "ray-ps-async", "ray-train", "dask-sync", "ray-localsgd", "torch-ddp"):
        assert f"| {name} [auto] " in out
    assert "Worth racing: " in out or "No row is predicted to beat " in out
    assert (tmp_path / "quick-plan.md").read_text().strip() == out.strip()


def test_plan_refuses_bad_settings_in_one_sentence(cli):
    from helpers import assert_one_line_error

    result = cli("plan", "-c", "benchmarks/configs/quick.yaml", "--set", "plan.seconds=0")
    assert_one_line_error(result, "'plan.seconds' and 'plan.steps' must be positive")
    result = cli("run", "-c", "benchmarks/configs/quick.yaml", *sets("plan.race=worth", "plan.check=false"))
    assert_one_line_error(result, "plan.race worth races the rows the run's plan names: set plan.check true")


def race_on_the_pair(cli, tmp_path, shared_cluster, *settings: str) -> tuple:
    """A short race of the desk and the 3x slower mac on the session's cluster: its output and records."""
    import json

    workers = "workers=[{name: desk, node: desktop}, {name: mac, node: mac, slowdown: 3.0}]"
    settings = [*settings, workers, "batch_size=64", "steps=4", "warmup_steps=1", "repeats=1", "standalone_steps=2"]
    settings += ["floor.iterations=3", "eval_every=100", "fine_eval_every=0", "download=false", "test_samples=300"]
    result = cli(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        *sets(*settings, "eval_samples=300", *shared_cluster.overrides),
        "--results-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (raw,) = (tmp_path / "raw").glob("*-quick-*.json")
    return result, json.loads(raw.read_text())


def test_a_race_records_the_plan_of_each_row_beside_what_it_measured(cli, tmp_path, shared_cluster):
    strategies = "strategies=[single, torch-ddp, ray-ps]"
    result, raw = race_on_the_pair(cli, tmp_path, shared_cluster, strategies, "balance=[auto]")
    records = {r["strategy"]: r for r in raw}
    assert records["single"].get("plan") is None  # the baseline is the plan's best alone, not a prediction
    for name in ("torch-ddp", "ray-ps"):
        plan = records[name]["plan"]
        assert 0 < plan["low"] <= plan["samples_per_s"] <= plan["high"]
    ddp = next(line for line in result.stdout.splitlines() if line.startswith("| torch-ddp"))
    # beside vs baseline, the plan's own ratio: over its own best alone, as `hetbench plan` prints it
    assert f"({records['torch-ddp']['plan']['vs_alone']:.2f}x)" in ddp
    # the plan the run made at its start, as `hetbench plan` writes it (at auto's first split: the record's
    # is at the split each repeat ended at, re-split after its warm-up)
    planned = (tmp_path / "quick-plan.md").read_text()
    assert re.search(r"^\| torch-ddp \[auto\] +\| \d+/\d+ .*\| \d+\.\d\dx \(", planned, re.M)
    assert records["torch-ddp"]["plan"]["compute_s"] > 0  # its step's compute, apart from the link
    plan = records["torch-ddp"]["plan"]
    assert set(plan["sharing"]) == {"desk", "mac"} and plan["lockstep"]  # timed in lockstep at the start
    # each worker's; the step's is the slowest's and its wait for whichever is slowest in each step
    assert max(plan["worker_compute_s"].values()) <= plan["compute_s"] * (1 + 1e-9)
    # the line each worker's prediction ran through: its step alone at 64 and at 32, as timed at the start
    assert {name: len(steps) for name, steps in plan["timed_alone_s"].items()} == {"desk": 2, "mac": 2}
    assert all(large > small > 0 for large, small in plan["timed_alone_s"].values())
    # bracketed rows: also predicted at each worker's speed alone around the row
    assert all(records[name]["plan"]["at_row_samples_per_s"] > 0 for name in ("torch-ddp", "ray-ps"))
    table = (tmp_path / "quick.md").read_text().split("Each row against a prediction of it")[1]
    (ddp,) = [line for line in table.splitlines() if line.startswith("| torch-ddp [auto]")]
    # the what-if's check, by the plan, with each worker's compute and the rest of the step, predicted/measured
    cells = [cell.strip() for cell in ddp.strip("|").split("|")]
    assert cells[2] == "plan" and re.fullmatch(r"[+-]\d+%", cells[4])
    assert re.fullmatch(r"desk \d+/\d+, mac \d+/\d+", cells[5]) and re.fullmatch(r"-?\d+/\d+", cells[6])
    notes = " ".join(table.split())
    assert re.search(r"in lockstep: desk \d+\.\d\dx, mac \d+\.\d\dx\.", notes)
    assert re.search(r"at the row's speeds: torch-ddp \[auto\] [+-]\d+%", notes)


def test_a_race_of_the_rows_worth_racing_records_the_others_as_predicted(cli, tmp_path, shared_cluster):
    strategies = "strategies=[single, torch-ddp, ray-ps, dask-sync]"
    result, raw = race_on_the_pair(cli, tmp_path, shared_cluster, strategies, "plan.race=worth")
    records = [r for r in raw if r["strategy"] not in ("gloo-floor", "ps-floor")]
    labels = {f"{r['strategy']} [{r['balance']}]": r for r in records if r["strategy"] != "single"}
    # the plan made at the start names the rows to race (or the closest, where none is worth it) ...
    planned = (tmp_path / "quick-plan.md").read_text()
    said = re.search(r"^(?:Worth racing: (.*?)|No row .*? to confirm it by a race: (.*?)) \(`", planned, re.M)
    named = set((said[1] or said[2]).split(", "))
    # ... and only those race, beside single; every other row is in the records and the table as predicted
    assert {label for label, r in labels.items() if r["status"] == "ok"} == named
    assert [r["status"] for r in records if r["strategy"] == "single"] == ["ok"]
    unraced = {label: r for label, r in labels.items() if r["status"] == "predicted"}
    assert unraced and set(unraced) | named == {"torch-ddp [equal]", "ray-ps [equal]", "dask-sync [equal]"}
    table = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    for r in unraced.values():
        assert r["plan"]["vs_alone"] > 0 and not r.get("samples_per_s")
        line = table[r["strategy"]]  # one balance: a strategy's one row
        assert f" - ({r['plan']['vs_alone']:.2f}x) " in line and f"| predicted: {r['reason']}" in line
    assert re.search(r"^  Predicted, not raced: .*\d\.\d\dx \(", result.stdout, re.M)
    assert re.search(r"^  The plan at the start, against the race: .*\d\.\d\dx \([+-]\d+%\)", result.stdout, re.M)

"""Every registered strategy learns real MNIST in one run, as a user's run does (one cluster, one set
of worker processes for all rows), and the run's records, tables and floor land."""

import json
import statistics

import pytest

from helpers import UNEQUAL, small_config
from hetbench.strategies import registry

# every strategy is past 92% test accuracy (500 images) after 40 steps of the unequal 40 + 24 batch
STEPS, EVAL_EVERY, WARMUP, SPEED_STEPS = 40, 20, 2, 5
# one run of seven rows: longer than pytest-timeout's 300 s for one test on a busy 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def learned(tmp_path_factory, _shared_cluster):
    """(strategy -> its record, the floors' under `gloo-floor` and `ps-floor`; the run's results dir)."""
    from hetbench.cluster.ray_connection import ray_kept_for_the_run
    from hetbench.runner import run

    results = tmp_path_factory.mktemp("learn")
    cfg = small_config(
        results,
        *_shared_cluster.overrides,
        "name=learn",
        f"strategies=[{', '.join(registry.STRATEGIES)}]",
        UNEQUAL,
        f"steps={STEPS}",
        f"speed_steps={SPEED_STEPS}",  # the second repeat is timed only
        "evaluated_repeats=1",
        "fine_eval_every=0",  # the curve's steps are asserted below (test_training checks fine ones)
        f"warmup_steps={WARMUP}",
        "repeats=2",
        f"eval_every={EVAL_EVERY}",
        "target_accuracy=0.6",
        "floor.iterations=5",
        "ray-ps-async.max_staleness=1",
    )
    with ray_kept_for_the_run(_shared_cluster.keeper):
        path = run(cfg).path
    return {r["strategy"]: r for r in json.loads(path.read_text())}, results / "results"


@pytest.mark.parametrize("name", registry.STRATEGIES)
def test_every_strategy_learns_and_records_its_workers(learned, name):
    records, _ = learned
    record = records[name]
    assert record["status"] == "ok", record.get("reason")
    assert record["final_accuracy"] > (0.8 if name == registry.BASELINE else 0.5)  # chance is 0.1
    assert [p["step"] for p in record["accuracy_curve"]] == [EVAL_EVERY, STEPS, STEPS + WARMUP]
    assert len(record["repeat_samples_per_s"]) == 2 and record["repeat_timed_steps"] == [STEPS, SPEED_STEPS]
    assert record["samples_per_s"] == statistics.median(record["repeat_samples_per_s"])
    assert record["step"]["compute_s"] > 0
    assert all(w["device"] == "cpu" for w in record["workers"])
    if name == registry.BASELINE:
        assert record["step"]["comm_s"] == 0.0 and record["time_to_target_s"] > 0
        assert record["config"]["steps"] == STEPS and record["env"]["versions"]["torch"]
    else:
        assert {w["name"]: w["batch"] for w in record["workers"]} == {"big": 40, "small": 24}
        assert record["step"]["comm_s"] > 0


def test_the_strategies_own_figures_are_recorded(learned):
    records, _ = learned
    staleness = records["ray-ps-async"]["staleness"]  # max_staleness 1, and a worker's own update in between
    assert sum(staleness["histogram"].values()) > STEPS and staleness["max"] <= 2
    dask = records["dask-sync"]["workers"]
    assert len({w["dask_worker"] for w in dask}) == 2  # one Dask worker each
    assert sorted(w["rank"] for w in records["ray-train"]["workers"]) == [0, 1]
    floor, ps_floor = records["gloo-floor"], records["ps-floor"]
    assert floor["status"] == "ok" and floor["allreduce_s"] > 0 and floor["bytes"] == 1_199_882 * 4
    assert ps_floor["status"] == "ok" and ps_floor["roundtrip_s"] > 0 and ps_floor["bytes"] == floor["bytes"]
    # each row names the floor it is judged against: a parameter server's round trip, or an all-reduce
    assert {name for name in registry.STRATEGIES if records[name].get("floor") == "ps-floor"} == {
        "ray-ps",
        "ray-ps-async",
        "ray-localsgd",
        "dask-sync",
    }


def test_the_run_writes_its_tables(learned):
    _, results = learned
    md = (results / "learn.md").read_text()
    assert md.count("Verdict: ") == 1
    assert all(f"| {name}" in md for name in [*registry.STRATEGIES, "gloo-floor", "ps-floor"])
    assert (results / "learn.csv").read_text().startswith("strategy,")

import csv
import io
import json
import os

import pytest

from helpers import typed
from hetbench.results import report
from hetbench.results.record import from_json
from hetbench.results.records import RecordFile, read_records, redacted
from hetbench.results.report import COLUMNS


def rows(records):
    return report.rows(typed(records))


def markdown(records, wide=False):
    return report.markdown(typed(records), wide)


def to_csv(records):
    return report.to_csv(typed(records))


def write_tables(records, results_dir, name):
    return report.write_tables(typed(records), results_dir, name)


def record(strategy, samples_per_s=None, **extra):
    return {
        "strategy": strategy,
        "status": "ok",
        "samples_per_s": samples_per_s,
        "workers": [{"name": "w0", "device": "cpu", "batch": 32}],
        **extra,
    }


KNOWN = [
    record(
        "ray-ps",
        500.0,
        samples_per_s_cv=0.1,
        step={"compute_s": 0.05, "comm_s": 0.008, "wait_s": 0.002, "sync_overhead_s": 0.010},
        final_accuracy=0.9,
        config={"batch_size": 64},
        floor_transfers=2.0,
    ),
    {"strategy": "gloo-floor", "status": "ok", "allreduce_s": 0.005, "allreduce_cv": 0.2, "workers": []},
    record(
        "single",
        1000.0,
        samples_per_s_cv=0.02,
        step={"compute_s": 0.06, "comm_s": 0.0, "wait_s": 0.0, "sync_overhead_s": 0.0},
        final_accuracy=0.95,
    ),
    {"strategy": "dask-sync", "status": "skipped", "reason": "not installed", "workers": []},
]


def test_baseline_first_then_floor_with_relative_columns():
    table = [dict(zip(COLUMNS, r)) for r in rows(KNOWN)]
    assert [r["strategy"] for r in table] == ["single", "gloo-floor", "ray-ps", "dask-sync"]
    single, floor, ps, skipped = table
    assert single["vs baseline"] == 1.0 and ps["vs baseline"] == 0.5
    assert floor["sync overhead ms"] == 5.0 and floor["vs floor"] == 1.0  # the floor is 1x itself
    assert abs(ps["sync overhead ms"] - 10.0) < 1e-9 and abs(ps["vs floor"] - 2.0) < 1e-9  # 10 ms = 2x a 5 ms floor
    assert skipped["status"] == "skipped: not installed"
    # what the floor allows a parameter server: 64 samples per (50 ms compute + 2 x a 5 ms all-reduce)
    assert ps["floor-predicted samples/s"] == pytest.approx(64 / 0.06) and ps["vs predicted"] == pytest.approx(
        0.469, abs=0.001
    )
    assert single["floor-predicted samples/s"] is None


def test_each_row_is_judged_against_its_own_patterns_floor_and_both_floors_are_shown():
    allreduce = record("torch-ddp", 800.0, step={"compute_s": 0.05, "sync_overhead_s": 0.006}, floor="gloo-floor")
    ps = {**KNOWN[0], "floor": "ps-floor"}  # 10 ms of sync overhead
    roundtrip = {"strategy": "ps-floor", "status": "ok", "roundtrip_s": 0.008, "roundtrip_cv": 0.1, "workers": []}
    table = {r["strategy"]: r for r in (dict(zip(COLUMNS, r)) for r in rows([*KNOWN, allreduce, roundtrip]))}
    assert list(table)[:3] == ["single", "gloo-floor", "ps-floor"]
    assert table["ps-floor"]["sync overhead ms"] == 8.0 and table["ps-floor"]["CV"] == 0.1
    assert table["torch-ddp"]["vs floor"] == pytest.approx(1.2)  # 6 ms over a 5 ms all-reduce
    assert table["ray-ps"]["vs floor"] == pytest.approx(2.0)  # a record from before the ps-floor: gloo's
    table = {r["strategy"]: r for r in (dict(zip(COLUMNS, r)) for r in rows([ps, KNOWN[1], roundtrip]))}
    assert table["ray-ps"]["vs floor"] == pytest.approx(1.25)  # 10 ms over an 8 ms round trip


def test_markdown_and_csv_render_the_same_rows():
    md = markdown(KNOWN)
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[2].startswith("| single") and "0.50x" in md and "10.0 (2.00x)" in md and "500.0 ± 10.0%" in md
    assert md.startswith("Verdict: keep to w0 alone (1,000 samples/s)")
    assert table[0].count("|") - 1 <= 10  # the default table answers; --wide has every column
    wide = [line for line in markdown(KNOWN, wide=True).splitlines() if line.startswith("|")]
    assert wide[0].count("|") - 1 == len(COLUMNS)
    parsed = list(csv.DictReader(io.StringIO(to_csv(KNOWN))))
    assert [r["strategy"] for r in parsed] == ["single", "gloo-floor", "ray-ps", "dask-sync"]
    assert float(parsed[2]["vs baseline"]) == 0.5


def test_record_file_is_new_each_run_and_never_overwrites(tmp_path):
    a, b = RecordFile(str(tmp_path), "x"), RecordFile(str(tmp_path), "x")
    assert a.path != b.path
    a.add(from_json(KNOWN[0]))
    a.add(from_json(KNOWN[2]))
    assert [r["strategy"] for r in json.loads(a.path.read_text())] == ["ray-ps", "single"]
    assert b.path.read_text() == ""  # reserved, untouched by the other run
    assert not [p for p in (tmp_path / "raw").iterdir() if p.name.startswith(".")]
    assert [r.strategy for r in read_records([str(a.path)])] == ["ray-ps", "single"]


def test_tables_written_next_to_records(tmp_path):
    md, csv_path = write_tables(KNOWN, str(tmp_path), "known")
    assert "| single" in md.read_text() and csv_path.read_text().startswith("strategy,")


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another user needs root, as in a container")
def test_tables_written_by_root_into_a_users_directory_are_handed_to_that_user(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    os.chown(results, 4242, 4343)  # the user's ./results, bind-mounted into the runner's container
    RecordFile(str(results), "known").add(from_json(KNOWN[0]))
    write_tables(KNOWN, str(results), "known")
    written = [results, *results.rglob("*")]
    assert len(written) > 4 and {(p.lstat().st_uid, p.lstat().st_gid) for p in written} == {(4242, 4343)}


def test_recorded_config_redacts_tokens():
    cfg = {"cluster": {"ray_token": "s3cret", "ray_address": "h:6379"}, "workers": [{"auth_token": "x"}]}
    out = redacted(cfg)
    assert out["cluster"] == {"ray_token": "<redacted>", "ray_address": "h:6379"}
    assert out["workers"][0]["auth_token"] == "<redacted>" and cfg["cluster"]["ray_token"] == "s3cret"


def test_a_scaling_efficiency_above_100_percent_is_drift_not_a_result():
    drifted = record("ray-ps", 900.0, scaling_efficiency=1.008)
    scaled = record("dask-sync", 700.0, scaling_efficiency=0.8)
    records = [record("single", 1000.0), drifted, scaled]
    table = {row[0]: dict(zip(COLUMNS, row)) for row in rows(records)}
    assert table["ray-ps"]["scaling eff"] == "drift" and table["dask-sync"]["scaling eff"] == 0.8
    md = markdown(records)
    assert "| drift " in md and "100.8%" not in md and "80.0%" in md
    parsed = {r["strategy"]: r for r in csv.DictReader(io.StringIO(to_csv(records)))}
    assert parsed["ray-ps"]["scaling eff"] == "drift"
    assert drifted["scaling_efficiency"] == 1.008  # the record keeps what was measured


def test_steps_to_target_is_the_first_evaluated_step_at_the_target():
    from hetbench.results.rows import steps_to_target
    from hetbench.training import CurvePoint

    curve = [CurvePoint(25, 1.0, 0.6), CurvePoint(50, 2.0, 0.86), CurvePoint(75, 3.0, 0.84)]
    assert steps_to_target(curve, 0.85) == 50 and steps_to_target(curve, 0.9) is None
    records = [record("single", 1000.0, steps_to_target=50, time_to_target_s=3.2)]
    wide = dict(zip(COLUMNS, rows(records)[0]))
    assert wide["steps to target"] == 50
    assert next(csv.DictReader(io.StringIO(to_csv(records))))["steps to target"] == "50"


def test_a_worker_that_finished_no_batch_in_most_steps_is_judged_by_those_it_did():
    from hetbench.results.rows import worker_figures
    from hetbench.step_timing import StepTiming

    # ray-ps-async at 100 Mbit: the slow worker's batch rides a 0.8 s round trip, so most steps lack it
    timed = [StepTiming({"desk": 0.2, "mac": 0.6 if i % 4 == 0 else 0.0}, 0.0, 0.0, 0.25) for i in range(8)]
    workers = [{"name": "desk", "batch": 192}, {"name": "mac", "batch": 64}, {"name": "lost", "batch": 8}]
    desk, mac, lost = worker_figures(workers, timed, 2.0, "float32", 1_199_882)
    assert desk.compute_s == 0.2 and desk.compute_samples_per_s == 192 / 0.2
    assert mac.compute_s == 0.6 and mac.compute_samples_per_s == 64 / 0.6
    assert lost.compute_s is None and lost.wire_bytes_per_step > 0


def test_a_table_names_the_commit_and_command_that_measured_it(tmp_path):
    env = {
        "git_commit": "0123456789abcdef",
        "git_dirty": True,
        "argv": ["/x/.venv/bin/hetbench", "run", "-c", "benchmarks/configs/local.yaml"],
        "host": "box",
        "time": "2026-12-02T01:00:00+0000",
        "usable_cores": 2,
        "versions": {"torch": "2.13.0", "ray": "2.60.0"},
    }
    md, _ = write_tables([{**r, "env": env} for r in KNOWN], str(tmp_path), "t")
    assert md.read_text().splitlines()[2:5] == [
        "Measured at commit 0123456 with uncommitted changes on box, 2026-12-02 (2 usable cores; torch 2.13.0, "
        "ray 2.60.0) with",
        "`hetbench run -c benchmarks/configs/local.yaml`.",
        "Devices: CPUs only; on a GPU desk a step computes far faster and the link weighs more.",
    ]
    pair = [{"name": "d", "device": "cuda:0", "batch": 48}, {"name": "m", "device": "mps", "batch": 16}]
    md, _ = write_tables([{**KNOWN[0], "env": env, "workers": pair}, *KNOWN[1:]], str(tmp_path), "g")
    assert md.read_text().splitlines()[4] == "Devices: cpu, cuda, mps."  # single's cpu too
    md, _ = write_tables(KNOWN, str(tmp_path), "bare")  # records without an environment: no such line
    assert md.read_text().splitlines()[2].startswith("Verdict")


def test_the_readmes_column_table_names_every_column_of_the_default_table():
    from helpers import REPO
    from hetbench.results.report import TABLE

    readme = (REPO / "README.md").read_text()
    body = readme[readme.index("| column | meaning |") :].split("\n\n")[0].splitlines()[2:]
    named = {name for line in body for name in line.split("|")[1].strip().split(", ")}
    assert named == {c.header for c in TABLE if c.narrow} - {"strategy"}


def test_the_step_plot_shows_the_longest_bar_whole_and_its_legend_beside_the_bars():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetbench.results.plots import _step_breakdown

    single = record("single", 900.0, step={"compute_s": 0.138, "comm_s": 0.0, "wait_s": 0.0})
    ddp = record("torch-ddp", 1400.0, step={"compute_s": 0.077, "comm_s": 0.005, "wait_s": 0.004})
    floor = {"strategy": "gloo-floor", "status": "ok", "allreduce_s": 0.005, "workers": []}
    fig, ax = plt.subplots()
    _step_breakdown(ax, typed([single, ddp]), typed([single, ddp, floor]))
    assert ax.get_xlim()[1] > 138 * 1.01  # single's 138 ms bar does not end at the axis' edge
    assert ax.get_legend().get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1
    plt.close(fig)


def test_the_table_says_how_each_interrupted_row_went_on():
    table = report.legend(
        typed(
            [
                record("single", 1000.0, resumed_at={"repeat": 1, "step": 30}),
                record("ray-ps-async", 900.0, balance="equal", resumed_at={"repeat": 0, "step": 0}),
                record("ray-ps", 950.0, balance="auto"),
            ]
        )
    )
    assert "single: resumed after an interrupt, repeat 2 from its checkpoint after step 30." in table
    assert "ray-ps-async [equal]: resumed after an interrupt, repeat 1 trained again from its start." in table
    assert "ray-ps [auto]: resumed" not in table

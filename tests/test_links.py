"""Runs over several links side by side: where adding the other machine starts to pay, and what the
wire changes on one link (a narrower dtype, torch-ddp's PowerSGD)."""

import json

from helpers import assert_one_line_error, typed
from hetbench.results import links
from hetbench.results.links import links_markdown, write_links


def by_link(runs):
    return links.by_link([typed(run) for run in runs])


def run(rate, gloo_sps, gloo_comm_s, wire="float32", name=None, compression="none", to_target=None, final=0.94):
    config = {
        "name": name or f"links-{rate}",
        "wire_dtype": wire,
        "link": {"rate": rate},
        "batch_size": 256,
        "repeats": 3,
        "torch-ddp": {"compression": compression, "powersgd_rank": 4},
    }
    workers = [
        {"name": "desk", "device": "cpu", "batch": 192, "standalone_samples_per_s": 3000.0},
        {"name": "mac", "device": "cpu", "batch": 64, "standalone_samples_per_s": 1000.0},
    ]
    return [
        {
            "strategy": "single",
            "status": "ok",
            "samples_per_s": 3000.0,
            "samples_per_s_cv": 0.02,
            "split": [256],
            "workers": workers[:1],
            "config": config,
            "final_accuracy": 0.95,
            "time_to_target_s": 40.0,
            "target_accuracy": 0.9,
        },
        {"strategy": "gloo-floor", "status": "ok", "allreduce_s": 0.4, "bytes": 4.8e6, "link": {"rate": rate}},
        {
            "strategy": "ray-train",
            "status": "ok",
            "balance": "auto",
            "samples_per_s": gloo_sps,
            "samples_per_s_cv": 0.02,
            "step": {"compute_s": 0.064, "comm_s": gloo_comm_s, "sync_overhead_s": gloo_comm_s, "wait_s": 0.0},
            "floor_transfers": 1,
            "workers": [
                {**w, "wire_bytes_per_step": 9.6e6 if wire == "float32" else 4.8e6, "compute_s": 0.064} for w in workers
            ],
            "config": config,
            "final_accuracy": final,
            "target_accuracy": 0.9,
            "time_to_target_s": to_target,
        },
    ]


def test_runs_side_by_side_fastest_link_first_with_the_rows_that_pay_marked():
    runs = by_link(
        [
            run("100mbit", 500.0, 0.45),
            run("100mbit", 800.0, 0.25, wire="bfloat16"),
            run("1gbit", 3500.0, 0.01, to_target=30.0, final=0.95),  # sooner, as accurate: the rule's "pays"
        ]
    )
    text = links_markdown(runs)
    header = next(line for line in text.splitlines() if line.startswith("| samples/s (vs alone)"))
    assert [c.strip() for c in header.split("|")[2:5]] == ["1gbit", "100mbit", "100mbit, bfloat16 wire"]
    gloo = next(line for line in text.splitlines() if line.startswith("| ray-train [auto]"))
    assert [c.strip() for c in gloo.split("|")[2:5]] == ["3,500 (1.17x) **pays**", "500 (0.17x)", "800 (0.27x)"]
    assert "**1gbit**: Verdict: use ray-train [auto]" in text
    assert "**100mbit**: Verdict: keep to desk alone" in text
    # the wire table: 450 -> 250 ms of comm, 1.80x lower, half the bytes
    wire = next(line for line in text.splitlines() if line.startswith("| ray-train [auto] | 450 -> 250"))
    assert [c.strip() for c in wire.split("|")[3:5]] == ["1.80x", "9.6 -> 4.8"]
    assert "not reached (94.0%)" in text and "40 s (95.0%)" in text and "30 s (95.0%)" in text
    assert text.startswith("Each column is one run of desk + mac, global batch 256, 3 repeats")


def test_report_links_writes_the_table_and_the_plot_and_refuses_a_run_without_a_link(cli, tmp_path):
    files = []
    for i, records in enumerate([run("1gbit", 3500.0, 0.01), run("100mbit", 500.0, 0.45)]):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(records))
    (tmp_path / "links-1gbit.md").write_text("one run's own table")
    result = cli("report", "--links", *map(str, files), "--results-dir", str(tmp_path), "--name", "links")
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "links.md").read_text()
    assert md.startswith("# hetbench: links") and "[1gbit](links-1gbit.md)" in md and "100mbit](" not in md
    assert (tmp_path / "links-crossover.png").read_bytes().startswith(b"\x89PNG")
    unlinked = [r for r in run("1gbit", 3500.0, 0.01) if r["strategy"] != "gloo-floor"]
    unlinked[0]["config"] = {**unlinked[0]["config"], "link": {"rate": None}}
    for r in unlinked:
        r["config"] = unlinked[0]["config"]
    (tmp_path / "unlinked.json").write_text(json.dumps(unlinked))
    assert_one_line_error(
        cli("report", "--links", str(tmp_path / "unlinked.json"), str(files[0])), "over an emulated link"
    )
    both = cli("report", "--links", "--wide", str(files[0]))
    assert both.returncode == 2 and "not allowed with argument --links" in both.stderr
    assert by_link([run("1gbit", 3500.0, 0.01)])[0][0].strategy == "single"
    write_links(by_link([run("10gbit", 3600.0, 0.004)]), str(tmp_path), "one")
    assert "10gbit" in (tmp_path / "one.md").read_text()


def test_a_powersgd_run_is_its_own_column_and_its_wire_is_compared_with_float32s():
    runs = by_link([run("100mbit", 500.0, 0.45), run("100mbit", 700.0, 0.05, compression="powersgd")])
    text = links_markdown(runs)
    header = next(line for line in text.splitlines() if line.startswith("| samples/s (vs alone)"))
    assert [c.strip() for c in header.split("|")[2:4]] == ["100mbit", "100mbit, PowerSGD rank 4"]
    assert "The wire on the 100mbit link, float32 -> PowerSGD rank 4:" in text
    assert "| ray-train [auto] | 450 -> 50" in text


def test_a_cell_shows_its_range_over_the_repeats_and_pays_only_by_the_verdicts_rule():
    from hetbench.results.links import _cell

    faster = run("wifi", 3500.0, 0.01, to_target=45.0, final=0.95)  # more samples/s, but later to the target
    faster[2]["repeat_samples_per_s"] = [3300.0, 3500.0, 3600.0]
    faster = typed(faster)
    assert _cell(faster[2], faster) == "3,500 (1.17x, 1.10-1.20x)"
    sooner = typed(run("wifi", 3500.0, 0.01, to_target=30.0, final=0.94))  # sooner, but a point less accurate
    assert "**pays**" not in _cell(sooner[2], sooner)
    kept = typed(run("wifi", 3500.0, 0.01, to_target=30.0, final=0.946))  # 0.4 points: within the tolerance
    assert _cell(kept[2], kept) == "3,500 (1.17x) **pays**"

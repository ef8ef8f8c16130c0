"""The typed record: every committed record reads, writes back the same, and renders the committed tables."""

import json

import pytest

from helpers import REFERENCE, committed
from hetbench.results.record import SCHEMA_VERSION, FloorRecord, RowRecord, from_json, to_json
from hetbench.results.records import read_records
from hetbench.results.report import write_tables

RAW = committed(REFERENCE / "raw", "*.json")  # the shipped records, whatever runs left beside them


@pytest.mark.parametrize("path", RAW, ids=[p.stem for p in RAW])
def test_a_committed_record_reads_as_types_and_writes_back_what_it_read(path):
    records = read_records([str(path)])
    assert {type(r) for r in records} == {RowRecord, FloorRecord}
    again = [from_json(json.loads(json.dumps(to_json(r)))) for r in records]
    assert again == records
    assert all(to_json(r)["schema"] == SCHEMA_VERSION for r in records)


@pytest.mark.parametrize("path", RAW, ids=[p.stem for p in RAW])
def test_a_committed_record_renders_its_committed_table(path, tmp_path):
    """results/reference/ is current: its tables are what `hetbench report` renders of its records today."""
    name = next(r.config.name for r in read_records([str(path)]))
    md, csv = write_tables(read_records([str(path)]), str(tmp_path), name)
    assert md.read_text() == (REFERENCE / f"{name}.md").read_text()
    assert csv.read_text() == (REFERENCE / f"{name}.csv").read_text()


def test_an_untyped_record_of_schema_1_upgrades_its_old_names():
    old = {
        "strategy": "ray-train-gloo",  # renamed ray-train
        "samples_per_s": 10.0,
        "standalone_timings": {"a": {"start": [1.0], "end": [2.0]}},  # before the brackets
        "config": {"ray-train-gloo": {"sync_every": 3}},
        "staleness": {"max": 1},  # a strategy's own figures, kept as they were
    }
    record = from_json(old)
    assert record.strategy == "ray-train" and record.config.of("ray-train").sync_every == 3
    assert record.standalone_timings["a"].whole_run and record.extras == {"staleness": {"max": 1}}
    written = to_json(record)
    assert written["standalone_timings"] == old["standalone_timings"] and written["staleness"] == {"max": 1}


@pytest.mark.parametrize("name", ["hetero-links", "shapes-links"])
def test_the_committed_link_report_is_what_its_records_render(tmp_path, name):
    import shutil

    from hetbench.results.links import by_link, write_links

    for table in committed(REFERENCE, f"{name}-*.md"):  # the report links each run's own table
        shutil.copy(table, tmp_path)
    files = committed(REFERENCE / "raw", f"*-{name}-*.json")
    written = write_links(by_link([read_records([str(f)]) for f in files]), str(tmp_path), name)
    assert written.read_text() == (REFERENCE / f"{name}.md").read_text()

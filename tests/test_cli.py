"""Every bad-input case through the real CLI: one line on stderr, exit code 2, no traceback unless -v.

The cases run `hetbench.cli.main` in this process (the `cli` fixture); three smokes at the end run
the console script itself: help, one bad input and one tiny run."""

import json
import time
from dataclasses import replace

import pytest
import torch

from helpers import TINY, assert_one_line_error, fake_split, hetbench, sets, write_idx


@pytest.fixture
def config(tmp_path):
    def make(text):
        path = tmp_path / "cfg.yaml"
        path.write_text(text)
        return str(path)

    return make


def test_malformed_yaml(cli, config):
    assert_one_line_error(cli("run", "-c", config("steps: [1,\n")), "is not valid YAML")


def test_unknown_key(cli, config):
    assert_one_line_error(cli("run", "-c", config("stepps: 1\n")), "unknown config key 'stepps'")


def test_unknown_strategy(cli, config):
    assert_one_line_error(
        cli("run", "-c", config("strategies: [single, horovod]\n")),
        "unknown strategy 'horovod'; available: single, ray-ps",
    )


def test_negative_batch(cli, config):
    assert_one_line_error(cli("run", "-c", config("workers: [{batch: -4}]\n")), "batch must be positive")


@pytest.mark.parametrize(
    "text,sets,message",
    [
        ("steps: many\n", [], "config key 'steps' must be int, got str 'many'"),
        ("- just\n- a list\n", [], "must be a mapping of keys to values"),
        ("workers: [{name: a}, {name: a}]\n", [], "duplicate worker name 'a'"),
        ("workers: [{share: 0.5}, {share: 0.4}]\n", [], "worker shares must sum to 1, they sum to 0.9"),
        ("workers: [{batch: 8}, {share: 0.5}]\n", [], "give every worker a 'batch', or every worker a 'share'"),
        ("workers: [{slowdown: 0.5}]\n", [], "slowdown must be >= 1.0"),
        ("batch_size: 0\n", [], "'batch_size' must be positive"),
        ("balance: [fastest]\n", [], "must be one of equal, proportional, auto"),
        ("steps: 3\n", ["steps"], "--set takes key=value, got 'steps'"),
        ("steps: 3\n", ["workers.5.batch=2"], "'5' is not an index of a list of 1"),
        ("steps: 3\n", ["faults=[{at_step: 1, kill: worker, target: mac}]"], "no worker is named 'mac'"),
        ("steps: 3\n", ["link.rate=fast"], "must look like 100mbit or 1gbit"),
        ("steps: 3\n", ["ray-localsgd.sync_every=0"], "'ray-localsgd.sync_every' must be a whole number of steps"),
        ("cluster: {mode: cloud}\n", [], "must be one of local, local-multinode"),
        ("cluster: {mode: local-multinode}\nstrategies: [ray-ps]\n", [], "needs workers with a 'node' placement label"),
    ],
)
def test_config_mistakes_are_one_sentence(cli, config, tmp_path, text, sets, message):
    overrides = [arg for item in sets for arg in ("--set", item)]
    result = cli("run", "-c", config(text), *overrides, "--results-dir", str(tmp_path / "r"))
    assert_one_line_error(result, message)
    assert not (tmp_path / "r").exists()  # nothing reserved, nothing written


def test_missing_config_file(cli, tmp_path):
    assert_one_line_error(cli("run", "-c", str(tmp_path / "none.yaml")), "does not exist")


@pytest.mark.parametrize(
    "device, message", [("'cuda:99'", "device 'cuda:99' is not available here"), ("tpu", "unknown device 'tpu'")]
)
def test_a_device_is_refused_where_its_worker_runs(cli, config, tmp_path, shared_cluster, device, message):
    joins = sets(*shared_cluster.overrides)
    result = cli(
        "run", "-c", config(f"workers: [{{device: {device}}}]\n"), *TINY, *joins, "--results-dir", str(tmp_path)
    )
    assert_one_line_error(result, message)


def test_missing_data_dir(cli, config, tmp_path):
    result = cli(
        "run", "-c", config(f"data_dir: {tmp_path / 'nowhere'}\n"), *TINY, "--results-dir", str(tmp_path / "r")
    )
    assert_one_line_error(result, "does not exist")
    assert not (tmp_path / "r").exists()  # refused before any record file was reserved


def test_corrupt_data_file(cli, config, tmp_path):
    images, labels = fake_split(3)
    write_idx(tmp_path / "d" / "t10k-images-idx3-ubyte", images, magic=7)
    write_idx(tmp_path / "d" / "t10k-labels-idx1-ubyte", labels)
    result = cli("run", "-c", config(f"data_dir: {tmp_path / 'd'}\n"), *TINY, "--results-dir", str(tmp_path / "r"))
    assert_one_line_error(result, "t10k-images-idx3-ubyte: bad magic number 7")
    assert not (tmp_path / "r").exists()


def test_results_dir_not_writable(cli, config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = cli("run", "-c", config("steps: 1\n"), *TINY, "--results-dir", str(blocker / "sub"))
    assert_one_line_error(result, "is not writable")


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary"), "is not UTF-8 text"),
        (lambda p: p.mkdir(), "is a directory, not a file"),
        (lambda p: p.write_text(BOMB), "anchors and aliases (*name) are not allowed"),
        (lambda p: open(p, "wb").truncate(17 * 1024 * 1024), "bytes: more than"),
        # valid YAML, a few MB: refused before parsing (PyYAML would take minutes over it)
        (lambda p: p.write_text("strategies: [single]\n" + "# padding\n" * 300_000), "bytes: more than 262,144"),
        # safe_load would keep the last of the two silently
        (lambda p: p.write_text("steps: 1\nsteps: 2\n"), "at line 2: key 'steps' is given twice in one mapping"),
        (lambda p: p.write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n"), "nested more than 32 levels deep"),
    ],
    ids=["binary", "directory", "alias-bomb", "huge", "megabytes-of-yaml", "key-twice", "deep"],
)
def test_a_config_that_is_not_a_config_file_is_one_sentence(cli, tmp_path, make, message):
    path = tmp_path / "cfg.yaml"
    make(path)
    assert_one_line_error(cli("run", "-c", str(path)), message)
    assert_one_line_error(cli("run", "-c", "benchmarks/configs/quick.yaml", "--set", "x=*a"), "unknown config key")


def test_a_record_file_that_is_not_text_or_a_directory_is_one_sentence(cli, tmp_path):
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00binary")
    assert_one_line_error(cli("report", str(tmp_path / "bin.json")), "is not UTF-8 text")
    assert_one_line_error(cli("report", str(tmp_path)), "is a directory, not a file")


def test_report_of_a_missing_or_foreign_file(cli, tmp_path):
    assert_one_line_error(cli("report", str(tmp_path / "none.json")), "does not exist")
    foreign = tmp_path / "x.json"
    foreign.write_text(json.dumps({"hello": 1}))
    assert_one_line_error(cli("report", str(foreign)), "does not hold hetbench records")


@pytest.mark.parametrize(
    "text, message",
    [
        ('[{"strategy": "single", "strategy": "x"}]', "key 'strategy' is given twice in one object"),
        ("[" * 50_000 + "]" * 50_000, "is nested too deeply to be one of ours"),
        ("[" * 40 + "]" * 40, "is nested more than 32 levels deep"),
        (
            '[{"strategy": "single", "status": "ok", "samples_per_s": "fast", "workers": []}]',
            "record 1 (single): samples_per_s must be a number, got str 'fast'",
        ),
        ('[{"strategy": "single", "workers": 3}]', "record 1 (single): workers must be a list, got int 3"),
        (
            '[{"strategy": "single", "workers": [{"name": "w", "batch": 8, "compute_s": [1, "x"]}]}]',
            "workers[0].compute_s must be a list of numbers",
        ),
        ('[{"strategy": "single", "status": 1}]', "record 1 (single): status must be text, got int 1"),
        ('[{"strategy": "single", "step": [1]}]', "record 1 (single): step must be an object, got list [1]"),
        ('[{"strategy": "single", "schema": 9}]', "schema 9 is not one this hetbench reads (1 to 2)"),
        ('[{"strategy": "single", "workers": [{"batch": 8}]}]', "record 1 (single): a worker has no name"),
        (
            '[{"strategy": "single", "accuracy_curve": [{"step": 1}]}]',
            "record 1 (single): a part of it is incomplete",
        ),
    ],
    ids=[
        "key-twice",
        "recursion-deep",
        "deep",
        "figure-text",
        "workers-not-list",
        "nested-figure",
        "status-number",
        "step-not-object",
        "newer-schema",
        "worker-unnamed",
        "curve-point-short",
    ],
)
def test_a_record_whose_structure_or_types_are_wrong_is_one_sentence(cli, tmp_path, text, message):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert_one_line_error(cli("report", str(path)), message)


def test_report_writes_tables_into_a_new_directory_and_refuses_an_unwritable_one(cli, tmp_path):
    records = tmp_path / "r.json"
    records.write_text(json.dumps([{"strategy": "single", "status": "ok", "samples_per_s": 10.0, "workers": []}]))
    result = cli("report", str(records), "--name", "again", "--results-dir", str(tmp_path / "new" / "dir"))
    assert result.returncode == 0 and "| single" in result.stdout
    assert (tmp_path / "new" / "dir" / "again.md").is_file()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = cli("report", str(records), "--name", "again", "--results-dir", str(blocker / "sub"))
    assert_one_line_error(result, "is not writable")


def test_report_against_a_run_without_an_emulated_link_is_refused(cli, tmp_path):
    records = tmp_path / "r.json"
    records.write_text(json.dumps([{"strategy": "single", "status": "ok", "samples_per_s": 10.0, "workers": []}]))
    result = cli("report", str(records), "--against", str(records))
    assert_one_line_error(result, "--against needs a run over an emulated link")


def test_verbose_shows_the_traceback(cli, config):
    result = cli("-v", "run", "-c", config("stepps: 1\n"))
    assert result.returncode == 2 and "Traceback" in result.stderr


@pytest.mark.parametrize("command", [[], ["run"], ["report"], ["devices"], ["strategies"]])
def test_help_shows_defaults(cli, command):
    result = cli(*command, "--help")
    assert result.returncode == 0 and "usage: hetbench" in result.stdout
    if command == ["report"]:
        assert "(default: results)" in result.stdout


def test_devices_and_strategies_list_what_is_here(cli):
    devices = cli("devices")
    assert devices.returncode == 0 and "cpu" in devices.stdout and devices.stdout.startswith("auto -> ")
    # a GPU container's start: a missing device is refused at once, not benchmarked on the CPU
    required = cli("devices", "--require", "cpu")
    assert required.returncode == 0 and required.stdout.startswith("cpu: cpu trains the model")
    if torch.version.cuda is None:  # this machine's torch: the gate names the cause, not just the absence
        assert_one_line_error(cli("devices", "--require", "cuda"), "is a CPU build and cannot use 'cuda'")
    strategies = cli("strategies")
    assert strategies.returncode == 0
    assert strategies.stdout.splitlines()[0].split() == ["single", "available"]


def test_worker_refuses_a_head_nothing_answers_at(cli, monkeypatch):
    monkeypatch.setenv("MAC_DEVICE", "cpu")  # this machine has no MPS: it joins as a Mac without one must
    result = cli("worker", "--head", "127.0.0.1", "--ray-port", "9", "--timeout", "2")
    checked, refused = result.stderr.splitlines()  # the device trained first, then the head was asked
    has = "(one forward and backward pass; it has fp32, tf32, bf16, fp16)"
    assert checked == f"hetbench worker: cpu: cpu trains the model in fp32 {has}"
    assert_one_line_error(replace(result, stderr=refused), "cannot reach 127.0.0.1:9 within 2 s")
    assert "Windows desktop must let it through its Hyper-V firewall" in result.stderr


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="a machine with MPS")
def test_a_worker_without_mps_is_refused_before_it_asks_the_head(cli, monkeypatch):
    monkeypatch.delenv("MAC_DEVICE", raising=False)  # a Mac's default: MPS, checked by training on it
    result = cli("worker", "--head", "127.0.0.1", "--ray-port", "9", "--timeout", "2")
    assert_one_line_error(result, "MPS is not available here: this is Linux")
    assert "set MAC_DEVICE=cpu here and in the desktop's .env" in result.stderr


def test_worker_refuses_version_mismatch_in_one_sentence():
    from hetbench.cluster.admission import check_versions, versions
    from hetbench.errors import UserError

    mine = versions()
    check_versions(mine, dict(mine))  # equal: nothing to say
    with pytest.raises(
        UserError, match=r"version mismatch: python \S+ here but \S+ on the head; ray 2\.60\.0 here but 2\.59\.0"
    ):
        check_versions(mine, {**mine, "python": "3.12", "ray": "2.59.0"})
    # a stale image: the same version string, other code
    with pytest.raises(UserError, match=r"version mismatch: hetbench code [0-9a-f]{12} here but 0123456789ab on the"):
        check_versions(mine, {**mine, "hetbench code": "0123456789ab"})


@pytest.mark.parametrize(
    "setting, message",
    [
        ("cluster.ray_address=127.0.0.1:9", "cannot reach 127.0.0.1:9 within 3 s"),
        ("cluster.dask_scheduler=tcp://127.0.0.1:9", "cannot reach tcp://127.0.0.1:9 within 3 s"),
    ],
    ids=["ray", "dask"],
)
def test_an_unreachable_cluster_address_is_exit_2_within_bounded_time(cli, tmp_path, setting, message):
    strategy = "dask-sync" if "dask" in setting else "ray-ps"
    started = time.monotonic()
    result = cli(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        *TINY,
        "--set",
        f"strategies=[{strategy}]",
        "--set",
        setting,
        "--set",
        "cluster.connect_timeout_s=3",
        "--results-dir",
        str(tmp_path),
    )
    assert_one_line_error(result, message)
    assert time.monotonic() - started < 60


# The console script itself, in its own process: help, one bad input, one tiny run.


def test_the_console_script_shows_help():
    result = hetbench("run", "--help")
    assert result.returncode == 0 and "usage: hetbench run" in result.stdout and "(default: None)" in result.stdout


def test_the_console_script_refuses_bad_input_in_one_line(config):
    assert_one_line_error(hetbench("run", "-c", config("stepps: 1\n")), "unknown config key 'stepps'")


def test_the_console_script_runs_prints_the_table_and_says_where_records_are(tmp_path, shared_cluster):
    result = hetbench(
        "run",
        "-c",
        "benchmarks/configs/quick.yaml",
        *TINY[:-2],  # with the floor
        "--set",
        "strategies=[single]",
        "--set",
        "floor.iterations=3",
        "--set",
        "test_samples=300",
        *sets(*shared_cluster.overrides),
        "--results-dir",
        str(tmp_path / "r"),
        timeout=200,
    )
    assert result.returncode == 0, result.stderr
    assert "| single" in result.stdout and "| gloo-floor" in result.stdout
    assert "records:" in result.stderr and list((tmp_path / "r" / "raw").glob("*-quick-*.json"))

"""Checkpoints and --resume: an interrupted run continues where it stopped, on the same trajectory."""

import json
import signal

import pytest
import torch

from helpers import UNEQUAL, assert_one_line_error, made, small_config, stop_a_run
from hetbench.strategies import registry
from hetbench.strategies.registry import STRATEGIES

RUN = [
    "--set",
    "strategies=[single, ray-ps]",
    "--set",
    "workers=[{name: big, batch: 40}, {name: small, batch: 24}]",
    "--set",
    "steps=12",
    "--set",
    "warmup_steps=0",
    "--set",
    "eval_every=3",
    "--set",
    "fine_eval_every=0",  # checked at the same steps as single's, whatever the accuracy
    "--set",
    "repeats=2",
    "--set",
    "checkpoint_every=3",
    "--set",
    "floor.enabled=false",
    "--set",
    "download=false",
    "--set",
    "eval_samples=500",
    "--set",
    "standalone_steps=0",
]


def checkpointed_in_repeat(results, key: str) -> bool:
    """Whether the row `key` has kept a checkpoint inside a repeat (its file says, from a pass's
    start, only which repeats it finished)."""
    return any(torch.load(p, weights_only=True)["progress"] for p in results.glob(f"checkpoints/*/{key}.pt"))


@pytest.mark.slow
def test_a_run_stopped_mid_scenario_resumes_from_its_checkpoint_on_the_same_trajectory(cli, tmp_path):
    def in_ray_ps() -> bool:  # between its first checkpoint and its end
        return checkpointed_in_repeat(tmp_path, "ray-ps-equal")

    code, err = stop_a_run(tmp_path, ["-c", "benchmarks/configs/quick.yaml", *RUN], in_ray_ps)
    assert code == 130, err[-2000:]
    (record_file,) = tmp_path.glob("raw/*.json")
    # the first pass had trained single's first repeat (written) when ray-ps's was stopped
    (interrupted,) = json.loads(record_file.read_text())
    assert interrupted["strategy"] == "single" and len(interrupted["repeat_samples_per_s"]) == 1

    resumed = cli("run", "--resume", str(record_file))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "single: going on from repeat 2" in resumed.stderr
    single, ray_ps = json.loads(record_file.read_text())  # single's record replaced in place
    assert ray_ps["strategy"] == "ray-ps" and ray_ps["status"] == "ok"
    assert len(single["repeat_samples_per_s"]) == len(ray_ps["repeat_samples_per_s"]) == 2
    assert (single["run_order"], ray_ps["run_order"]) == ([1, 2], [2, 1])  # as the uninterrupted run's
    assert ray_ps["resumed_at"]["repeat"] * 12 + ray_ps["resumed_at"]["step"] >= 3
    # every ray-ps step equals the single-device step (dropout's masks keyed by sample), so the resumed run's accuracy
    # follows the uninterrupted baseline's, checkpoint by checkpoint (one image of 500 = 0.002)
    for a, b in zip(single["accuracy_curve"], ray_ps["accuracy_curve"], strict=True):
        assert a["step"] == b["step"] and a["accuracy"] == pytest.approx(b["accuracy"], abs=0.0021)
    assert ray_ps["final_accuracy"] == pytest.approx(single["final_accuracy"], abs=0.001)
    left = sorted(p.name for p in tmp_path.glob("checkpoints/*/*"))
    assert left == ["run.json"]  # a recorded scenario's checkpoint is removed


@pytest.mark.slow
def test_every_strategy_interrupted_with_ctrl_c_resumes_to_every_row_once(cli, tmp_path):
    """Ctrl-C (SIGINT to the run's process group) in ray-train's first pass, then --resume: every row
    once, with every repeat; the passes recorded before the interrupt as they were; ray-train goes on
    from its checkpoint on the single-device trajectory, and the table says how each row resumed."""
    every = ["--set", f"strategies=[{', '.join(STRATEGIES)}]"]
    args = ["-c", "benchmarks/configs/quick.yaml", *RUN, *every]

    def in_ray_train() -> bool:
        return checkpointed_in_repeat(tmp_path, "ray-train-equal")

    code, err = stop_a_run(tmp_path, args, in_ray_train, signum=signal.SIGINT)
    assert code == 130 and "interrupted; records written so far are kept" in err, err[-2000:]
    (record_file,) = tmp_path.glob("raw/*.json")
    before = {r["strategy"]: r for r in json.loads(record_file.read_text())}
    assert set(before) == {"single", "ray-ps", "ray-ps-async"}  # ray-train's first pass was under way

    resumed = cli("run", "--resume", str(record_file))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "cannot be resumed" not in err + resumed.stderr
    rows = json.loads(record_file.read_text())
    assert [r["strategy"] for r in rows] == list(STRATEGIES)  # each once, in the config's order
    assert all(r["status"] == "ok" and len(r["repeat_samples_per_s"]) == 2 for r in rows), rows
    by_name = {r["strategy"]: r for r in rows}
    for name, was in before.items():  # the first pass of a row recorded before, as it was
        now = by_name[name]
        assert (
            now["repeat_samples_per_s"][0] == was["repeat_samples_per_s"][0]
            and now["run_order"][0] == was["run_order"][0]
        )
    ray_train = by_name["ray-train"]  # stopped inside its first repeat: on from its checkpoint
    assert ray_train["resumed_at"]["repeat"] == 0 and ray_train["resumed_at"]["step"] in (3, 6, 9)
    for a, b in zip(by_name["single"]["accuracy_curve"], ray_train["accuracy_curve"], strict=True):
        assert a["step"] == b["step"] and a["accuracy"] == pytest.approx(b["accuracy"], abs=0.0021)
    (table,) = tmp_path.glob("*.md")
    (resumed_note,) = [line for line in table.read_text().splitlines() if "resumed after an interrupt" in line]
    assert resumed_note.startswith("ray-train [equal]: resumed after an interrupt, repeat 1 from its checkpoint after")


RESUMABLE = [name for name in STRATEGIES if registry.load(name).resumable]
FAST = ("single", "dask-sync")  # the rest start Ray workers or groups: the slow tier's


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in RESUMABLE])
def test_a_checkpoint_read_back_weights_only_continues_exactly_in_a_new_start(tmp_path, name, shared_cluster):
    """As a resumed pass does: the state after step 9 written to its file and read back weights-only,
    loaded into the strategy started afresh, trains on to the weights the first start reached (16
    steps: ray-localsgd's checkpoint inside its second round, which ends in an exchange)."""
    from hetbench.results.checkpoints import RunCheckpoints

    overrides = ["dropout=0", "steps=16", "warmup_steps=0", "eval_every=5", "checkpoint_every=5"]
    cfg = small_config(tmp_path, UNEQUAL, *overrides, *shared_cluster.overrides)
    kept = RunCheckpoints(str(tmp_path), "run")
    kept.dir.mkdir(parents=True)
    weights = []
    for resuming in (False, True):
        strategy = made(registry.load(name), cfg)
        try:
            strategy.start()
            strategy.reset(cfg.run.seed)
            if resuming:
                strategy.load_state(kept.load(name)["state"])
            for step in range(10 if resuming else 0, 16):
                strategy.step(step)
                if step == 9 and not resuming:
                    kept.save(name, {"state": strategy.state()})  # refused here unless plain data
            weights.append(strategy.weights().clone())
        finally:
            strategy.close()
    assert torch.equal(*weights)


def test_resume_refuses_what_it_cannot_continue(cli, tmp_path):
    assert_one_line_error(
        cli("run", "--resume", "nothing-like-it", "--results-dir", str(tmp_path)),
        "run nothing-like-it kept no checkpoints",
    )
    assert_one_line_error(
        cli("run", "--resume", "x", "-c", "benchmarks/configs/quick.yaml"),
        "--resume continues a run with the config it was started with",
    )
    assert_one_line_error(cli("run"), "needs a config (-c CONFIG) or a run to continue (--resume RUN)")
    kept = tmp_path / "checkpoints" / "broken"
    kept.mkdir(parents=True)
    for text, message in [
        ('{"config": {}, "config": {}}', "key 'config' is given twice in one object"),
        ('{"config": [1]}', "does not hold a run's config and speeds"),
        ('{"config": {}, "standalone": 3}', "its speeds must be an object or null"),
    ]:
        (kept / "run.json").write_text(text)
        assert_one_line_error(cli("run", "--resume", "broken", "--results-dir", str(tmp_path)), message)


class Planted:
    """What a foreign checkpoint could carry: an object whose unpickling would run its code."""

    def __reduce__(self):
        return (print, ("ran code from a checkpoint",))


def test_a_checkpoint_that_would_run_code_is_refused_in_one_sentence(tmp_path):
    import torch

    from hetbench.errors import UserError
    from hetbench.results.checkpoints import RunCheckpoints

    kept = RunCheckpoints(str(tmp_path), "run")
    kept.dir.mkdir(parents=True)
    torch.save({"progress": Planted()}, kept.dir / "single.pt")
    with pytest.raises(UserError, match=r"^checkpoint .*single\.pt cannot be read: it holds a [\w.]*print, and"):
        kept.load("single")


def test_numpy_values_in_what_a_row_keeps_are_saved_as_plain_data_and_read_back_weights_only(tmp_path):
    import numpy as np
    import torch

    from hetbench.results.checkpoints import RunCheckpoints

    kept = RunCheckpoints(str(tmp_path), "run")
    kept.dir.mkdir(parents=True)
    payload = {"done": [{"samples_per_s": np.float64(812.5), "steps": (np.int64(3), 4)}], "w": np.ones(3)}
    kept.save("ray-ps-async-equal", payload)
    loaded = kept.load("ray-ps-async-equal")
    assert loaded["done"] == [{"samples_per_s": 812.5, "steps": (3, 4)}] and type(loaded["done"][0]["steps"][0]) is int
    assert torch.equal(loaded["w"], torch.ones(3, dtype=torch.float64))

"""Checkpoints and --resume: an interrupted run continues where it stopped, on the same trajectory."""

import json

import pytest
import torch

from helpers import UNEQUAL, assert_one_line_error, made, sigterm_a_run, small_config
from hetbench.strategies.dask_sync import DaskSync
from hetbench.strategies.single import Single

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


@pytest.mark.slow
def test_a_run_stopped_mid_scenario_resumes_from_its_checkpoint_on_the_same_trajectory(cli, tmp_path):
    def in_ray_ps() -> bool:  # between its first checkpoint and its end
        return bool(list(tmp_path.glob("checkpoints/*/ray-ps-equal.pt")))

    code, err = sigterm_a_run(tmp_path, ["-c", "benchmarks/configs/quick.yaml", *RUN], in_ray_ps)
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


@pytest.mark.parametrize("strategy_cls", [Single, DaskSync])
def test_state_taken_and_loaded_continues_exactly(tmp_path, strategy_cls, shared_cluster):
    strategy = made(strategy_cls, small_config(tmp_path, UNEQUAL, "dropout=0", *shared_cluster.overrides))
    try:
        strategy.start()
        strategy.reset(0)
        for step in range(3):
            strategy.step(step)
        state = strategy.state()
        for step in range(3, 5):
            strategy.step(step)
        straight = strategy.weights().clone()
        strategy.reset(0)
        strategy.load_state(state)
        for step in range(3, 5):
            strategy.step(step)
        assert torch.equal(strategy.weights(), straight)
    finally:
        strategy.close()


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

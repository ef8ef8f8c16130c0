"""A user's workload through the seam: found by module:function, refused in one sentence where
hetbench cannot train it alike, marked inexact where its dropout is the process's own, and
fingerprinted so the driver refuses a machine running another copy."""

from dataclasses import replace

import pytest
import torch
from torch import nn

from helpers import assert_one_line_error
from hetbench.config import RunConfig
from hetbench.errors import UserError
from hetbench.workload import KeyedDropout, LoadedWorkload, check_same_workload, keyed_dropout, load_workload
from tiny_workload import build
from tiny_workload import data as tiny_data


def test_a_users_module_function_is_loaded_with_its_own_optimizer():
    loaded = load_workload(RunConfig(workload="tiny_workload:build"))
    assert (loaded.name, loaded.spec, loaded.exact, loaded.parameters) == ("tiny-mlp", "tiny_workload:build", True, 676)
    optimizer = loaded.build_optimizer(loaded.build_model(0).parameters(), RunConfig())
    assert isinstance(optimizer.optimizer, torch.optim.SGD) and optimizer.scheduler is None
    assert loaded.facts().optimizer == "SGD" and load_workload(RunConfig()).facts().optimizer is None
    train = loaded.train_split()
    assert train.inputs.shape == (2_000, 16) and train.labels.dtype.name == "int64"
    assert torch.equal(loaded.build_model(3)[0].weight, loaded.build_model(3)[0].weight)


def test_a_dict_with_a_module_and_a_dataset_is_a_workload_made_alike_in_every_process():
    """The plainest form a user writes: build(seed) -> {"model": a module, "train": a Dataset, "test":
    a tensor pair}; every process calls it under the run's seed, so the module's weights agree."""
    loaded = load_workload(RunConfig(workload="tiny_workload:as_dict", seed=5))
    loaded.preflight(RunConfig())
    train = loaded.train_split()
    assert train.inputs.shape == (2_000, 16) and train.labels.dtype.name == "int64"
    assert torch.equal(torch.from_numpy(train.inputs), tiny_data(2_000, 0)[0])
    first, again = loaded.build_model(0), loaded.build_model(1)  # a module: every repeat starts from its weights
    assert torch.equal(first[0].weight, again[0].weight) and first is not again
    import tiny_workload

    elsewhere = tiny_workload.as_dict(5)["model"]  # another process's call, under the same seed
    assert not torch.equal(elsewhere[0].weight, first[0].weight)  # bare, its draws follow the caller's stream
    from hetbench.workload import _called

    made = _called(tiny_workload.as_dict, "tiny_workload:as_dict", 5)["model"]
    assert torch.equal(made[0].weight, first[0].weight)  # hetbench's call: the same weights in every process
    assert loaded.facts().input_shape == [16] and loaded.facts().keyed_layers == 1


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module:build", "workload no_such_module:build: no module no_such_module on this machine's"),
        ("tiny_workload:nothing", "workload tiny_workload:nothing: module tiny_workload"),
        ("tiny_workload", "workload 'tiny_workload' is neither a built-in (mnist-cnn, shapes-resnet) nor a module"),
        ("tiny_workload:data", "workload tiny_workload:data: data() raised TypeError"),
        ("tiny_workload:wide_prepare", "workload tiny_workload:wide_prepare: its prepare() returns float64"),
        ("tiny_workload:summed_loss", "workload tiny_workload:summed_loss: its loss is not a mean over the batch"),
        ("tiny_workload:counting", "its model's buffers (2.seen) change in a training step, and hetbench"),
        ("tiny_workload:no_test", "workload tiny_workload:no_test: what it returned has no test: it needs"),
        ("tiny_workload:Counting", "workload tiny_workload:Counting: it returned a Counting, not a hetbench"),
        ("tiny_workload:regression", "workload tiny_workload:regression: its labels are not class indices, so rows"),
        ("tiny_workload:not_a_scheduler", "its scheduler returned a SGD, not a torch LRScheduler (scheduler: lambda"),
        ("tiny_workload:top2_accuracy", "rows are judged by its metric, top-2 accuracy: set target_metric, the"),
        ("tiny_workload:with_no_scores", "returns a tensor of shape [32] for a batch of 8, and accuracy reads class"),
    ],
)
def test_a_bad_workload_is_one_sentence_and_exit_2(cli, spec, says):
    assert_one_line_error(cli("run", "-c", "benchmarks/configs/quick.yaml", "--set", f"workload={spec}"), says)


def test_float_targets_make_the_test_loss_the_metric_and_it_needs_a_target_loss():
    loaded = load_workload(RunConfig(workload="tiny_workload:regression"))
    train = loaded.train_split()
    assert (train.labels.shape, train.labels.dtype.name) == ((2_000, 2), "float32")
    assert loaded.metric.name == "loss" and loaded.facts().metric == "loss"
    assert load_workload(RunConfig(workload="tiny_workload:build")).facts().metric == "accuracy"
    loaded.preflight(RunConfig(target_loss=0.5))
    with pytest.raises(UserError, match="set target_loss, the test loss to train to"):
        loaded.preflight(RunConfig())


def test_a_metric_of_the_workloads_own_judges_it_and_must_give_a_number_for_the_batch():
    loaded = load_workload(RunConfig(workload="tiny_workload:top2_accuracy"))
    assert (loaded.metric.name, loaded.metric.higher_is_better) == ("top-2 accuracy", True)
    assert (loaded.facts().metric, loaded.facts().higher_is_better) == ("top-2 accuracy", True)
    loaded.preflight(RunConfig(target_metric=0.9))
    # summed over the test batches and counted: a batch of 3 and one of 1, as the whole 4
    outputs = torch.tensor([[3.0, 2, 1, 0], [0, 1, 2, 3], [1, 0, 3, 2], [0, 3, 2, 1]])
    labels = torch.tensor([1, 0, 3, 2])
    assert loaded.score(outputs[:3], labels[:3]) == (pytest.approx(2.0), 3)  # the first and the third
    assert loaded.score(outputs[3:], labels[3:]) == (pytest.approx(1.0), 1)
    wrong = load_workload(RunConfig(workload="tiny_workload:metric_of_a_tensor"))
    with pytest.raises(UserError, match=r"its metric returns a tensor of shape \[8\] for a test batch, not one number"):
        wrong.preflight(RunConfig(target_metric=0.9))


def test_accuracy_reads_the_class_scores_of_a_tuple_or_of_logits_as_of_a_tensor():
    from hetbench.gradients import FlatModel
    from hetbench.training import Evaluator

    run = RunConfig(workload="tiny_workload:build", eval_samples=600)
    weights = FlatModel(load_workload(run).build_model(3)).params
    plain = Evaluator(load_workload(run), run)(weights)
    for spec in ("tiny_workload:with_aux", "tiny_workload:with_logits"):
        loaded = load_workload(replace(run, workload=spec))
        loaded.preflight(run)
        assert Evaluator(loaded, run)(weights) == plain  # the same net within, the same weights


def test_a_run_judged_by_a_metric_of_its_own_trains_to_it_and_names_it(cli, tmp_path, shared_cluster):
    judged = ["workload=tiny_workload:top2_accuracy", "target_metric=0.7"]
    single, ddp, table = single_and_ddp(cli, tmp_path, shared_cluster, *judged)
    assert single["workload"]["metric"] == ddp["workload"]["metric"] == "top-2 accuracy"
    curve = [(p["train_s"], p["accuracy"]) for p in single["accuracy_curve"]]
    reached = next(seconds for seconds, top2 in curve if top2 >= 0.7)  # from below: the first check at or over it
    assert single["time_to_target_s"] == reached and single["target_accuracy"] == 0.7
    assert "| top-2 accuracy " in table and "| test acc" not in table
    verdict = next(line for line in table.splitlines() if line.startswith("Verdict"))
    assert "top-2 accuracy 0.7" in verdict, verdict


def single_and_ddp(cli, tmp_path, shared_cluster, *settings: str) -> tuple[dict, dict, str]:
    """`hetbench run` of single and torch-ddp, 16 steps, with `settings`: their records and the table."""
    import json

    from helpers import sets

    settings = [*settings, "strategies=[single, torch-ddp]", "steps=16", "warmup_steps=1", "repeats=1"]
    settings += ["eval_every=4", "fine_eval_every=0", "standalone_steps=2", "floor.enabled=false"]
    result = cli(
        "run", "-c", "benchmarks/configs/quick.yaml", *sets(*settings, *shared_cluster.overrides),
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (raw,) = (tmp_path / "raw").glob("*.json")
    single, ddp = json.loads(raw.read_text())
    return single, ddp, (tmp_path / "quick.md").read_text()


def test_plain_dropout_is_inexact_with_its_reason_and_keyed_dropout_swaps_it():
    loaded = load_workload(RunConfig(workload="tiny_workload:plain"))
    assert not loaded.exact and loaded.facts().inexact.startswith("its dropout (2) draws from each process's own")
    model = keyed_dropout(nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Dropout(0.3)), nn.Dropout2d(0.1)))
    assert isinstance(model[1][0], KeyedDropout) and model[1][0].p == 0.3
    assert isinstance(model[2], nn.Dropout2d)  # whole channels: left as it is


def test_the_code_digest_covers_the_users_module_and_a_different_copy_is_refused(tmp_path):
    import tiny_workload

    source = open(tiny_workload.__file__).read()
    copies = {}
    for name, text in (("desk", source), ("mac", source.replace("lr=0.1", "lr=0.2"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tiny_workload.py").write_text(text)
        copies[name] = LoadedWorkload("tiny_workload:build", build(), [tmp_path / name / "tiny_workload.py"])
    assert copies["desk"].code == load_workload(RunConfig(workload="tiny_workload:build")).code
    assert copies["desk"].code != copies["mac"].code
    workers = [{"name": name, "workload": copy.fingerprint()} for name, copy in copies.items()]
    with pytest.raises(UserError) as refused:
        check_same_workload(workers)
    assert str(refused.value) == (
        "the workers would train different code: tiny_workload.py differs: desk runs workload tiny_workload:build "
        f"(code {copies['desk'].code}), "
        f"but mac runs tiny_workload:build (code {copies['mac'].code}); give every machine the same copy of the "
        "workload's module"
    )
    check_same_workload(workers[:1] * 2)  # the same copy: no sentence


def test_a_frozen_layer_is_neither_counted_nor_moved_and_the_server_shares_the_rest():
    """The parameter server's shared memory is sized by the workload's count and filled from FlatModel:
    both the trainable parameters only, so a model with a frozen layer fits, and its layer stays put."""
    from hetbench.config import Job
    from strategies.parameter_server import ParameterServer

    job = Job(run=RunConfig(workload="tiny_workload:frozen"))
    loaded = load_workload(job.run)
    assert loaded.parameters == 676 - (16 * 32 + 32)  # the tiny MLP less its frozen first layer
    server = ParameterServer()
    if server.share_with(job, slots=1) is None:
        pytest.skip("no shared memory on this machine")
    try:
        server.reset(job, seed=3)
        assert server.flat.params.numel() == loaded.parameters == server.shared.numel
        frozen = server.flat.model[0].weight
        assert torch.equal(frozen, loaded.build_model(3)[0].weight) and frozen.grad is None
    finally:
        server.shared_by_all()


@pytest.mark.slow
def test_hetbench_run_trains_a_users_module_through_every_strategy_on_two_nodes(tmp_path):
    """The README's command from the user's own folder: `mypkg.mymodel:build` found there by the driver,
    and by the processes of both local nodes (the mac's too), through every registered strategy."""
    import json

    import tiny_workload
    from helpers import REPO, hetbench, sets
    from hetbench.strategies import registry

    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "mymodel.py").write_text(open(tiny_workload.__file__).read())
    settings = ["workload=mypkg.mymodel:build", f"strategies=[{', '.join(registry.STRATEGIES)}]"]
    settings += ["workers=[{name: desk, node: desktop}, {name: mac, node: mac, slowdown: 2}]"]
    settings += ["cluster.mode=local-multinode", "batch_size=64", "steps=4", "warmup_steps=1", "repeats=1"]
    settings += ["eval_every=2", "standalone_steps=2", "floor.iterations=5", "target_accuracy=0.3"]
    config = str(REPO / "benchmarks" / "configs" / "quick.yaml")
    result = hetbench("run", "-c", config, *sets(*settings), "--results-dir", "out", cwd=project, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    (raw,) = (project / "out" / "raw").glob("*.json")
    records = json.loads(raw.read_text())
    rows = [r for r in records if r["strategy"] in registry.STRATEGIES]
    assert sorted(r["strategy"] for r in rows) == sorted(registry.STRATEGIES)
    assert all(r["status"] == "ok" for r in records), [(r["strategy"], r.get("reason")) for r in records]
    assert {(r["workload"]["spec"], r["workload"]["name"], r["workload"]["exact"]) for r in rows} == {
        ("mypkg.mymodel:build", "tiny-mlp", True)
    }
    floor = next(r for r in records if r["strategy"] == "gloo-floor")
    assert floor["bytes"] == 676 * 4  # the user's model is what the floor moves
    table = (project / "out" / "quick.md").read_text()
    assert "Workload: tiny-mlp (676 parameters, 0.0027 MB a step, input [16], its own SGD)." in table


def test_a_run_of_float_targets_judges_rows_by_their_test_loss_in_records_tables_and_verdict(
    cli, tmp_path, shared_cluster
):
    judged = ["workload=tiny_workload:regression", "target_loss=0.5"]
    single, ddp, table = single_and_ddp(cli, tmp_path, shared_cluster, *judged)
    assert (single["workload"]["metric"], ddp["workload"]["metric"]) == ("loss", "loss")
    curve = [(p["train_s"], p["accuracy"]) for p in single["accuracy_curve"]]
    assert curve[-1][1] < curve[0][1]  # the test loss falls
    reached = next(seconds for seconds, loss in curve if loss <= 0.5)  # from above: the first check at or under it
    assert single["time_to_target_s"] == reached and single["target_accuracy"] == 0.5
    assert "| test loss " in table and "| test acc" not in table and "test loss 0.5" in table.split("\n\n")[2]
    assert (tmp_path / "quick.csv").read_text().splitlines()[0].count(",test loss,") == 1


def test_the_example_models_load_as_a_user_trains_them():
    """workloads/: a torchvision-style ResNet with batch norm and a schedule, and a small causal
    transformer with its own token loss, AdamW and warm-up then cosine (docs/workloads.md)."""
    resnet = load_workload(RunConfig(workload="workloads.resnet_bn:build"))
    resnet.preflight(RunConfig())
    assert (resnet.exact, resnet.facts().batch_norm_layers, resnet.facts().scheduler) == (False, 9, "LambdaLR")
    lm = load_workload(RunConfig(workload="workloads.tiny_lm:build", target_loss=2.0))
    lm.preflight(RunConfig(target_loss=2.0))
    assert (lm.exact, lm.metric.name, lm.facts().optimizer, lm.facts().input_shape) == (True, "loss", "AdamW", [32])

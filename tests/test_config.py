import pytest

from helpers import REPO
from hetbench import config
from hetbench.balance import split_batch
from hetbench.config import DEFAULTS, LinkConfig
from hetbench.errors import UserError
from hetbench.scenarios import balanced
from hetbench.strategies import registry


def load_config(path, overrides=()):
    """As the CLI loads one: every registered strategy's own settings known."""
    return config.load_config(path, overrides, registry.declared())


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_then_yaml_then_set(tmp_path):
    path = write(tmp_path, "steps: 7\nlr: 0.5\n")
    cfg = load_config(path, ["lr=0.25", "floor.iterations=3"])
    assert cfg.run.steps == 7 and cfg.run.lr == 0.25 and cfg.floor.iterations == 3
    assert cfg.run.repeats == DEFAULTS["repeats"] and cfg.run.name == "c"


def test_unknown_key_lists_the_valid_ones(tmp_path):
    with pytest.raises(UserError, match=r"unknown config key 'stepz'; valid keys: name, strategies"):
        load_config(write(tmp_path, "stepz: 3\n"))


def test_unknown_nested_and_worker_keys(tmp_path):
    with pytest.raises(UserError, match=r"unknown config key 'cluster.adress'"):
        load_config(write(tmp_path, "cluster: {adress: x}\n"))
    with pytest.raises(UserError, match=r"unknown config key 'workers\[1\].gpu'"):
        load_config(write(tmp_path, "workers: [{name: a}, {gpu: 1}]\n"))


def test_wrong_type_and_bad_choice(tmp_path):
    with pytest.raises(UserError, match=r"'steps' must be int, got str"):
        load_config(None, ["steps=many"])
    with pytest.raises(UserError, match=r"'optimizer' must be one of adadelta, sgd, adam"):
        load_config(None, ["optimizer=rmsprop"])
    with pytest.raises(UserError, match=r"'download' must be bool"):
        load_config(None, ["download=3"])


def test_malformed_yaml_says_where(tmp_path):
    with pytest.raises(UserError, match=r"not valid YAML at line [23]"):
        load_config(write(tmp_path, "steps: 3\nlr: [1, 2\nseed: 3\n"))


def test_explicit_batches_set_the_global_batch(tmp_path):
    cfg = load_config(write(tmp_path, "workers: [{batch: 40}, {batch: 24}]\n"))
    assert [w.batch for w in cfg.workers] == [40, 24] and cfg.run.batch_size == 64
    assert [w.name for w in cfg.workers] == ["w0", "w1"]


def test_shares_split_the_global_batch_exactly(tmp_path):
    cfg = load_config(write(tmp_path, "batch_size: 100\nworkers: [{share: 0.7}, {share: 0.2}, {share: 0.1}]\n"))
    assert [w.batch for w in cfg.workers] == [70, 20, 10]


def test_equal_split_when_neither_is_given(tmp_path):
    cfg = load_config(write(tmp_path, "batch_size: 65\nworkers: [{}, {}]\n"))
    assert sorted(w.batch for w in cfg.workers) == [32, 33]


@pytest.mark.parametrize(
    "text,message",
    [
        ("workers: [{batch: 0}]", "batch must be positive"),
        ("workers: [{batch: -3}]", "batch must be positive"),
        ("workers: [{share: 0.5}, {share: 0.4}]", "shares must sum to 1"),
        ("workers: [{batch: 3}, {share: 0.5}]", "not a mix"),
        ("workers: [{name: a}, {name: a}]", "duplicate worker name 'a'"),
        ("workers: []", "non-empty list"),
        ("batch_size: -1", "'batch_size' must be positive"),
        ("steps: 0", "'steps' must be positive"),
        ("dropout: 1.5", "'dropout' must be in"),
        ("strategies: []", "at least one strategy"),
        ("workers: [{slowdown: 0.5}]", "slowdown must be >= 1.0"),
        ("balance: [equal, fastest]", "'balance' must be one of equal, proportional, auto"),
        ("balance: auto\nworkers: [{batch: 8}, {batch: 8}]", "remove the workers' batch/share"),
        ("balance: auto\nstandalone_steps: 0", "standalone_steps must be positive"),
        ("rebalance_every: -1", "'rebalance_every' must not be negative"),
        ("fine_eval_every: -2", "'fine_eval_every' must not be negative"),
        ("evaluated_repeats: 0", "'evaluated_repeats' must be positive"),
        ("fine_eval_within: 1.5", r"'fine_eval_within' must be in \[0, 1\], got 1.5"),
        ("rebalance_every: often", "rebalance_every"),
        ("cluster: {mode: cloud}", "'cluster.mode' must be one of local, local-multinode"),
        ("link: {rate: 100mbit}", "set cluster.mode local-multinode"),
        ("link: {profile: dialup}", "'link.profile' must be one of 10gbit, 1gbit, wifi, 100mbit"),
        ("link: {profile: wifi, rate: 1gbit}", "set link.profile or link.rate, not both"),
        ("link: {profile: wifi}", "set cluster.mode local-multinode"),
        ("cluster: {pin_nodes: true}", "pin_nodes shares out the cores among local nodes: set cluster.mode"),
        ("workers: [{speed: 0}]", "speed must be positive"),
        ("- a\n- b", "must be a mapping"),
        ("torch-ddp: {compression: zip}", "'torch-ddp.compression' must be one of none, powersgd"),
        ("torch-ddp: {powersgd_rank: 0}", "'torch-ddp.powersgd_rank' must be a whole number >= 1"),
        ("torch-ddp: {powersgd_rank: 2.5}", "'torch-ddp.powersgd_rank' must be int"),
        ("torch-ddp: {powersgd_start: 1}", "'torch-ddp.powersgd_start' must be a whole number >= 2"),
    ],
)
def test_bad_values_are_one_sentence(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        load_config(write(tmp_path, text + "\n"))


@pytest.mark.parametrize("path", sorted((REPO / "benchmarks" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    assert load_config(str(path)).run.strategies


def test_a_link_profile_is_its_rate(tmp_path):
    cfg = load_config(None, ["cluster.mode=local-multinode", "workers=[{node: a}, {node: b}]", "link.profile=wifi"])
    assert cfg.link == LinkConfig(profile="wifi", rate="200mbit")


def test_set_reaches_into_worker_lists(tmp_path):
    cfg = load_config(write(tmp_path, "workers: [{batch: 8}, {batch: 8}]\n"), ["workers.1.batch=24"])
    assert [w.batch for w in cfg.workers] == [8, 24]
    with pytest.raises(UserError, match="not an index"):
        load_config(write(tmp_path, "workers: [{batch: 8}]\n"), ["workers.5.batch=1"])
    with pytest.raises(UserError, match="key=value"):
        load_config(None, ["steps"])


@pytest.mark.parametrize("total,weights", [(64, [1, 1]), (100, [3, 1, 1]), (7, [0.9, 0.05, 0.05]), (256, [1] * 7)])
def test_split_batch_sums_exactly_and_gives_everyone_at_least_one(total, weights):
    parts = split_batch(total, weights)
    assert sum(parts) == total and min(parts) >= 1 and len(parts) == len(weights)


def test_balanced_splits_keep_the_global_batch_and_follow_speed():
    cfg = load_config(
        None,
        [
            "batch_size=256",
            "balance=[equal, proportional, auto]",
            "workers=[{name: fast}, {name: slow, slowdown: 3}, {name: odd, speed: 0.5}]",
        ],
    )
    assert [w.batch for w in balanced(cfg, "equal").workers] == [86, 85, 85]
    assert [w.batch for w in balanced(cfg, "proportional").workers] == [140, 46, 70]  # 1 : 1/3 : 0.5 of 256
    auto = balanced(cfg, "auto", {"fast": 900.0, "slow": 300.0, "odd": 300.0})
    assert [w.batch for w in auto.workers] == [154, 51, 51] and auto.run.balance == ("auto",)
    assert cfg.run.balance == ("equal", "proportional", "auto")  # the run's config is left as it was


def test_every_key_has_a_one_line_doc_and_the_described_defaults_load_as_the_defaults(tmp_path, cli):
    from dataclasses import fields, replace

    for section in (config.RunConfig, config.WorkerConfig, *config.SECTIONS.values()):
        assert all(f.metadata.get("doc") and "\n" not in f.metadata["doc"] for f in fields(section)), section
    shown = cli("settings")
    assert shown.returncode == 0 and "  max_staleness: 2  # " in shown.stdout  # a strategy's own, too
    cfg = load_config(write(tmp_path, shown.stdout))
    assert replace(cfg, run=replace(cfg.run, name="run")) == load_config(None)


def test_a_config_as_records_keep_it_loads_back_as_it_was(tmp_path):
    # a checkpoint's run.json: resolved already (every batch set, the profile beside its rate)
    cfg = load_config(
        None,
        [
            "balance=[equal, proportional, auto]",
            "workers=[{name: a, node: x}, {node: y, slowdown: 2}]",
            "cluster.mode=local-multinode",
            "link.profile=wifi",
            "faults=[{at_step: 3, kill: worker, target: a}]",
            "ray-ps-async.max_staleness=1",
        ],
    )
    assert config.from_dict(cfg.as_dict(), registry.declared()) == cfg


def test_a_renamed_strategy_loads_under_its_old_name_in_configs_and_records(tmp_path):
    import json

    from hetbench.results.records import read_records

    old = tmp_path / "old.yaml"
    old.write_text("strategies: [single, ray-train-gloo]\nray-train-gloo: {max_failures: 3}\n")
    cfg = load_config(str(old))
    assert cfg.run.strategies == ("single", "ray-train") and cfg.options["ray-train"]["max_failures"] == 3
    records = tmp_path / "old.json"
    records.write_text(json.dumps([{"strategy": "ray-train-gloo", "status": "ok"}]))
    assert [r.strategy for r in read_records([str(records)])] == ["ray-train"]


def test_a_workload_brings_its_schedule_and_a_config_section_per_workload_beats_it(tmp_path):
    from hetbench.workloads import BUILT_IN

    path = write(tmp_path, "steps: 30\nmnist-cnn: {steps: 60, repeats: 4}\nshapes-resnet: {repeats: 1}\n")
    mnist = load_config(path)
    assert (mnist.run.steps, mnist.run.repeats, mnist.run.optimizer) == (60, 4, DEFAULTS["optimizer"])
    shapes = load_config(path, ["workload=shapes-resnet"]).run
    assert (shapes.steps, shapes.repeats) == (30, 1)  # the top level over the schedule, the section over both
    assert (shapes.optimizer, shapes.lr, shapes.target_accuracy) == ("adam", 0.002, 0.6)  # its own settings
    assert load_config(path, ["workload=shapes-resnet", "repeats=5", "lr=0.01"]).run.repeats == 5  # --set last
    assert load_config(path, ["mnist-cnn.steps=9"]).run.steps == 9
    for name in BUILT_IN:  # every built-in's settings are run keys of the right types, and it loads
        assert load_config(None, [f"workload={name}"]).run.workload == name
        assert set(config.BUILT_IN_WORKLOADS[name]) <= set(config.RUN_KINDS) - {"workload"}


def test_a_user_workload_may_have_a_section_and_every_section_is_checked(tmp_path):
    path = write(tmp_path, "workload: 'mypkg.model:build'\n'mypkg.model:build': {steps: 12}\n")
    assert load_config(path).run.steps == 12
    for text, message in (
        ("mnist-cnn: {stepz: 3}\n", r"config key 'mnist-cnn.stepz' is not a run key"),
        ("shapes-resnet: {workload: mnist-cnn}\n", r"config key 'shapes-resnet.workload' is not a run key"),
        ("shapes-resnet: 3\n", r"config key 'shapes-resnet' must be a mapping"),
        ("shapes-resnet: {steps: many}\n", r"config key 'shapes-resnet.steps' must be int"),
    ):
        with pytest.raises(UserError, match=message):
            load_config(write(tmp_path, text), ["workload=shapes-resnet"])

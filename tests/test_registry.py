"""The registry is the list every strategy test iterates over: a new strategy is one module and one
registry line, and it is then covered by the runner, equivalence, lost-worker and placement checks."""

import time

import pytest

from helpers import (
    check_a_killed_worker_is_survived,
    check_first_update_is_the_union_batch_step,
    leftover_actors,
    made,
    registered,
    small_config,
)
from hetbench.cluster.ray_connection import ray_kept_for_the_run
from hetbench.errors import UserError
from hetbench.strategies import registry

# A whole strategy, as a user would add one: ray-ps with every buffer through Ray's object store.
OBJECT_STORE_ONLY = """
from dataclasses import dataclass

from hetbench.config import setting
from hetbench.strategies.ray_ps import RayParameterServer, RayPsOptions


@dataclass(frozen=True)
class Options(RayPsOptions):
    transport: str = setting("object-store", "not ray-ps's direct connections either")


class ObjectStoreOnly(RayParameterServer):
    name = "ray-ps-object-store"
    uses_host_memory = False
    options = Options
"""


@pytest.mark.slow
def test_a_strategy_in_one_new_file_and_one_registry_line_runs_every_check(tmp_path, monkeypatch, shared_nodes):
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "object_store_only.py").write_text(OBJECT_STORE_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path / "plugin"))
    monkeypatch.setitem(registry.STRATEGIES, "ray-ps-object-store", "object_store_only:ObjectStoreOnly")
    with ray_kept_for_the_run(shared_nodes.keeper):  # the session's cluster: its workers import the plug-in
        check_first_update_is_the_union_batch_step(tmp_path / "equivalence", "ray-ps-object-store", shared_nodes)
    # a whole run of it after `single`, through the runner, losing a worker for real (its own Ray)
    record = check_a_killed_worker_is_survived(tmp_path / "faults", "ray-ps-object-store")
    assert [w["transport"] for w in record["workers"]] == ["object store"] * 2


def test_an_unknown_strategy_is_refused_listing_the_registered_ones():
    with pytest.raises(UserError, match="unknown strategy 'horovod'; available: single, ray-ps, ray-ps-async"):
        registry.load("horovod")


def test_a_name_registered_twice_or_a_target_not_module_colon_class_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "STRATEGIES", dict(registry.STRATEGIES))
    with pytest.raises(ValueError, match="strategy 'ray-ps' is registered twice"):
        registry.register("ray-ps", "elsewhere:Other")
    with pytest.raises(ValueError, match="'ray_ps.RayParameterServer' is not module:Class"):
        registry.register("ray-ps-2", "ray_ps.RayParameterServer")


def test_a_registered_class_must_be_a_strategy_of_that_name(tmp_path, monkeypatch):
    (tmp_path / "wrong.py").write_text(
        "from hetbench.strategies.single import Single\n\nclass NotOne:\n    name = 'x'\n\n"
        "class Renamed(Single):\n    name = 'other'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "STRATEGIES", dict(registry.STRATEGIES))
    registry.register("not-one", "wrong:NotOne")
    registry.register("renamed", "wrong:Renamed")
    registry.register("missing", "wrong:Missing")
    with pytest.raises(TypeError, match="wrong:NotOne is not a Strategy subclass"):
        registry.load("not-one")
    with pytest.raises(TypeError, match="wrong:Missing is not a Strategy subclass"):
        registry.load("missing")
    with pytest.raises(TypeError, match="wrong:Renamed calls itself 'other'"):
        registry.load("renamed")


@pytest.mark.parametrize("name", registered(lambda cls: cls.distributed))
def test_a_label_no_node_has_fails_fast_naming_it(tmp_path, name, shared_cluster):
    cfg = small_config(tmp_path, *shared_cluster.overrides, "workers=[{node: laptop}]")
    strategy = made(registry.load(name), cfg)
    started = time.monotonic()
    try:
        with pytest.raises(UserError, match="advertises placement label 'laptop'"):
            strategy.start()
    finally:
        strategy.close()
    assert time.monotonic() - started < 60 and leftover_actors(shared_cluster.keeper) == []

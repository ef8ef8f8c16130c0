"""The desktop + Mac deployment's promises that need no Docker or second machine: fixed, documented
ports in one home; listening only toward the head; the Ray token kept from Dask and from the
environment; a missing token file in one sentence. The compose smoke (deploy/ci) runs the rest."""

import os
import re

import pytest
import yaml

from helpers import REPO
from hetbench.cluster.admission import check_token
from hetbench.cluster.nodes import COLLECTIVE_PORTS, DASK_WORKER_PORT, DIRECT_PORT, RAY_NODE_PORTS, fixed_port_args
from hetbench.cluster.worker import node_commands, node_environments
from hetbench.errors import UserError

COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())


def test_compose_the_docs_and_the_smokes_firewall_name_the_fixed_ports_of_nodes_py():
    head = COMPOSE["services"]["ray-head"]["command"]
    assert all(arg in head.split() for arg in fixed_port_args())
    assert f"--worker-port={DASK_WORKER_PORT}" in COMPOSE["services"]["dask-worker"]["command"].split()
    assert f" {DIRECT_PORT} ray-ps" in (REPO / "compose.yaml").read_text()  # named for the firewall's owner
    ports = (REPO / "docs/deployment.md").read_text()
    assert f" {COLLECTIVE_PORTS[0]}-{COLLECTIVE_PORTS[1]} the TCP group" in (REPO / "compose.yaml").read_text()
    for port in [*RAY_NODE_PORTS.values(), DASK_WORKER_PORT, DIRECT_PORT, *COLLECTIVE_PORTS]:
        assert re.search(rf"\b{port}\b", ports), f"docs/deployment.md does not list port {port}"
    smoke = (REPO / "deploy/ci/compose-smoke.sh").read_text()
    opened = re.search(r"^MAC_PORTS=(\S+)$", smoke, re.M).group(1)
    ranges = [tuple(int(n) for n in part.split(":")) for part in opened.split(",")]
    for port in [*RAY_NODE_PORTS.values(), DASK_WORKER_PORT, *COLLECTIVE_PORTS]:
        assert any(r[0] <= port <= r[-1] for r in ranges), f"the smoke's firewall does not open {port}"


def test_compose_services_get_open_files_for_ray_and_one_copy_of_mnist():
    from hetbench.config import RunConfig

    for name, service in COMPOSE["services"].items():
        assert service["ulimits"]["nofile"] == {"soft": 65536, "hard": 65536}, name
    for name in ("ray-head", "dask-worker", "runner"):  # where MNIST is loaded: Ray's workers, Dask's, the driver
        assert "mnist:/root/.cache/hetbench" in COMPOSE["services"][name]["volumes"], name
    assert RunConfig().cache_dir == "~/.cache/hetbench/mnist"  # the volume holds cache_dir's default (root's home)


def test_compose_gives_the_token_to_the_ray_services_only_and_from_a_file():
    for name, service in COMPOSE["services"].items():
        assert "RAY_AUTH_TOKEN" not in (service.get("environment") or {}), name
        assert bool(service.get("secrets")) == (name in ("ray-head", "runner")), name
    assert "RAY_AUTH_TOKEN" not in COMPOSE["x-node"]["environment"]
    assert COMPOSE["x-node"]["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray-token"


def test_the_macs_nodes_listen_toward_the_head_on_fixed_ports_and_dask_never_sees_the_token(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    (ray, _), (dask, _) = node_commands("127.0.0.1", 6379, 8786, "mac", "mac")
    assert "--node-ip-address=127.0.0.1" in ray and all(arg in ray for arg in fixed_port_args())
    assert dask[dask.index("--host") + 1] == "127.0.0.1" and "0.0.0.0" not in dask
    assert dask[dask.index("--worker-port") + 1] == str(DASK_WORKER_PORT)
    envs = node_environments("127.0.0.1")
    assert envs["ray"]["RAY_AUTH_TOKEN"] == "s3cret" and "RAY_AUTH_TOKEN" not in envs["dask"]
    assert envs["ray"]["GLOO_SOCKET_IFNAME"] == "lo"  # the interface toward the head, not the host name's


def test_the_workload_path_comes_first_on_both_processes_path_and_a_missing_one_is_one_sentence(monkeypatch, tmp_path):
    from hetbench.cluster.worker import on_workload_path

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    (tmp_path / "mypkg").mkdir()
    on_workload_path(str(tmp_path))
    envs = node_environments("127.0.0.1")
    assert envs["ray"]["PYTHONPATH"] == envs["dask"]["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    with pytest.raises(UserError, match="^--workload-path /no/such: no such folder on this machine$"):
        on_workload_path("/no/such")


def test_a_gloo_rank_joins_on_its_interface_toward_rank_zero_unless_its_starter_chose_one(monkeypatch):
    # not the host name's address: 127.0.1.1 in a Debian desk's containers, which the Mac would dial
    from hetbench.cluster import collective

    monkeypatch.setattr(collective, "CHOSEN", None)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # so that what the calls set is undone after the test
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert collective.use_interface_toward("127.0.0.1") == "lo" and os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setattr(collective, "CHOSEN", "hbm42")  # hetbench worker's, an emulated link's, the user's
    assert collective.use_interface_toward("127.0.0.1") == "hbm42" and os.environ["GLOO_SOCKET_IFNAME"] == "hbm42"


def test_a_missing_or_empty_token_file_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    with pytest.raises(UserError, match="no Ray token: put the head's token"):
        check_token()
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "ray-token"))
    with pytest.raises(UserError, match="cannot read the Ray token file .*: copy the desktop's .ray-token there"):
        check_token()
    (tmp_path / "ray-token").write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        check_token()
    (tmp_path / "ray-token").write_text("abc\n")
    check_token()


def test_a_port_nothing_answers_at_is_named_as_blocked():
    import socket

    from hetbench.cluster.admission import unreachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        open_port = listening.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
            shut = closed.getsockname()[1]
            assert unreachable("127.0.0.1", [open_port, shut], 2.0) == [shut]


def test_the_smoke_opens_macos_ephemeral_range_for_gloo_and_the_docs_name_it():
    from hetbench.cluster.nodes import MAC_EPHEMERAL_PORTS

    smoke = (REPO / "deploy/ci/compose-smoke.sh").read_text()
    low, high = MAC_EPHEMERAL_PORTS
    assert re.search(rf"^MAC_EPHEMERAL={low}:{high}$", smoke, re.M)
    assert f"macOS {low}-{high}" in (REPO / "docs/deployment.md").read_text()


def test_a_head_that_reaches_this_machines_ephemeral_ports_gives_no_gloo_warning():
    from distributed import LocalCluster

    from hetbench.cluster.admission import gloo_warning

    with LocalCluster(n_workers=0, processes=False, scheduler_port=0, dashboard_address=None) as cluster:
        assert gloo_warning("127.0.0.1", cluster.scheduler_address, 5.0) is None


def test_the_pinned_ray_joins_a_node_of_another_python_patch_release_but_not_another_minor():
    """The smoke's nodes share one Python (3.11.2: this machine's and the image's Debian); what makes a
    Homebrew 3.11.y join the image's 3.11.x is Ray's minor-level match, which hetbench sets: checked
    here against the pinned Ray's own version check."""
    import platform

    import ray
    from ray._private.utils import check_version_info

    from hetbench.cluster.ray_connection import use_ray_defaults

    use_ray_defaults()  # what every hetbench process sets first

    major, minor, _ = platform.python_version_tuple()
    check_version_info({"ray_version": ray.__version__, "python_version": f"{major}.{minor}.99"}, "test")
    with pytest.raises(RuntimeError, match="Version mismatch"):
        check_version_info({"ray_version": ray.__version__, "python_version": f"{major}.{int(minor) + 1}.0"}, "test")


def test_the_group_check_forms_the_backend_the_rows_will_and_names_a_failure_in_a_sentence(monkeypatch):
    from distributed import LocalCluster

    from hetbench.cluster import collective
    from hetbench.cluster.admission import check_group

    with LocalCluster(n_workers=0, processes=False, scheduler_port=0, dashboard_address=None) as cluster:
        assert check_group("127.0.0.1", cluster.scheduler_address, 30.0) == "gloo"  # both ends Linux
        monkeypatch.setattr(collective, "operating_system", lambda: "Darwin")  # this end as a Mac's
        assert check_group("127.0.0.1", cluster.scheduler_address, 30.0) == "tcp"
        with pytest.raises(UserError, match="the head could not open a group's rendezvous at 192.0.2.1"):
            check_group("192.0.2.1", cluster.scheduler_address, 10.0)  # TEST-NET-1: no address of this machine

"""The desktop on Windows (WSL2, mirrored networking): what the desktop and the Mac say when a step
was missed, fed with what each case shows (kernel release, `wslinfo`, the machine's addresses).
Nothing here needs Windows; docs/deployment.md lists what could not be verified without it."""

import subprocess

import pytest

from helpers import assert_one_line_error
from hetbench.cluster import admission, wsl
from hetbench.errors import UserError

LINUX = "6.1.0-18-amd64"
WSL1 = "4.4.0-19041-Microsoft"
WSL2 = "5.15.153.1-microsoft-standard-WSL2"
OLD_WSL2 = "4.19.128-microsoft-standard"
# a WSL2 VM in NAT mode: its own address behind Windows; the LAN address is Windows'
NAT_ADDRESSES = {"127.0.0.1", "172.22.94.17"}
MIRRORED_ADDRESSES = {"127.0.0.1", "192.168.1.23"}  # Windows' own, mirrored into the VM


@pytest.mark.parametrize(
    "release, version", [(LINUX, 0), (WSL1, 1), (WSL2, 2), (OLD_WSL2, 2), ("6.6.87.2-microsoft-standard-WSL2+", 2)]
)
def test_the_kernel_release_tells_wsl_1_from_wsl2_from_linux(release, version):
    assert wsl.wsl_version(release) == version


@pytest.mark.parametrize(
    "release, mode, addresses",
    [
        (WSL2, "mirrored", MIRRORED_ADDRESSES),  # the supported route
        (WSL2, None, MIRRORED_ADDRESSES),  # in a container: no wslinfo, the mirrored address is here
        (LINUX, None, MIRRORED_ADDRESSES),  # a Linux desktop
    ],
)
def test_a_desktop_the_mac_can_reach_passes(release, mode, addresses):
    wsl.check_desktop("192.168.1.23", release, mode, addresses)


@pytest.mark.parametrize(
    "release, mode, addresses, message",
    [
        (WSL2, "nat", MIRRORED_ADDRESSES, r"WSL2 is in NAT networking mode, which hides every port from the Mac: "),
        # in a container (no wslinfo): HEAD_HOST, Windows' LAN address, is none of the VM's
        (WSL2, None, NAT_ADDRESSES, r"HEAD_HOST 192.168.1.23 is not an address of this WSL2 machine \(172.22.94.17\)"),
        (WSL1, None, MIRRORED_ADDRESSES, r"WSL 1, which runs no Docker Engine .*`wsl --set-version <distribution> 2"),
        (LINUX, None, NAT_ADDRESSES, r"HEAD_HOST 192.168.1.23 is not an address of this machine \(172.22.94.17\): set"),
    ],
)
def test_a_desktop_the_mac_cannot_reach_is_refused_naming_the_step(release, mode, addresses, message):
    with pytest.raises(UserError, match=message) as refused:
        wsl.check_desktop("192.168.1.23", release, mode, addresses)
    if "NAT" in message:  # the fix, whole: the setting, where it goes, the restart
        text = str(refused.value)
        assert "networkingMode=mirrored" in text and ".wslconfig" in text and "wsl --shutdown" in text


def test_wslinfo_is_asked_where_present_and_its_absence_is_no_answer(monkeypatch):
    answers = {"wslinfo": subprocess.CompletedProcess([], 0, "mirrored\n", "")}

    def run(argv, **_):
        if argv[0] not in answers:
            raise FileNotFoundError(argv[0])
        return answers[argv[0]]

    monkeypatch.setattr(wsl.subprocess, "run", run)
    assert wsl.networking_mode() == "mirrored"
    answers["wslinfo"] = subprocess.CompletedProcess([], 0, "nat\n", "")
    assert wsl.networking_mode() == "nat"
    answers.clear()  # a container, or an older WSL: no wslinfo
    assert wsl.networking_mode() is None


def test_the_hyperv_rule_opens_the_ports_the_docs_list_for_the_desktop():
    from helpers import REPO

    docs = (REPO / "docs/deployment.md").read_text()
    assert wsl.HYPERV_RULE in docs and wsl.WSL_VM_CREATOR_ID in wsl.HYPERV_RULE
    ranges = [[int(n) for n in part.split("-")] for part in wsl.DESKTOP_PORTS.split(",")]
    for port in (6379, 6380, 6385, 6386, 6390, 6399, 8786, 8788, 10002, 10101, 32768, 60999):
        assert any(r[0] <= port <= r[-1] for r in ranges), port


def test_the_desktop_check_runs_in_gpu_check_and_refuses_in_one_sentence(cli):
    assert cli("devices", "--require", "cpu", "--head", "127.0.0.1").returncode == 0
    refused = cli("devices", "--require", "cpu", "--head", "198.51.100.7")  # TEST-NET-2: no machine's address
    assert_one_line_error(refused, "HEAD_HOST 198.51.100.7 is not an address of this machine")


def test_compose_checks_the_desktop_before_anything_starts():
    import yaml

    from helpers import REPO

    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert "--head=${HEAD_HOST" in compose["services"]["gpu-check"]["command"]


def test_the_mac_names_the_hyperv_rule_when_the_head_it_cannot_reach_is_a_wsl2_desktop():
    who = "this machine cannot reach the head at 192.168.1.23"
    blocked = admission.blocked_message(who, [6380], "the desktop's", wsl2_head=True)
    assert blocked.startswith(f"{who} on port 6380 (Ray node manager): let it through the desktop's firewall")
    assert blocked.endswith(f"open its Hyper-V firewall too (administrator PowerShell): {wsl.HYPERV_RULE}")
    assert "Hyper-V" not in admission.blocked_message(who, [6380], "the desktop's", wsl2_head=False)


def test_the_head_says_whether_it_is_a_wsl2_desktop(monkeypatch, tmp_path):
    release = tmp_path / "osrelease"
    monkeypatch.setattr(wsl, "OSRELEASE", release)
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)
    release.write_text(WSL2 + "\n")
    assert wsl.is_wsl2()
    release.write_text(LINUX + "\n")
    assert not wsl.is_wsl2()
    monkeypatch.setenv("WSL_DISTRO_NAME", "Ubuntu")  # a WSL shell
    assert wsl.is_wsl2()

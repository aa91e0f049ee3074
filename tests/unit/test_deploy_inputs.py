"""Deploy options that make no sense for a multi-node server are refused before any host is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.hosts import deploy, status_play
from orchestrator.profile import model as profile_mod
from orchestrator.tuning import bench, canary


@pytest.fixture
def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(deploy, "run_playbook", lambda *a, **k: pytest.fail("a play ran"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    return inv


@pytest.mark.parametrize("options", [{"serial": "1"}, {"max_fail_percent": 0}])
def test_serial_and_max_fail_percent_are_refused_for_a_multinode_server(two_nodes: Path, options: dict):
    with pytest.raises(InputError, match=r"multi-node server \(gpu1, gpu2\) restarts all its ranks together"):
        deploy.deploy(profile_mod.load("cg_5tok_2node"), two_nodes, deploy.Options(**options))


def test_canary_is_refused_for_a_multinode_server_before_any_bench(two_nodes: Path) -> None:
    with pytest.raises(InputError, match=r"deploy it without --canary"):
        canary.canary_deploy(
            profile_mod.load("cg_5tok_2node"), two_nodes, deploy.Options(), 0.05, bench.Settings()
        )


def test_verify_names_a_running_profile_that_is_not_in_profiles(two_nodes: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    row = status_play.HostStatus("gpu1", True, "slow", "d", "active", 1, 1.0, 200, 0, [])
    monkeypatch.setattr(status_play, "status", lambda inv, limit=None: [row])
    done = CliRunner().invoke(cli, ["verify", "-i", str(two_nodes)])
    assert done.exit_code == 2
    assert "the hosts run profile 'slow', which is not in ./profiles/" in done.output


def test_a_multinode_server_is_one_worker_of_its_gateway_rank_0s(tmp_path: Path, monkeypatch) -> None:
    """Only rank 0 serves HTTP: the gateway knows the server by its URL, and only rank 0's play takes
    it out of rotation and puts it back; a host's own worker URL wins over ADDRESS:PORT."""
    from orchestrator.hosts.playvars import placements

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars: {orchestrator_gateway_url: 'http://10.0.0.9:39000/'}\n  hosts:\n"
        "    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n"
    )
    where = placements(profile_mod.load("cg_5tok_2node"), inv, None)
    gw = where["gpu1"].gateway
    assert gw is not None and where["gpu2"].gateway is None
    assert (gw.url, gw.worker_url, gw.server_url) == (
        "http://10.0.0.9:39000",
        "http://10.0.0.1:30000",
        "http://10.0.0.1:30000",  # a rank's /health is rank 0's address, its own here
    )
    plays = deploy.play_vars(profile_mod.load("cg_5tok_2node"), where, deploy.Options(drain_timeout_s=5), "r")
    assert plays.hosts["gpu1"].gateway.drain_timeout_s == 5 and plays.hosts["gpu2"].gateway is None
    assert (
        deploy.play_vars(profile_mod.load("cg_5tok"), where, deploy.Options(drain=False), "r")
        .hosts["gpu1"]
        .gateway
        is None
    )
    inv.write_text(inv.read_text().replace("{ansible_host: 10.0.0.2}", "{ansible_host: 10.0.0.2, "
                   "orchestrator_gateway_worker_url: 'http://gpu2.internal:30000'}"))  # fmt: skip
    fleet = placements(profile_mod.load("cg_5tok"), inv, None)
    assert fleet["gpu2"].gateway.worker_url == "http://gpu2.internal:30000"


def test_a_multinode_http_port_equal_to_the_rendezvous_port_is_refused(two_nodes: Path, tmp_path: Path):
    """#21: rank 0 would bind the port twice (HTTP and --dist-init-addr); said by the profile, it is a
    validation error; said by the inventory (orchestrator_deployment), a deploy refuses it before any play."""
    path = tmp_path / "same.yml"
    path.write_text("extends: cg_5tok\nserver: {port: 5757}\n")
    fleet = profile_mod.load(str(path))  # a fleet has no rendezvous: fine
    two_nodes.write_text(
        two_nodes.read_text().replace("all:\n", "all:\n  vars: {orchestrator_deployment: multinode}\n")
    )
    with pytest.raises(InputError, match=r"server.port 5757 is also deployment.dist_init_port: node rank 0"):
        deploy.deploy(fleet, two_nodes, deploy.Options())
    path.write_text("extends: cg_5tok_2node\nserver: {port: 5757}\n")
    with pytest.raises(profile_mod.ProfileError) as info:
        profile_mod.load(str(path))
    assert [p.loc for p in info.value.problems] == ["deployment.dist_init_port"]

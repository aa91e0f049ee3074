"""`verify` for a container runtime (orchestrator/hosts/verify/test_deployment.py): the container runs
the planned image (by image ID), SGLang's argv (inspect's Config.Cmd) and environment
(Config.Env) are the plan's, on a host that answers as podman's CLI does."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.hosts.playvars import unit_facts
from orchestrator.hosts.verify import test_deployment as checks
from orchestrator.hosts.verify.run import plan_json
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

IMAGE_ID = "1ac87e3132daf12f7f0bd0eeb60d931a3d00b7785cc4ab4201ad834af54a9cfb"
IMAGE = "docker.io/lmsysorg/sglang:v0.5.9@sha256:" + "0123456789abcdef" * 4


def _plan(tmp_path: Path, kind: str = "podman") -> dict[str, Any]:
    doc = {
        "extends": "cg_5tok",
        "api_key": {"env": "SGLANG_KEY"},
        "env": {"HF_HUB_OFFLINE": "1"},
        "runtime": {"kind": kind, "image": IMAGE},
    }
    (tmp_path / "ctr.yml").write_text(yaml.safe_dump(doc))
    prof = profile_mod.load(str(tmp_path / "ctr.yml"))
    return plan_json(launch.build(prof), unit_facts(prof))


class Host:
    """`podman container inspect` and `podman image inspect` as podman prints them (a JSON array),
    for a container started from `plan`; a test changes `container` or `image_id` to drift."""

    def __init__(self, plan: dict[str, Any]) -> None:
        credentials = f"/run/credentials/{plan['unit_name']}"
        self.container = {
            "Image": IMAGE_ID,
            "State": {"Running": True, "Status": "running"},
            "Config": {
                "Cmd": [a.replace("${CREDENTIALS_DIRECTORY}", credentials) for a in plan["argv"]],
                "Env": [
                    "PATH=/usr/local/bin:/usr/bin",
                    *(f"{k}={v}" for k, v in plan["environment"].items()),
                ],
                "Labels": {"orchestrator.unit": plan["unit_name"], "sglang.version": "0.5.9"},
            },
        }
        self.image_id: str | None = IMAGE_ID
        self.plan, self.commands = plan, []

    def run(self, command: str) -> types.SimpleNamespace:
        self.commands.append(command)
        if command == f"/usr/bin/podman container inspect {self.plan['container']}":
            if self.container is None:
                return _done("[]", 125, f"Error: no such container {self.plan['container']}")
            return _done(json.dumps([self.container]))
        assert command == f"/usr/bin/podman image inspect {IMAGE}", command
        if self.image_id is None:
            return _done("[]", 125, f"Error: {IMAGE}: image not known")
        return _done(json.dumps([{"Id": self.image_id, "RepoDigests": [IMAGE.replace(":v0.5.9", "")]}]))


def _done(stdout: str, rc: int = 0, stderr: str = "") -> types.SimpleNamespace:
    return types.SimpleNamespace(stdout=stdout, stderr=stderr, rc=rc)


@pytest.fixture
def plan(tmp_path: Path) -> dict[str, Any]:
    return _plan(tmp_path)


def test_the_plan_names_the_engine_the_container_and_the_image(plan, tmp_path):
    assert (plan["runtime"], plan["engine"], plan["container"], plan["image"]) == (
        "podman",
        "/usr/bin/podman",
        "sglang",
        IMAGE,
    )
    docker = _plan(tmp_path, "docker")
    assert (docker["engine"], docker["image"]) == ("/usr/bin/docker", IMAGE)


def test_a_container_started_from_the_plan_passes(plan):
    host = Host(plan)
    checks.test_server_argv_and_environment_match_the_plan(host, plan)
    checks.test_container_runs_the_planned_image(host, plan)
    assert "${CREDENTIALS_DIRECTORY}/sglang-config.yaml" in plan["argv"]  # expanded in the container


def test_a_flag_that_differs_inside_the_container_is_named(plan):
    host = Host(plan)
    cmd = host.container["Config"]["Cmd"]
    cmd[cmd.index("--tensor-parallel-size") + 1] = "4"
    with pytest.raises(pytest.fail.Exception) as failed:
        checks.test_server_argv_and_environment_match_the_plan(host, plan)
    assert str(failed.value) == "server argv differs from the plan: --tensor-parallel-size: 4 (plan: 8)"


def test_an_environment_variable_missing_inside_the_container_is_named(plan):
    host = Host(plan)
    host.container["Config"]["Env"] = [
        e for e in host.container["Config"]["Env"] if not e.startswith("HF_HUB")
    ]
    with pytest.raises(AssertionError, match=r"environment lacks \{'HF_HUB_OFFLINE': '1'\}"):
        checks.test_server_argv_and_environment_match_the_plan(host, plan)


def test_a_container_of_another_image_fails(plan):
    """The tag was moved by a pull since the container started: it runs the old image's ID."""
    host = Host(plan)
    host.image_id = "sha256:" + "fe" * 32
    with pytest.raises(AssertionError) as failed:
        checks.test_container_runs_the_planned_image(host, plan)
    assert str(failed.value).startswith(
        f"container sglang runs image {IMAGE_ID[:12]}, the plan's {IMAGE} is {'fe' * 6}: "
        "deploy --force-restart to run it\n"
    )
    host.image_id = None
    with pytest.raises(AssertionError, match=r"the plan's image .* is not on this host"):
        checks.test_container_runs_the_planned_image(host, plan)


def test_a_stopped_or_missing_container_or_a_foreign_label_fails(plan):
    host = Host(plan)
    host.container["State"] = {"Running": False, "Status": "exited"}
    with pytest.raises(AssertionError, match=r"container sglang is exited"):
        checks.test_container_runs_the_planned_image(host, plan)
    host.container["State"] = {"Running": True}
    host.container["Config"]["Labels"] = {"orchestrator.unit": "sglang-b.service"}
    with pytest.raises(
        AssertionError, match=r"container sglang is labelled orchestrator\.unit=sglang-b\.service"
    ):
        checks.test_container_runs_the_planned_image(host, plan)
    host.container = None
    with pytest.raises(AssertionError, match=r"no container sglang: Error: no such container sglang"):
        checks.test_server_argv_and_environment_match_the_plan(host, plan)


def test_the_host_runtime_has_no_container_to_inspect(tmp_path):
    (tmp_path / "h.yml").write_text(yaml.safe_dump({"extends": "cg_5tok"}))
    prof = profile_mod.load(str(tmp_path / "h.yml"))
    host_plan = plan_json(launch.build(prof), unit_facts(prof))
    assert host_plan["runtime"] == "host" and "engine" not in host_plan
    host = Host({**host_plan, "container": "x"})
    with pytest.raises(pytest.skip.Exception, match="the host runtime runs no container"):
        checks.test_container_runs_the_planned_image(host, host_plan)
    assert host.commands == []

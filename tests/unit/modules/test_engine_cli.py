"""The commands the host modules and `verify` give docker and podman, handed to the real CLIs
(Debian's docker.io and podman; scripts/setup.sh installs both, without starting dockerd).

podman runs over a storage root of its own (as tests/unit/test_container_cli.py does it): a
container is created from a rendered unit's `run` words over an empty root file system, never
started (nothing runs here), and the modules' parsers and `verify`'s checks read what podman
really prints about it. docker, with no daemon, answers every command with "Cannot connect",
which the modules take for an engine with no containers, and preflight names.
"""

from __future__ import annotations

import shutil
import subprocess
import types
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from ansible.module_utils import orchestrator_host as oh

from orchestrator import container, profile
from orchestrator import plan as plan_mod
from orchestrator.hostplan import unit_facts
from orchestrator.verify import test_deployment as checks
from orchestrator.verify.run import plan_json

ABSENT = "localhost/orchestrator-test/absent:1"
UNIT = "sglang-b.service"


class RealModule:
    """What the module_utils functions use of AnsibleModule, running the real commands."""

    check_mode = False

    def __init__(self, bins: dict[str, str]) -> None:
        self.bins = bins
        self.calls: list[tuple[list[str], int, str, str]] = []

    def get_bin_path(self, name: str, required: bool = False) -> str | None:
        return self.bins.get(name)

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        self.calls.append((argv, done.returncode, done.stdout, done.stderr))
        return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `podman` that is the real one over a storage root of its own."""
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("no podman CLI here: apt-get install podman (scripts/setup.sh does)")
    root = tmp_path_factory.mktemp("podman")
    wrapper = root / "podman"
    options = (
        f"--root={root}/storage --runroot={root}/run --tmpdir={root}/tmp --storage-driver=vfs "
        "--cgroup-manager=cgroupfs --events-backend=file"
    )
    wrapper.write_text(f'#!/bin/sh\nexec {binary} {options} "$@"\n')
    wrapper.chmod(0o755)
    info = subprocess.run(
        [str(wrapper), "info", "--format", "{{.Version.Version}}"], capture_output=True, text=True
    )
    if info.returncode != 0:
        pytest.skip(f"podman cannot use a storage root of its own here: {info.stderr.strip()[:200]}")
    try:
        yield str(wrapper)
    finally:
        subprocess.run([str(wrapper), "rm", "--all", "--force"], capture_output=True, check=False)


@pytest.fixture
def docker() -> str:
    binary = shutil.which("docker")
    if binary is None:
        pytest.skip("no docker CLI here: apt-get install docker.io (scripts/setup.sh does)")
    if subprocess.run([binary, "version"], capture_output=True).returncode == 0:
        pytest.skip("a docker daemon answers here: these tests are of the client alone")
    return binary


@pytest.fixture(scope="module")
def created(podman: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A podman profile's unit, its `run` made `create` over an empty root file system: the
    plan as verify sees it, with the container podman made of it."""
    tmp = tmp_path_factory.mktemp("created")
    (tmp / "rootfs").mkdir()
    (tmp / "model").mkdir()
    (tmp / "drafter").mkdir()
    doc = {
        "extends": "cg_5tok",
        "server": {"model_path": str(tmp / "model"), "gpus": "4-7", "tp_size": 4},
        "speculative": {"draft_model_path": str(tmp / "drafter")},
        "env": {"HF_HUB_OFFLINE": "1"},
        "service": {"unit_name": UNIT},
        "runtime": {"kind": "podman", "image": ABSENT, "pull": "never"},
    }
    (tmp / "p.yml").write_text(yaml.safe_dump(doc))
    prof = profile.load(str(tmp / "p.yml"))
    built = plan_mod.build(prof)
    words = [w for w in built.exec_argv if w != "-d"]  # `run -d` is `create` and `start`: only the first
    image = words.index(ABSENT)
    made = subprocess.run(
        [podman, "create", *words[2:image], "--rootfs", str(tmp / "rootfs"), *words[image + 1 :]],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    return {**plan_json(built, unit_facts(prof)), "engine": podman}


def test_podman_ps_and_inspect_as_the_modules_read_them(podman: str, created: dict[str, Any]) -> None:
    """`ps` lists running containers only (this one never ran): with -a, the same command's JSON
    gives parse_ps the container and its unit label; its main PID reads 0 (not running)."""
    module = RealModule({"podman": podman})
    assert oh.labelled_containers(module) == []
    [(argv, rc, out, _)] = module.calls
    assert argv[1:] == ["ps", "--filter", "label=orchestrator.unit", "--format", "json"] and rc == 0
    assert oh.parse_ps(out) == []
    listed = subprocess.run([*argv[:2], "-a", *argv[2:]], capture_output=True, text=True, check=True)
    [(cid, unit)] = oh.parse_ps(listed.stdout)
    assert unit == UNIT
    rc, out, _ = module.run_command([podman, "inspect", "--format", "{{.State.Pid}}", cid])
    assert (rc, out.strip()) == (0, "0")
    assert oh.container_units(module, {UNIT}) == {}


def test_verify_reads_the_argv_and_environment_podman_made(created: dict[str, Any]) -> None:
    """`container inspect` of the container the unit's command made: Config.Cmd is the plan's
    argv, Config.Env holds its environment, its label names the unit."""
    host = types.SimpleNamespace(run=_shell)
    checks.test_server_argv_and_environment_match_the_plan(host, created)
    shown = checks._container(host, created)
    assert shown["Config"]["Labels"]["orchestrator.unit"] == UNIT
    with pytest.raises(AssertionError, match=r"container sglang-b is created"):
        checks.test_container_runs_the_planned_image(host, created)


def _shell(command: str) -> types.SimpleNamespace:
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    return types.SimpleNamespace(rc=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _probe_options(kind: str, tmp_path: Any) -> list[str]:
    """container.probe_options of a profile with limits, cgroups and options set."""
    runtime: dict[str, Any] = {"kind": kind, "image": ABSENT, "options": ["--ulimit=nproc=96365:96365"]}
    if kind == "podman":
        runtime["cgroups"] = "disabled"
    doc = {
        "extends": "cg_5tok",
        "runtime": runtime,
        "service": {"limits": {"memlock": "8192K", "nofile": 20000}},
    }
    (tmp_path / "p.yml").write_text(yaml.safe_dump(doc))
    return container.probe_options(profile.load(str(tmp_path / "p.yml")))


def test_podman_preflight_commands_parse(podman: str, tmp_path: Any) -> None:
    """The engine answers; an absent image is `image inspect`'s exit 125; the throw-away run's
    flags (the unit's own network, cgroups and ulimits) parse and podman stops at the image."""
    module = RealModule({"podman": podman})
    assert oh._engine(module, "podman") == (podman, "")
    checks_ = {"engine": "podman", "image": ABSENT, "pull": "never", "python": "python3"}
    image, problems, notes = oh._inspect_image(module, podman, checks_)
    assert (image, notes) == ({}, []) and problems[0].startswith(f"image {ABSENT} is not on this host")
    assert module.calls[-1][1] == 125
    options = _probe_options("podman", tmp_path)
    assert options == [
        "--network=host",
        "--cgroups=disabled",
        "--ulimit=memlock=8388608:8388608",
        "--ulimit=nofile=20000:20000",
        "--ulimit=nproc=96365:96365",
    ]
    rc, _, err = oh._in_image(
        module, podman, "0" * 64, {"run_options": options}, ["python3", "-c", "print(1)"]
    )
    assert rc == 125 and "image not known" in err, err
    assert module.calls[-1][0][2 : 5 + len(options)] == ["--rm", "--pull=never", *options, "0" * 64]


def test_docker_without_its_daemon_has_no_containers_and_is_named_by_preflight(
    docker: str, tmp_path: Any
) -> None:
    module = RealModule({"docker": docker})
    assert oh.labelled_containers(module) == []
    exe, problem = oh._engine(module, "docker")
    assert exe == "" and problem == (
        "`docker version` exited 1: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?: start the daemon (systemctl start docker)"
    )
    for argv in (
        [docker, "ps", "--filter", "label=orchestrator.unit", "--format", "{{json .}}"],
        [docker, "inspect", "--format", "{{.State.Pid}}", "0123abcd"],
        [docker, "image", "inspect", ABSENT],
        [docker, "run", "--rm", "--pull=never", *_probe_options("docker", tmp_path), "0" * 64, "python3"],
        [docker, "container", "inspect", "sglang-b"],
    ):
        rc, out, err = module.run_command(argv)
        assert rc != 0 and "Cannot connect to the Docker daemon" in out + err, (argv, out + err)

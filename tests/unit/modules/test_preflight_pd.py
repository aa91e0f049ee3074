"""A prefill or decode server's preflight (checks.pd): its bootstrap port free, its transfer
backend's engine importable by the server's Python, its IB devices on the host. Read from real
things: a socket this test listens on, a real Python interpreter with or without the engine's
module, a sysfs directory of the test's own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import preflight as pf
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs import argv0
from hostfakes import NOT_FOUND, capture, load_module, store_unit

from orchestrator.hosts import playvars
from orchestrator.paths import ROOT
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch
from tests.unit.test_standin_sglang import free_port

HELP = ROOT / "orchestrator/profile/sglang_help/launch_server-help-0.5.9.txt"
IDLE = (capture("released-query-gpu.csv"), "")
BOOTSTRAP_FIX = ": stop it or give this profile another disaggregation.bootstrap_port"


def me() -> str:
    """This test's process as a problem names it (read now: pytest-xdist renames its workers)."""
    return f"PID {os.getpid()} {argv0(os.getpid())}"


class Host:
    """run_command as AnsibleModule runs it: the real process, its (rc, stdout, stderr)."""

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr


def real(argv: list[str]) -> tuple[int, str, str]:
    return Host().run_command(argv)


def python_with(tmp_path: Path, *modules: str) -> str:
    """A Python as a server's venv has one: this interpreter, with SGLang 0.5.9 (its metadata, and a
    launch_server that prints 0.5.9's captured --help) and each of `modules` (a stub of the
    engine's module) importable."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(f"print(open({str(HELP)!r}).read())\n")
    (site / "sglang-0.5.9.dist-info").mkdir()
    (site / "sglang-0.5.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n"
    )
    for module in modules:
        *packages, name = module.split(".")
        folder = site
        for package in packages:
            folder /= package
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        (folder / f"{name}.py").write_text("class TransferEngine:\n    pass\n")
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port this test's own process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/sys/class/infiniband of a host with mlx5_0 and mlx5_1."""
    root = tmp_path / "infiniband"
    for dev in ("mlx5_0", "mlx5_1"):
        (root / dev).mkdir(parents=True)
    monkeypatch.setattr(pf, "IB_SYSFS", str(root))
    return root


# --- the control machine: what the profile asks of the host --------------------------------------


def _checks(tmp_path: Path, section: str) -> playvars.PreflightChecks:
    """The preflight checks of a base profile on SGLang 0.5.23 with `section`."""
    path = tmp_path / "pd.yml"
    # 0.5.23: it takes a per-GPU JSON mapping of IB devices too (0.5.9 a comma list only).
    server = "server: {sglang_version: '0.5.23'}\n"
    path.write_text(f"extends: base\n{server}{section}")
    prof = profile_mod.load(str(path))
    return playvars.preflight_checks(prof, launch.build(prof), [0], False)


@pytest.mark.parametrize(
    ("ib_device", "devices"),
    [
        ("mlx5_0", ["mlx5_0"]),
        ("mlx5_0,mlx5_1", ["mlx5_0", "mlx5_1"]),
        (" mlx5_0, ,mlx5_1 ,", ["mlx5_0", "mlx5_1"]),  # blanks dropped, as SGLang drops them
        ('{"0": "mlx5_0", "1": "mlx5_1"}', ["mlx5_0", "mlx5_1"]),
        ('{"0": "mlx5_0,mlx5_1", "1": "mlx5_1, mlx5_2"}', ["mlx5_0", "mlx5_1", "mlx5_2"]),  # each named once
        ("/etc/sglang/ib.json", []),  # a file SGLang reads on the host at start
    ],
)
def test_the_plan_names_every_ib_device_of_the_profile(tmp_path: Path, ib_device: str, devices: list[str]):
    checks = _checks(tmp_path, f"disaggregation: {{mode: prefill, ib_device: '{ib_device}'}}\n")
    assert checks.pd == {"transfer_backend": "mooncake", "bootstrap_port": 8998, "ib_devices": devices}


def test_only_a_prefill_server_has_a_bootstrap_port_to_check(tmp_path: Path):
    prefill = "disaggregation: {mode: prefill, transfer_backend: nixl, bootstrap_port: 9100}\n"
    nixl = {"transfer_backend": "nixl", "ib_devices": []}
    assert _checks(tmp_path, prefill).pd == {**nixl, "bootstrap_port": 9100}
    decode = "disaggregation: {mode: decode, transfer_backend: nixl}\n"
    assert _checks(tmp_path, decode).pd == {**nixl, "bootstrap_port": 0}
    assert _checks(tmp_path, "").pd == {}  # not a PD server: nothing to check


# --- the host's pure parts ----------------------------------------------------------------------


def test_a_python_without_the_backends_engine_is_named_with_its_error(tmp_path: Path):
    """This interpreter really lacks NIXL: its own ModuleNotFoundError is in the problem."""
    assert pf.transfer_problem(Host(), sys.executable, "nixl") == (
        f"transfer backend nixl: `import nixl._api` fails in {sys.executable} (ModuleNotFoundError: No "
        "module named 'nixl'): install NIXL for that Python or choose another disaggregation.transfer_backend"
    )
    mori = pf.transfer_problem(Host(), sys.executable, "mori")
    assert mori.startswith(f"transfer backend mori: `import mori.cpp, mori.io` fails in {sys.executable} (")


def test_a_python_with_the_backends_engine_passes(tmp_path: Path):
    python = python_with(tmp_path, "mooncake.engine")
    assert pf.transfer_problem(Host(), python, "mooncake") == ""
    assert pf.transfer_problem(Host(), python, "mooncake_tcp") == ""  # mooncake's engine over TCP
    assert "`import nixl._api` fails" in pf.transfer_problem(Host(), python, "nixl")


def test_the_fake_backend_imports_nothing():
    class Nothing:
        def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
            raise AssertionError(f"ran {argv}")

    assert pf.transfer_problem(Nothing(), "/nonexistent/python", "fake") == ""


def test_ib_devices_the_host_lacks_are_named_with_those_it_has(sysfs: Path):
    assert pf.ib_device_problem(["mlx5_0", "mlx5_1"], "mooncake") == ""
    assert pf.ib_device_problem(["mlx5_0", "mlx5_3"], "nixl") == (
        f"disaggregation.ib_device: IB device mlx5_3 is not on this host ({sysfs} has mlx5_0, mlx5_1): "
        "name devices this host has, or leave ib_device out for the backend to find them"
    )
    assert pf.ib_device_problem(["mlx5_2", "mlx5_3"], "mori").startswith(
        "disaggregation.ib_device: IB devices mlx5_2, mlx5_3 are not on this host"
    )
    assert pf.ib_device_problem(["mlx5_3"], "mooncake_tcp") == ""  # SGLang drops ib_device for it
    assert pf.ib_device_problem([], "mooncake") == ""


def test_a_host_without_infiniband_says_it_has_none(sysfs: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pf, "IB_SYSFS", str(sysfs / "absent"))
    assert f"({sysfs / 'absent'} has none)" in pf.ib_device_problem(["mlx5_0"], "mooncake")


def test_bootstrap_port_problems_name_the_profile_setting_that_moves_it():
    units = {"sglang-a.service": {"profile": "cg_5tok", "port": 8998}}
    field = "disaggregation.bootstrap_port"
    assert pf.port_problems(8998, "sglang.service", [], units, list(units), field, BOOTSTRAP_FIX) == [
        "bootstrap port 8998 is the port of sglang-a.service (profile cg_5tok) on this host: give this "
        "profile another disaggregation.bootstrap_port"
    ]
    owners = [(9, "nginx", ""), (7, "python3", "sglang.service")]  # our own server's is no problem
    assert pf.port_problems(8998, "sglang.service", owners, {}, [], field, BOOTSTRAP_FIX) == [
        "bootstrap port 8998 is taken by PID 9 nginx (not sglang.service): stop it or give this profile "
        "another disaggregation.bootstrap_port"
    ]


def test_a_hand_started_server_holding_both_ports_is_one_note():
    assert pf.takeover_note(42, [30000, 8998], [0]) == (
        "ports 30000, 8998 and GPU 0 are held by PID 42, the hand-started server this deploy takes over: "
        "it is stopped first"
    )
    assert pf.takeover_note(42, [8998], []) == (
        "port 8998 is held by PID 42, the hand-started server this deploy takes over: it is stopped first"
    )


def test_a_container_runtime_gets_a_note_for_the_import(tmp_path: Path, sysfs: Path):
    """The image's Python is not run for the import: a note says what it must have. The IB devices
    are the host's (a container on the host network sees its sysfs)."""
    paths = {"unit_dir": str(tmp_path), "state_dir": str(tmp_path), "lock_dir": str(tmp_path)}
    pd = {"transfer_backend": "mooncake", "bootstrap_port": 0, "ib_devices": ["mlx5_9"]}
    c = {"pd": pd, "engine": "podman", "image": "lmsysorg/sglang:v0.5.9", "python": "python3"}
    problems, notes, held = pf.pd_problems(Host(), "sglang.service", paths, c, {}, set())
    assert notes == [
        "transfer backend mooncake: `import mooncake.engine` is not tried in image lmsysorg/sglang:v0.5.9: "
        "without Mooncake (mooncake-transfer-engine) there the server fails after loading the weights"
    ]
    assert len(problems) == 1 and "IB device mlx5_9 is not on this host" in problems[0] and held == 0


# --- the module on a host -----------------------------------------------------------------------


@pytest.fixture
def preflight():
    return load_module("sglang_preflight")


@pytest.fixture
def checks(tmp_path: Path, host, sysfs: Path) -> dict:
    """Checks that pass: a prefill server with Mooncake's engine in its Python, a target model, an
    idle GPU, IB device mlx5_0."""
    python = python_with(tmp_path, "mooncake.engine")
    host.answers["python3"] = real
    host.answers["systemctl"] = [NOT_FOUND]
    host.smi = [IDLE]
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return {
        "python": python,
        "sglang_version": "0.5.9",
        "flags": ["--model-path", "--disaggregation-mode"],
        "model_path": str(tmp_path / "target"),
        "gpus": [0],
        "port": free_port(),
        "log_dir": str(tmp_path),
        "min_free_mib": 1,
        "pd": {"transfer_backend": "mooncake", "bootstrap_port": free_port(), "ib_devices": ["mlx5_0"]},
    }


def run(run_module, preflight, paths: dict, checks: dict, **pd: Any) -> tuple[bool, dict]:
    checks = {**checks, "pd": {**checks["pd"], **pd}}
    return run_module(preflight, {"unit_name": "sglang.service", "paths": paths, "checks": checks})


def test_a_pd_server_the_host_can_run_passes(preflight, paths, checks, run_module, host):
    failed, result = run(run_module, preflight, paths, checks)
    assert not failed, result["msg"]
    assert result["notes"] == []
    imports = [c for c in host.ran("python3") if c[1:3] == ["-c", "import mooncake.engine"]]
    assert len(imports) == 1  # the check ran, in the server's own Python


def test_every_pd_problem_is_named_at_once(preflight, paths, checks, run_module, listener):
    pd = {"transfer_backend": "nixl", "bootstrap_port": listener, "ib_devices": ["mlx5_4"]}
    failed, result = run(run_module, preflight, paths, checks, **pd)
    assert failed and result["problems"] == [
        f"bootstrap port {listener} is taken by {me()} (not sglang.service){BOOTSTRAP_FIX}",
        f"transfer backend nixl: `import nixl._api` fails in {checks['python']} (ModuleNotFoundError: No "
        "module named 'nixl'): install NIXL for that Python or choose another "
        "disaggregation.transfer_backend",
        f"disaggregation.ib_device: IB device mlx5_4 is not on this host ({pf.IB_SYSFS} has mlx5_0, mlx5_1): "
        "name devices this host has, or leave ib_device out for the backend to find them",
    ]


def test_our_own_unit_may_hold_the_bootstrap_port(preflight, paths, checks, run_module, cgroups, listener):
    """The restart stops it first: a prefill server redeployed holds its bootstrap port until then."""
    cgroups[os.getpid()] = "sglang.service"
    failed, result = run(run_module, preflight, paths, checks, bootstrap_port=listener)
    assert not failed, result["msg"]


def test_another_units_listener_on_the_bootstrap_port_is_named(
    preflight, paths, checks, run_module, cgroups, listener
):
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[1])
    cgroups[os.getpid()] = "sglang-a.service"
    failed, result = run(run_module, preflight, paths, checks, bootstrap_port=listener)
    assert failed and result["problems"] == [
        f"bootstrap port {listener} is taken by {me()} of sglang-a.service (profile cg_5tok), another "
        "orchestrator unit on this host: give this profile another disaggregation.bootstrap_port"
    ]


def test_a_bootstrap_port_that_is_another_units_port_is_a_problem(preflight, paths, checks, run_module, host):
    """Running or enabled, that unit takes the port at its next start even when it does not listen now."""
    boot = checks["pd"]["bootstrap_port"]
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=boot, gpus=[1])

    def show(argv: list[str]) -> tuple[int, str, str]:
        if argv[3:] == ["--property=Id,LoadState,FragmentPath"]:
            return NOT_FOUND
        assert argv[2:] == ["sglang-a.service", "--property=Id,UnitFileState,ActiveState"], argv
        return 0, "Id=sglang-a.service\nUnitFileState=enabled\nActiveState=inactive\n", ""

    host.answers["systemctl"] = show
    failed, result = run(run_module, preflight, paths, checks)
    assert failed and result["problems"] == [
        f"bootstrap port {boot} is the port of sglang-a.service (profile cg_5tok) on this host: give this "
        "profile another disaggregation.bootstrap_port"
    ]


def test_a_decode_server_opens_no_bootstrap_port(preflight, paths, checks, run_module, listener):
    failed, result = run(run_module, preflight, paths, checks, bootstrap_port=0)
    assert not failed, result["msg"]


def test_a_server_without_a_pd_role_checks_none_of_it(preflight, paths, checks, run_module, host, listener):
    checks = {**checks, "pd": {}}
    failed, result = run_module(preflight, {"unit_name": "sglang.service", "paths": paths, "checks": checks})
    assert not failed, result["msg"]
    assert [c[1:3] for c in host.ran("python3") if c[2] == "import mooncake.engine"] == []


def test_the_hand_started_server_may_hold_the_bootstrap_port(preflight, paths, checks, run_module):
    """The server a deploy takes over (orchestrator adopt) listens there: the restart stops it first."""
    code = "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
    code += "print(s.getsockname()[1], flush=True)\ntime.sleep(60)\n"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            failed, result = run(run_module, preflight, paths, checks, bootstrap_port=port)
            taken = f"bootstrap port {port} is taken by PID {server.pid}"
            assert failed and result["problems"][0].startswith(taken)
            checks = {**checks, "takeover_pid": server.pid}
            failed, result = run(run_module, preflight, paths, checks, bootstrap_port=port)
            assert not failed, result["msg"]
            assert result["notes"] == [
                f"port {port} is held by PID {server.pid}, the hand-started server this deploy takes over: "
                "it is stopped first"
            ]
        finally:
            server.kill()

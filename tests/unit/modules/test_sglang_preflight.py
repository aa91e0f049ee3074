"""roles/sglang_preflight: every problem at once, read from the host as it is (a real port taken by
this test's process, real model directories), SGLang and nvidia-smi answering as captured."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs import argv0
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import unit_digest
from hostfakes import (
    MANAGED,
    NOT_FOUND,
    Engine,
    capture,
    compute_apps,
    load_module,
    query_gpu,
    store_unit,
    systemctl_show,
)

from orchestrator.paths import ROOT
from tests.unit.test_standin_sglang import free_port

HELP = (ROOT / "orchestrator/profile/sglang_help/launch_server-help-0.5.9.txt").read_text()
H200 = "GPU-8b9e1fa8-32f8-da01-8524-833ee60332e7"
IDLE = (capture("released-query-gpu.csv"), "")


@pytest.fixture
def preflight():
    return load_module("sglang_preflight")


@pytest.fixture
def checks(tmp_path: Path, host) -> dict:
    """Checks that pass: a python answering as SGLang 0.5.9 does, a target and an EAGLE-3 drafter."""
    python = tmp_path / "python"
    python.write_text("")
    python.chmod(0o755)
    host.answers["python"] = lambda argv: (0, "0.5.9\n", "") if argv[1] == "-c" else (0, HELP, "")
    host.answers["systemctl"] = [NOT_FOUND]
    host.smi = [IDLE]
    for name, config in (
        ("target", {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}),
        ("draft", {"architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": 4096}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    return {
        "python": str(python),
        "sglang_version": "0.5.9",
        "flags": ["--model-path", "--speculative-algorithm"],
        "model_path": str(tmp_path / "target"),
        "draft_model_path": str(tmp_path / "draft"),
        "algorithm": "EAGLE3",
        "gpus": [0],
        "port": free_port(),
        "log_dir": str(tmp_path),
        "min_free_mib": 1,
    }


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def run(run_module, preflight, paths: dict, checks: dict) -> tuple[bool, dict]:
    return run_module(preflight, {"unit_name": "sglang.service", "paths": paths, "checks": checks})


def test_a_host_that_can_run_the_plan_passes(preflight, paths, checks, run_module, host):
    failed, result = run(run_module, preflight, paths, checks)
    assert not failed, result["msg"]
    files = result.pop("model_files")
    assert result == {
        "changed": False,
        "problems": [],
        "notes": [],
        "sglang_version": "0.5.9",
        "gpus": 1,
        "help_checked": True,
        "verified_digest": "",
        "memory": {},  # no memory settings asked for the fit
    }
    assert set(files) == {"model", "draft"}  # each directory's fingerprint, for a multi-host compare


def test_the_planned_unit_is_verified_by_systemd_before_anything_stops(
    preflight, paths, checks, run_module, host
):
    """A unit systemd-analyze refuses fails the preflight (the old server still runs); an
    accepted one returns its digest, so the write after the stop need not verify it again."""
    unit = f"{MANAGED}[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server\n"
    seen: list[str] = []

    def analyze(argv: list[str]) -> tuple[int, str, str]:
        seen.append(Path(argv[-1]).read_text())
        assert Path(argv[-1]).name == "sglang.service"  # systemd-analyze needs the unit's own name
        return (1, "", f"{argv[-1]}:3: Unknown key name 'Bogus'") if "Bogus" in seen[-1] else (0, "", "")

    host.answers["systemd-analyze"] = analyze
    failed, result = run(run_module, preflight, paths, {**checks, "unit_content": unit})
    assert not failed and result["verified_digest"] == unit_digest(unit.encode()) and seen == [unit]
    failed, result = run(run_module, preflight, paths, {**checks, "unit_content": unit + "Bogus=1\n"})
    assert failed and result["verified_digest"] == ""
    assert result["problems"] == [
        "systemd-analyze verify refuses the planned sglang.service: "
        "sglang.service:3: Unknown key name 'Bogus'"
    ]
    Path(paths["unit_dir"], "sglang.service").write_text(unit)  # installed and running: not checked again
    failed, result = run(run_module, preflight, paths, {**checks, "unit_content": unit})
    assert not failed and result["verified_digest"] == "" and len(seen) == 2


def test_a_unit_that_is_not_ours_is_a_problem(preflight, paths, checks, run_module, host):
    """#21: `service.unit_name: ssh.service` passed preflight; the deploy then stopped ssh and wrote
    /etc/systemd/system/ssh.service over the package's unit. Named first, with where it comes from."""
    ssh = {"Id": "ssh.service", "LoadState": "loaded", "FragmentPath": "/lib/systemd/system/ssh.service"}
    host.answers["systemctl"] = [systemctl_show(**ssh)]
    failed, result = run_module(preflight, {"unit_name": "ssh.service", "paths": paths, "checks": checks})
    assert failed and result["problems"] == [
        "ssh.service is not orchestrator's: systemd loads it from /lib/systemd/system/ssh.service; "
        "a deploy would replace it: choose another service.unit_name"
    ]
    host.answers["systemctl"] = [NOT_FOUND]  # a unit nobody has is ours to write
    failed, result = run_module(preflight, {"unit_name": "ssh.service", "paths": paths, "checks": checks})
    assert not failed, result["msg"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_a_line_the_real_systemd_analyze_ignores_fails_it(preflight, paths, checks, run_module, host):
    """It exits 0 on `CPUAffinity=5-2`, and the server would start on every CPU."""

    def analyze(argv: list[str]) -> tuple[int, str, str]:
        done = subprocess.run(["systemd-analyze", *argv[1:]], capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    host.answers["systemd-analyze"] = analyze
    unit = "[Service]\nExecStart=/bin/true\nCPUAffinity=5-2\n"
    failed, result = run(run_module, preflight, paths, {**checks, "unit_content": unit})
    assert failed and result["verified_digest"] == ""
    assert result["problems"] == [
        "systemd-analyze verify refuses the planned sglang.service: "
        "sglang.service:3: Range '5-2' is invalid, 5 > 2, ignoring."
    ]


def test_a_host_without_systemd_is_one_problem_among_the_others(preflight, paths, checks, run_module, host):
    """The wheel's preflight of the control machine itself (no systemd as PID 1): `systemctl show`
    fails there; that is one line among the other checks' problems, not the end of the preflight."""
    down = (
        "System has not been booted with systemd as init system (PID 1). Can't operate.\nFailed to "
        "connect to bus: Host is down"
    )
    host.answers["systemctl"] = [(1, "", down)]
    failed, result = run(run_module, preflight, paths, checks)
    assert failed and result["problems"][0] == (
        "systemctl show sglang.service failed: System has not been booted with systemd as init system "
        "(PID 1). Can't operate. Failed to connect to bus: Host is down"
    )
    assert all("\n" not in problem for problem in result["problems"])


def test_every_problem_is_named_at_once(preflight, paths, checks, run_module, host, listener):
    host.smi = [(capture("killed-query-gpu.csv"), f"1, init, 100, {H200}\n")]
    checks = {**checks, "sglang_version": "0.5.23", "flags": ["--no-such-flag"], "algorithm": "EAGLE"}
    failed, result = run(run_module, preflight, paths, {**checks, "gpus": [0, 1], "port": listener})
    assert failed
    assert result["problems"] == [
        'SGLang 0.5.9 is installed, the profile renders flags for 0.5.23: set server.sglang_version: "0.5.9" '
        "or install 0.5.23",
        "flag --no-such-flag is not in this host's `sglang.launch_server --help` (SGLang 0.5.9)",
        f"drafter {checks['draft_model_path']} is an EAGLE-3 model (LlamaForCausalLMEagle3) but the "
        "algorithm is EAGLE: the server would start and silently run with accept length 1.0; "
        "use --speculative-algorithm EAGLE3",
        "the server uses GPU 0-1 (2: TP x DP, on server.gpus); GPU 1 is not on this host: "
        "nvidia-smi reports 1 GPU (0)",
        "GPU 0 is used by PID 1 init 100 MiB, outside sglang.service (--kill-gpu-holders kills it)",
        f"port {listener} is taken by PID {os.getpid()} {argv0(os.getpid())} (not sglang.service)",
    ]
    assert result["msg"] == "preflight: " + "; ".join(result["problems"])


def test_allowed_gpu_holders_are_no_problem(preflight, paths, checks, run_module, host):
    host.smi = [(capture("killed-query-gpu.csv"), f"1, init, 100, {H200}\n")]
    failed, result = run(run_module, preflight, paths, {**checks, "allow_gpu_holders": True})
    assert not failed and result["problems"] == []


def test_the_help_check_is_skipped_for_the_unit_already_running(preflight, paths, checks, run_module, host):
    Path(paths["unit_dir"], "sglang.service").write_text(f"{MANAGED}[Unit]\n")
    skip = unit_digest(f"{MANAGED}[Unit]\n".encode())
    failed, result = run(run_module, preflight, paths, {**checks, "skip_flags_if_digest": skip})
    assert not failed and result["help_checked"] is False
    assert not any("--help" in call for call in host.ran("python"))


def test_no_gpu_and_no_sglang(preflight, paths, checks, run_module, host):
    host.answers["python"] = [(1, "", "Traceback\nModuleNotFoundError: No module named 'sglang'\n")]
    host.smi = [("", "")]
    failed, result = run(run_module, preflight, paths, checks)
    assert failed and result["problems"][0] == (
        f"SGLang is not importable by {checks['python']}: ModuleNotFoundError: No module named 'sglang'"
    )
    assert result["problems"][1].startswith("nvidia-smi reported no GPU")
    assert result["gpus"] == 0 and result["help_checked"] is False


def test_checks_missing_a_required_key_are_refused(preflight, paths, run_module):
    failed, result = run(run_module, preflight, paths, {"python": "/x"})
    assert failed and "missing required arguments" in result["msg"]


# --- several servers on one host: sglang-a.service on GPUs 0-3 and port 30000, ours on 4-7 ----------


@pytest.fixture
def neighbour(paths: dict, cgroups: dict[int, str]) -> dict[int, str]:
    """sglang-a.service deployed on GPUs 0-3 of an 8-GPU host; `cgroups` puts PIDs in units."""
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3])
    return cgroups


def run_b(run_module, preflight, paths: dict, checks: dict) -> tuple[bool, dict]:
    checks = {"gpus": [4, 5, 6, 7], **checks}
    return run_module(preflight, {"unit_name": "sglang-b.service", "paths": paths, "checks": checks})


def test_only_our_gpu_set_is_looked_at(preflight, paths, checks, run_module, host, neighbour):
    """The issue's first defect: sglang-a.service on GPUs 0-3 is no holder of ours on 4-7, and
    neither is a stray process there."""
    neighbour.update({100 + i: "sglang-a.service" for i in range(4)})
    apps = [(100 + i, "python3", 70000, i) for i in range(4)] + [(77, "python3", 4000, 2)]
    host.smi = [(query_gpu(8, {i: 70000 for i in range(4)}), compute_apps(*apps))]
    failed, result = run_b(run_module, preflight, paths, {k: v for k, v in checks.items() if k != "gpus"})
    assert not failed, result["msg"]
    assert result["gpus"] == 8


def test_a_neighbour_on_our_gpus_fails_naming_it_even_with_kill_gpu_holders(
    preflight, paths, checks, run_module, host, neighbour
):
    neighbour[123] = "sglang-a.service"
    host.smi = [
        (query_gpu(8, {4: 70000}), compute_apps((123, "python3", 70000, 4), (77, "python3", 4000, 5)))
    ]
    checks = {**checks, "gpus": [4, 5, 6, 7], "allow_gpu_holders": True}  # --kill-gpu-holders
    failed, result = run_b(run_module, preflight, paths, checks)
    assert failed
    assert result["problems"] == [
        "GPU 4 is used by PID 123 python3 of sglang-a.service (profile cg_5tok), another orchestrator unit "
        "on this host: give this profile other server.gpus or stop sglang-a.service"
    ]


def test_a_gpu_the_host_lacks(preflight, paths, checks, run_module, host):
    host.smi = [(query_gpu(4), "")]
    failed, result = run_b(run_module, preflight, paths, {**checks, "gpus": [0, 7]})
    assert failed and result["problems"] == [
        "the server uses GPU 0,7 (2: TP x DP, on server.gpus); GPU 7 is not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)"
    ]


def test_another_units_port_is_a_problem_naming_it(preflight, paths, checks, run_module, host, neighbour):
    """Installed and running or enabled (started at boot, it would take the port); stopped and
    disabled (`orchestrator stop`) or removed by hand, no more."""
    port = checks["port"]
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=port, gpus=[0, 1, 2, 3])
    host.smi = [(query_gpu(8), "")]
    state = {"UnitFileState": "enabled", "ActiveState": "inactive"}

    def show(argv: list[str]) -> tuple[int, str, str]:
        if argv[3:] == ["--property=Id,LoadState,FragmentPath"]:
            return NOT_FOUND
        assert argv[2:] == ["sglang-a.service", "--property=Id,UnitFileState,ActiveState"], argv
        return 0, "Id=sglang-a.service\n" + "".join(f"{k}={v}\n" for k, v in state.items()), ""

    host.answers["systemctl"] = show
    failed, result = run_b(run_module, preflight, paths, checks)
    assert failed and result["problems"] == [
        f"port {port} is the port of sglang-a.service (profile cg_5tok) on this host: "
        "give this profile another server.port"
    ]
    state["UnitFileState"] = "disabled"
    failed, result = run_b(run_module, preflight, paths, checks)
    assert not failed, result["msg"]
    state["ActiveState"] = "active"
    failed, _ = run_b(run_module, preflight, paths, checks)
    assert failed
    Path(paths["unit_dir"], "sglang-a.service").unlink()
    failed, result = run_b(run_module, preflight, paths, checks)
    assert not failed, result["msg"]


def test_a_listener_of_another_unit_is_named(preflight, paths, checks, run_module, host, neighbour, listener):
    """This test's own process listens on the port; made a process of sglang-a.service."""
    neighbour[os.getpid()] = "sglang-a.service"
    host.smi = [(query_gpu(8), "")]
    failed, result = run_b(run_module, preflight, paths, {**checks, "port": listener})
    assert failed and result["problems"] == [
        f"port {listener} is taken by PID {os.getpid()} {argv0(os.getpid())} of sglang-a.service "
        "(profile cg_5tok), another orchestrator unit on this host: give this profile another server.port"
    ]
    neighbour[os.getpid()] = "sglang-b.service"  # our own server holds it: no problem
    failed, result = run_b(run_module, preflight, paths, {**checks, "port": listener})
    assert not failed, result["msg"]


def test_a_service_user_missing_on_the_host_is_a_problem(preflight, paths, checks, run_module, host):
    host.smi = [(query_gpu(8), "")]
    failed, result = run_b(run_module, preflight, paths, {**checks, "user": "no-such-user-here"})
    assert failed and result["problems"] == [
        "service.user no-such-user-here does not exist on this host: create it "
        "(useradd --system no-such-user-here) or set another"
    ]
    failed, result = run_b(run_module, preflight, paths, {**checks, "user": "nobody"})
    assert not failed, result["msg"]


# --- a container runtime: the engine, the image and the image's own SGLang ---------------------------

IMAGE_ID = "1ac87e3132daf12f7f0bd0eeb60d931a3d00b7785cc4ab4201ad834af54a9cfb"  # the captured image's


@pytest.fixture
def podman(host) -> Engine:
    """podman installed and answering; its image is the captured one (label sglang.version=0.5.9);
    SGLang in it answers --help as 0.5.9's."""
    engine = Engine("podman")
    engine.run = lambda argv: (
        (0, HELP, "") if argv[1:] == ["-m", "sglang.launch_server", "--help"] else (0, "0.5.9\n", "")
    )
    host.answers["podman"] = engine
    return engine


@pytest.fixture
def in_image(checks: dict) -> dict:
    """The checks of a podman profile: `python` is the image's, not a file of this host."""
    return {
        **checks,
        "python": "python3",
        "engine": "podman",
        "image": "localhost/capture:1",
        "pull": "never",
        "run_options": ["--network=host", "--cgroups=disabled"],
    }


def runs(host) -> list[list[str]]:
    return [c for c in host.ran("podman") if c[1] == "run"]


def test_the_image_is_checked_not_the_hosts_python(preflight, paths, in_image, run_module, host, podman):
    """The version from the image's label, the flags from the image's own --help (one throw-away
    container with the unit's run_options, no pull), both cached by image ID: the next preflight
    starts none."""
    failed, result = run(run_module, preflight, paths, in_image)
    assert not failed, result["msg"]
    assert (result["sglang_version"], result["help_checked"], result["notes"]) == ("0.5.9", True, [])
    assert runs(host) == [
        [
            "/usr/bin/podman",
            "run",
            "--rm",
            "--pull=never",
            "--network=host",
            "--cgroups=disabled",
            IMAGE_ID,
            "python3",
            "-m",
            "sglang.launch_server",
            "--help",
        ]
    ]
    assert host.ran("python") == []
    cache = Path(paths["state_dir"], "images", f"{IMAGE_ID}.json")
    assert (
        json.loads(cache.read_text())["sglang_version"] == "0.5.9" and oct(cache.stat().st_mode)[-3:] == "600"
    )
    failed, result = run(run_module, preflight, paths, {**in_image, "flags": ["--no-such-flag"]})
    assert len(runs(host)) == 1  # from the cache
    assert failed and result["problems"] == [
        "flag --no-such-flag is not in the `sglang.launch_server --help` of image localhost/capture:1 "
        "(SGLang 0.5.9)"
    ]


def test_without_a_label_the_image_is_asked_its_version_once(
    preflight, paths, in_image, run_module, host, podman
):
    """Ubuntu's org.opencontainers.image.version (22.04), inherited by a CUDA image, is no SGLang version."""
    podman.label({"org.opencontainers.image.version": "22.04"})
    podman.run = lambda argv: (0, "0.5.8\n", "") if argv[1] == "-c" else (0, HELP, "")
    failed, result = run(run_module, preflight, paths, in_image)
    assert failed and result["problems"] == [
        "image localhost/capture:1 has SGLang 0.5.8, the profile renders flags for 0.5.9: "
        'set server.sglang_version: "0.5.8" or use an image with 0.5.9'
    ]
    failed, result = run(run_module, preflight, paths, in_image)
    assert [c[7:] for c in runs(host)] == [
        ["python3", "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        ["python3", "-m", "sglang.launch_server", "--help"],
    ]


def test_an_image_without_sglang(preflight, paths, in_image, run_module, host, podman):
    podman.label({})
    podman.run = lambda argv: (1, "", "Traceback\nModuleNotFoundError: No module named 'sglang'\n")
    failed, result = run(run_module, preflight, paths, in_image)
    assert failed and result["problems"] == [
        "SGLang is not importable by python3 in image localhost/capture:1: "
        "ModuleNotFoundError: No module named 'sglang'"
    ]


def test_a_missing_image_is_a_problem_only_when_it_will_not_be_pulled(
    preflight, paths, in_image, run_module, host, podman
):
    podman.image = None
    failed, result = run(run_module, preflight, paths, in_image)
    assert failed and result["problems"] == [
        "image localhost/capture:1 is not on this host and runtime.pull is never: pull it "
        "(podman pull localhost/capture:1) or set runtime.pull: missing"
    ]
    failed, result = run(run_module, preflight, paths, {**in_image, "pull": "missing"})
    assert not failed and result["problems"] == [] and result["help_checked"] is False
    assert result["notes"] == [
        "image localhost/capture:1 is not on this host: podman pulls it when the unit starts (runtime.pull: "
        "missing); its SGLang version and flags are checked by the next preflight"
    ]
    assert runs(host) == [] and not any(c[1] == "pull" for c in host.ran("podman"))


def test_an_engine_missing_or_not_answering(preflight, paths, in_image, run_module, host):
    failed, result = run(run_module, preflight, paths, {**in_image, "engine": "docker"})
    assert failed and result["problems"] == [
        "docker is not installed on this host (runtime.kind: docker): install it (apt-get install docker.io) "
        "or set another runtime.kind"
    ]
    host.answers["docker"] = Engine("docker")
    host.answers["docker"].daemon = False
    failed, result = run(run_module, preflight, paths, {**in_image, "engine": "docker"})
    assert failed and result["problems"] == [
        "`docker version` exited 1: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?: start the daemon (systemctl start docker)"
    ]


def test_the_drafter_checks_read_the_mounted_paths(preflight, paths, in_image, run_module, host, podman):
    """Model and drafter are mounted read-only at their own paths: the host's files are the container's."""
    failed, result = run(run_module, preflight, paths, {**in_image, "algorithm": "EAGLE"})
    assert failed and result["problems"] == [
        f"drafter {in_image['draft_model_path']} is an EAGLE-3 model (LlamaForCausalLMEagle3) but the "
        "algorithm is EAGLE: the server would start and silently run with accept length 1.0; "
        "use --speculative-algorithm EAGLE3"
    ]


def test_a_neighbours_container_on_our_gpus_is_named(
    preflight, paths, in_image, run_module, host, podman, neighbour
):
    """sglang-a's container runs outside every cgroup of ours (as docker's do); its label names it."""
    podman.containers = {"c0ffee": ("sglang-a.service", os.getpid())}
    host.smi = [(query_gpu(8), compute_apps((os.getpid(), argv0(os.getpid()), 500, 4)))]
    failed, result = run_b(
        run_module, preflight, paths, {**in_image, "gpus": [4, 5, 6, 7], "allow_gpu_holders": True}
    )
    assert failed and result["problems"] == [
        f"GPU 4 is used by PID {os.getpid()} {argv0(os.getpid())} of sglang-a.service (profile cg_5tok), "
        "another orchestrator unit on this host: give this profile other server.gpus or stop sglang-a.service"
    ]
    podman.containers = {"c0ffee": ("sglang-b.service", os.getpid())}  # our own container
    failed, result = run_b(run_module, preflight, paths, {**in_image, "gpus": [4, 5, 6, 7]})
    assert not failed, result["msg"]


def test_a_missing_mount_source_is_a_problem(preflight, paths, in_image, run_module, host, podman, tmp_path):
    mounts = [str(tmp_path / "target"), str(tmp_path / "hf-cache")]
    failed, result = run(run_module, preflight, paths, {**in_image, "mounts": mounts})
    assert failed and result["problems"] == [
        f"runtime.mounts source {tmp_path / 'hf-cache'} does not exist on this host: create it or fix the "
        "path (podman would not start; docker would mount an empty directory made in its place)"
    ]


def test_pull_always_of_a_tag_is_a_note(preflight, paths, in_image, run_module, host, podman):
    """What runs after the start's pull may not be what was checked, unless the digest pins it."""
    failed, result = run(run_module, preflight, paths, {**in_image, "pull": "always"})
    assert not failed and result["notes"] == [
        "image localhost/capture:1 is checked as it is here, but runtime.pull always pulls its tag again at "
        "start: pin it by digest (IMAGE:TAG@sha256:...) so that what runs is what was checked"
    ]
    pinned = "localhost/capture:1@sha256:684a024643f75c3464de281ba9311d99e10a0af7fd07069382d075306a72f5df"
    failed, result = run(run_module, preflight, paths, {**in_image, "pull": "always", "image": pinned})
    assert not failed and result["notes"] == []


def test_a_neighbours_container_listening_on_our_port_is_named(
    preflight, paths, in_image, run_module, host, podman, neighbour, listener
):
    """This test's process listens on the port, made the main process of sglang-a's container
    (on the host network, as the units run them); in no unit's cgroup."""
    podman.containers = {"c0ffee": ("sglang-a.service", os.getpid())}
    host.smi = [(query_gpu(8), "")]
    failed, result = run_b(run_module, preflight, paths, {**in_image, "gpus": [4], "port": listener})
    assert failed and result["problems"] == [
        f"port {listener} is taken by PID {os.getpid()} {argv0(os.getpid())} of sglang-a.service "
        "(profile cg_5tok), another orchestrator unit on this host: give this profile another server.port"
    ]

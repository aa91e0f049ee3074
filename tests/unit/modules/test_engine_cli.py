"""The commands the host modules and `verify` give docker and podman, handed to the real CLIs
(Debian's docker.io and podman; scripts/setup.sh --test installs both, without starting dockerd).

podman runs over a storage root of its own (as tests/unit/test_container_cli.py does it): a
container is created from a rendered unit's `run` words over an empty root file system, never
started (nothing runs here), and the modules' parsers and `verify`'s checks read what podman
really prints about it. docker, with no daemon, answers every command with "Cannot connect",
which the modules take for an engine with no containers, and preflight names.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import (
    preflight as preflight_mod,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers import (
    container_units,
    labelled_containers,
    parse_ps,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.preflight import (
    _created_problems,
    _engine,
    _image_problems,
    _in_image,
    _inspect_image,
    cdi_devices,
    cdi_requests,
    cdi_spec_devices,
    device_problems,
    docker_gpu_problems,
    engine_message,
    engine_options,
    nvidia_majors,
    nvidia_nodes,
    refused_words,
)
from hostfakes import capture

from orchestrator.hosts import playvars
from orchestrator.hosts.playvars import unit_facts
from orchestrator.hosts.verify import test_deployment as checks
from orchestrator.hosts.verify.run import plan_json
from orchestrator.lab import standins
from orchestrator.profile import model as profile_mod
from orchestrator.render import container_unit, launch

ABSENT = "localhost/orchestrator-test/absent:1"
UNIT = "sglang-b.service"
NAME = "sglang-b"


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
        pytest.skip("no podman CLI here: apt-get install podman (scripts/setup.sh --test does)")
    # Short: podman refuses a runroot over 50 characters (an xdist worker's tmp_path is longer).
    root = Path(tempfile.mkdtemp(prefix="podman-"))
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
        shutil.rmtree(root, ignore_errors=True)


#: The docker CLI on PATH, and Debian's /usr/bin one (20.10, the lab's) when that is another.
DOCKERS = list(
    {
        os.path.realpath(b): b
        for b in (shutil.which("docker"), "/usr/bin/docker")
        if b and os.access(b, os.X_OK)
    }.values()
)


@pytest.fixture(params=DOCKERS or [None], ids=lambda b: b or "no-docker")
def docker(request: pytest.FixtureRequest) -> str:
    binary = request.param
    if binary is None:
        pytest.skip("no docker CLI here: apt-get install docker.io (scripts/setup.sh --test does)")
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
        # no compile cache: systemd makes /var/cache/orchestrator/... at start, not this test
        "service": {"unit_name": UNIT, "compile_cache": False},
        "runtime": {"kind": "podman", "image": ABSENT, "pull": "never"},
    }
    (tmp / "p.yml").write_text(yaml.safe_dump(doc))
    prof = profile_mod.load(str(tmp / "p.yml"))
    built = launch.build(prof)
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
    assert labelled_containers(module) == []
    [(argv, rc, out, _)] = module.calls
    assert argv[1:] == ["ps", "--filter", "label=orchestrator.unit", "--format", "json"] and rc == 0
    assert parse_ps(out) == []
    listed = subprocess.run([*argv[:2], "-a", *argv[2:]], capture_output=True, text=True, check=True)
    [(cid, unit)] = parse_ps(listed.stdout)
    assert unit == UNIT
    rc, out, _ = module.run_command([podman, "inspect", "--format", "{{.State.Pid}}", cid])
    assert (rc, out.strip()) == (0, "0")
    assert container_units(module, {UNIT}) == {}


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
    return container_unit.probe_options(profile_mod.load(str(tmp_path / "p.yml")))


def test_podman_preflight_commands_parse(podman: str, tmp_path: Any) -> None:
    """The engine answers; an absent image is `image inspect`'s exit 125; the throw-away run's
    flags (the unit's own network, cgroups and ulimits) parse and podman stops at the image."""
    module = RealModule({"podman": podman})
    assert _engine(module, "podman") == (podman, "")
    checks_ = {"engine": "podman", "image": ABSENT, "pull": "never", "python": "python3"}
    image, problems, notes = _inspect_image(module, podman, checks_)
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
    rc, _, err = _in_image(module, podman, "0" * 64, {"run_options": options}, ["python3", "-c", "print(1)"])
    assert rc == 125 and "image not known" in err, err
    assert module.calls[-1][0][2 : 5 + len(options)] == ["--rm", "--pull=never", *options, "0" * 64]


def test_docker_without_its_daemon_has_no_containers_and_is_named_by_preflight(
    docker: str, tmp_path: Any
) -> None:
    module = RealModule({"docker": docker})
    assert labelled_containers(module) == []
    exe, problem = _engine(module, "docker")
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


# --- the engine's own parse of the unit's run command, before the stop ---------------------------


def _create_checks(
    tmp_path: Path, options: list[str], kind: str = "podman", **runtime: Any
) -> dict[str, Any]:
    """playvars' PreflightChecks of a `kind` profile of UNIT (the `created` fixture's, whose
    container stands for the running server's), with an API key's --config mount and a secret
    --env-file, neither written yet."""
    for name in ("model", "drafter"):
        (tmp_path / name).mkdir(exist_ok=True)
    doc = {
        "extends": "cg_5tok",
        "server": {"model_path": str(tmp_path / "model"), "gpus": "4-7", "tp_size": 4},
        "speculative": {"draft_model_path": str(tmp_path / "drafter")},
        "api_key": {"env": "SGLANG_KEY"},
        "secret_env": {"HF_TOKEN": {"env": "HF_TOKEN"}},
        # no compile cache: systemd makes /var/cache/orchestrator/... at start, not this test
        "service": {"unit_name": UNIT, "compile_cache": False},
        "runtime": {"kind": kind, "image": ABSENT, "pull": "never", "options": options, **runtime},
    }
    (tmp_path / "p.yml").write_text(yaml.safe_dump(doc))
    prof = profile_mod.load(str(tmp_path / "p.yml"))
    return playvars.preflight_checks(prof, launch.build(prof), [4, 5, 6, 7], False).model_dump()


def _containers(podman: str) -> list[tuple[str, str]]:
    listed = subprocess.run(
        [podman, "ps", "-a", "--format", "json"], capture_output=True, text=True, check=True
    )
    return sorted((row["Id"], row["Names"][0]) for row in json.loads(listed.stdout or "[]"))


def test_podman_create_judges_the_run_command_beside_the_servers_container(
    podman: str, created: dict[str, Any], tmp_path: Path
) -> None:
    """The unit's words, less -d and --replace (which would remove the server's container
    `sglang-b`), under a name and label of its own, never pulling, over an empty root file
    system, the secret files empty ones of its own: podman accepts them, and the container is
    removed again; the server's is untouched."""
    before = _containers(podman)
    assert [name for _, name in before] == ["sglang-b"]
    c = _create_checks(tmp_path, ["--ulimit=core=0", "--device=/dev/null:/dev/orchestrator-null:rw"])
    assert c["secret_files"] == [f"/etc/orchestrator/{NAME}.config.yaml", f"/etc/orchestrator/{NAME}.env"]
    module = RealModule({"podman": podman})
    assert _created_problems(module, podman, c, "") == []
    (create, rc, _, err), (remove, *_) = module.calls
    assert rc == 0, err
    unit_words = c["run_words"]
    assert {"-d", "--replace"} <= set(unit_words) and not {"-d", "--replace"} & set(create)
    [name] = [w.removeprefix("--name=") for w in create if w.startswith("--name=")]
    assert name.startswith(f"{NAME}-preflight-") and remove == [podman, "rm", "-f", "--ignore", name]
    assert f"--label=orchestrator.preflight={UNIT}" in create and "--pull=never" in create
    rootfs = create.index("--rootfs")
    assert create[rootfs + 2 :] == unit_words[unit_words.index(ABSENT) + 1 :]  # SGLang's argv as is
    # systemd's expansion of the --config word; the secret files' empty stand-ins, gone again.
    assert create[-2:] == ["--config", f"/run/credentials/{UNIT}/sglang-config.yaml"]
    [env_file] = [w.removeprefix("--env-file=") for w in create if w.startswith("--env-file=")]
    [key] = [w for w in create if w.endswith(f":/run/credentials/{UNIT}/sglang-config.yaml:ro")]
    key_file = key.removeprefix("--volume=").partition(":")[0]
    assert os.path.dirname(env_file) == os.path.dirname(key_file) != "/etc/orchestrator"
    assert not os.path.exists(os.path.dirname(env_file))
    assert _containers(podman) == before


def test_a_value_only_the_engine_refuses_is_a_preflight_problem_naming_it(
    podman: str, tmp_path: Path, paths: dict[str, str]
) -> None:
    """A --device the host lacks passes every rule of the control machine; podman's create
    refuses it before the stop, and preflight says so with podman's words and the option.
    Nothing is left behind."""
    c = {**_create_checks(tmp_path, ["--device=/dev/orchestrator-absent"]), "python": "python3"}
    module = RealModule({"podman": podman})
    problems, version, help_checked, notes = _image_problems(module, UNIT, paths, c)
    assert problems == [
        f"image {ABSENT} is not on this host and runtime.pull is never: pull it (podman pull {ABSENT}) or "
        "set runtime.pull: missing",
        "podman refuses the unit's run command: stat /dev/orchestrator-absent: no such file or directory "
        "(--device=/dev/orchestrator-absent), said by its own `podman create` before the stop: fix the "
        "profile's value",
    ]
    assert (version, help_checked, notes) == ("", False, [])
    assert not [name for _, name in _containers(podman) if "-preflight-" in name]


@pytest.mark.parametrize(
    ("err", "option"),
    [
        (
            'Error: ulimit option "core=9999999999999999999" requires name=SOFT:HARD, failed to be parsed: '
            'strconv.ParseInt: parsing "9999999999999999999": value out of range',
            "--ulimit=core=9999999999999999999",
        ),
        ("Error: invalid device mode: mmm", "--device=/dev/null:mmm"),
        ('Error: "/data/m": duplicate mount destination', "--volume=/scratch/a:/data/m/."),
        (
            'docker: Error response from daemon: invalid mount config for type "bind": bind source path does '
            "not exist: /scratch/a\n\nRun 'docker create --help' for more information\n",
            "--volume=/scratch/a:/data/m/.",
        ),
    ],
)
def test_the_refused_option_is_named_from_the_engines_message(err: str, option: str) -> None:
    """As podman 4.3.1 and docker word them (the first three seen here, with the real podman)."""
    words = ["--name=x", "--network=host", "--volume=/data/models/k:/data/models/k:ro", option, "IMAGE"]
    message = engine_message("", err)
    assert "\n" not in message and not message.startswith(("Error", "docker:"))
    assert refused_words(message, words) == [option]


# --- NVIDIA's devices behind links the control machine cannot see --------------------------------


def test_nvidia_majors_are_read_from_proc_devices() -> None:
    assert nvidia_majors(capture("proc-devices-h200.txt")) == {195, 238, 239, 240, 241, 242}
    assert nvidia_majors("Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia-ish\n") == {195}


def test_a_device_or_mount_that_leads_to_a_gpu_node_is_named(tmp_path: Path) -> None:
    """/dev/null's major (1, mem) stands in for NVIDIA's here: a --device link to it, or to a
    directory holding it (the engines hand over a directory's nodes, not its links), and a mount
    source that leads into /dev. A model directory outside /dev is not walked."""
    majors = {os.major(os.stat("/dev/null").st_rdev)}
    (tmp_path / "gpu0").symlink_to("/dev/null")
    (tmp_path / "devices").symlink_to("/dev")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "gpu0").symlink_to("/dev/null")
    words = [
        f"--device={tmp_path}/gpu0:/dev/x:rw",
        f"--device={tmp_path}/links",
        "--device=nvidia.com/gpu=4",
        "--device=/dev/orchestrator-absent",
    ]
    problems = device_problems(words, [str(tmp_path / "devices"), str(tmp_path / "links")], majors)
    assert problems[0] == (
        f"--device={tmp_path}/gpu0:/dev/x:rw gives the container /dev/null on this host, NVIDIA's: GPUs "
        "reach the container from server.gpus only; drop it from runtime.options"
    )
    assert len(problems) == 2 and problems[1].startswith(f"runtime.mounts source {tmp_path}/devices gives ")
    assert problems[1].endswith(
        "on this host, NVIDIA's: GPUs reach the container from server.gpus only; mount no device paths"
    )
    assert "/dev/null" in nvidia_nodes(str(tmp_path / "devices"), majors)
    assert device_problems(words, [str(tmp_path / "devices")], nvidia_majors("")) == []
    # docker's daemon opens a device only at start: one this host lacks is named here.
    assert device_problems(words, [], nvidia_majors(""), missing=True) == [
        "--device=/dev/orchestrator-absent: /dev/orchestrator-absent does not exist on this host: drop it "
        "from runtime.options"
    ]


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A unix socket that the docker client takes for its daemon (DOCKER_HOST): it records each
    request and answers a create with `create` ((status, body), 201 and an ID unless a test sets
    it), a removal with 204. Nothing runs."""
    seen: dict[str, Any] = {"requests": [], "create": (201, {"Id": "f00d" * 16, "Warnings": []})}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "test"

        def _answer(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode() if code != 204 else b""
            self.send_response(code)
            for name, value in (
                ("Api-Version", "1.41"),
                ("Ostype", "linux"),
                ("Content-Type", "application/json"),
            ):
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # the client's /_ping
            self._answer(200, "OK")

        def do_GET(self) -> None:
            if self.path.endswith("/info") and "info" in seen:
                self._answer(200, seen["info"])
                return
            self._answer(200 if self.path.endswith("/_ping") else 404, {"message": "not recorded"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen["requests"].append(("POST", self.path, json.loads(body or b"null")))
            self._answer(*seen["create"])

        def do_DELETE(self) -> None:
            seen["requests"].append(("DELETE", self.path, None))
            self._answer(204, None)

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    socket = tmp_path / "docker.sock"
    server = Server(str(socket), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def test_docker_create_asks_for_a_container_of_its_own_and_removes_it(
    docker: str, daemon: dict[str, Any], tmp_path: Path
) -> None:
    """What the docker client sends for preflight's create (the daemon verifies every setting of
    it, so refusals come back before the stop), then its removal by the same name."""
    c = _create_checks(tmp_path, ["--ulimit=core=0"], "docker")
    module = RealModule({"docker": docker})
    assert _created_problems(module, docker, c, "0" * 64) == []
    (post, path, body), (delete, removed, _) = daemon["requests"]
    name = path.partition("?name=")[2]
    assert (post, delete) == ("POST", "DELETE") and name.startswith(f"{NAME}-preflight-")
    assert removed.endswith(f"/containers/{name}?force=1")
    assert body["Image"] == "0" * 64 and body["Labels"] == {"orchestrator.preflight": UNIT}
    assert body["Cmd"] == c["run_words"][c["run_words"].index(ABSENT) + 1 :]
    assert {"Name": "core", "Hard": 0, "Soft": 0} in body["HostConfig"]["Ulimits"]
    assert not any("/etc/orchestrator/" in bind for bind in body["HostConfig"]["Binds"])
    daemon["requests"].clear()
    daemon["create"] = (
        400,
        {"message": 'invalid mount config for type "bind": bind source path does not exist'},
    )
    [problem] = _created_problems(module, docker, c, "0" * 64)
    assert problem.startswith('docker refuses the unit\'s run command: invalid mount config for type "bind"')
    assert [r[0] for r in daemon["requests"]] == ["POST", "DELETE"]  # removed even so
    daemon["create"] = (404, {"message": f"No such image: {ABSENT}"})  # the daemon checked the rest first
    assert _created_problems(module, docker, c, "") == []


# --- how docker hands over the GPUs (its create takes what only its start refuses) ---------------


def _gpu_words(tmp_path: Path, gpu_devices: str) -> list[str]:
    """The run words preflight gets of a docker profile on GPUs 4-7 with this runtime.gpu_devices."""
    words = _create_checks(tmp_path, [], "docker", gpu_devices=gpu_devices)["run_words"]
    gpus = [w for w in words if w.startswith(("--gpus=", "--device=nvidia.com/"))]
    cdi = [f"--device=nvidia.com/gpu={g}" for g in range(4, 8)]
    assert gpus == (['--gpus="device=4,5,6,7"'] if gpu_devices == "gpus" else cdi), words
    return words


def _cdi_spec(folder: Path, names: range, name: str = "nvidia.yaml") -> None:
    spec = standins.cdi_spec(8)
    spec["devices"] = [d for d in spec["devices"] if int(d["name"]) in names]
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps(spec))


def test_docker_gpus_need_nvidias_hook_on_the_host(tmp_path: Path) -> None:
    """`docker create --gpus` passes without the NVIDIA Container Toolkit; its start fails (`could
    not select device driver "" with capabilities: [[gpu]]`), after the stop: preflight names it."""
    words = _gpu_words(tmp_path, "gpus")
    said = (
        "docker's --gpus needs the NVIDIA Container Toolkit on this host (nvidia-container-runtime-hook is "
        "not on PATH, so the daemon has no GPU driver): install it and restart docker (the daemon looks for "
        "it at its start), or set runtime.gpu_devices: cdi with a CDI spec (nvidia-ctk cdi generate)"
    )
    assert docker_gpu_problems(RealModule({}), "/usr/bin/docker", words) == ([said], [])
    # NVIDIA's CDI hook alone serves --gpus only on the newest docker releases: refused all the same.
    only_cdi = RealModule({"nvidia-cdi-hook": "/usr/bin/nvidia-cdi-hook"})
    assert docker_gpu_problems(only_cdi, "/usr/bin/docker", words) == ([said], [])
    hook = RealModule({"nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook"})
    assert docker_gpu_problems(hook, "docker", words) == ([], [])
    # SGLang's own words after the image are not docker's: a --gpus= there asks docker for nothing.
    after = [*_gpu_words(tmp_path, "cdi"), "--gpus=x", "--device=nvidia.com/gpu=9"]
    assert engine_options(after) == engine_options(_gpu_words(tmp_path, "cdi"))
    assert cdi_requests(after) == [f"nvidia.com/gpu={g}" for g in range(4, 8)]
    assert docker_gpu_problems(RealModule({}), "docker", [*words[:-1], "--gpus=x"]) == ([said], [])


def test_the_toolkits_cdi_or_csv_mode_refuses_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-container-runtime-hook in the toolkit's cdi (or csv) mode refuses to be called by
    --gpus; the mode is read from its config.toml as the toolkit writes it."""
    config = tmp_path / "config.toml"
    monkeypatch.setattr(preflight_mod, "NVIDIA_TOOLKIT_CONFIG", str(config))
    words = _gpu_words(tmp_path, "gpus")
    hook = RealModule({"nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook"})
    config.write_text('[nvidia-container-runtime]\n#mode = "cdi"\nmode = "auto"\n')
    assert docker_gpu_problems(hook, "docker", words) == ([], [])
    config.write_text('[nvidia-container-runtime]\nlog-level = "info"\nmode = "cdi"\n')
    [problem], _ = docker_gpu_problems(hook, "docker", words)
    assert problem == (
        "docker's --gpus calls nvidia-container-runtime-hook, which refuses that in the toolkit's "
        f'mode = "cdi" ({config}): set runtime.gpu_devices: cdi, or the toolkit\'s mode to auto or legacy'
    )


def test_docker_cdi_devices_need_the_daemons_cdi_and_a_spec_for_each(
    docker: str, daemon: dict[str, Any], tmp_path: Path
) -> None:
    """The real client's `docker info` of a daemon (the recorder) with CDI off, then with spec
    directories that define GPUs 0-5 of the 4-7 asked for. Docker before 25 has no CDISpecDirs
    (its template fails): CDI off too."""
    words = _gpu_words(tmp_path, "cdi")
    assert cdi_requests(words) == [f"nvidia.com/gpu={g}" for g in range(4, 8)]
    module = RealModule({"docker": docker})
    version = subprocess.run(
        [docker, "version", "--format={{.Client.Version}}"], capture_output=True, text=True
    )
    modern = int(version.stdout.split(".")[0]) >= 25
    off = "docker on this host has no CDI (runtime.gpu_devices: cdi; `docker info` lists no CDI spec "
    off += "directories)"
    daemon["info"] = {"CDISpecDirs": []}
    [problem], _ = docker_gpu_problems(module, docker, words)
    assert problem.startswith(off), problem
    specs, run = tmp_path / "cdi", tmp_path / "run-cdi"
    _cdi_spec(specs, range(0, 6))
    daemon["info"] = {"CDISpecDirs": [str(specs), str(run)]}
    problems, notes = docker_gpu_problems(module, docker, words)
    if not modern:
        assert [p[: len(off)] for p in problems] == [off]
        return
    assert (
        problems
        == [
            f"CDI devices nvidia.com/gpu=6, nvidia.com/gpu=7 not defined by any spec in {specs}, {run}: "
            "generate it (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml) or fix server.gpus"
        ]
        and notes == []
    )
    _cdi_spec(run, range(6, 8), "more.json")
    assert docker_gpu_problems(module, docker, words) == ([], [])


def test_cdi_specs_are_read_as_json_or_yaml(tmp_path: Path) -> None:
    """As the CDI library finds them: *.json and *.yaml only (a .yml is no spec to docker); JSON
    with YAML's comment lines (the lab's own spec) without PyYAML, YAML with it."""
    yaml_spec = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: all\n"
    assert cdi_spec_devices(yaml_spec) is None  # no loader: not read, and said so below
    assert cdi_spec_devices(yaml_spec, yaml.safe_load) == ("nvidia.com/gpu", ["0", "all"])
    lab_spec = "# Written by the orchestrator lab.\n" + json.dumps(standins.cdi_spec(2), indent=2)
    assert cdi_spec_devices(lab_spec) == ("nvidia.com/gpu", ["0", "1"])
    (tmp_path / "nvidia.yaml").write_text(yaml_spec)
    (tmp_path / "broken.json").write_text('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "dev')
    (tmp_path / "vendor.yaml").write_text("kind: vendor.com/fpga\ndevices: [")  # not NVIDIA's: no matter
    (tmp_path / "other.yml").write_text(json.dumps(standins.cdi_spec(4)))
    (tmp_path / "README").write_text("not a spec")
    found, unread = cdi_devices([str(tmp_path), str(tmp_path / "absent")])
    # a half-written NVIDIA spec is named (its devices may be the missing ones); another vendor's is not
    assert found == {"nvidia.com/gpu=0", "nvidia.com/gpu=all"} and unread == [str(tmp_path / "broken.json")]

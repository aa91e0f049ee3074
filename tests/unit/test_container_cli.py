"""The real docker and podman command-line clients read every rendered command as the unit means it.

A unit the engine refuses is found out on the host only after the running server was stopped, so
each rendered `run` (and the unit's ExecStartPre=/ExecStop= commands) goes to the CLIs Debian
ships (docker.io, podman; scripts/setup.sh --test installs both), as systemd would hand it over: the
ExecStart= words with ${CREDENTIALS_DIRECTORY} expanded. Host paths that a parse opens are moved
into a temporary directory: the --env-file (written by secrets.py, so its syntax is checked too),
and for podman's create the mount sources.

- docker, with no daemon: the client parses every flag before it connects, so the command must fail
  only with "Cannot connect to the Docker daemon", never "unknown flag" or "invalid argument". Then,
  with a socket that records what the client sends (it answers the create with an error, nothing
  runs), the request itself: GPU device IDs, binds, environment, ulimits, the argv.
- podman, in a throw-away storage root: with an image that does not exist and `--pull never`, the
  flags parse and the error is "image not known"; with an empty root file system in the image's
  place, the same command as `podman create` builds the container, and `podman container inspect`
  shows what it understood. Nothing is started.

Each test skips, saying why, where its CLI is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.hosts import secrets
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

IMAGE = "docker.io/lmsysorg/sglang:v0.5.9-cu129-amd64@sha256:" + "0123456789abcdef" * 4
ABSENT = "localhost/orchestrator-test/absent:1"
UNIT = "sglang-b.service"
NAME = "sglang-b"

#: Profiles that use every part of the runtime section, and a plain one.
CASES: dict[str, dict[str, Any]] = {
    "plain": {"extends": "cg_5tok", "runtime": {}},
    "everything": {
        "extends": "cg_5tok",
        "server": {"tp_size": 4, "gpus": "4-7", "served_model_name": "kimi $HOME 100%", "port": 30001},
        "env": {"SGLANG_X": 'a b "c" $HOME'},
        "api_key": {"env": "SGLANG_KEY"},
        "secret_env": {"HF_TOKEN": {"env": "HF_TOKEN"}},
        "service": {"unit_name": UNIT, "limits": {"memlock": "64G", "nofile": 65536}, "stop_timeout_s": 30},
        "runtime": {
            "ipc_host": False,
            "shm_size": "32g",
            "pull": "always",
            "mounts": [
                {"source": "/data/hf", "target": "/root/.cache/huggingface", "read_only": False},
                {"source": "/etc/site", "target": "/etc/site"},
            ],
            "options": [
                "--cap-add IPC_LOCK",
                "--cap-add=CAP_SYS_NICE",
                "--security-opt=no-new-privileges",
                "--security-opt=label=disable",
                "--pids-limit=4096",
                "--ulimit=core=0",
                "--ulimit=stack=67108864:-1",
                "--device=/dev/null:/dev/orchestrator-null:rw",
            ],
        },
    },
}


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_KEY", "k-123")
    monkeypatch.setenv("HF_TOKEN", 'hf_a"b $c')


def _profile(tmp_path: Path, doc: dict[str, Any], kind: str, **runtime: Any) -> profile_mod.Profile:
    doc = yaml.safe_load(yaml.safe_dump(doc))
    doc["runtime"] = {"kind": kind, "image": IMAGE, **doc["runtime"], **runtime}
    path = tmp_path / f"{kind}.yml"
    path.write_text(yaml.safe_dump(doc))
    return profile_mod.load(str(path))


def _as_systemd_runs_it(p: launch.Plan, prof: profile_mod.Profile, tmp_path: Path) -> list[str]:
    """ExecStart='s words after systemd's expansion, the --env-file moved to a file written here."""
    credentials = f"/run/credentials/{p.unit_name}"
    words = [w.replace("${CREDENTIALS_DIRECTORY}", credentials) for w in p.exec_argv]
    if p.env_file_path:
        env_file = tmp_path / "sglang.env"
        env_file.write_text(secrets.secret_env_text(prof))
        words = [f"--env-file={env_file}" if w == f"--env-file={p.env_file_path}" else w for w in words]
    return words


def _cli(name: str) -> list[str]:
    """The CLI on PATH, and Debian's /usr/bin one when that is another binary (another version)."""
    found = [shutil.which(name), f"/usr/bin/{name}"]
    real = {os.path.realpath(f): f for f in found if f and os.access(f, os.X_OK)}
    return list(real.values())


DOCKERS = _cli("docker")


@pytest.fixture(params=DOCKERS or [None], ids=lambda b: b or "no-docker")
def docker(request: pytest.FixtureRequest) -> str:
    if request.param is None:
        pytest.skip("no docker CLI here: apt-get install docker.io (scripts/setup.sh --test does)")
    return request.param


def _docker_env(tmp_path: Path, socket: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),
        "DOCKER_HOST": f"unix://{socket}",
    }


def _unit_commands(p: launch.Plan) -> list[list[str]]:
    """ExecStartPre=, ExecStop= and ExecStopPost= of the unit, as argv lists (without `-`)."""
    out = []
    for line in p.unit.splitlines():
        directive, _, value = line.partition("=")
        if directive in ("ExecStartPre", "ExecStop", "ExecStopPost"):
            words = launch.unquote_exec(value)
            out.append([words[0].removeprefix("-"), *words[1:]])
    return out


# --- docker ----------------------------------------------------------------------------------


#: The docker client checks a --device value against the daemon's OS, which it learns from the
#: daemon: with none it says "unknown server OS" instead. The recorder below covers --device.
NEEDS_THE_DAEMONS_OS = "--device="


@pytest.mark.parametrize("case", sorted(CASES))
def test_docker_without_a_daemon_fails_only_to_connect(case: str, docker: str, tmp_path: Path) -> None:
    doc = yaml.safe_load(yaml.safe_dump(CASES[case]))
    options = doc["runtime"].get("options", [])
    doc["runtime"]["options"] = [o for o in options if not o.startswith(NEEDS_THE_DAEMONS_OS)]
    prof = _profile(tmp_path, doc, "docker")
    p = launch.build(prof)
    env = _docker_env(tmp_path, tmp_path / "no-daemon.sock")
    for words in (_as_systemd_runs_it(p, prof, tmp_path), *_unit_commands(p)):
        result = subprocess.run([docker, *words[1:]], capture_output=True, text=True, env=env, timeout=60)
        said = result.stderr.strip()
        assert "unknown flag" not in said and "invalid argument" not in said, (words, said)
        assert result.returncode != 0 and said.startswith(
            ("docker: Cannot connect to the Docker daemon", "Cannot connect to the Docker daemon")
        ), (words, said)


def test_docker_checks_a_device_against_the_daemons_os(docker: str, tmp_path: Path) -> None:
    """Why the test above leaves --device out: without a daemon the client cannot check it."""
    prof = _profile(tmp_path, CASES["everything"], "docker")
    words = _as_systemd_runs_it(launch.build(prof), prof, tmp_path)
    assert any(w.startswith(NEEDS_THE_DAEMONS_OS) for w in words)
    env = _docker_env(tmp_path, tmp_path / "no-daemon.sock")
    result = subprocess.run([docker, *words[1:]], capture_output=True, text=True, env=env, timeout=60)
    assert result.stderr.startswith("docker: unknown server OS: "), result.stderr


@dataclass
class _Recorder:
    """A unix socket that records the requests the docker client makes and answers each container
    create with an error, so the client stops there (no daemon, nothing started)."""

    requests: list[tuple[str, str, Any]]


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[_Recorder, Path]]:
    seen = _Recorder([])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "test"

        def _answer(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Api-Version", "1.41")
            self.send_header("Ostype", "linux")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_HEAD(self) -> None:  # the client's /_ping
            self._answer(200, "OK")

        def do_GET(self) -> None:
            seen.requests.append(("GET", self.path, None))
            self._answer(200 if self.path.endswith("/_ping") else 404, '{"message": "not recorded"}')

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.requests.append(("POST", self.path, json.loads(body or b"null")))
            self._answer(500, '{"message": "recorded by the test"}')

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    socket = tmp_path / "recorder.sock"
    server = Server(str(socket), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield seen, socket
    finally:
        server.shutdown()
        server.server_close()


def test_docker_asks_for_the_container_the_unit_means(
    docker: str, recorder: tuple[_Recorder, Path], tmp_path: Path
) -> None:
    seen, socket = recorder
    options = [*CASES["everything"]["runtime"]["options"], "--init"]
    # pull: missing, so that the client asks for the container first (`always` pulls before).
    prof = _profile(tmp_path, CASES["everything"], "docker", options=options, pull="missing")
    p = launch.build(prof)
    words = _as_systemd_runs_it(p, prof, tmp_path)
    env = _docker_env(tmp_path, socket)
    result = subprocess.run([docker, *words[1:]], capture_output=True, text=True, env=env, timeout=60)
    assert "recorded by the test" in result.stderr, result.stderr
    (_, path, body), *_ = [r for r in seen.requests if r[0] == "POST"]
    assert path.endswith(f"/containers/create?name={NAME}")
    host = body["HostConfig"]
    assert body["Image"] == IMAGE and body["Labels"] == {"orchestrator.unit": UNIT}
    assert body["Cmd"] == [w.replace("${CREDENTIALS_DIRECTORY}", f"/run/credentials/{UNIT}") for w in p.argv]
    assert set(body["Env"]) == {f"{k}={v}" for k, v in p.environment.items()} | {'HF_TOKEN=hf_a"b $c'}
    assert host["DeviceRequests"] == [
        {
            "Driver": "",
            "Count": 0,
            "DeviceIDs": ["4", "5", "6", "7"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert set(host["Binds"]) == {
        "/data/models/Kimi-K2.5:/data/models/Kimi-K2.5:ro",
        "/data/eagle3/output_10k_sglang/4:/data/eagle3/output_10k_sglang/4:ro",
        f"/var/cache/orchestrator/{NAME}:/var/cache/orchestrator/{NAME}",  # the compile caches
        "/data/hf:/root/.cache/huggingface",
        "/etc/site:/etc/site:ro",
        f"/etc/orchestrator/{NAME}.config.yaml:/run/credentials/{UNIT}/sglang-config.yaml:ro",
    }
    assert (host["NetworkMode"], host["IpcMode"], host["ShmSize"]) == ("host", "", 32 * 2**30)
    assert sorted(host["Ulimits"], key=lambda u: u["Name"]) == [
        {"Name": "core", "Hard": 0, "Soft": 0},
        {"Name": "memlock", "Hard": 64 * 2**30, "Soft": 64 * 2**30},
        {"Name": "nofile", "Hard": 65536, "Soft": 65536},
        {"Name": "stack", "Hard": -1, "Soft": 67108864},
    ]
    assert {c.removeprefix("CAP_") for c in host["CapAdd"]} == {"IPC_LOCK", "SYS_NICE"}
    assert host["SecurityOpt"] == ["no-new-privileges", "label=disable"]
    assert host["PidsLimit"] == 4096 and host["AutoRemove"] is True and host["Init"] is True
    assert host["Devices"] == [
        {"PathOnHost": "/dev/null", "PathInContainer": "/dev/orchestrator-null", "CgroupPermissions": "rw"}
    ]


def test_docker_asks_for_cdi_devices_with_gpu_devices_cdi(
    docker: str, recorder: tuple[_Recorder, Path], tmp_path: Path
) -> None:
    """runtime.gpu_devices cdi: one --device=nvidia.com/gpu=N per GPU in place of --gpus, which
    the client hands to the daemon by name for its CDI to resolve (docker 25 on; an older client
    refuses the name as a device path)."""
    seen, socket = recorder
    prof = _profile(tmp_path, CASES["everything"], "docker", gpu_devices="cdi", pull="missing")
    words = _as_systemd_runs_it(launch.build(prof), prof, tmp_path)
    wanted = [f"nvidia.com/gpu={gpu}" for gpu in range(4, 8)]
    assert [w for w in words if "gpu" in w.partition("=")[0]] == []  # no --gpus
    assert [w.partition("=")[2] for w in words if w.startswith("--device=nvidia.com/")] == wanted
    env = _docker_env(tmp_path, socket)
    result = subprocess.run([docker, *words[1:]], capture_output=True, text=True, env=env, timeout=60)
    said = subprocess.run([docker, "version", "--format={{.Client.Version}}"], capture_output=True, text=True)
    if int(said.stdout.split(".")[0]) < 25:  # Debian bookworm's 20.10: preflight's create says so
        assert result.stderr.startswith("docker: nvidia.com/gpu=4 is not an absolute path."), result.stderr
        return
    assert "recorded by the test" in result.stderr, result.stderr
    (_, _path, body), *_ = [r for r in seen.requests if r[0] == "POST"]
    host = body["HostConfig"]
    by_name = [d["PathOnHost"] for d in host["Devices"] or [] if d["PathOnHost"].startswith("nvidia.com/")]
    requested = [i for r in host.get("DeviceRequests") or [] if r["Driver"] == "cdi" for i in r["DeviceIDs"]]
    assert by_name + requested == wanted, host
    assert not [r for r in host.get("DeviceRequests") or [] if r["Driver"] != "cdi"], host


# --- podman ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Podman:
    """The podman CLI over a storage root of its own (nothing of this machine's is read or kept)."""

    binary: str
    root: Path

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        options = [
            f"--root={self.root / 'storage'}",
            f"--runroot={self.root / 'run'}",
            f"--tmpdir={self.root / 'tmp'}",
            "--storage-driver=vfs",
            "--cgroup-manager=cgroupfs",
            "--events-backend=file",
        ]
        return subprocess.run([self.binary, *options, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("no podman CLI here: apt-get install podman (scripts/setup.sh --test does)")
    # Short: podman refuses a runroot over 50 characters (an xdist worker's tmp_path is longer).
    engine = Podman(binary, Path(tempfile.mkdtemp(prefix="podman-")))
    info = engine("info", "--format", "{{.Version.Version}}")
    if info.returncode != 0:
        pytest.skip(f"podman cannot use a storage root of its own here: {info.stderr.strip()[:200]}")
    try:
        yield engine
    finally:
        engine("rm", "--all", "--force")
        shutil.rmtree(engine.root, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_podman_parses_every_rendered_run(case: str, podman: Podman, tmp_path: Path) -> None:
    """An image that does not exist, never pulled: every flag parses, and podman stops at the image."""
    prof = _profile(tmp_path, CASES[case], "podman", image=ABSENT, pull="never")
    p = launch.build(prof)
    words = _as_systemd_runs_it(p, prof, tmp_path)
    result = podman(*words[1:])
    assert (result.returncode, result.stderr.strip()) == (125, f"Error: {ABSENT}: image not known"), words
    for command in _unit_commands(p):  # stop --ignore, rm --ignore: nothing to stop, and no error
        result = podman(*command[1:])
        assert result.returncode == 0, (command, result.stderr)


def test_podman_creates_the_container_the_unit_means(podman: Podman, tmp_path: Path) -> None:
    """The same command as `podman create`, over an empty root file system in place of the image
    (`--rootfs DIR` where the image was: importing one would write podman's blob cache under
    /var/lib/containers, outside the test's storage root): what podman understood."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    doc = CASES["everything"]
    host = {name: tmp_path / name for name in ("model", "drafter", "hf", "site")}
    for path in host.values():
        path.mkdir()
    mounts = [
        {"source": str(host["hf"]), "target": "/root/.cache/huggingface", "read_only": False},
        {"source": str(host["site"]), "target": "/etc/site"},
    ]
    moved = {
        **doc,
        "server": {**doc["server"], "model_path": str(host["model"])},
        "speculative": {"draft_model_path": str(host["drafter"])},
        "runtime": {**doc["runtime"], "mounts": mounts},
        # /var/cache/orchestrator/... is systemd's to make (CacheDirectory=), at start: not here
        "service": {**doc.get("service", {}), "compile_cache": False},
    }
    prof = _profile(tmp_path, moved, "podman", pull="never")
    p = launch.build(prof)
    key_file = tmp_path / "config.yaml"
    key_file.write_text(secrets.secret_config(prof))
    words = [
        w.replace(f"--volume={p.secret_path}:", f"--volume={key_file}:")
        for w in _as_systemd_runs_it(p, prof, tmp_path)
        if w != "-d"  # `run -d` is `create` and `start`: only the first here
    ]
    image = words.index(IMAGE)
    created = podman("create", *words[2:image], "--rootfs", str(rootfs), *words[image + 1 :])
    assert created.returncode == 0, created.stderr
    shown = json.loads(podman("container", "inspect", NAME).stdout)[0]
    config, hostconfig = shown["Config"], shown["HostConfig"]
    assert config["Cmd"] == [
        w.replace("${CREDENTIALS_DIRECTORY}", f"/run/credentials/{UNIT}") for w in p.argv
    ]
    assert {f"{k}={v}" for k, v in p.environment.items()} | {'HF_TOKEN=hf_a"b $c'} <= set(config["Env"])
    assert config["Labels"] == {"orchestrator.unit": UNIT} and config["sdNotifyMode"] == "conmon"
    assert hostconfig["NetworkMode"] == "host" and hostconfig["ShmSize"] == 32 * 2**30
    assert hostconfig["LogConfig"]["Type"] == "passthrough" and hostconfig["AutoRemove"] is True
    assert {(m["Source"], m["Destination"], m["RW"]) for m in shown["Mounts"]} == {
        (str(host["model"]), str(host["model"]), False),
        (str(host["drafter"]), str(host["drafter"]), False),
        (str(host["hf"]), "/root/.cache/huggingface", True),
        (str(host["site"]), "/etc/site", False),
        (str(key_file), f"/run/credentials/{UNIT}/sglang-config.yaml", False),
    }
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in hostconfig["Ulimits"]}
    assert limits["RLIMIT_MEMLOCK"] == (64 * 2**30, 64 * 2**30) and limits["RLIMIT_NOFILE"] == (65536, 65536)
    assert limits["RLIMIT_CORE"] == (0, 0) and limits["RLIMIT_STACK"] == (67108864, -1)
    assert set(hostconfig["CapAdd"]) == {"CAP_IPC_LOCK", "CAP_SYS_NICE"}
    assert hostconfig["SecurityOpt"] == ["no-new-privileges", "label=disable"]
    assert hostconfig["PidsLimit"] == 4096
    for command in _unit_commands(p):  # ExecStop= and ExecStopPost= on a container that exists
        result = podman(*command[1:])
        assert result.returncode == 0, (command, result.stderr)
    assert podman("container", "exists", NAME).returncode == 1  # removed


# --- docs/containers.md's profile ------------------------------------------------------------------------


def readme_profile() -> str:
    """The profile docs/containers.md shows first, for SGLang's own image."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "containers.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block.startswith("# profiles/cg_5tok_docker.yml\n"), block[:80]
    return block


def test_the_readmes_profile_for_lmsysorg_sglang_validates_and_docker_reads_its_unit(
    docker: str, tmp_path: Path
) -> None:
    path = tmp_path / "cg_5tok_docker.yml"
    path.write_text(readme_profile())
    prof = profile_mod.load(str(path))
    assert (prof.runtime.kind, str(prof.runtime.image)) == ("docker", "docker.io/lmsysorg/sglang:v0.5.9")
    assert profile_mod.notes(prof) == [
        "runtime.image docker.io/lmsysorg/sglang:v0.5.9 is pinned by tag only: a tag can be moved, so "
        "hosts may run different images; add the digest (IMAGE:TAG@sha256:...) to pin it"
    ]
    p = launch.build(prof)
    assert '"--gpus=\\"device=4,5,6,7\\""' in p.unit and "LimitMEMLOCK=infinity" in p.unit
    env = _docker_env(tmp_path, tmp_path / "no-daemon.sock")
    for words in (_as_systemd_runs_it(p, prof, tmp_path), *_unit_commands(p)):
        result = subprocess.run([docker, *words[1:]], capture_output=True, text=True, env=env, timeout=60)
        said = result.stderr.strip()
        assert result.returncode != 0 and "Cannot connect to the Docker daemon" in said, (words, said)

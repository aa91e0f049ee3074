"""roles/sglang_adopt and the takeover (issue 42): SGLang servers started by hand, found, taken over
and started again. Real processes on this machine: a stand-in `python3 -m sglang.launch_server`
(it forks a scheduler, as SGLang does, and answers /health), installed in a virtual environment as
SGLang is, started with nohup or under `sh -c`; /proc is read as it is. nvidia-smi is a script
listing the scheduler on GPU 1."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import adopt
from hostfakes import NOT_FOUND, compute_apps, load_module, query_gpu, store_unit, systemctl_show

from orchestrator.hosts import runner
from orchestrator.hosts.module_results import parse
from orchestrator.profile import sglang_flags, sglang_rules
from tests.unit.test_standin_sglang import free_port

#: A stand-in for SGLang's server: a forked child (its scheduler), then /health on --host:--port.
SERVER = """\
import argparse, http.server, os, time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--host", default="127.0.0.1")
args, _rest = parser.parse_known_args()
if os.fork() == 0:
    while True:
        time.sleep(60)
print("server started", flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer((args.host, args.port), Health).serve_forever()
"""
NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) cat "$(dirname "$0")/gpus.csv" ;;
  *) cat "$(dirname "$0")/apps.csv" ;;
esac
"""
API_KEY = "sk-hand-0123456789"
#: The user a server runs as in the tests of another user's server (nobody).
NOBODY = 65534


@dataclass
class Hand:
    """A server started by hand: its PID, port, log, working directory and environment."""

    pid: int
    port: int
    log: Path
    cwd: Path
    env: dict[str, str]
    shell: subprocess.Popen | None = None
    argv: list[bytes] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        ticks = adopt.start_ticks(self.pid)
        assert ticks is not None
        return ticks

    @property
    def scheduler(self) -> int:
        """The child it forked."""
        for name in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
                if name.isdigit() and int(fields[1]) == self.pid:
                    return int(name)
        raise AssertionError(f"PID {self.pid} has no child")


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def ppid(pid: int) -> int:
    return adopt.walk()[pid]["ppid"]


def running(pid: int) -> bool:
    return adopt.start_ticks(pid) is not None


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def sessions() -> Iterator[list[int]]:
    """Session (and process group) IDs whose processes are all killed after the test."""
    made: list[int] = []
    yield made
    for sid in made:
        if sid != os.getsid(0):  # never this test's own session
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)


@pytest.fixture
def gpus(tmp_path: Path) -> Callable[..., str]:
    """nvidia-smi as a script: two GPUs, and the processes given on them."""
    folder = tmp_path / "smi"
    folder.mkdir()
    (folder / "gpus.csv").write_text(query_gpu(2))
    (folder / "apps.csv").write_text("")
    smi = folder / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)

    def listing(*rows: tuple[int, str, int, int]) -> str:
        (folder / "apps.csv").write_text(compute_apps(*rows))
        return str(smi)

    return listing


def make_venv(python: str, folder: Path) -> Path:
    """A virtual environment of `python` in `folder`, the stand-in in its site-packages (with its
    dist-info, so importlib.metadata names its version): SGLang as pip installs it."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(folder)], check=True)
    [site] = folder.glob("lib/python3*/site-packages")
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(SERVER)
    (site / "sglang-0.5.9.dist-info").mkdir()
    (site / "sglang-0.5.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n"
    )
    return folder


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(sys.executable, tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="module")
def open_venv() -> Iterator[Path]:
    """A virtual environment, and a folder beside it, that another user may read: made from
    /usr/bin/python3 (this test's own python may lie below root's 0700 home)."""
    if os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs root and /usr/bin/python3")
    folder = Path(tempfile.mkdtemp(prefix="adopt-"))
    try:
        folder.chmod(0o755)
        yield make_venv("/usr/bin/python3", folder / "venv")
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def start(tmp_path: Path, sessions: list[int], venv: Path) -> Callable[..., Hand]:
    """start(how, *args, env=...) -> Hand: the stand-in started as a team starts it. `nohup`:
    `sh -c 'nohup python3 -m sglang.launch_server ... > LOG 2>&1 &'` (the shell exits; init is its
    parent); `shell`: under `sh -c '... & wait'` (the shell waits); `direct`: this process's child,
    with argv words as bytes."""
    count = iter(range(100))

    def run(how: str, *args: str | bytes, env: dict[str, str] | None = None) -> Hand:
        n, port = next(count), free_port()
        cwd = tmp_path / f"cwd{n}"
        cwd.mkdir()
        log = tmp_path / f"server{n}.log"
        base = {
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
            "NCCL_ALGO": "Ring",
            "HF_TOKEN": "hf_abc",
            "PWD": str(cwd),
            "SHLVL": "1",
        }
        env = {**base, **(env or {})}
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/x", "--port", str(port), *args]
        shell = None
        if how == "direct":
            with log.open("ab") as out:
                pid = subprocess.Popen(
                    argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                ).pid
        else:
            words = " ".join(shlex.quote(os.fsdecode(a)) for a in argv)
            script = {
                "nohup": f"nohup {words} > {log} 2>&1 & echo $!",
                "shell": f"{words} > {log} 2>&1 & echo $!; wait",
            }[how]
            shell = subprocess.Popen(
                ["sh", "-c", os.fsencode(script)],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert shell.stdout is not None
            pid = int(shell.stdout.readline())
            if how == "nohup":
                shell.wait()
                shell = None
        sessions.append(os.getsid(pid))
        wait_until(lambda: healthy(port), f"the server on port {port} answers /health")
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        return Hand(pid, port, log, cwd, env, shell, raw)

    return run


@pytest.fixture
def adopt_module():
    return load_module("sglang_adopt")


def find(run_module, module, paths, smi: str, **args) -> dict:
    failed, result = run_module(module, {"paths": paths, "nvidia_smi": smi, **args})
    assert not failed, result.get("msg")
    return result


def by_pid(result: dict) -> dict[int, dict]:
    return {s["pid"]: s for s in result["servers"]}


# --- find -----------------------------------------------------------------------------------------


def test_find_by_port_by_pid_and_every_server(adopt_module, start, gpus, paths, run_module, cgroups):
    nohup, shell = start("nohup", "--api-key", API_KEY), start("shell", "--tp", "2")
    cgroups.update({p: "session-3.scope" for p in (nohup.pid, shell.pid)})  # an ssh login's
    smi = gpus((nohup.scheduler, "python3", 40000, 1))

    result = find(run_module, adopt_module, paths, smi, port=nohup.port)
    [server] = result["servers"]
    assert (result["sglang_version"], result["problems"], result["units"]) == ("0.5.9", [], [])
    assert (server["cpus_allowed"], server["mems_allowed"]) == ("", "")  # every CPU and node
    assert server["argv"] == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/x", "--port", str(nohup.port),
        "--api-key", "<secret>",
    ]  # fmt: skip
    assert {k: server["env"][k] for k in ("NCCL_ALGO", "PWD", "SHLVL")} == {
        "NCCL_ALGO": "Ring",
        "PWD": str(nohup.cwd),
        "SHLVL": "1",
    }
    assert server["python"] == shutil.which("python3", path=nohup.env["PATH"])
    assert (server["pid"], server["ppid"], server["start_ticks"]) == (nohup.pid, ppid(nohup.pid), nohup.ticks)
    assert (server["uid"], server["user"], server["cwd"]) == (os.getuid(), "root", str(nohup.cwd))
    assert abs(server["started"] - time.time()) < 60
    assert (server["entry"], server["ports"], server["gpus"]) == ("module", [nohup.port], [1])
    assert server["launcher"] == {"kind": "nohup", "detail": f"nohup, output to {nohup.log}"}
    assert (server["log"], server["log_err"], server["unit"], server["ours"]) == (
        str(nohup.log),
        str(nohup.log),
        "",
        False,
    )
    assert server["container"] == {}

    [server] = find(run_module, adopt_module, paths, smi, pid=shell.pid)["servers"]
    assert server["launcher"] == {"kind": "shell", "detail": f"sh PID {shell.shell.pid}"}  # type: ignore[union-attr]
    assert server["argv"][-2:] == ["--tp", "2"] and server["gpus"] == []

    every = by_pid(find(run_module, adopt_module, paths, smi))
    assert {nohup.pid, shell.pid} <= set(every)
    assert not {nohup.scheduler, shell.scheduler} & set(every)  # a forked scheduler is no server


def test_a_server_in_an_orchestrator_unit_is_ours(adopt_module, start, gpus, paths, run_module, cgroups):
    server = start("nohup")
    store_unit(paths, "sglang.service", profile="cg_5tok", port=server.port, gpus=[0])
    cgroups[server.pid] = "sglang.service"
    said = find(run_module, adopt_module, paths, gpus(), pid=server.pid)
    assert said["units"] == ["sglang.service"]  # adopt refuses a --unit-name among them
    [found] = said["servers"]
    assert (found["unit"], found["ours"], found["launcher"]) == (
        "sglang.service",
        True,
        {"kind": "unit", "detail": "sglang.service"},
    )


def test_secrets_never_leave_the_host(adopt_module, start, gpus, paths, run_module):
    server = start(
        "nohup",
        "--api-key", API_KEY, "--admin-api-k=sk-admin-42", "--ssl-keyfile", "/etc/k.pem",
        "--ssl-keyfile-password", "pw-three",
        env={"MY_API_KEY": "k-four", "db_password": "pw-five", "OPENAI_APIKEY": "k-six",
             "SECRET_KEY_BASE": "k-seven", "hf_token_v2": "k-eight"},
    )  # fmt: skip
    result = find(run_module, adopt_module, paths, gpus(), pid=server.pid)
    [found] = result["servers"]
    assert found["argv"][7:] == [
        "--api-key", "<secret>", "--admin-api-k=<secret>", "--ssl-keyfile", "/etc/k.pem",
        "--ssl-keyfile-password", "<secret>",
    ]  # fmt: skip
    names = ("HF_TOKEN", "MY_API_KEY", "db_password", "OPENAI_APIKEY", "SECRET_KEY_BASE", "hf_token_v2")
    assert {k: found["env"][k] for k in names} == dict.fromkeys(names, "<secret>")
    said = json.dumps(result)
    for secret in (API_KEY, "sk-admin-42", "pw-three", "hf_abc", "k-four", "pw-five", "k-six", "k-seven"):
        assert secret not in said
    sha = {
        name: adopt.digest(value.encode()) for name, value in (("--api-key", API_KEY), ("HF_TOKEN", "hf_abc"))
    }
    assert found["secrets"] == {
        **sha,
        "--admin-api-key": adopt.digest(b"sk-admin-42"),
        "--ssl-keyfile-password": adopt.digest(b"pw-three"),
        "MY_API_KEY": adopt.digest(b"k-four"),
        "db_password": adopt.digest(b"pw-five"),
        "OPENAI_APIKEY": adopt.digest(b"k-six"),
        "SECRET_KEY_BASE": adopt.digest(b"k-seven"),
        "hf_token_v2": adopt.digest(b"k-eight"),
    }


def test_the_version_probe_runs_nothing_the_server_was_given(
    adopt_module, start, gpus, paths, run_module, tmp_path
):
    """Any user may start a process that looks like a server, with a PYTHONPATH whose sitecustomize
    would run as root when the version is read (before: it did)."""
    planted, ran = tmp_path / "planted", tmp_path / "ran"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text(
        f"import os\nwith open({str(ran)!r}, 'a') as out:\n    out.write(f'{{os.getpid()}}\\n')\n"
    )
    server = start("nohup", env={"PYTHONPATH": str(planted)})
    assert ran.read_text().split() == [str(server.pid)]  # the server's own start imported it
    said = find(run_module, adopt_module, paths, gpus(), pid=server.pid)
    assert (said["sglang_version"], said["problems"]) == ("0.5.9", [])
    assert ran.read_text().split() == [str(server.pid)]  # the probe did not


def test_the_version_probe_runs_as_the_servers_user(
    adopt_module, open_venv, gpus, paths, run_module, sessions
):
    """The server's python runs as its user and groups, in /, with PATH alone (before: as root, in
    its directory, with its environment). A .pth file of its site-packages says who runs it."""
    [site] = open_venv.glob("lib/python3*/site-packages")
    (site / "whoami.pth").write_text(
        "import json, os; print(json.dumps([os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), "
        "sorted(set(os.environ) - {'LC_CTYPE'})]), flush=True)\n"  # LC_CTYPE: Python's own locale coercion
    )
    cwd, port = open_venv.parent / "cwd", free_port()
    cwd.mkdir(exist_ok=True)
    argv = [
        str(open_venv / "bin" / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/x",
        "--port",
        str(port),
    ]
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": "/x", "PYTHONPATH": "/nowhere"}
    try:
        pid = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, user=NOBODY, group=NOBODY, extra_groups=[100],
            start_new_session=True,
        ).pid  # fmt: skip
        sessions.append(pid)
        wait_until(lambda: healthy(port), f"the server on port {port} answers /health")
        said = find(run_module, adopt_module, paths, gpus(), pid=pid)
    finally:
        (site / "whoami.pth").unlink()
    *who, version = said["sglang_version"].splitlines()
    assert version == "0.5.9" and said["problems"] == []
    assert {json.dumps(json.loads(w)) for w in who} == {json.dumps([NOBODY, NOBODY, [100], "/", ["PATH"]])}


def test_a_pid_that_is_not_a_server_or_not_running(adopt_module, start, gpus, paths, run_module):
    """Another program is named by its program alone: its argv may hold a secret (before: in full)."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(100)", "--db-password", "hunter2"]
    )
    server = start("nohup")
    try:
        said = find(run_module, adopt_module, paths, gpus(), pid=sleeper.pid)
        assert (said["servers"], said["problems"]) == (
            [],
            [f"PID {sleeper.pid} is not an SGLang server: {os.path.basename(sys.executable)[:15]}"],
        )
        assert "hunter2" not in json.dumps(said)
        said = find(run_module, adopt_module, paths, gpus(), pid=server.scheduler)
        assert said["problems"] == [
            f"PID {server.scheduler} is a process of the SGLang server PID {server.pid}, not a server"
        ]
    finally:
        sleeper.kill()
        sleeper.wait()
    said = find(run_module, adopt_module, paths, gpus(), pid=sleeper.pid)
    assert said["problems"] == [f"PID {sleeper.pid} is not running"]
    said = find(run_module, adopt_module, paths, gpus(), port=free_port())
    assert said["servers"] == [] and said["problems"][0].endswith(": no SGLang server listens on it")


def test_a_server_pinned_to_cpus_says_which(adopt_module, start, gpus, paths, run_module):
    """taskset or numactl leave no trace but the affinity: find names it."""
    online = sorted(adopt.id_list(Path("/sys/devices/system/cpu/online").read_text()))
    if len(online) < 2:
        pytest.skip("needs two online CPUs")
    server = start("nohup")
    os.sched_setaffinity(server.pid, {online[-1]})
    [found] = find(run_module, adopt_module, paths, gpus(), pid=server.pid)["servers"]
    assert (found["cpus_allowed"], found["mems_allowed"]) == (str(online[-1]), "")


@pytest.mark.parametrize(
    ("allowed", "online", "said"),
    [
        ("0-7", "0-7", ""),
        ("0-255", "0-7", ""),  # the possible CPUs: each online one is allowed
        ("0-3", "0-7", "0-3"),
        ("0,2,4-6", "0-7", "0,2,4-6"),
        ("1", "0-1", "1"),
        ("0", "0", ""),  # one NUMA node
        ("", "0-7", ""),  # not known
        ("0-3", "", ""),
    ],
)
def test_an_affinity_is_named_where_it_leaves_out_an_online_cpu(allowed: str, online: str, said: str) -> None:
    assert adopt.narrowed(allowed, online) == said


def test_a_server_that_exits_while_it_is_read(adopt_module, start, gpus, paths, run_module, monkeypatch):
    server = start("nohup")
    real = adopt.read_bytes

    def exits_first(path: str) -> bytes | None:
        if path == f"/proc/{server.pid}/environ":
            os.killpg(os.getsid(server.pid), signal.SIGKILL)
            wait_until(lambda: not running(server.pid), "the server is gone")
        return real(path)

    monkeypatch.setattr(adopt, "read_bytes", exits_first)
    said = find(run_module, adopt_module, paths, gpus(), pid=server.pid)
    assert (said["servers"], said["problems"]) == ([], [f"PID {server.pid} exited while it was read"])


def test_argv_a_profile_cannot_hold_and_an_environment_of_megabytes(
    adopt_module, start, gpus, paths, run_module
):
    big = {f"BIG_{i}": "x" * 100_000 for i in range(12)}  # 1.2 MB; one variable may be 128 kB at most
    server = start("direct", "--served-model-name", "two\nlines", b"--x=\xff", env=big)
    [found] = (said := find(run_module, adopt_module, paths, gpus(), pid=server.pid))["servers"]
    assert found["argv"][-3:] == ["--served-model-name", "two\nlines", "--x=\\xff"]
    assert said["problems"][0] == f"PID {server.pid}: argv word 9 is not UTF-8: a profile cannot hold it"
    assert [re.sub(r"is \d\.\d MB", "is N MB", p) for p in said["problems"][1:]] == [
        f"PID {server.pid}: its environment is N MB; BIG_{i} (100 kB) is left out" for i in range(12)
    ]
    assert not [name for name in found["env"] if name.startswith("BIG_")]


def test_a_server_in_a_container_is_read_from_its_engine(
    adopt_module, start, gpus, paths, run_module, cgroups, tmp_path, monkeypatch
):
    server = start("nohup")
    cid = "c0ffee" * 10 + "abcd"
    cgroups[server.pid] = f"docker-{cid}.scope"
    row = {
        "Name": "/sglang-hand",
        "Config": {
            "Image": "lmsysorg/sglang:v0.5.9",
            "Entrypoint": ["python3", "-m", "sglang.launch_server"],
            "Cmd": ["--model-path", "/models/m", "--api-key", API_KEY],
            "Env": ["NCCL_ALGO=Tree", "HF_TOKEN=hf_abc"],
            "Labels": {},
        },
    }
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "inspect.json").write_text(json.dumps([row]))
    docker = engines / "docker"
    docker.write_text(
        '#!/bin/sh\n[ -e "$(dirname "$0")/hang" ] && sleep 5\n'
        'case "$1" in inspect) cat "$(dirname "$0")/inspect.json" ;; exec) echo 0.5.9 ;; esac\n'
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{engines}:{os.environ['PATH']}")

    said = find(run_module, adopt_module, paths, gpus(), pid=server.pid)
    [found] = said["servers"]
    assert found["container"] == {
        "engine": "docker",
        "id": cid,
        "name": "sglang-hand",
        "image": "lmsysorg/sglang:v0.5.9",
    }
    assert found["launcher"] == {"kind": "container", "detail": "docker container sglang-hand"}
    assert found["argv"] == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--api-key",
        "<secret>",
    ]
    assert found["env"] == {"NCCL_ALGO": "Tree", "HF_TOKEN": "<secret>"}
    assert (said["sglang_version"], said["problems"]) == ("0.5.9", [])

    (engines / "hang").write_text("")
    said = find(run_module, adopt_module, paths, gpus(), pid=server.pid, engine_timeout_s=0.5)
    assert (
        said["problems"][0]
        == f"docker did not answer in 0.5 s: PID {server.pid} (container c0ffeec0ffee) is read from /proc"
    )
    assert said["servers"][0]["argv"][3:5] == ["--model-path", "/x"]  # /proc's


# --- takeover -----------------------------------------------------------------------------------


@pytest.fixture
def restart():
    return load_module("sglang_restart")


def takeover_args(server: Hand, paths: dict, ticks: int | None = None) -> dict:
    return {
        "pid": server.pid,
        "start_ticks": server.ticks if ticks is None else ticks,
        "unit_name": "sglang.service",
        "paths": paths,
        "gone_timeout_s": 5,
    }


def test_the_takeover_stops_the_tree_and_saves_the_command(restart, start, paths, run_module):
    server = start("nohup", "--api-key", API_KEY)
    scheduler, environ = server.scheduler, Path(f"/proc/{server.pid}/environ").read_bytes()
    failed, result = run_module(restart, {"takeover": takeover_args(server, paths)})
    assert not failed, result.get("msg")
    [step] = result["steps"]
    assert (step["action"], result["changed"], result["failed_step"]) == ("sglang_adopt", True, "")
    said = step["result"]
    assert (said["taken"], said["why"], said["pid"], said["killed"]) == (
        True,
        "",
        server.pid,
        sorted([server.pid, scheduler]),
    )
    assert said["launcher"]["kind"] == "nohup" and said["log"] == str(server.log)
    assert not running(server.pid) and not running(scheduler) and not healthy(server.port)
    # The controller reads the step as sglang_adopt's own event.
    [_begun, ended] = runner.split_steps(runner.TaskEvent("h", "changed", "", "sglang_restart", result))
    assert (ended.action, ended.kind) == ("sglang_adopt", "changed")
    assert parse(ended.action, ended.result, False).taken is True

    saved = Path(paths["state_dir"], "adopted", "sglang.json")
    assert said["record_path"] == str(saved)
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    record = json.loads(saved.read_text())
    assert [base64.b64decode(w) for w in record["argv"]] == server.argv
    assert base64.b64decode(record["environ"]) == environ
    assert base64.b64decode(record["cwd"]) == bytes(server.cwd)
    assert (record["log"], record["log_err"], record["uid"], record["pid"]) == (
        str(server.log),
        str(server.log),
        0,
        server.pid,
    )
    assert API_KEY not in json.dumps(record["command"])


def test_a_takeover_stops_the_sh_c_that_waits_for_the_server(adopt_module, start, paths, run_module):
    server = start("shell")
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths)})
    assert not failed and said["taken"]
    assert server.shell is not None and server.shell.pid in said["killed"]
    assert server.shell.wait(timeout=5) == -signal.SIGTERM  # it would have gone on to its next command
    assert said["launcher"] == {"kind": "shell", "detail": f"sh PID {server.shell.pid}"}


def test_a_pid_reused_or_gone_is_nothing_to_stop(adopt_module, start, paths, run_module):
    server = start("nohup")
    failed, said = run_module(
        adopt_module, {"action": "takeover", **takeover_args(server, paths, server.ticks - 1)}
    )
    assert not failed and (said["taken"], said["changed"], said["killed"]) == (False, False, [])
    assert said["why"] == (
        f"PID {server.pid} is another process now (started at tick {server.ticks}, not {server.ticks - 1}): "
        "nothing to stop"
    )
    assert healthy(server.port) and not Path(paths["state_dir"], "adopted").exists()
    ticks = server.ticks
    os.killpg(os.getsid(server.pid), signal.SIGKILL)
    wait_until(lambda: not running(server.pid), "the server is gone")
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths, ticks)})
    assert not failed and not said["taken"] and said["why"] == f"PID {server.pid} is gone: nothing to stop"


def test_check_mode_stops_and_saves_nothing(restart, start, paths, run_module):
    server = start("nohup")
    failed, result = run_module(restart, {"takeover": takeover_args(server, paths)}, check_mode=True)
    assert not failed
    said = result["steps"][0]["result"]
    assert said["taken"] and said["killed"] == sorted([server.pid, server.scheduler])
    assert healthy(server.port) and not Path(said["record_path"]).exists()


# --- relaunch -------------------------------------------------------------------------------------


def test_relaunch_starts_the_exact_command_again(adopt_module, start, paths, run_module, sessions):
    server = start("nohup", "--served-model-name", "two\nlines", b"--x=\xff", "--api-key", API_KEY)
    cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{server.pid}/environ").read_bytes()
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths)})
    assert not failed and said["taken"]
    args = {
        "action": "relaunch",
        "unit_name": "sglang.service",
        "paths": paths,
        "health_url": f"http://127.0.0.1:{server.port}/health",
        "health_timeout_s": 15,
    }
    failed, said = run_module(adopt_module, args)
    assert not failed, said.get("msg")
    pid = said["pid"]
    assert os.getsid(pid) != os.getsid(0)  # a session of its own
    sessions.append(os.getsid(pid))
    assert said["healthy"] and healthy(server.port) and said["log"] == str(server.log)
    assert said["argv"][-2:] == ["--api-key", "<secret>"] and API_KEY not in json.dumps(said)
    assert Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline
    assert Path(f"/proc/{pid}/environ").read_bytes() == environ
    assert os.readlink(f"/proc/{pid}/cwd") == str(server.cwd)
    assert adopt.walk()[pid]["ppid"] != os.getpid()
    assert server.log.read_text().count("server started") == 2  # appended to the old log
    status = adopt.status_fields(pid)
    assert int(status["SigIgn"], 16) & 1  # as nohup left it: SIGHUP ignored


def test_relaunch_starts_nothing_while_the_server_taken_over_still_runs(
    adopt_module, start, paths, run_module
):
    """A restart cut off before its takeover step stopped anything: the server runs on, and the
    relaunch says so instead of starting a second copy (or failing on a command never saved)."""
    server = start("nohup")
    ticks = adopt.start_ticks(server.pid)
    args = {"action": "relaunch", "unit_name": "sglang.service", "paths": paths}
    failed, said = run_module(adopt_module, {**args, "pid": server.pid, "start_ticks": ticks})
    assert not failed and said["healthy"] and said["pid"] == server.pid and not said["changed"]
    assert healthy(server.port) and adopt.start_ticks(server.pid) == ticks  # the same process
    assert not Path(adopt.adopted_path(paths, "sglang.service")).exists()


def test_relaunch_refuses_a_command_saved_for_another_process(adopt_module, start, paths, run_module):
    server = start("nohup")
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths)})
    assert not failed and said["taken"]
    args = {"action": "relaunch", "unit_name": "sglang.service", "paths": paths, "pid": 1, "start_ticks": 5}
    failed, said = run_module(adopt_module, args)
    assert failed and said["msg"] == (
        f"the command saved for sglang.service is of PID {server.pid}, not of PID 1 the deploy took "
        "over: it is not started"
    )


def test_relaunch_without_a_saved_command_fails_naming_it(adopt_module, paths, run_module):
    failed, said = run_module(
        adopt_module, {"action": "relaunch", "unit_name": "sglang.service", "paths": paths}
    )
    saved = Path(paths["state_dir"], "adopted", "sglang.json")
    assert (
        failed and said["msg"] == f"no hand-started command was saved for sglang.service ({saved} is missing)"
    )


def _nobody_server(venv: Path, log: Path, sessions: list[int]) -> Hand:
    """The stand-in run as nobody, its output in `log`, opened by this (root) process as a root
    shell's redirect does: `sudo -u nobody nohup python3 -m sglang.launch_server ... > LOG`."""
    cwd, port = venv.parent / "cwd", free_port()
    cwd.mkdir(exist_ok=True)
    argv = [
        str(venv / "bin" / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/x",
        "--port",
        str(port),
    ]
    env = {"PATH": "/usr/bin:/bin"}
    with log.open("ab") as out:
        pid = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, user=NOBODY, group=NOBODY,
            extra_groups=[], start_new_session=True,
        ).pid  # fmt: skip
    sessions.append(pid)
    wait_until(lambda: healthy(port), f"the server on port {port} answers /health")
    return Hand(pid, port, log, cwd, env)


def relaunch_args(server: Hand, paths: dict) -> dict:
    return {
        "action": "relaunch",
        "unit_name": "sglang.service",
        "paths": paths,
        "health_url": f"http://127.0.0.1:{server.port}/health",
        "health_timeout_s": 15,
    }


def test_relaunch_of_another_users_server_writes_the_log_root_made(
    adopt_module, open_venv, paths, run_module, sessions
):
    """The log is root's 0644 (a root shell's redirect): opened before the drop to nobody (before:
    after it, so the rollback failed and left the server stopped)."""
    log = open_venv.parent / "root-made.log"
    server = _nobody_server(open_venv, log, sessions)
    assert (log.stat().st_uid, stat.S_IMODE(log.stat().st_mode)) == (0, 0o644)
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths)})
    assert not failed and said["taken"] and not running(server.pid)
    failed, said = run_module(adopt_module, relaunch_args(server, paths))
    assert not failed, said.get("msg")
    pid = said["pid"]
    sessions.append(os.getsid(pid))
    assert said["healthy"] and adopt.status_fields(pid)["Uid"].split() == [str(NOBODY)] * 4
    assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2") == str(log)
    assert os.readlink(f"/proc/{pid}/cwd") == str(server.cwd)
    assert log.read_text().count("server started") == 2


def test_relaunch_never_writes_as_root_through_a_log_swapped_for_a_link(
    adopt_module, open_venv, paths, run_module, sessions
):
    """Root opens only the very file the server wrote: its user, who may swap the path for a link
    after the takeover, never gets root to append to another file."""
    log = open_venv.parent / "swapped.log"
    server = _nobody_server(open_venv, log, sessions)
    failed, said = run_module(adopt_module, {"action": "takeover", **takeover_args(server, paths)})
    assert not failed and said["taken"]
    target = open_venv.parent / "root-only"
    target.write_text("root's\n")
    target.chmod(0o600)
    log.unlink()
    log.symlink_to(target)
    failed, said = run_module(adopt_module, relaunch_args(server, paths))
    assert failed and "PermissionError" in said["msg"]  # opened as nobody, who may not
    assert target.read_text() == "root's\n"


# --- preflight, the probe and status --------------------------------------------------------------


def test_preflight_leaves_the_port_and_gpus_of_the_server_taken_over(
    start, paths, run_module, host, tmp_path
):
    server = start("nohup")
    preflight = load_module("sglang_preflight")
    python = tmp_path / "python"
    python.write_text("")
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    host.answers["python"] = lambda argv: (0, "0.5.9\n", "") if argv[1] == "-c" else (0, "--model-path\n", "")
    host.answers["systemctl"] = [NOT_FOUND]
    host.smi = [(query_gpu(2), compute_apps((server.scheduler, "python3", 40000, 1)))]
    checks = {
        "python": str(python),
        "sglang_version": "0.5.9",
        "model_path": str(tmp_path / "model"),
        "gpus": [0, 1],
        "port": server.port,
        "log_dir": str(tmp_path),
        "min_free_mib": 1,
    }
    args = {"unit_name": "sglang.service", "paths": paths}
    failed, said = run_module(preflight, {**args, "checks": checks})
    assert failed and len(said["problems"]) == 2  # without the takeover: its GPU and its port
    note = (
        f"port {server.port} and GPU 1 are held by PID {server.pid}, the hand-started server this deploy "
        "takes over: it is stopped first"
    )
    for ticks in (0, server.ticks):  # 0: its start not known, the PID alone says
        taken = {"takeover_pid": server.pid, "takeover_start_ticks": ticks}
        failed, said = run_module(preflight, {**args, "checks": {**checks, **taken}})
        assert not failed and (said["problems"], said["notes"]) == ([], [note])
    # The PID started at another time: another process's now, its port and GPU no excuse (before: excused).
    taken = {"takeover_pid": server.pid, "takeover_start_ticks": server.ticks - 1}
    failed, said = run_module(preflight, {**args, "checks": {**checks, **taken}})
    assert failed and len(said["problems"]) == 2 and said["notes"] == []


def test_the_probe_restarts_while_the_server_to_take_over_runs(start, paths, run_module, host):
    server = start("nohup")
    probe = load_module("sglang_probe")
    unit = "# Managed by orchestrator: x\n[Unit]\n"
    Path(paths["unit_dir"], "sglang.service").write_text(unit)
    host.answers["systemctl"] = [systemctl_show(LoadState="loaded", ActiveState="active", MainPID="7")]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": adopt_digest(unit)}
    failed, said = run_module(probe, args)
    assert not failed and not said["restart_needed"]
    takeover = {"pid": server.pid, "start_ticks": server.ticks}
    failed, said = run_module(probe, {**args, "takeover": takeover})
    assert said["restart_needed"] and said["reasons"] == [f"PID {server.pid}, started by hand, is taken over"]


def adopt_digest(unit: str) -> str:
    from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
        unit_digest,
    )

    return unit_digest(unit.encode())


def test_status_lists_the_servers_no_unit_runs(start, paths, run_module, cgroups):
    hand, ours = start("nohup", "--api-key", API_KEY), start("nohup")
    store_unit(paths, "sglang.service", profile="cg_5tok", port=ours.port, gpus=[0])
    cgroups[ours.pid] = "sglang.service"
    failed, said = run_module(load_module("sglang_units_info"), {"paths": paths})
    assert not failed and said["units"] == ["sglang.service"]
    foreign = {s["pid"]: s for s in said["foreign"]}
    assert ours.pid not in foreign
    assert foreign[hand.pid] == {
        "pid": hand.pid,
        "user": "root",
        "started": foreign[hand.pid]["started"],
        "ports": [hand.port],
        "launcher": {"kind": "nohup", "detail": f"nohup, output to {hand.log}"},
        "argv": [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/x",
            "--port",
            str(hand.port),
            "--api-key",
            "<secret>",
        ],
        "log": str(hand.log),
    }


# --- what counts as an SGLang server, and as a secret flag -----------------------------------------


@pytest.mark.parametrize(
    ("argv", "entry"),
    [
        ("python3 -m sglang.launch_server --port 1", "module"),
        ("/venv/bin/python -u -X dev -W error -m sglang.launch_server", "module"),
        ("python3 -Bm sglang.launch_server", "module"),
        ("sglang serve --model-path m", "serve"),
        ("/venv/bin/python3 /venv/bin/sglang serve --model-path m", "serve"),
        ("python3 -c from multiprocessing.spawn import spawn_main -m sglang.launch_server", ""),
        ("python3 -m sglang.launch_router", ""),
        ("python3 launch_server.py -m sglang.launch_server", ""),
        ("sglang version", ""),
    ],
)
def test_what_runs_an_sglang_server(argv: str, entry: str) -> None:
    assert adopt.sglang_entry([w.encode() for w in argv.split()]) == entry


@pytest.mark.parametrize(
    ("word", "flag"),
    [
        ("--api-key", "--api-key"),
        ("--api-k", "--api-key"),
        ("--api-key=v", "--api-key"),
        ("--admin-api", "--admin-api-key"),
        ("--ssl-keyfile-password", "--ssl-keyfile-password"),
        ("--ssl-keyfile-p", "--ssl-keyfile-password"),
        ("--ssl-keyfile", ""),  # a flag of its own: argparse takes the exact one
        ("--port", ""),
        ("-a", ""),
    ],
)
def test_which_words_spell_a_secret_flag(word: str, flag: str) -> None:
    assert adopt.secret_flag(word) == flag


# --- one secret rule on both sides --------------------------------------------------------------


def test_the_host_calls_secret_what_the_control_machine_does() -> None:
    """Before, the host redacted HF_TOKEN and *_KEY, *_TOKEN, *_SECRET, *PASSWORD* only: OPENAI_APIKEY
    or SECRET_KEY_BASE reached the control machine in clear."""
    assert adopt.SECRET_NAME_PARTS == sglang_rules.SECRET_NAME_PARTS
    names = [
        "OPENAI_APIKEY",
        "SECRET_KEY_BASE",
        "hf_token",
        "Db_Password",
        "MY_API_KEY",
        "KEYRING",
        "NCCL_ALGO",
    ]
    assert {n: adopt.secret_name(n) for n in names} == {n: sglang_rules.looks_secret(n) for n in names}


@pytest.mark.parametrize("version", sglang_flags.SHIPPED)
def test_every_secret_flag_of_the_help_is_redacted(version: str) -> None:
    """The host's secret flags hold the control machine's, and every option of the shipped help
    named like a key, password, secret or credential (the `token` options count tokens) but
    --ssl-keyfile, a path."""
    assert set(sglang_flags.SECRET_FLAGS) <= set(adopt.SECRET_FLAGS)
    names = {n for o in sglang_flags.flag_table(version).all_options for n in o.names}
    secretish = {n for n in names if any(w in n for w in ("key", "password", "secret", "credential"))}
    assert secretish - set(adopt.PLAIN_FLAGS) <= set(adopt.SECRET_FLAGS), secretish


class _Systemctl:
    """`systemctl show UNIT --property=MainPID --value` answering `main`."""

    def __init__(self, main: int) -> None:
        self.main = main

    def get_bin_path(self, name: str) -> str:
        return "/bin/systemctl"

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        return 0, f"{self.main}\n", ""


def test_a_server_is_a_units_only_when_that_units_main_process_is_it() -> None:
    """nohup over ssh to a host without logind leaves the server in ssh.service's cgroup, and
    cron's @reboot leaves it in cron.service's: sshd and cron run above it, but no unit runs it.
    A unit runs it when its main process is the server, or the `sh -c` that only waits for it."""

    def proc(ppid: int, comm: str, *argv: bytes) -> dict:
        return {"ppid": ppid, "comm": comm, "argv": list(argv) or [comm.encode()]}

    table = {
        10: proc(1, "sshd"),
        20: proc(10, "python3", b"python3", b"-m", b"sglang.launch_server"),
        30: proc(1, "python3", b"python3", b"-m", b"sglang.launch_server"),
        40: proc(1, "sh", b"/bin/sh", b"-c", b"python3 -m sglang.launch_server"),
        41: proc(40, "python3", b"python3", b"-m", b"sglang.launch_server"),
    }
    ssh = "0::/system.slice/ssh.service\n"
    assert adopt.owning_unit(_Systemctl(10), 20, table, ssh) == ""  # sshd above it: no unit's
    assert adopt.owning_unit(_Systemctl(10), 30, table, ssh) == ""  # left behind by it
    team = "0::/system.slice/team-sglang.service\n"
    assert adopt.owning_unit(_Systemctl(30), 30, table, team) == "team-sglang.service"
    assert adopt.owning_unit(_Systemctl(40), 41, table, team) == "team-sglang.service"  # ExecStart=sh -c
    assert adopt.owning_unit(_Systemctl(0), 30, table, team) == ""
    session = "0::/user.slice/user-0.slice/session-3.scope\n"
    assert adopt.owning_unit(_Systemctl(10), 30, table, session) == ""


class _Show:
    """`systemctl show A B --property=Id,UnitFileState,ActiveState` as systemd answers it."""

    def get_bin_path(self, name: str) -> str:
        return "/bin/systemctl"

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        return (
            0,
            (
                "Id=a.service\nUnitFileState=disabled\nActiveState=inactive\n\n"
                "Id=b.service\nUnitFileState=enabled\nActiveState=inactive\n\n"
                "Id=c.service\nUnitFileState=disabled\nActiveState=active\n"
            ),
            "",
        )


def test_a_unit_orchestrator_stop_stopped_and_disabled_is_not_live() -> None:
    assert adopt.live_units(_Show(), ["a.service", "b.service", "c.service"]) == ["b.service", "c.service"]


@pytest.mark.parametrize("said", [b"P:77\nE:PermissionError: denied\n", b"E:PermissionError: denied\nP:77\n"])
def test_a_failed_exec_is_named_whichever_writer_came_first(said: bytes) -> None:
    """Under load the grandchild's failure can reach the pipe before the child's PID line."""
    assert adopt.spawn_report(said) == (0, "PermissionError: denied")
    assert adopt.spawn_report(b"P:77\n") == (77, "")
    assert adopt.spawn_report(b"") == (0, "the start failed")

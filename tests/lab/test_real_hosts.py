"""#14: two servers on one 8-GPU host, each on its own GPUs, unit and port; a non-root server
with secrets; a restart policy that does not hide a crash from the deploy.

One lab host carries `sglang-a.service` (GPUs 0-3, port 30000) and `sglang-b.service` (GPUs 4-7,
port 30001). Everything a user does to one of them (deploy, restart, a failed deploy and its
rollback, stop, verify, status) is checked against what the other's server shows on the host:
its MainPID, its start time and the memory nvidia-smi reports on its GPUs.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from labutil import ssh

pytestmark = pytest.mark.lab

A = {"unit": "sglang-a.service", "gpus": "0-3", "port": 30000}
B = {"unit": "sglang-b.service", "gpus": "4-7", "port": 30001}


#: Kimi-K2.5 needs all 8 GPUs (576 GB of weights); a 70B model fits on 4.
MODEL = "/data/models/Llama-3.3-70B-Instruct"


def unit_profile(tmp_path: Path, name: str, side: dict, **more: dict) -> str:
    server = {"model_path": MODEL, "served_model_name": "llama-3.3-70b", "tp_size": 4}
    doc = {
        "extends": "baseline",
        "server": {**server, "gpus": side["gpus"], "port": side["port"], **more.pop("server", {})},
        "service": {"unit_name": side["unit"], **more.pop("service", {})},
        **more,
    }
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run(lab, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = ["python3", "-m", "orchestrator", *args]
    if args[0] not in ("render",):
        argv[4:4] = ["-i", str(lab.inventory)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy())


def deploy(lab, host, ref: str, *extra: str, env: dict | None = None) -> tuple[int, dict]:
    done = run(lab, "deploy", "--limit", host.name, "-p", ref, "--json", *extra, env=env)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\n{done.stdout}\n{done.stderr}") from None


def server(host, unit: str) -> dict[str, str]:
    """What systemd says of the unit: state, MainPID and when that process started."""
    out = ssh(host, "systemctl", "show", unit, "--property=ActiveState,MainPID,ExecMainStartTimestamp")
    return dict(line.split("=", 1) for line in out.splitlines())


def gpu_memory(host) -> dict[int, int]:
    """memory.used per GPU index, as nvidia-smi reports it on the host."""
    out = ssh(host, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    return {int(i): int(m) for i, m in (line.split(",") for line in out.splitlines())}


def gpu_pids(host) -> dict[int, set[int]]:
    """The PIDs nvidia-smi lists on each GPU index."""
    uuids = ssh(host, "nvidia-smi --query-gpu=index,uuid --format=csv,noheader")
    index = {u.strip(): int(i) for i, u in (line.split(",") for line in uuids.splitlines())}
    apps = ssh(host, "nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader")
    out: dict[int, set[int]] = {}
    for line in apps.splitlines():
        pid, uuid = (c.strip() for c in line.split(","))
        out.setdefault(index[uuid], set()).add(int(pid))
    return out


def units_of(host, pids: set[int]) -> set[str]:
    """The systemd units these processes run in (from /proc/PID/cgroup)."""
    out = ssh(host, " ".join(f"cat /proc/{p}/cgroup;" for p in sorted(pids)))
    return {part for line in out.splitlines() for part in line.split("/") if part.endswith(".service")}


def healthy(host, port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://{host.address}:{port}/health", timeout=5).status == 200
    except (urllib.error.URLError, OSError):
        return False


def side_view(host, side: dict) -> tuple[dict[str, str], dict[int, int]]:
    """What a user sees of one server from outside: systemd's view and its GPUs' memory."""
    memory = gpu_memory(host)
    first, last = (int(x) for x in side["gpus"].split("-"))
    return server(host, side["unit"]), {g: memory[g] for g in range(first, last + 1)}


@pytest.fixture(scope="module")
def host(lab):
    """A lab host with nothing of other tests on it: sglang.service stopped, then A and B deployed."""
    h = lab.hosts[2] if len(lab.hosts) > 2 else lab.hosts[-1]
    done = run(lab, "stop", "--limit", h.name)
    assert done.returncode == 0, done.stdout + done.stderr
    yield h
    for side in (A, B):
        run(lab, "stop", "--limit", h.name, "--unit", side["unit"])
    # Other tests deploy sglang.service on every GPU of this host: leave no unit of ours behind.
    ssh(
        h,
        "rm -f /etc/systemd/system/sglang-[abc].service /etc/orchestrator/units/sglang-[abc].service.json "
        "/etc/orchestrator/last-good/sglang-[abc].service.json /etc/orchestrator/sglang-[abc].* "
        "&& systemctl daemon-reload",
    )


@pytest.fixture(scope="module")
def pair(lab, host, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    refs = {"a": unit_profile(tmp, "left", A), "b": unit_profile(tmp, "right", B)}
    for side in ("a", "b"):
        rc, report = deploy(lab, host, refs[side])
        assert rc == 0, report
    return refs


def test_two_servers_run_on_their_own_gpus(lab, host, pair):
    assert healthy(host, A["port"]) and healthy(host, B["port"])
    on_gpu = gpu_pids(host)
    # The stand-in places memory where CUDA_VISIBLE_DEVICES says, as the real server does, and
    # nvidia-smi reports physical indexes: A's processes on 0-3 only, B's on 4-7 only.
    assert sorted(on_gpu) == list(range(8)), on_gpu
    assert all(units_of(host, on_gpu[g]) == {A["unit"]} for g in range(4)), on_gpu
    assert all(units_of(host, on_gpu[g]) == {B["unit"]} for g in range(4, 8)), on_gpu


def test_restarting_one_leaves_the_other_untouched(lab, host, pair):
    before = side_view(host, B)
    a_before = server(host, A["unit"])
    rc, report = deploy(lab, host, pair["a"], "--force-restart")
    assert rc == 0, report
    assert report["hosts"][0]["restarted"]
    assert server(host, A["unit"])["MainPID"] != a_before["MainPID"]
    assert side_view(host, B) == before


def test_a_failed_deploy_rolls_back_its_own_unit_only(lab, host, pair, tmp_path):
    before, a_before = side_view(host, A), server(host, A["unit"])
    oom = unit_profile(tmp_path, "right_oom", B, server={"mem_fraction_static": 0.97})
    rc, report = deploy(lab, host, oom, "--no-preflight")  # past the memory fit: a start that dies
    assert rc == 1
    h = report["hosts"][0]
    assert h["diagnosis"].startswith("CUDA out of memory"), h
    assert h["rolled_back_to"].startswith("right ("), h
    assert healthy(host, B["port"])
    assert "# profile: right\n" in ssh(host, "cat", f"/etc/systemd/system/{B['unit']}")
    assert side_view(host, A) == before and server(host, A["unit"]) == a_before


def test_stop_rollback_and_verify_take_one_unit(lab, host, pair):
    b_before = side_view(host, B)
    done = run(lab, "stop", "--limit", host.name, "--unit", A["unit"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert server(host, A["unit"])["ActiveState"] == "inactive"
    assert all(mib == 0 for g, mib in gpu_memory(host).items() if g < 4), gpu_memory(host)
    assert side_view(host, B) == b_before
    assert ssh(host, f"systemctl is-enabled {A['unit']} || true").strip() == "disabled"
    # Its last healthy unit of that profile comes back, on its own GPUs.
    done = run(lab, "rollback", "--limit", host.name, "--unit", A["unit"], "--to", "left")
    assert done.returncode == 0, done.stdout + done.stderr
    assert healthy(host, A["port"]) and side_view(host, B) == b_before
    for side in ("a", "b"):
        done = run(lab, "verify", "--limit", host.name, "-p", pair[side])
        assert done.returncode == 0, done.stdout + done.stderr


def test_status_shows_every_unit_of_the_host(lab, host, pair):
    done = run(lab, "status", "--limit", host.name, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    rows = rows if isinstance(rows, list) else rows["hosts"]
    mine = {r["unit"]: r for r in rows if r["host"] == host.name}
    assert set(mine) >= {A["unit"], B["unit"]}, rows
    for side, profile_name in ((A, "left"), (B, "right")):
        row = mine[side["unit"]]
        assert (row["profile"], row["port"], row["health"]) == (profile_name, side["port"], 200), row
        pid = int(server(host, side["unit"])["MainPID"])
        assert row["main_pid"] == pid
        holders = {h["pid"] for h in row["gpu_holders"]}
        assert holders and units_of(host, holders) == {side["unit"]}, row
    # --unit picks one.
    done = run(lab, "status", "--limit", host.name, "--unit", B["unit"], "--json")
    rows = json.loads(done.stdout)
    rows = rows if isinstance(rows, list) else rows["hosts"]
    assert {r["unit"] for r in rows} == {B["unit"]}


def test_a_neighbour_on_our_gpus_fails_preflight_and_is_never_killed(lab, host, pair, tmp_path):
    side = {"unit": "sglang-c.service", "gpus": "2-5", "port": 30000}
    ref = unit_profile(tmp_path, "middle", side)
    before = (server(host, A["unit"]), server(host, B["unit"]))
    for extra in ((), ("--kill-gpu-holders",)):
        rc, report = deploy(lab, host, ref, *extra)
        assert rc == 1, report
        text = json.dumps(report)
        assert "sglang-a.service (profile left)" in text and "sglang-b.service (profile right)" in text, text
        assert "port 30000 is the port of sglang-a.service (profile left)" in text, text
        assert (server(host, A["unit"]), server(host, B["unit"])) == before
    assert server(host, side["unit"])["ActiveState"] == "inactive"


def test_a_non_root_server_reads_its_secrets(lab, host, pair, tmp_path):
    """service.user sglang with an API key and an HF token: the key through LoadCredential=, the
    token through a 0600 EnvironmentFile= owned by sglang; neither in the unit or anywhere on the
    control machine's state."""
    key, token = "sk-orch-" + secrets.token_hex(12), "hf_" + secrets.token_hex(16)
    ref = unit_profile(
        tmp_path,
        "left",
        A,
        service={"user": "sglang", "restart": "on-failure"},
        api_key={"env": "ORCH_TEST_API_KEY"},
        secret_env={"HF_TOKEN": {"env": "ORCH_TEST_HF_TOKEN"}},
    )
    env = {**os.environ, "ORCH_TEST_API_KEY": key, "ORCH_TEST_HF_TOKEN": token}
    b_before = side_view(host, B)
    rc, report = deploy(lab, host, ref, env=env)
    assert rc == 0, report
    pid = server(host, A["unit"])["MainPID"]
    assert ssh(host, f"stat -c %U /proc/{pid}").strip() == "sglang"
    url = f"http://{host.address}:{A['port']}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    authed = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    assert urllib.request.urlopen(authed, timeout=5).status == 200
    environ = ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    assert f"HF_TOKEN={token}" in environ
    assert ssh(host, "stat -c '%a %U' /etc/orchestrator/sglang-a.env").split() == ["600", "sglang"]
    unit = ssh(host, "cat", f"/etc/systemd/system/{A['unit']}")
    assert token not in unit and key not in unit and "HF_TOKEN" not in unit
    assert side_view(host, B) == b_before
    from orchestrator.paths import state_dir

    leaks, files_read = [], 0
    for folder, subdirs, files in os.walk(state_dir()):
        # Not the hosts' own file systems (they hold both, by design) nor the lab's base image.
        subdirs[:] = [
            d
            for d in subdirs
            if Path(folder, d) not in (state_dir() / "lab/hosts", state_dir() / "lab-cache")
        ]
        for name in files:
            path = Path(folder, name)
            data = path.read_bytes() if path.is_file() else b""
            if key.encode() in data or token.encode() in data:
                leaks.append(str(path))
            files_read += bool(data)
    assert files_read > 20
    assert not leaks, leaks
    # A new token restarts the server with it (compared on the host, never sent as a digest).
    env["ORCH_TEST_HF_TOKEN"] = token + "x"
    rc, report = deploy(lab, host, ref, env=env)
    assert rc == 0 and report["hosts"][0]["restarted"], report
    pid = server(host, A["unit"])["MainPID"]
    assert f"HF_TOKEN={token}x" in ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()


def test_restart_on_failure_does_not_hide_a_crash_from_the_deploy(lab, host, pair, tmp_path):
    """With Restart=on-failure systemd starts a dying server again; the deploy still sees the
    first death (MainPID/NRestarts), fails fast and rolls back to the last healthy unit."""
    ref = unit_profile(
        tmp_path,
        "left_oom",
        A,
        server={"mem_fraction_static": 0.97},
        service={"restart": "on-failure", "restart_sec": 1, "health_timeout_s": 900},
    )
    started = time.monotonic()
    rc, report = deploy(lab, host, ref, "--no-preflight")  # past the memory fit: a start that dies
    took = time.monotonic() - started
    assert rc == 1, report
    h = report["hosts"][0]
    assert h["diagnosis"].startswith("CUDA out of memory"), h
    assert h["rolled_back_to"].startswith("left ("), h
    assert healthy(host, A["port"])
    assert took < 900, f"waited out the health timeout ({took:.0f} s)"
    assert "# profile: left\n" in ssh(host, "cat", f"/etc/systemd/system/{A['unit']}")

"""The nvidia-smi stand-in prints what the real one printed (tests/data/nvidia-smi), byte for byte.

It runs as installed on a lab host (install() into a temporary root filesystem), with its
config and registry directory moved by environment variables; no lab needed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.lab.standins import DIST_PACKAGES, install

CAPTURES = Path(__file__).resolve().parent.parent / "data" / "nvidia-smi"
CAPTURED_UUID = "GPU-1c99f63f-3983-6cc7-7349-904bbbeb995b"
CAPTURED_BUS = "00000000:00:06.0"
# A later H200's captures, made by tests/gpu/gpu_idle_proof.py (PyTorch holders).
PROOF_CAPTURES = Path(__file__).resolve().parent.parent / "gpu" / "captures"
PROOF_UUID = "GPU-be62d11b-469b-eeb0-2665-82ba275259d3"
# Debian's system python, as on the lab hosts: its processes are named `python3`.
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
QUERY = "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu"
APPS = "pid,process_name,used_memory,gpu_uuid"


class Host:
    """A root filesystem with the stand-ins, and a way to run its programs here."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "etc/nvidia-standin.json"
        self.env = dict(
            os.environ,
            NVIDIA_STANDIN_CONFIG=str(self.config),
            NVIDIA_STANDIN_RUN_DIR=str(root / "run/nvidia-standin"),
            PYTHONPATH=str(root / DIST_PACKAGES),
        )
        self.env.pop("CUDA_VISIBLE_DEVICES", None)

    def smi(self, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
        cmd = [PYTHON, str(self.root / "usr/bin/nvidia-smi"), *args]
        return subprocess.run(cmd, env={**self.env, **env}, capture_output=True, timeout=10)

    def hold(self, gpu: int, mib: int, argv0: str = "python3") -> subprocess.Popen[bytes]:
        """A holder started as `argv0` (nvidia-smi names processes by argv[0]: `python3` in the captures)."""
        cmd = [argv0, "-m", "nvidia_standin.hold", "--gpu", str(gpu), "--mib", str(mib)]
        proc = subprocess.Popen(cmd, executable=PYTHON, env=self.env, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()  # "holding ...": registered
        return proc


@pytest.fixture
def host(tmp_path: Path) -> Host:
    """A one-GPU host configured with the captured GPU's UUID and bus id."""
    install(tmp_path, gpus=1)
    host = Host(tmp_path)
    config = json.loads(host.config.read_text())
    config.update(uuids=[CAPTURED_UUID], bus_ids=[CAPTURED_BUS])
    host.config.write_text(json.dumps(config))
    return host


@pytest.fixture
def proof_host(tmp_path: Path) -> Host:
    """A one-GPU host configured as the H200 of tests/gpu/captures."""
    install(tmp_path, gpus=1)
    host = Host(tmp_path)
    config = json.loads(host.config.read_text())
    config.update(uuids=[PROOF_UUID], bus_ids=[CAPTURED_BUS])
    host.config.write_text(json.dumps(config))
    return host


@pytest.fixture
def holders(host: Host):
    procs: list[subprocess.Popen[bytes]] = []
    yield lambda gpu, mib: procs.append(host.hold(gpu, mib)) or procs[-1]
    for proc in procs:
        proc.kill()
        proc.wait()


def capture(name: str) -> bytes:
    return (CAPTURES / name).read_bytes()


@pytest.mark.parametrize(
    ("args", "env", "fixture", "code"),
    [
        (["-L"], {}, "list-L.txt", 0),
        ([f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], {}, "idle-query-gpu.csv", 0),
        ([f"--query-gpu={QUERY}", "--format=csv"], {}, "idle-query-gpu-header.csv", 0),
        ([f"--query-compute-apps={APPS}", "--format=csv,noheader,nounits"], {}, "idle-compute-apps.csv", 0),
        (["--query-gpu=index,bogus.field", "--format=csv,noheader"], {}, "badfield.txt", 2),
        (["--id=7", "--query-gpu=index", "--format=csv,noheader"], {}, "badid.txt", 6),
        (["--query-gpu=index", "--format=csv,noheader"], {"CUDA_VISIBLE_DEVICES": "5"}, "cvd5.txt", 0),
    ],
    ids=lambda v: v if isinstance(v, str) and v.endswith((".txt", ".csv")) else "",
)
def test_idle_output_matches_capture(host: Host, args: list[str], env: dict, fixture: str, code: int) -> None:
    result = host.smi(*args, **env)
    assert (result.stdout, result.returncode) == (capture(fixture), code)


def test_busy_output_matches_capture(host: Host, holders) -> None:
    first, second = holders(0, 3380), holders(0, 4426)
    pids = {str(first.pid): "424", str(second.pid): "450"}

    def as_captured(out: bytes) -> bytes:
        text = out.decode()
        for real, captured in pids.items():
            text = text.replace(f"{real}, ", f"{captured}, ")
        return text.encode()

    gpu = host.smi(f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
    assert gpu.stdout == capture("busy-query-gpu.csv")
    apps = host.smi(f"--query-compute-apps={APPS}", "--format=csv,noheader,nounits")
    assert as_captured(apps.stdout) == capture("busy-compute-apps.csv")
    header = host.smi(f"--query-compute-apps={APPS}", "--format=csv")
    assert as_captured(header.stdout) == capture("busy-compute-apps-header.csv")


def test_memory_is_released_when_the_holder_dies(host: Host, holders) -> None:
    proc = holders(0, 4000)
    used = host.smi("--query-gpu=memory.used,memory.free", "--format=csv,noheader,nounits")
    assert used.stdout == b"4009, 139762\n"
    proc.send_signal(signal.SIGKILL)  # no clean-up of its own: the dead PID frees it
    proc.wait()
    assert host.smi("--query-gpu=memory.used", "--format=csv,noheader").stdout == b"0 MiB\n"


def test_sigterm_removes_the_registry_entry(host: Host, holders) -> None:
    proc = holders(0, 1000)
    proc.terminate()
    assert proc.wait(timeout=5) == 0
    assert list((host.root / "run/nvidia-standin").glob("*.json")) == []


def test_reused_pid_with_another_start_time_holds_nothing(host: Host) -> None:
    run_dir = host.root / "run/nvidia-standin"
    run_dir.mkdir(parents=True, exist_ok=True)
    stale = run_dir / f"{os.getpid()}.json"
    stale.write_text(json.dumps({"pid": os.getpid(), "start_time": 1, "gpus": [0], "mib_per_gpu": 9000}))
    apps = host.smi(f"--query-compute-apps={APPS}", "--format=csv,noheader")
    assert apps.stdout == b""
    assert not stale.exists()


def test_eight_gpus_have_stable_distinct_uuids(tmp_path: Path) -> None:
    install(tmp_path, gpus=8)
    host = Host(tmp_path)
    query = ("--query-gpu=index,uuid,pci.bus_id,count,driver_version", "--format=csv,noheader")
    rows = host.smi(*query).stdout.decode().splitlines()
    assert len(rows) == 8 and len({r.split(", ")[1] for r in rows}) == 8
    assert rows[0].endswith("00000000:18:00.0, 8, 580.159.04")
    assert host.smi(*query).stdout.decode().splitlines() == rows
    assert host.smi("--id=3", "-L").stdout.decode().startswith("GPU 3: NVIDIA H200 (UUID: GPU-")


def test_compute_apps_per_gpu(tmp_path: Path, holders) -> None:
    install(tmp_path, gpus=2)
    host = Host(tmp_path)
    proc = host.hold(1, 2500)
    try:
        time.sleep(0.05)
        out = host.smi("-i", "1", "--query-compute-apps=pid,used_memory,gpu_bus_id", "--format=csv")
        expected = f"pid, used_gpu_memory [MiB], gpu_bus_id\n{proc.pid}, 2500 MiB, 00000000:2A:00.0\n"
        assert out.stdout.decode() == expected
        assert host.smi("-i", "0", "--query-compute-apps=pid", "--format=csv,noheader").stdout == b""
    finally:
        proc.kill()
        proc.wait()


def proof_capture(name: str, pids: dict[int, int]) -> str:
    """A capture of tests/gpu/captures with its PIDs replaced by ours, as pid cells or table cells."""
    text = (PROOF_CAPTURES / name).read_text()
    for ours, real in pids.items():
        text = re.sub(rf"^{real}, ", f"{ours}, ", text, flags=re.MULTILINE)
        text = text.replace(f"N/A {real:>15}  ", f"N/A {ours:>15}  ")
    return text


def people_view(table: str) -> str:
    """The table without what is no layout: the clock line, temperature, power, utilization."""
    table = table.split("\n", 1)[1]
    table = re.sub(r"N/A +\d+C +P0 +\d+W", "N/A _C P0 _W", table)
    return re.sub(r"\| +\d+% +Default", "| _% Default", table)


def start(host: Host, mib: int, argv0: str, procs: list[subprocess.Popen[bytes]]) -> int:
    procs.append(host.hold(0, mib, argv0))
    return procs[-1].pid


def test_pytorch_holder_matches_the_proof_captures(proof_host: Host) -> None:
    """One 4 GiB PyTorch holder on a real H200: 4614 MiB listed, memory.used 4623, named by argv[0]."""
    assert people_view(proof_host.smi().stdout.decode()) == people_view(proof_capture("idle-table.txt", {}))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pids = {start(proof_host, 4614, "/opt/torch/.venv/bin/python3", procs): 516}
        gpu = proof_host.smi(f"--query-gpu={QUERY}", "--format=csv")
        assert gpu.stdout.decode() == proof_capture("busy-query-gpu-header.csv", pids)
        for fmt, name in (
            ("csv,noheader,nounits", "busy-compute-apps.csv"),
            ("csv", "busy-compute-apps-header.csv"),
        ):
            apps = proof_host.smi(f"--query-compute-apps={APPS}", f"--format={fmt}")
            assert apps.stdout.decode() == proof_capture(name, pids)
        table = people_view(proof_host.smi().stdout.decode())
        assert table == people_view(proof_capture("busy-table.txt", pids))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_process_name_is_argv0_cut_in_the_table(proof_host: Host) -> None:
    """Not comm (`python3`) nor exe: argv[0], whole in the query, cut to its tail in the table."""
    long = "/opt/a-rather-long-virtualenv-path/for-the-server/bin/gpu-proof-argv0"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pids = {start(proof_host, 1542, "gpu-proof-argv0", procs): 782}
        pids[start(proof_host, 1542, long, procs)] = 807
        apps = proof_host.smi(f"--query-compute-apps={APPS}", "--format=csv")
        assert apps.stdout.decode() == proof_capture("argv0-compute-apps-header.csv", pids)
        table = people_view(proof_host.smi().stdout.decode())
        assert table == people_view(proof_capture("argv0-table.txt", pids))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()

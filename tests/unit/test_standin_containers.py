"""The GPU stand-in across a PID namespace, as podman's CDI devices give it to a container
(orchestrator.lab.standins.cdi_spec): the container's holder records the host's GPU indexes and
its own namespace; the host's nvidia-smi shows the PID it sees; a dead container's memory is free
at once; a reader inside the container counts the host's holders it cannot see.

The container is `unshare --pid --fork --mount-proc` (root only); no lab, no podman.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_standin_nvidia_smi import PYTHON, Host

from orchestrator.lab.standins import install

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root and unshare"
)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    install(tmp_path, gpus=8)
    devices = tmp_path / "container-devices"
    devices.mkdir()
    for gpu in (4, 5, 6, 7):  # as `--device nvidia.com/gpu=4` ... mount them
        (devices / f"gpu{gpu}").write_text(f"{gpu}\n")
    return Host(tmp_path)


def in_container(host: Host, *argv: str) -> subprocess.Popen[bytes]:
    env = {**host.env, "NVIDIA_STANDIN_DEVICES": str(host.root / "container-devices")}
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", PYTHON, *argv]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )


def apps(host: Host, **env: str) -> list[tuple[int, int]]:
    """(pid, GPU index) of every compute app nvidia-smi lists."""
    uuids = host.smi("--query-gpu=index,uuid", "--format=csv,noheader", **env).stdout.decode()
    index = {u.strip(): int(i) for i, u in (line.split(",") for line in uuids.splitlines())}
    out = host.smi("--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader", **env).stdout.decode()
    return sorted((int(p), index[u.strip()]) for p, u in (line.split(",") for line in out.splitlines()))


def test_a_container_holder_is_seen_from_the_host_by_its_host_pid(host: Host) -> None:
    proc = in_container(host, "-m", "nvidia_standin.hold", "--gpu", "0,1", "--mib", "1000")
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"holding")
        (entry,) = (host.root / "run/nvidia-standin").glob("*.json")
        assert entry.name.endswith("-1.json")  # PID 1 of its namespace, named with the namespace
        seen = apps(host)
        pids = {pid for pid, _ in seen}
        assert [gpu for _, gpu in seen] == [4, 5]  # the container's GPU 0 and 1 are the host's 4 and 5
        (pid,) = pids
        assert pid != 1 and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == PYTHON.encode()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while apps(host) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert apps(host) == []  # killed with the namespace: free at once, and the entry is gone
    assert list((host.root / "run/nvidia-standin").glob("*.json")) == []


def test_a_reader_in_the_container_counts_holders_it_cannot_see(host: Host) -> None:
    outside = host.hold(4, 2000)
    try:
        reader = in_container(host, "-c", "from nvidia_standin import registry; print(registry.used_mib(4))")
        out, err = reader.communicate(timeout=20)
        assert out.decode().strip() == str(2000 + 3 + 6), err
        assert len(list((host.root / "run/nvidia-standin").glob("*.json"))) == 1  # and left it there
    finally:
        outside.terminate()
        outside.wait()

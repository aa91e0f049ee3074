"""Several SGLang stand-ins form one multi-node server, and fail as one.

Each node is a `python3 -m sglang.launch_server --nnodes N --node-rank R --dist-init-addr
127.0.0.1:P` process on this machine with its own GPU registry directory (a host of its own,
as far as GPU memory goes); short load delays and dist timeouts keep the file fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.hosts.deploy import _group_diagnosis
from orchestrator.hosts.diagnose import classify
from orchestrator.hosts.host_report import HostReport
from orchestrator.lab.standins import DIST_PACKAGES, install, kimi_config, write_model_dir
from tests.unit.test_standin_memory import weightless_used_mib
from tests.unit.test_standin_sglang import Server, free_port

PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


class Node(Server):
    """One rank: a server process whose output goes to a file, read while it runs."""

    def __init__(self, proc: subprocess.Popen[str], port: int, log: Path, run_dir: Path) -> None:
        super().__init__(proc, port)
        self.log, self.run_dir = log, run_dir

    def output(self) -> str:
        return self.log.read_text()

    def wait_exit(self, timeout: float) -> float:
        """Seconds until the process ended (fails the test after `timeout`)."""
        start = time.monotonic()
        self.proc.wait(timeout=timeout)
        return time.monotonic() - start

    def wait_for(self, text: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)


class Cluster:
    """One installed root filesystem; each node gets its own registry dir, HTTP and log file."""

    def __init__(self, root: Path) -> None:
        install(root, gpus=2)
        self.root = root
        self.model = write_model_dir(root / "models/target", kimi_config(), load_delay_s=0.3, warmup_s=0.2)
        self.store = free_port()
        self.nodes: list[Node] = []

    def start(self, rank: int, nnodes: int = 2, timeout_s: float = 10, *extra: str) -> Node:
        run_dir = self.root / f"run/node{rank}"
        env = dict(
            os.environ,
            NVIDIA_STANDIN_CONFIG=str(self.root / "etc/nvidia-standin.json"),
            NVIDIA_STANDIN_RUN_DIR=str(run_dir),
            PYTHONPATH=str(self.root / DIST_PACKAGES),
            SGLANG_STANDIN_DIST_TIMEOUT_S=str(timeout_s),
        )
        port = free_port()
        args = ["--model-path", str(self.model), "--port", str(port), "--tp-size", str(nnodes)]
        args += ["--mem-fraction-static", "0.5", "--nnodes", str(nnodes), "--node-rank", str(rank)]
        args += ["--dist-init-addr", f"127.0.0.1:{self.store}", *extra]
        log = self.root / f"node{len(self.nodes)}-rank{rank}.log"
        with log.open("w") as out:
            cmd = [PYTHON, "-m", "sglang.launch_server", *args]
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        node = Node(proc, port, log, run_dir)
        self.nodes.append(node)
        return node

    def smi_used(self, node: Node) -> list[int]:
        env = dict(
            os.environ,
            NVIDIA_STANDIN_CONFIG=str(self.root / "etc/nvidia-standin.json"),
            NVIDIA_STANDIN_RUN_DIR=str(node.run_dir),
            PYTHONPATH=str(self.root / DIST_PACKAGES),
        )
        smi = [PYTHON, str(self.root / "usr/bin/nvidia-smi"), "--query-gpu=memory.used"]
        out = subprocess.run([*smi, "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True)
        return [int(v) for v in out.stdout.split()]

    def close(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()


@pytest.fixture
def cluster(tmp_path: Path):
    cluster = Cluster(tmp_path)
    yield cluster
    cluster.close()


def up(cluster: Cluster, nnodes: int = 2) -> list[Node]:
    nodes = [cluster.start(rank, nnodes) for rank in range(nnodes)]
    nodes[0].wait_ready()
    for node in nodes[1:]:
        node.wait_for("only node rank 0 serves HTTP")
    return nodes


def test_rank_0_serves_only_after_rank_1_joined(cluster: Cluster) -> None:
    rank0 = cluster.start(0)
    rank0.wait_for("TP0] Init torch distributed begin.")
    time.sleep(1.0)  # well past its own load delay and warm-up
    assert rank0.status() is None  # port still closed: connection refused
    assert "Init torch distributed ends" not in rank0.output()
    rank1 = cluster.start(1)
    seen = rank0.wait_ready()
    assert 200 in seen
    rank1.wait_for("only node rank 0 serves HTTP")
    out0, out1 = rank0.output(), rank1.output()
    assert "TP0] Init torch distributed ends." in out0 and "The server is fired up and ready to roll!" in out0
    assert "TP1] Init torch distributed begin." in out1 and "TP1] Init torch distributed ends." in out1
    assert "fired up" not in out1 and rank1.status() is None  # one HTTP endpoint: rank 0's
    used = weightless_used_mib(0.5)
    assert cluster.smi_used(rank0) == cluster.smi_used(rank1) == [used, 0]  # TP 2 over 2 nodes: 1 GPU each
    rank1.proc.terminate()
    rank0.proc.terminate()


def test_rank_1_alone_dies_like_a_torch_store_timeout(cluster: Cluster) -> None:
    rank1 = cluster.start(1, timeout_s=1)
    assert rank1.wait_exit(timeout=6) < 5
    assert rank1.proc.returncode == 1
    out = rank1.output()
    line = (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms "
        f"while trying to connect to (127.0.0.1, {cluster.store})."
    )
    assert line in out.splitlines()
    assert classify(out.splitlines()).kind == "nccl"
    assert cluster.smi_used(rank1) == [0, 0]


def test_rank_0_alone_times_out_waiting_for_clients(cluster: Cluster) -> None:
    rank0 = cluster.start(0, timeout_s=1)
    assert rank0.wait_exit(timeout=6) < 5
    assert rank0.proc.returncode == 1
    out = rank0.output()
    assert (
        "torch.distributed.DistStoreError: Timed out after 1 seconds waiting for clients. 1/2 clients joined."
        in out
    )
    assert rank0.status() is None


def test_dist_timeout_flag_overrides_the_knob(cluster: Cluster) -> None:
    rank1 = cluster.start(1, 2, 30, "--dist-timeout", "1")
    assert rank1.wait_exit(timeout=6) < 5
    assert "timed out after 1000ms" in rank1.output()


def test_killing_rank_1_ends_rank_0_naming_rank_1(cluster: Cluster) -> None:
    rank0, rank1 = up(cluster)
    rank1.proc.send_signal(signal.SIGKILL)
    assert rank0.wait_exit(timeout=5) < 2
    assert rank0.proc.returncode == 1
    lines = rank0.output().splitlines()
    diagnosis = classify(lines)
    assert diagnosis.kind == "nccl" and "node rank 1" in diagnosis.evidence
    assert "remote process exited or there was a network error" in diagnosis.evidence
    assert "Received sigquit from a child process. It usually means the child failed." in lines[-1]
    assert cluster.smi_used(rank0) == [0, 0]


def test_the_group_names_the_killed_rank_even_when_the_survivor_exited_first(cluster: Cluster) -> None:
    """The survivor can be reaped first (a busy host, clock skew between hosts): its
    ncclRemoteError is a consequence, and the group's diagnosis still names the killed rank."""
    rank0, rank1 = up(cluster)
    rank1.proc.send_signal(signal.SIGKILL)
    rank0.wait_exit(timeout=5)
    killed = {"Result": "signal", "ExecMainCode": "killed", "ExecMainStatus": "9"}
    reports = [
        HostReport(
            host="a",
            ok=False,
            step="health",
            diagnosis=str(classify(rank0.output().splitlines())),
            exited_at="Tue 2026-12-01 16:00:00.100000 UTC",
        ),
        HostReport(
            host="b",
            ok=False,
            step="health",
            diagnosis=str(classify([], killed)),
            exited_at="Tue 2026-12-01 16:00:00.104000 UTC",
        ),
    ]
    where = {
        "a": SimpleNamespace(facts=SimpleNamespace(rank=0)),
        "b": SimpleNamespace(facts=SimpleNamespace(rank=1)),
    }
    _group_diagnosis(reports, where)
    for r in reports:
        assert r.diagnosis.startswith("group failed: node rank 1 (b) failed first: killed by a signal"), (
            r.diagnosis
        )


def test_killing_rank_0_ends_rank_1(cluster: Cluster) -> None:
    rank0, rank1 = up(cluster)
    rank0.proc.send_signal(signal.SIGKILL)
    assert rank1.wait_exit(timeout=5) < 2
    assert rank1.proc.returncode == 1
    diagnosis = classify(rank1.output().splitlines())
    assert diagnosis.kind == "nccl" and "node rank 0" in diagnosis.evidence


def test_every_survivor_names_the_rank_that_died_first(cluster: Cluster) -> None:
    nodes = up(cluster, nnodes=3)
    cluster.nodes[2].proc.send_signal(signal.SIGKILL)
    for node in nodes[:2]:
        assert node.wait_exit(timeout=5) < 2
        assert node.proc.returncode == 1
        assert "(peer: node rank 2, host " in classify(node.output().splitlines()).evidence


def test_a_second_node_with_the_same_rank_is_refused(cluster: Cluster) -> None:
    nodes = up(cluster)
    twin = cluster.start(1, timeout_s=1)
    assert twin.wait_exit(timeout=6) < 5
    assert (
        "DistNetworkError: The client socket has timed out" in twin.output()
    )  # store closed after the barrier
    assert all(node.proc.poll() is None for node in nodes)


def test_a_duplicate_rank_before_the_barrier_is_refused(cluster: Cluster) -> None:
    rank0, rank1 = cluster.start(0, 3), cluster.start(1, 3)
    rank1.wait_for("TP1] Init torch distributed begin.")
    time.sleep(0.5)  # rank 1 has joined; rank 2 has not
    twin = cluster.start(1, 3)
    assert twin.wait_exit(timeout=5) < 3
    assert "refused: node rank 1 already joined from " in twin.output()
    assert rank0.proc.poll() is None and rank1.proc.poll() is None  # still waiting for rank 2

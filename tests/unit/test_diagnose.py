"""The diagnosis classes, from journal lines of the shapes SGLang, torch and systemd print."""

from __future__ import annotations

import pytest

from orchestrator.hosts.diagnose import classify

CASES = [
    (
        [
            "usage: python -m sglang.launch_server [-h] ...",
            "launch_server: error: unrecognized arguments: --foo 1",
        ],
        "bad-flag",
    ),
    (
        ["launch_server: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-dec"],
        "bad-flag",
    ),
    (["OSError: Can't load the configuration of '/data/x'. If you were trying ..."], "path-missing"),
    (["OSError: None is not a local folder and is not a valid model identifier"], "path-missing"),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], "cuda-oom"),
    (["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], "cuda-oom"),
    (  # 0.5.23's words for a pool the weights leave no room in (kv_cache_configurator)
        [
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.5. Raise --mem-fraction-static above 0.514"
        ],
        "cuda-oom",
    ),
    (  # both versions, when another process holds memory on one GPU of a TP group
        [
            "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
            "processes. min_per_gpu_memory=98.23828125, local_gpu_memory=137.3095703125"
        ],
        "gpu-memory-unbalanced",
    ),
    (
        ["ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address in use"],
        "port-in-use",
    ),
    (["torch.distributed.DistNetworkError: The client socket has timed out after 30000ms"], "nccl"),
    (
        ["torch.distributed.DistStoreError: Timed out after 30 seconds waiting for clients. 1/2 joined."],
        "nccl",
    ),
    (
        ["torch.distributed.DistBackendError: NCCL error: remote process exited (peer: node rank 1)"],
        "nccl",
    ),
    (["ModuleNotFoundError: No module named 'sgl_kernel'"], "import-error"),
]


@pytest.mark.parametrize(("journal", "kind"), CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_journal_lines_are_classified(journal: list[str], kind: str) -> None:
    found = classify(["[2026-11-29 13:00:00] Starting", *journal, "Received sigquit from a child process."])
    assert found.kind == kind
    assert journal[-1][:40] in found.evidence


def test_killed_by_signal_and_oom_killer() -> None:
    assert str(classify([], {"Result": "signal", "ExecMainStatus": "9"})) == "killed by a signal: signal 9"
    assert classify([], {"Result": "oom-kill"}).kind == "killed"


def test_timeout_and_unknown() -> None:
    assert classify(["still loading"], {}, "timeout").summary == "alive but never healthy before the timeout"
    assert classify(["something odd"], {"Result": "exit-code"}).kind == "unknown"

"""The start-up phases read from the stand-in's real lines (both versions) and from hostile text:
module_utils' Startup follows the phases in order, takes a bar's last redraw for k/N, follows one
rank, and a line it does not know changes nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.unit.test_standin_sglang import EAGLE3_345
from tests.unit.test_standin_startup_lines import lab_for, started

SOURCE = Path(__file__).resolve().parents[2] / "plugins/module_utils/orchestrator_host/startup.py"
_spec = importlib.util.spec_from_file_location("startup_parser", SOURCE)
assert _spec and _spec.loader
startup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(startup)


def phases_of(lines: list[str]) -> tuple[list[str], object]:
    s = startup.Startup()
    for i, line in enumerate(lines):
        s.feed(float(i), line)
    return s.order, s


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_stand_ins_lines_give_every_phase_in_order(tmp_path: Path, version: str) -> None:
    lab = lab_for(tmp_path, version, jit_s=0.05)
    lines = started(lab, "--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345)
    order, s = phases_of(lines)
    # DeepGEMM compiles inside the capture, before its bar (SGLang's order)
    expected = ["launch", "init", "weights", "kv_cache", "graphs", "jit", "draft", "draft_graphs", "warmup"]
    assert order == [*expected, "ready"]
    assert s.phase == "ready"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_bar_gives_k_of_n_and_the_batch_size(tmp_path: Path, version: str) -> None:
    lab = lab_for(tmp_path, version)
    lines = started(lab)
    s = startup.Startup()
    seen = []
    for i, line in enumerate(lines):
        s.feed(float(i), line)
        if s.progress:
            seen.append((s.phase, s.progress["done"], s.progress["total"]))
    assert ("weights", 8, 8) in seen
    graphs = [p for p in seen if p[0] == "graphs"]
    assert graphs and graphs[-1][1] == graphs[-1][2]


def test_a_bar_caught_mid_way_says_how_far_and_which_batch_size() -> None:
    s = startup.Startup()
    s.feed(1.0, "[2026-12-03 06:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.")
    s.feed(
        2.0,
        "\rCapturing batches (bs=160 avail_mem=20.1 GB):  10%| | 3/36 [..]\rCapturing batches "
        "(bs=96 avail_mem=20.0 GB):  63%|██▌ | 23/36 [00:02<00:01,  4.5it/s]",
    )
    assert (s.phase, s.progress) == ("graphs", {"done": 23, "total": 36, "detail": "bs 96"})


def test_other_ranks_and_unknown_lines_change_nothing() -> None:
    s = startup.Startup()
    s.feed(1.0, "[2026-12-03 06:00:00 TP0] Init torch distributed begin.")
    s.feed(2.0, "[2026-12-03 06:00:01 TP3] Load weight begin. avail mem=1 GB")  # another rank
    for junk in ("", "\r\r", "\x00\x1b[31mboom", "Load weight", "[9999-99-99 TP0]", "k/N [", "1/0 ["):
        s.feed(3.0, junk)
    assert s.phase == "init" and s.lines == 9
    s.feed(4.0, "[2026-12-03 06:00:02 TP0] Load weight begin. avail mem=1 GB")
    assert s.phase == "weights"
    assert [p["phase"] for p in s.durations(5.0)] == ["launch", "init", "weights"]
    assert s.durations(5.0)[1]["s"] == 3.0


def test_a_phase_that_comes_back_adds_its_time_and_a_quiet_start_is_stalled_past_its_limit() -> None:
    s = startup.Startup()
    s.feed(0.0, "[2026-12-03 06:00:00 TP0] Capture cuda graph begin. avail mem=1 GB")
    s.feed(2.0, "[2026-12-03 06:00:00 TP0] Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N=1")
    s.feed(5.0, "Capturing batches (bs=48 avail_mem=1 GB):   0%|   | 0/10 [00:00<?, ?it/s]")
    s.feed(6.0, "[2026-12-03 06:00:00 TP0] Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N=2")
    s.feed(7.0, "Capturing batches (bs=1 avail_mem=1 GB): 100%|███| 10/10 [00:02<00:00]")
    durations = {p["phase"]: p["s"] for p in s.durations(8.0)}
    assert durations == {"launch": 0.0, "graphs": 4.0, "jit": 4.0}
    assert s.stalled(8.0, {"graphs": 5.0}) is None
    assert s.stalled(12.5, {"graphs": 5.0}) == 5.0
    assert s.stalled(12.5, {"*": 10.0}) is None and s.stalled(18.0, {"*": 10.0}) == 10.0


def test_the_health_polls_access_lines_are_no_progress() -> None:
    """A server stuck in its warm-up answers every poll 503 and logs it: still stalled."""
    s = startup.Startup()
    s.feed(1.0, "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)")
    for t in range(2, 30):
        s.feed(float(t), 'INFO:     127.0.0.1:52314 - "GET /health HTTP/1.1" 503 Service Unavailable')
    assert s.phase == "warmup" and s.stalled(30.0, {"warmup": 10}) == 10
    s.feed(31.0, 'INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    assert s.stalled(32.0, {"warmup": 10}) is None


def test_the_memory_lines_are_kept_and_no_argument_but_the_fraction() -> None:
    """The ledger records a start's memory lines; server_args' line also holds an API key, so of it
    only `mem_fraction_static=` is kept (and nothing when it is unset)."""
    s = startup.Startup()
    s.feed(0.1, "[2026-12-05 10:00:00] server_args=ServerArgs(api_key='sk-1', mem_fraction_static=0.8024)")
    s.feed(0.2, "[2026-12-05 10:00:00] server_args=ServerArgs(api_key='sk-2', mem_fraction_static=None)")
    s.feed(0.3, "[2026-12-05 10:00:01 TP0] Load weight begin. avail mem=137.31 GB")
    s.feed(0.4, "[2026-12-05 10:00:01 TP1] Load weight begin. avail mem=137.30 GB")  # another rank's
    s.feed(0.5, "[2026-12-05 10:00:09 TP0] KV Cache is allocated. #tokens: 589503, KV size: 38.58 GB")
    lines = s.report(1.0)["memory_lines"]
    assert lines == [
        "mem_fraction_static=0.8024",
        "Load weight begin. avail mem=137.31 GB",
        "KV Cache is allocated. #tokens: 589503, KV size: 38.58 GB",
    ]
    assert not any("sk-" in line for line in lines)

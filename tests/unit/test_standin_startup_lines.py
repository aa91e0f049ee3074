"""The SGLang stand-in prints each start-up phase with the real server's lines, per version.

A deployment tool reads start-up progress from the journal by these lines (docs/standins.md,
"Start-up lines"), so their spelling and order are the contract: checked here for 0.5.9 and
0.5.23, with the batch-size counts of the capture bar, DeepGEMM's JIT cache, and the `stall`
knob that stops a phase for good.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from orchestrator.lab.standins import write_model_dir, write_weights
from tests.unit.test_standin_sglang import EAGLE3_345, KIMI_TOKENIZER, Lab, Server, kimi_config

FAST = {"load_delay_s": 0.2, "warmup_s": 0.1, "capture_s_per_bs": 0.005, "draft_load_s": 0.05}
FAST |= {"draft_capture_s": 0.05, "read_mib_s": 120}
#: 8 shards of 4 MiB: 0.27 s at read_mib_s 120 from a cold page cache (a fresh dir is cold).
SMALL = [(f"model.layers.{i}.mlp.down_proj.weight", "BF16", (1024, 2048)) for i in range(8)]


def lab_for(tmp_path: Path, version: str, **knobs: object) -> Lab:
    lab = Lab(tmp_path, version=version)
    lab.target = write_model_dir(tmp_path / "models/fast", kimi_config(), KIMI_TOKENIZER, **(FAST | knobs))
    write_weights(lab.target, SMALL, shards=8)
    lab.env["SGLANG_DG_CACHE_DIR"] = str(tmp_path / "deep_gemm")
    return lab


def lines_of(log: Path) -> list[str]:
    """Split at `\\n` only, as the journal does: a bar's `\\r` redraws stay in one line."""
    return log.read_bytes().decode().split("\n")


def started(lab: Lab, *args: str) -> list[str]:
    """The lines of one start until ready."""
    log = lab.root / "server.log"
    server = lab.start(*args, log=log)
    server.wait_ready()
    server.proc.terminate()
    server.proc.wait(timeout=10)
    return lines_of(log)


def in_order(lines: list[str], expected: list[str]) -> list[str]:
    """The lines that match `expected` (regexes searched in each line), one after another."""
    found, i = [], 0
    for line in lines:
        if i < len(expected) and re.search(expected[i], line):
            found.append(line)
            i += 1
    assert i == len(expected), f"missing {expected[i]!r} after {found[-1:]!r}"
    return found


STAMP = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] "
PLAIN = {
    "0.5.9": [
        STAMP + r"Init torch distributed begin\.$",
        STAMP + r"Init torch distributed ends\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB$",
        STAMP + r"Load weight begin\. avail mem=\d+\.\d\d GB$",
        r"^\rLoading safetensors checkpoint shards:   0% Completed \| 0/8 \[00:00<\?, \?it/s\]\r.*"
        r"\rLoading safetensors checkpoint shards: 100% Completed \| 8/8 \[",
        STAMP + r"Load weight end\. elapsed=\d+\.\d\d s, type=KimiK25ForConditionalGeneration, "
        r"dtype=torch\.bfloat16, avail mem=\d+\.\d\d GB, mem usage=\d+\.\d\d GB\.$",
        STAMP + r"KV Cache is allocated\. #tokens: \d+, KV size: \d+\.\d\d GB$",
        STAMP + r"Memory pool end\. avail mem=\d+\.\d\d GB$",
        STAMP + r"Capture cuda graph begin\. This can take up to several minutes\. avail mem=\d+\.\d\d GB$",
        STAMP + r"Capture cuda graph bs \[1, 2, 4, 8, 12, 16, 24, 32, 40, 48\]$",
        r"^\rCapturing batches \(bs=48 avail_mem=\d+\.\d\d GB\):   0%\|          \| 0/10 .*"
        r"\rCapturing batches \(bs=1 avail_mem=\d+\.\d\d GB\): 100%\|██████████\| 10/10 \[",
        STAMP + r"Capture cuda graph end\. Time elapsed: \d+\.\d\d s\. mem usage=\d+\.\d\d GB\. "
        r"avail mem=\d+\.\d\d GB\.$",
        STAMP + r"max_total_num_tokens=",
        r"INFO:     Uvicorn running on http://",
        r'"POST /generate HTTP/1\.1" 200 OK$',
        r"The server is fired up and ready to roll!$",
    ],
    "0.5.23": [
        STAMP + r"Init torch distributed begin\.$",
        STAMP + r"Init torch distributed ends\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB$",
        STAMP + r"Load weight begin\. avail mem=\d+\.\d\d GB$",
        r"^\rMulti-thread loading shards:   0% Completed \| 0/8 .*"
        r"\rMulti-thread loading shards: 100% Completed \| 8/8 \[",
        STAMP + r"Load weight end\. elapsed=\d+\.\d\d s, type=KimiK25ForConditionalGeneration, "
        r"quant=compressed-tensors, avail mem=\d+\.\d\d GB, mem usage=\d+\.\d\d GB\.$",
        STAMP + r"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, KV size: \d+\.\d\d GB$",
        STAMP + r"Memory pool end\. avail mem=\d+\.\d\d GB$",
        STAMP + r"Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, "
        r"bs=\[1, 2, 4, 8, 12, 16, 24, 32, 40, 48\], avail mem=\d+\.\d\d GB$",
        r"^\rCapturing batches \(bs=48 avail_mem=\d+\.\d\d GB\):   0%\|          \| 0/10 .*"
        r"\rCapturing batches \(bs=1 avail_mem=\d+\.\d\d GB\): 100%\|██████████\| 10/10 \[",
        STAMP + r"Capture target decode CUDA graph end\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB, "
        r"avail mem=\d+\.\d\d GB\.$",
        STAMP + r"max_total_num_tokens=",
        r"^\[[^]]*\d\d\] Engine startup timings \(s\): load_weight=\d+\.\d\d, kv_cache_allocation=\d+\.\d\d, "
        r"scheduler_e2e=\d+\.\d\d, cuda_graph=\{prefill=0\.00, decode=\d+\.\d\d, target_verify=0\.00, "
        r"draft_prefill=0\.00, draft_decode=0\.00, draft_extend=0\.00\}, tokenizer_e2e=\d+\.\d\d$",
        r"INFO:     Uvicorn running on http://",
        r'"POST /generate HTTP/1\.1" 200 OK$',
        r"The server is fired up and ready to roll!$",
    ],
}
MAX_BS_FLAG = {"0.5.9": "--cuda-graph-max-bs", "0.5.23": "--cuda-graph-max-bs-decode"}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_phases_come_in_order_with_each_versions_spelling(tmp_path: Path, version: str) -> None:
    lab = lab_for(tmp_path, version)
    try:
        in_order(started(lab, MAX_BS_FLAG[version], "48"), PLAIN[version])
    finally:
        lab.close()


DRAFTED = {
    "0.5.9": [
        r"Capture cuda graph begin\. This can take",
        r"Capture cuda graph end\. Time elapsed: ",
        r"TP0\] Init torch distributed begin\.$",
        r"TP0\] Load weight begin\. ",
        r"\rLoading safetensors checkpoint shards: 100% Completed \| 1/1 ",
        r"Load weight end\. elapsed=\d+\.\d\d s, type=LlamaForCausalLMEagle3, dtype=torch\.bfloat16, ",
        r"KV Cache is allocated\. #tokens: \d+, K size: \d+\.\d\d GB, V size: \d+\.\d\d GB$",
        r"Capture draft cuda graph begin\. This can take up to several minutes\. avail mem=\d+\.\d\d GB$",
        r"Capture draft cuda graph end\. Time elapsed: \d+\.\d\d s\. mem usage=\d+\.\d\d GB\. avail mem=",
        r"Capture draft extend cuda graph begin\. This can take up to several minutes\. avail mem=",
        r"Capture draft extend cuda graph end\. Time elapsed: \d+\.\d\d s\. mem usage=",
        r"max_total_num_tokens=",
    ],
    "0.5.23": [
        r"Capture target verify CUDA graph begin\. backend=full, num_tokens_per_req=5, bs=\[1, 2, 3,",
        r"Capture target verify CUDA graph end\. elapsed=",
        r"TP0\] Init torch distributed begin\.$",
        r"\rMulti-thread loading shards: 100% Completed \| 1/1 ",
        r"Load weight end\. elapsed=\d+\.\d\d s, type=LlamaForCausalLMEagle3, avail mem=",
        r"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, K size: ",
        r"Capture draft decode CUDA graph begin\. backend=full, num_tokens_per_req=4, bs=\[",
        r"Capture draft decode CUDA graph end\. elapsed=\d+\.\d\d s, mem usage=",
        r"Capture draft extend CUDA graph begin\. backend=full, num_tokens_per_req=5, bs=\[",
        r"Capture draft extend CUDA graph end\. elapsed=",
        r"max_total_num_tokens=",
        r"Engine startup timings \(s\): .*target_verify=\d+\.\d\d, draft_prefill=0\.00, "
        r"draft_decode=\d+\.\d\d, draft_extend=\d+\.\d\d\}",
    ],
}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_draft_worker_starts_after_the_target(tmp_path: Path, version: str) -> None:
    lab = lab_for(tmp_path, version)
    try:
        lines = started(lab, "--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345)
        in_order(lines, DRAFTED[version])
        assert sum("Load weight begin." in line for line in lines) == 2
    finally:
        lab.close()


def bar_total(lines: list[str]) -> int:
    bars = [line for line in lines if "Capturing batches" in line]
    return int(re.search(r"\| 0/(\d+) ", bars[0]).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("version", "max_bs", "spec", "count"),
    [
        ("0.5.9", "96", False, 16),
        ("0.5.23", "160", False, 24),
        ("0.5.9", "256", True, 23),  # speculation: max running requests 48 cut the list
    ],
)
def test_the_capture_bar_counts_sglangs_batch_sizes(
    tmp_path: Path, version: str, max_bs: str, spec: bool, count: int
) -> None:
    lab = lab_for(tmp_path, version)
    args = ["--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345] if spec else []
    try:
        assert bar_total(started(lab, MAX_BS_FLAG[version], max_bs, *args)) == count
    finally:
        lab.close()


def test_no_capture_phase_without_cuda_graphs(tmp_path: Path) -> None:
    lab = lab_for(tmp_path, "0.5.9")
    try:
        out = "\n".join(started(lab, "--disable-cuda-graph"))
        assert "Capture" not in out and "The server is fired up" in out
    finally:
        lab.close()


def jit_rates(lines: list[str]) -> list[float]:
    """The final rate of each DeepGEMM warm-up bar (the stand-in draws its planned figures)."""
    bars = [line for line in lines if "DeepGEMM warmup" in line]
    return [float(re.findall(r"([\d.]+)it/s\]", bar)[-1]) for bar in bars]


def test_deep_gemm_compiles_once_per_cache_dir(tmp_path: Path) -> None:
    lab = lab_for(tmp_path, "0.5.9", jit_s=0.3)
    try:
        cold = started(lab)
        try_lines = [line for line in cold if "Try DeepGEMM JIT Compiling for <GEMM_NT_F8F8BF16> N=" in line]
        assert len(try_lines) == 3 and try_lines[0].endswith(
            "num_groups=1 with all Ms. It only takes a little time (typically 1 sec) if you have run "
            "`python3 -m sglang.compile_deep_gemm`. "
        )
        assert jit_rates(cold) == [16384 / 0.1] * 3  # 0.3 s over three kernels
        assert list((tmp_path / "deep_gemm").glob("standin-*.done"))
        warm = started(lab)  # same cache dir: the same lines, kernels loaded, not compiled
        assert len([line for line in warm if "Try DeepGEMM" in line]) == 3
        assert min(jit_rates(warm)) > 16384 / 0.1 * 4
        lab.env["SGLANG_DG_CACHE_DIR"] = str(tmp_path / "fresh")
        assert jit_rates(started(lab)) == [16384 / 0.1] * 3
    finally:
        lab.close()


def test_an_unwritable_deep_gemm_cache_compiles_every_time(tmp_path: Path) -> None:
    lab = lab_for(tmp_path, "0.5.23", jit_s=0.3)
    (tmp_path / "a-file").write_text("")
    lab.env["SGLANG_DG_CACHE_DIR"] = str(tmp_path / "a-file/deep_gemm")
    try:
        for _ in range(2):
            lines = started(lab)
            assert jit_rates(lines) == [16384 / 0.1] * 3
            assert any("DeepGEMM JIT cache dir" in line and "is not writable" in line for line in lines)
    finally:
        lab.close()


def stalled(lab: Lab, log: Path, *args: str) -> tuple[Server, list[str]]:
    """Start, give the stall time to happen, and return the lines written so far."""
    server = lab.start(*args, log=log)
    time.sleep(1.5)
    assert server.proc.poll() is None
    return server, lines_of(log)


@pytest.mark.parametrize(
    ("stall", "last"),
    [
        ("init", r"TP0\] Init torch distributed begin\.$"),
        ("weights", r"^\rLoading safetensors checkpoint shards: .*\r.*  50% Completed \| 4/8 \[[^\r]*$"),
        ("kv_cache", r"TP0\] Load weight end\. "),
        ("jit", r"^\rDeepGEMM warmup: .*\rDeepGEMM warmup:  50%\|█████     \| 8192/16384 [^\r]*$"),
        ("graphs", r"^\rCapturing batches .*\| 5/10 \[[^\r]*$"),
        ("draft", r"^\rLoading safetensors checkpoint shards:   0% Completed \| 0/1 .*\r.* 1/1 "),
        ("draft_graphs", r"^\rCapturing batches .*\| 6/12 \[[^\r]*$"),
    ],
)
def test_a_stall_stops_all_output_after_its_phase_began(tmp_path: Path, stall: str, last: str) -> None:
    lab = lab_for(tmp_path, "0.5.9", stall=stall)
    spec = ["--speculative-draft-model-path", str(lab.eagle3), *EAGLE3_345] if "draft" in stall else []
    try:
        server, lines = stalled(
            lab, tmp_path / "out.log", "--cuda-graph-max-bs", "16" if spec else "48", *spec
        )
        assert lines[-1] == ""  # the last line was ended, so the journal has it
        assert re.search(last, lines[-2]), lines[-2]
        assert server.status() is None  # port never opened
    finally:
        lab.close()


def test_a_warmup_stall_keeps_health_at_503(tmp_path: Path) -> None:
    lab = lab_for(tmp_path, "0.5.23", stall="warmup")
    try:
        server, lines = stalled(lab, tmp_path / "out.log")
        assert "Uvicorn running on http://" in lines[-2]
        assert server.status() == 503
    finally:
        lab.close()

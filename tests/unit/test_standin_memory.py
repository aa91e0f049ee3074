"""The SGLang stand-in's GPU memory is SGLang's arithmetic, on the lab's real-sized weight files.

The lab's model dirs hold sparse safetensors files with the real checkpoints' tensors. The
stand-in reads their headers, splits them over the TP ranks as SGLang's layers do, and sizes the
KV pool with SGLang's formula per version. The expected figures here are worked out by hand
from the formulas (the source lines are quoted at each), not with the stand-in's code.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import paths
from orchestrator.lab.standins import EAGLE3_DIR, KIMI_DIR, LLAMA_DIR, install, write_model_dir, write_weights
from tests.unit.test_standin_sglang import PYTHON, Lab, kimi_config

H200_MIB = 143771
TORCH_MIB = 143165  # torch's 139.81 GiB of an H200
CONTEXT_MIB = 512  # the stand-in's CUDA context
DIST_MIB = 2048  # its distributed init with more than one rank (NCCL buffers, as a real H200 at TP 8)
GRAPH_MIB, DRAFT_GRAPH_MIB = 820, 160  # what its CUDA graphs take
DRIVER_MIB = 3 + 6  # nvidia-smi's share for a GPU with one process
GIB = 1 << 30
#: Kimi-K2.5's KV cell, MLA: (kv_lora_rank + qk_rope_head_dim) * num_layers * 2 bytes
#: (model_runner_kv_cache_mixin.get_cell_size_per_token; 0.5.23 pool_configurator._compute_cell_size).
KIMI_CELL = (512 + 64) * 61 * 2
#: adjust_mem_fraction_for_vlm for Kimi-K2.5's MoonViT (27 layers of 1152 against ViT-L's 24 of 1024):
#: 0.95 * (1 - 0.1 * (complexity_ratio - 1)).
KIMI_VLM = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
FAST = {"SGLANG_STANDIN_LOAD_DELAY_S": "0.2", "SGLANG_STANDIN_WARMUP_S": "0.1"}
FAST |= {"SGLANG_STANDIN_CAPTURE_S_PER_BS": "0.002", "SGLANG_STANDIN_DRAFT_CAPTURE_S": "0.05"}
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
EAGLE3 += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def kimi_rank_bytes(tp: int) -> int:
    """Kimi-K2.5 on one of `tp` ranks, from its shapes: routed experts (INT4: int32 packs 8, a bf16
    scale per 32 inputs) and everything TP-sharded / tp; MLA's q_a/kv_a projections
    (ReplicatedLinear in deepseek_v2.py), norms, the router, weight_shape, and the vision tower
    except its attention whole."""
    h, bf, i4 = 7168, 2, 4
    expert = 2 * (2048 * h // 8 * i4 + 2048 * h // 32 * bf) + (h * 2048 // 8 * i4 + h * 2048 // 32 * bf)
    experts = 60 * (384 * expert // tp + 384 * 3 * 2 * 4)
    attn_whole = (1536 + 576) * h * bf + (2 * h + 1536 + 512) * bf
    attn_split = (64 * 192 * 1536 + 64 * 256 * 512 + h * 64 * 128) * bf // tp
    dense = 3 * 18432 * h * bf // tp  # layer 0
    moe_rest = 60 * (384 * h * bf + 384 * 4 + 3 * 2048 * h * bf // tp)  # router, bias, shared expert
    vocab = 2 * 163840 * h * bf // tp + h * bf  # embedding, head, final norm
    d, m = 1152, 4304
    block = (4 * d + (3 * d * d + 3 * d) // tp + (d * d + d) // tp + (m * d + m) + (d * m + d)) * bf
    vision = (d * 3 * 14 * 14 + d + 64 * 64 * d) * bf + 27 * block + 4 * d * bf
    projector = (4608 * 4608 + 4608 + 7168 * 4608 + 7168) * bf
    return experts + 61 * (attn_whole + attn_split) + dense + moe_rest + vocab + vision + projector


def eagle3_rank_bytes(tp: int) -> int:
    """The lab's EAGLE-3 drafter on one of `tp` ranks: midlayer sharded (one KV head of 112 per
    rank at TP 8), `fc` (an nn.Linear), norms and the vocab maps whole, the head / tp."""
    h, bf, head = 7168, 2, 112
    attn = (h * 2 * h + h * h) * bf // tp + 2 * max(1, 8 // tp) * head * 2 * h * bf
    return (
        attn
        + 3 * 18432 * h * bf // tp
        + h * 3 * h * bf
        + 4 * h * bf
        + 32000 * h * bf // tp
        + 32000 * 8
        + 163840
    )


def kv_tokens(
    pre_gib: float, weights_gib: float, fraction: float, cell: int, reserve_gib: float = 0.0
) -> int:
    """0.5.9 model_runner_kv_cache_mixin.profile_max_num_token / 0.5.23
    kv_cache_configurator._profile_available_bytes + pool_configurator.calculate_pool_sizes:
        rest_memory = available_gpu_memory - total_gpu_memory * (1 - self.mem_fraction_static)
        return int(rest_memory * (1 << 30)) // cell_size
    (0.5.23 takes `mm_reservation_gb` off rest_memory too)."""
    available = pre_gib - weights_gib
    rest = available - pre_gib * (1 - fraction) - reserve_gib
    return int(rest * (1 << 30)) // cell


def pre_gib(tp: int) -> float:
    """What torch has free before the weights load: its 139.81 GiB less the context and, with more
    than one rank, the distributed init."""
    return (TORCH_MIB - CONTEXT_MIB - (DIST_MIB if tp > 1 else 0)) / 1024


def weightless_used_mib(fraction: float, tp: int = 2) -> int:
    """nvidia-smi's memory.used on each GPU of a started server whose model dir has no weight files
    (Kimi's config, 0.5.9, CUDA graphs, TP `tp`): context and distributed init, the KV pool (tokens
    + 1 padding slot) and graphs."""
    dist = DIST_MIB if tp > 1 else 0
    tokens = kv_tokens(pre_gib(tp), 0.0, fraction, KIMI_CELL)
    return math.ceil(CONTEXT_MIB + dist + (tokens + 1) * KIMI_CELL / (1 << 20) + GRAPH_MIB) + DRIVER_MIB


def kimi_lab(tmp_path: Path, version: str) -> Lab:
    lab = Lab(tmp_path, version=version, gpus=8, models=True)
    lab.target = lab.root / KIMI_DIR
    lab.env |= FAST
    return lab


def run_until_ready(lab: Lab, *args: str) -> str:
    log = lab.root / "server.log"
    server = lab.start(*args, log=log)
    server.wait_ready(timeout=30)
    server.stop()
    return log.read_text()


def holder(lab: Lab, gpu: int, mib: int) -> subprocess.Popen[bytes]:
    """Another process holding `mib` on `gpu` (the lab's gpu-hold), once it holds it."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "nvidia_standin.hold", "--gpu", str(gpu), "--mib", str(mib)],
        env=lab.env,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def line(out: str, pattern: str) -> str:
    found = [ln for ln in out.splitlines() if re.search(pattern, ln)]
    assert found, f"no line matches {pattern!r}"
    return found[0]


# --- the lab's model dirs ------------------------------------------------------------------------


def test_the_lab_installs_real_sized_sparse_checkpoints(tmp_path: Path) -> None:
    tic = time.perf_counter()
    install(tmp_path)
    took = time.perf_counter() - tic
    kimi = tmp_path / KIMI_DIR
    shards = sorted(kimi.glob("*.safetensors"))
    index = json.loads((kimi / "model.safetensors.index.json").read_text())
    apparent = sum(f.stat().st_size for f in shards)
    on_disk = sum(f.stat().st_blocks * 512 for f in shards)
    print(
        f"install: {took:.2f} s; Kimi-K2.5 {apparent / 1e9:.1f} GB apparent, {on_disk / 1e6:.0f} MB on disk"
    )
    assert [f.name for f in shards][:1] == ["model-00001-of-00061.safetensors"] and len(shards) == 61
    assert 590e9 < index["metadata"]["total_size"] < 600e9 and on_disk < 200e6
    with shards[10].open("rb") as f:  # a shard is a real safetensors file: length, JSON header
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    packed = next(v for k, v in header.items() if k.endswith("experts.7.gate_proj.weight_packed"))
    assert (packed["dtype"], packed["shape"]) == ("I32", [2048, 896])
    assert index["weight_map"]["language_model.model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    llama = json.loads((tmp_path / LLAMA_DIR / "model.safetensors.index.json").read_text())
    assert round(llama["metadata"]["total_size"] / 2 / 1e9, 1) == 70.6  # bf16 parameters
    assert (tmp_path / EAGLE3_DIR / "model.safetensors").is_file()


# --- weights and the KV pool, as SGLang computes them ----------------------------------------------


def test_kimi_at_tp4_on_an_h200_dies_loading_its_weights_with_torchs_oom(tmp_path: Path) -> None:
    """140.55 GiB per GPU does not fit the 137.31 GiB torch has free after its context and the
    distributed init. The
    parameter that does not fit is a real one: layer 60's experts' down projections at TP 4 (384 x
    7168 x 2048/8 int32 / 4 = 672 MiB), with what the earlier ones left free."""
    lab = kimi_lab(tmp_path, "0.5.9")
    try:
        result = lab.run("--model-path", str(lab.target), "--tp-size", "4", timeout=60)
    finally:
        lab.close()
    assert result.returncode == 1
    assert (
        "Load weight begin. avail mem=137.31 GB" in result.stdout and "Load weight end" not in result.stdout
    )
    oom = line(result.stderr, r"^torch\.OutOfMemoryError: CUDA out of memory\.")
    found = re.search(
        r"Tried to allocate ([\d.]+) MiB\. GPU 0 has a total capacity of 139\.81 GiB of which ([\d.]+) MiB "
        r"is free\. Including non-PyTorch memory, this process has ([\d.]+) GiB memory in use\.",
        oom,
    )
    assert found, oom
    wanted, free, used = (float(g) for g in found.groups())
    assert wanted == 384 * 7168 * 2048 // 8 * 4 / 4 / (1 << 20) == 672.0
    assert free < wanted and abs(used + free / 1024 - 139.81) < 0.01
    assert "1.99 GiB" not in result.stderr


@pytest.mark.parametrize(
    ("version", "reserved_mb", "reserve_gib"),
    [
        # 0.5.9 server_args._handle_gpu_memory_settings: reserved_mem = 512 + max(chunked_prefill_size
        # 8192, 2048) * 1.5 + cuda_graph_max_bs 512 * 2 + tp_size 8 * pp_size / 8 * 1024
        ("0.5.9", 512 + 8192 * 1.5 + 512 * 2 + 8 / 8 * 1024, 0.0),
        # 0.5.23 memory_hook.handle_gpu_memory_settings: the same, + reserve_for_graph_mb's MLA prefill
        # graphs (1.5 * 1024); the KV budget keeps SGLANG_VLM_CACHE_SIZE_MB (100) for the embedding cache.
        ("0.5.23", 512 + 8192 * 1.5 + 8 / 8 * 1024 + 512 * 2 + 1.5 * 1024, 100 / 1024),
    ],
)
def test_kimi_at_tp8_holds_sglangs_weights_and_kv_tokens(
    tmp_path: Path, version: str, reserved_mb: float, reserve_gib: float
) -> None:
    fraction = round((H200_MIB - reserved_mb) / H200_MIB, 3) * KIMI_VLM  # then x the VLM factor
    pre = pre_gib(8)
    weights = kimi_rank_bytes(8) / GIB
    tokens = kv_tokens(pre, weights, fraction, KIMI_CELL, reserve_gib)
    lab = kimi_lab(tmp_path, version)
    try:
        out = run_until_ready(lab, "--tp-size", "8")
    finally:
        lab.close()
    assert f"mem_fraction_static={fraction!r}," in line(out, r"server_args=ServerArgs")
    assert line(out, r"Load weight end").endswith(
        f"avail mem={pre - weights:.2f} GB, mem usage={weights:.2f} GB."
    )
    dtype = "dtype: torch.bfloat16, " if version == "0.5.23" else ""
    kv = (tokens + 1) * KIMI_CELL / GIB  # page_size 1: one padding slot per layer buffer
    assert line(out, r"KV Cache is allocated").endswith(
        f"KV Cache is allocated. {dtype}#tokens: {tokens}, KV size: {kv:.2f} GB"
    )
    assert f"max_total_num_tokens={tokens}," in out
    print(f"{version}: mem_fraction_static {fraction:.4f}, {weights:.2f} GiB of weights, {tokens} KV tokens")


@pytest.mark.parametrize(
    ("version", "error"),
    [
        # model_runner_kv_cache_mixin.init_memory_pool:
        # f"... Current value: {self.server_args.mem_fraction_static=}"
        (
            "0.5.9",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: self.server_args.mem_fraction_static=0.5",
        ),
        # kv_cache_configurator._profile_available_bytes: minimum = 1 - available / pre
        (
            "0.5.23",
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.5. Raise --mem-fraction-static above {above} (minimum viable = "
            "1 - available/pre = {minimum}). If using speculative decoding, draft weights are now counted.",
        ),
    ],
)
def test_a_mem_fraction_too_small_for_the_weights_is_sglangs_not_enough_memory(
    tmp_path: Path, version: str, error: str
) -> None:
    pre = pre_gib(8)
    minimum = 1 - (pre - kimi_rank_bytes(8) / GIB) / pre
    lab = kimi_lab(tmp_path, version)
    try:
        result = lab.run(
            "--model-path", str(lab.target), "--tp-size", "8", "--mem-fraction-static", "0.5", timeout=60
        )
    finally:
        lab.close()
    assert result.returncode == 1 and "Load weight end" in result.stdout
    expected = error.format(above=f"{math.ceil(minimum * 1000) / 1000:.3f}", minimum=f"{minimum:.4f}")
    assert expected in result.stderr.splitlines()


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_draft_worker_loads_its_weights_and_a_pool_of_the_targets_tokens(
    tmp_path: Path, version: str
) -> None:
    """0.5.9: the draft loads after the target's pool, which its weights do not shrink; its own pool
    holds the target's token count (init_memory_pool: `draft_runner_cache_size`). 0.5.23 loads the
    draft first and sizes one budget for both pools: cell_size + int(cell_size * draft_layers /
    num_layers) (pool_configurator.DefaultPoolConfigurator)."""
    pre = pre_gib(8)
    weights, draft = kimi_rank_bytes(8) / GIB, eagle3_rank_bytes(8) / GIB
    if version == "0.5.9":  # + 2 * 1024 for an EAGLE draft
        fraction = round((H200_MIB - (512 + 8192 * 1.5 + 512 * 2 + 1024 + 2048)) / H200_MIB, 3) * KIMI_VLM
        tokens = kv_tokens(pre, weights, fraction, KIMI_CELL)
    else:
        fraction = round((H200_MIB - (512 + 8192 * 1.5 + 1024 + 512 * 2 + 1536)) / H200_MIB, 3) * KIMI_VLM
        tokens = kv_tokens(pre, weights + draft, fraction, KIMI_CELL + KIMI_CELL // 61, 100 / 1024)
    lab = kimi_lab(tmp_path, version)
    try:
        out = run_until_ready(
            lab, "--tp-size", "8", "--speculative-draft-model-path", str(lab.root / EAGLE3_DIR), *EAGLE3
        )
    finally:
        lab.close()
    draft_end = [ln for ln in out.splitlines() if "Load weight end" in ln][1]
    assert "type=LlamaForCausalLMEagle3" in draft_end and draft_end.endswith(f"mem usage={draft:.2f} GB.")
    k_size = (tokens + 1) * 1 * 112 * 2 / GIB  # one KV head of 112 per rank, one layer
    dtype = "dtype: torch.bfloat16, " if version == "0.5.23" else ""
    pools = [ln for ln in out.splitlines() if "KV Cache is allocated" in ln]
    assert pools[0].endswith(f"{dtype}#tokens: {tokens}, KV size: {(tokens + 1) * KIMI_CELL / GIB:.2f} GB")
    assert pools[1].endswith(f"{dtype}#tokens: {tokens}, K size: {k_size:.2f} GB, V size: {k_size:.2f} GB")


def test_a_foreign_process_shows_in_the_oom_of_a_model_that_does_not_fit(tmp_path: Path) -> None:
    """120 GB held by another process leaves a 40 GiB model no room on that GPU at TP 1."""
    lab = Lab(tmp_path)
    hold = holder(lab, gpu=0, mib=120000)
    try:
        write_weights(
            lab.target, [(f"model.layers.{i}.mlp.down_proj.weight", "BF16", (8192, 65536)) for i in range(40)]
        )
        result = lab.run("--model-path", str(lab.target))
    finally:
        hold.kill()
        hold.wait()
        lab.close()
    assert result.returncode == 1
    # c10's format_size prints MiB up to 1 GiB included
    assert "Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 139.81 GiB" in result.stderr
    assert f"Process {hold.pid} has 117.19 GiB memory in use." in result.stderr


# --- the page cache ----------------------------------------------------------------------------


def drop_cache(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_share(files: list[Path]) -> float:
    """Share of the files in the page cache, as the tool's own mincore(2) reader finds it
    (module_utils modelfiles.resident): a reader apart from the stand-in's."""
    resident, total = paths.module_utils("orchestrator_host.modelfiles").resident([str(f) for f in files])
    assert resident >= 0, "mincore(2) did not answer"
    return resident / total


def load_seconds(out: str) -> float:
    return float(re.search(r"Load weight end\. elapsed=([\d.]+) s", out).group(1))  # type: ignore[union-attr]


def test_a_warm_page_cache_loads_faster_than_a_cold_one(tmp_path: Path) -> None:
    """read_mib_s 128: 128 MiB of weights take 1 s from storage. The load leaves the files in the page
    cache, so the next start reads them at 20000 MiB/s; a read-ahead after the cache was dropped
    (what a tool does before a restart) does the same."""
    lab = Lab(tmp_path)
    write_model_dir(lab.target, kimi_config(), load_delay_s=0.2, warmup_s=0.1, read_mib_s=128)
    write_weights(
        lab.target, [(f"model.layers.{i}.mlp.down_proj.weight", "BF16", (4096, 4096)) for i in range(4)], 4
    )
    files = sorted(lab.target.glob("*.safetensors"))
    try:
        drop_cache(files)
        if cached_share(files) > 0.01:
            pytest.skip("this filesystem keeps the files in memory (tmpfs): no cold start to be had")
        cold = load_seconds(run_until_ready(lab))
        deadline = time.monotonic() + 20
        while cached_share(files) < 0.99 and time.monotonic() < deadline:
            time.sleep(0.05)
        if cached_share(files) < 0.99:
            pytest.skip("reading holes does not fill this filesystem's page cache (tmpfs)")
        warm = load_seconds(run_until_ready(lab))
        drop_cache(files)
        again = load_seconds(run_until_ready(lab))  # cold again: the first start's own fill is running now
        time.sleep(0.5)
        drop_cache(files)
        for f in files:  # the tool's read-ahead
            f.read_bytes()
        ahead = load_seconds(run_until_ready(lab))
    finally:
        lab.close()
    ratio = cold / max(warm, 0.01)
    print(f"cold {cold:.2f} s, warm {warm:.2f} s: {ratio:.0f}x; after a read-ahead {ahead:.2f} s")
    assert cold >= 1.0 and again >= 1.0
    assert warm < 0.2 and ahead < 0.2


def test_cachestat_and_mincore_see_the_same_cached_pages(tmp_path: Path) -> None:
    """cachestat(2) answers where the kernel has it (6.5 on), mincore(2) elsewhere: one figure."""
    import importlib.util

    lab = Lab(tmp_path)
    spec = importlib.util.spec_from_file_location("standin_weights", lab.dist / "sglang/_weights.py")
    assert spec and spec.loader
    weights = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = weights  # dataclasses look their module up there
    spec.loader.exec_module(weights)
    write_weights(lab.target, [("model.layers.0.mlp.down_proj.weight", "BF16", (4096, 4096))])
    path = lab.target / "model.safetensors"
    drop_cache([path])
    with path.open("rb") as f:
        f.read(8 << 20)  # a quarter of its 32 MiB
    mincore = weights.resident_bytes(path, "mincore")
    assert 8 << 20 <= mincore < 16 << 20
    if weights.resident_bytes(path, "cachestat"):
        assert weights.resident_bytes(path, "cachestat") == mincore

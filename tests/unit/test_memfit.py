"""Memory fit (plugins/module_utils/orchestrator_host/memfit.py): will the weights, the KV cache
and the CUDA graphs fit, before a start can fail? Each expected number below is computed the way
SGLang's own code computes it, with the source line cited (the PyPI wheels 0.5.9 and 0.5.23,
python/sglang/srt/...). The weights are built as the model scanner groups real tensor names."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import paths

mf = paths.module_utils("orchestrator_host.memfit")

MIB = 2**20
BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8, "BOOL": 1}
H200_MIB = 143771  # nvidia-smi memory.total
# What SGLang's total_gpu_memory is on an H200 at TP > 1: torch sees 139.81 GiB, the CUDA context
# takes 0.5 GiB, the distributed init 2 GiB (the start-up estimate memfit documents).
H200_FREE_MIB = round(139.81 * 1024) - 512 - 2048
EAGLE3 = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def groups(tensors: Iterator[tuple[str, str, list[int]]]) -> list[dict]:
    """Group (name, dtype, shape) as the scanner does: digits become `*`, layer after `layers.`."""
    out: dict[tuple, dict] = {}
    for name, dtype, shape in tensors:
        parts = name.split(".")
        layer = None
        for i, part in enumerate(parts):
            if part.isdigit():
                if layer is None and i and parts[i - 1] in ("layers", "h", "blocks"):
                    layer = int(part)
                parts[i] = "*"
        key = (".".join(parts), layer, dtype)
        group = out.setdefault(
            key, {"pattern": key[0], "layer": layer, "dtype": dtype, "count": 0, "bytes": 0, "shape": shape}
        )
        group["count"] += 1
        group["bytes"] += math.prod(shape) * BYTES[dtype]
    return list(out.values())


def model(config: dict, tensors: Iterator[tuple[str, str, list[int]]]) -> dict:
    weights = groups(tensors)
    return {"config": config, "weights": weights, "tensor_bytes": sum(g["bytes"] for g in weights)}


# --- Llama-3.3-70B ------------------------------------------------------------------------------

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def llama_tensors() -> Iterator[tuple[str, str, list[int]]]:
    h, inter, vocab = 8192, 28672, 128256
    yield "model.embed_tokens.weight", "BF16", [vocab, h]
    for layer in range(80):
        p = f"model.layers.{layer}."
        yield p + "self_attn.q_proj.weight", "BF16", [h, h]
        yield p + "self_attn.k_proj.weight", "BF16", [1024, h]
        yield p + "self_attn.v_proj.weight", "BF16", [1024, h]
        yield p + "self_attn.o_proj.weight", "BF16", [h, h]
        yield p + "mlp.gate_proj.weight", "BF16", [inter, h]
        yield p + "mlp.up_proj.weight", "BF16", [inter, h]
        yield p + "mlp.down_proj.weight", "BF16", [h, inter]
        yield p + "input_layernorm.weight", "BF16", [h]
        yield p + "post_attention_layernorm.weight", "BF16", [h]
    yield "model.norm.weight", "BF16", [h]
    yield "lm_head.weight", "BF16", [vocab, h]


@functools.cache
def llama() -> dict:
    return model(LLAMA_CONFIG, llama_tensors())


def llama_gpu_bytes(tp: int) -> int:
    """Llama's bytes on one GPU as SGLang splits them (models/llama.py): QKVParallelLinear keeps
    max(1, 8 // tp) KV heads, vocab rows split by TP, norms replicated."""
    h, inter = 8192, 28672
    kv_heads = max(1, 8 // tp)
    layer = 2 * h * h * 2 // tp + 2 * kv_heads * 128 * h * 2 + 3 * inter * h * 2 // tp + 2 * h * 2
    return 2 * (128256 // tp) * h * 2 + 80 * layer + h * 2


# --- Kimi-K2.5 and its EAGLE-3 drafter ----------------------------------------------------------

KIMI_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "first_k_dense_replace": 1,
    "intermediate_size": 18432,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# Kimi-K2.5's config.json: the DeepSeek-V3 text model wrapped with a MoonViT vision tower.
KIMI_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": KIMI_TEXT,
    "vision_config": {"vt_hidden_size": 1152, "vt_num_hidden_layers": 27, "vt_intermediate_size": 4304},
    "tie_word_embeddings": False,
}
# torchspec-project/TorchSpec configs/draft_models/kimi_k25_eagle3.json, with draft_vocab_size.
DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 7168,
    "num_hidden_layers": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 163840,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
EXPERT_PROJS = (("gate_proj", 2048, 7168), ("up_proj", 2048, 7168), ("down_proj", 7168, 2048))


def kimi_tensors() -> Iterator[tuple[str, str, list[int]]]:
    """Kimi-K2.5's tensors with their real names and shapes: INT4 experts as weight_packed
    (I32 [out, in/8]), weight_scale (BF16 [out, in/32]) and weight_shape (I32 [2])."""
    h, lm = 7168, "language_model."
    yield lm + "model.embed_tokens.weight", "BF16", [163840, h]
    yield lm + "lm_head.weight", "BF16", [163840, h]
    yield lm + "model.norm.weight", "BF16", [h]
    for layer in range(61):
        p = f"{lm}model.layers.{layer}."
        yield p + "input_layernorm.weight", "BF16", [h]
        yield p + "post_attention_layernorm.weight", "BF16", [h]
        yield p + "self_attn.q_a_proj.weight", "BF16", [1536, h]
        yield p + "self_attn.q_a_layernorm.weight", "BF16", [1536]
        yield p + "self_attn.q_b_proj.weight", "BF16", [12288, 1536]
        yield p + "self_attn.kv_a_proj_with_mqa.weight", "BF16", [576, h]
        yield p + "self_attn.kv_a_layernorm.weight", "BF16", [512]
        yield p + "self_attn.kv_b_proj.weight", "BF16", [16384, 512]
        yield p + "self_attn.o_proj.weight", "BF16", [h, 8192]
        if layer == 0:
            yield p + "mlp.gate_proj.weight", "BF16", [18432, h]
            yield p + "mlp.up_proj.weight", "BF16", [18432, h]
            yield p + "mlp.down_proj.weight", "BF16", [h, 18432]
            continue
        yield p + "mlp.gate.weight", "BF16", [384, h]
        yield p + "mlp.gate.e_score_correction_bias", "F32", [384]
        for proj, rows, cols in EXPERT_PROJS:
            yield p + f"mlp.shared_experts.{proj}.weight", "BF16", [rows, cols]
            for expert in range(384):
                q = p + f"mlp.experts.{expert}.{proj}."
                yield q + "weight_packed", "I32", [rows, cols // 8]
                yield q + "weight_scale", "BF16", [rows, cols // 32]
                yield q + "weight_shape", "I32", [2]
    yield from vision_tensors()


def vision_tensors() -> Iterator[tuple[str, str, list[int]]]:
    v = "vision_tower.encoder.blocks."
    for block in range(27):
        for name, shape in (
            ("mlp.fc0.weight", [4304, 1152]),
            ("mlp.fc0.bias", [4304]),
            ("mlp.fc1.weight", [1152, 4304]),
            ("mlp.fc1.bias", [1152]),
            ("norm0.weight", [1152]),
            ("norm0.bias", [1152]),
            ("norm1.weight", [1152]),
            ("norm1.bias", [1152]),
            ("wqkv.weight", [3456, 1152]),
            ("wqkv.bias", [3456]),
            ("wo.weight", [1152, 1152]),
            ("wo.bias", [1152]),
        ):
            yield f"{v}{block}.{name}", "BF16", shape
    yield "vision_tower.patch_embed.proj.weight", "BF16", [1152, 3, 14, 14]
    yield "vision_tower.patch_embed.pos_emb.weight", "BF16", [64, 64, 1152]
    yield "mm_projector.proj.0.weight", "BF16", [4608, 4608]
    yield "mm_projector.proj.2.weight", "BF16", [7168, 4608]


def draft_tensors() -> Iterator[tuple[str, str, list[int]]]:
    h = 7168
    for proj in ("q_proj", "k_proj", "v_proj"):
        yield f"midlayer.self_attn.{proj}.weight", "BF16", [8192, 2 * h]
    yield "midlayer.self_attn.o_proj.weight", "BF16", [h, 8192]
    yield "midlayer.mlp.gate_proj.weight", "BF16", [12288, h]
    yield "midlayer.mlp.up_proj.weight", "BF16", [12288, h]
    yield "midlayer.mlp.down_proj.weight", "BF16", [h, 12288]
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        yield f"midlayer.{norm}.weight", "BF16", [h]
    yield "norm.weight", "BF16", [h]
    yield "fc.weight", "BF16", [h, 3 * h]
    yield "lm_head.weight", "BF16", [32000, h]
    yield "d2t", "I64", [32000]
    yield "t2d", "BOOL", [163840]


@functools.cache
def kimi() -> dict:
    return model(KIMI_CONFIG, kimi_tensors())


@functools.cache
def drafter() -> dict:
    return model(DRAFT_CONFIG, draft_tensors())


def kimi_gpu_bytes(tp: int) -> int:
    """Kimi-K2.5's bytes on one GPU as SGLang splits them (models/deepseek_v2.py, kimi_k25.py):
    q_a_proj, kv_a_proj_with_mqa, norms, the router and its bias replicated; q_b_proj, kv_b_proj,
    o_proj, MLPs and experts split by TP; kv_b_proj kept again as bf16 w_kc and w_vc
    (deepseek_weight_loader.py post_load_weights); MoonViT's wqkv and wo split, the rest kept."""
    h = 7168
    attention = (1536 + 576) * h * 2 + (h + h + 1536 + 512) * 2
    attention += (12288 * 1536 + 2 * 16384 * 512 + h * 8192) * 2 // tp
    dense = 3 * 18432 * h * 2 // tp
    experts = 384 * sum(rows * cols // 8 * 4 + rows * cols // 32 * 2 + 8 for _, rows, cols in EXPERT_PROJS)
    moe = 384 * h * 2 + 384 * 4 + (3 * 2048 * h * 2 + experts) // tp
    vision_split = 27 * (3456 * 1152 + 1152 * 1152) * 2
    vision = sum(math.prod(s) * 2 for _, _, s in vision_tensors()) - vision_split + vision_split // tp
    return 2 * (163840 // tp) * h * 2 + h * 2 + 61 * attention + dense + 60 * moe + vision


def draft_load_bytes(tp: int) -> int:
    """The drafter's "Load weight end" on one GPU (models/llama_eagle3.py): its layer split by
    TP, fc (torch.nn.Linear) and norms kept, its own lm_head over 32,000 rows, and the 163,840
    rows of embedding it allocates before set_embed swaps in the target's."""
    h = 7168
    layer = (3 * 8192 * 2 * h + h * 8192 + 3 * 12288 * h) * 2 // tp
    kept = h * 3 * h * 2 + 4 * h * 2
    return layer + kept + (32000 // tp) * h * 2 + (163840 // tp) * h * 2


# --- SGLang's arithmetic, as its code writes it --------------------------------------------------


def profile_tokens(free_mib: int, used: int, fraction: float, cell: int, mm_gib: float = 0.0) -> int:
    """max_total_num_tokens.
    0.5.9 model_runner_kv_cache_mixin.py profile_max_num_token:
        rest_memory = available_gpu_memory - total_gpu_memory * (1 - self.mem_fraction_static)
        return int(rest_memory * (1 << 30)) // cell_size
    0.5.23 kv_cache_configurator.py _profile_available_bytes:
        rest_memory = available_gpu_memory - slack_gb - mm_reservation_gb
    get_available_gpu_memory is free bytes / (1 << 30)."""
    available_gpu_memory = (free_mib * MIB - used) / (1 << 30)
    total_gpu_memory = free_mib / 1024
    rest_memory = available_gpu_memory - total_gpu_memory * (1 - fraction) - mm_gib
    return int(rest_memory * (1 << 30)) // cell


def vlm_factor(layers: int, width: int) -> float:
    """adjust_mem_fraction_for_vlm (0.5.9 server_args.py, 0.5.23 memory_hook.py)."""
    complexity_ratio = layers * (width**2) / (24 * (1024**2))
    dynamic_adjustment_factor = max(0.8, min(1.05, 1.0 - 0.1 * (complexity_ratio - 1.0)))
    return 0.95 * dynamic_adjustment_factor


# --- the formula against SGLang's own ------------------------------------------------------------


@pytest.mark.parametrize("tp", [4, 8])
@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_llama_70b_on_h200_matches_sglang(version: str, tp: int) -> None:
    # H200 (143771 MiB, under 160 GiB): chunked_prefill_size 8192, cuda_graph_max_bs 512 at TP >= 4
    # (0.5.9 server_args.py _handle_gpu_memory_settings; 0.5.23 memory_hook.py, the same table).
    reserved = 512 + max(8192, 2048) * 1.5 + tp * 1 / 8 * 1024
    reserved += 512 * 2  # "reserved_mem += self.cuda_graph_max_bs * 2"
    if version == "0.5.23":
        # reserve_for_graph_mb: the breakable prefill graph, 8 MiB per captured size up to 8192.
        reserved += 58 * 8
    reserved = max(reserved, 10 * 1024)  # "if gpu_mem > 60 * 1024"
    fraction = round((H200_MIB - reserved) / H200_MIB, 3)
    weights = llama_gpu_bytes(tp)
    # get_cell_size_per_token: get_num_kv_heads(tp) * (head_dim + v_head_dim) * num_layers * kv_size
    cell = max(1, 8 // tp) * (128 + 128) * 80 * 2

    r = mf.predict(llama(), None, {"sglang_version": version, "tp_size": tp}, H200_MIB)

    assert r["mem_fraction_static"] == fraction
    assert r["mem_fraction_source"] == f"SGLang {version} default for 140.4 GiB at TP {tp}"
    assert r["weights_mib"] == -(-weights // MIB)
    assert r["kv_cell_bytes"] == cell
    assert r["kv_tokens"] == profile_tokens(H200_FREE_MIB, weights, fraction, cell)
    assert r["kv_tokens"] > 1_000_000
    assert r["problems"] == []


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_kimi_k25_with_eagle3_at_tp8_matches_sglang(version: str) -> None:
    reserved = 512 + 8192 * 1.5 + 8 / 8 * 1024 + 512 * 2
    if version == "0.5.23":
        reserved += 1.5 * 1024  # reserve_for_graph_mb: "MLA backend overhead", prefill graph
    reserved = max(reserved, 10 * 1024)
    if version == "0.5.9":
        reserved += 2 * 1024  # "eagle draft models and cuda graphs"
    # Multimodal: adjust_mem_fraction_for_vlm; KimiK25VisionConfig fills 27 layers of 1152.
    fraction = round((H200_MIB - reserved) / H200_MIB, 3) * vlm_factor(27, 1152)
    cell = (512 + 64) * 61 * 2  # MLA: (kv_lora_rank + qk_rope_head_dim) * num_layers * kv_size
    if version == "0.5.9":
        # The draft worker loads after the target's KV cache (eagle_worker.py): not counted.
        expected = profile_tokens(H200_FREE_MIB, kimi_gpu_bytes(8), fraction, cell)
    else:
        # Drafter loaded first (scheduler.py init_memory_pools); pool_configurator.py adds
        # int(cell * draft_num_layers / num_layers) for the draft pool; 100 MiB for mm caches.
        used = kimi_gpu_bytes(8) + draft_load_bytes(8)
        expected = profile_tokens(H200_FREE_MIB, used, fraction, cell + int(cell * 1 / 61), 100 / 1024)
    server = {"sglang_version": version, "tp_size": 8, "speculative": EAGLE3}

    r = mf.predict(kimi(), drafter(), server, H200_MIB)

    assert r["mem_fraction_static"] == round(fraction, 4)
    assert r["weights_mib"] == -(-kimi_gpu_bytes(8) // MIB)
    assert r["draft_weights_mib"] == -(-draft_load_bytes(8) // MIB)
    assert r["kv_cell_bytes"] == cell
    # The drafter's own pool: 64 KV heads / 8 * (128 + 128) * 1 layer * 2 bytes.
    assert r["draft_kv_cell_bytes"] == 8 * 256 * 2
    assert r["kv_tokens"] == expected
    assert r["kv_tokens"] > r["needs_tokens"] == 262144
    assert r["problems"] == []


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_kimi_k25_at_tp4_is_refused_and_tp8_offered(version: str) -> None:
    server = {"sglang_version": version, "tp_size": 4, "gpus_available": 8, "speculative": EAGLE3}

    r = mf.predict(kimi(), drafter(), server, H200_MIB)

    weights = -(-kimi_gpu_bytes(4) // MIB) + (-(-draft_load_bytes(4) // MIB) if version == "0.5.23" else 0)
    assert weights > H200_FREE_MIB
    [problem] = r["problems"]
    assert problem.startswith(f"weights {weights / 1024:.2f} GiB per GPU at TP 4 > 137.31 GiB free")
    assert "554.27 GiB in total" in problem
    at_tp8 = mf.predict(kimi(), drafter(), {**server, "tp_size": 8}, H200_MIB)
    assert at_tp8["problems"] == []
    at_tp8_gib = -(-kimi_gpu_bytes(8) // MIB) / 1024
    assert r["fixes"] == [
        f"tp_size 8 fits: weights {at_tp8_gib:.2f} GiB per GPU, KV ~{at_tp8['kv_tokens']:,} tokens"
    ]


def test_a_small_fraction_leaves_too_little_kv_and_names_a_fraction_that_fits() -> None:
    """Refused where the profile asks for the context; with the model's own it is a note, as SGLang
    starts and caps each request's input to the pool."""
    server = {"sglang_version": "0.5.9", "tp_size": 8, "mem_fraction_static": 0.13}
    tokens = profile_tokens(H200_FREE_MIB, llama_gpu_bytes(8), 0.13, 40960)
    assert 0 < tokens < 131072

    own = mf.predict(llama(), None, server, H200_MIB)
    assert own["problems"] == [] and own["notes"] == [
        f"KV cache {tokens:,} tokens < the model's context length 131,072: SGLang starts, and caps a "
        "request's input to fit (set server.context_length to require more)"
    ]

    server["context_length"] = 131072
    r = mf.predict(llama(), None, server, H200_MIB)
    assert r["problems"] == [
        f"KV cache {tokens:,} tokens < context length 131,072: longer requests are refused"
    ]
    fraction = next(f for f in r["fixes"] if f.startswith("mem_fraction_static "))
    value = float(fraction.split()[1])
    assert mf.predict(llama(), None, {**server, "mem_fraction_static": value}, H200_MIB)["problems"] == []
    assert any(f.startswith("context_length ") for f in r["fixes"])


def test_no_room_outside_the_static_pool_is_refused_with_a_fix() -> None:
    server = {"sglang_version": "0.5.9", "tp_size": 8, "speculative": EAGLE3, "mem_fraction_static": 0.97}

    r = mf.predict(kimi(), drafter(), server, H200_MIB)

    [problem] = r["problems"]
    assert "outside the static pool" in problem
    assert "drafter weights and KV" in problem
    assert r["outside_mib"] < r["outside_need_mib"]
    assert any(f.startswith("mem_fraction_static 0.9") for f in r["fixes"])


# --- calibration and the server's log lines ------------------------------------------------------

LINES_059 = [
    # model_runner.py 899: f"Load weight begin. avail mem={...:.2f} GB"
    "[2026-01-05 10:00:01 TP0] Load weight begin. avail mem=137.29 GB",
    "[2026-01-05 10:00:01 TP1] Load weight begin. avail mem=137.25 GB",
    # model_runner.py 1041: "Load weight end. elapsed=, type=, dtype=, avail mem=, mem usage="
    "[2026-01-05 10:01:30 TP0] Load weight end. elapsed=89.12 s, type=KimiK25ForConditionalGeneration, "
    "dtype=torch.bfloat16, avail mem=65.40 GB, mem usage=71.89 GB.",
    "[2026-01-05 10:01:30 TP1] Load weight end. elapsed=89.20 s, type=KimiK25ForConditionalGeneration, "
    "dtype=torch.bfloat16, avail mem=65.30 GB, mem usage=71.95 GB.",
    # mem_cache/memory_pool.py 658: f"KV Cache is allocated. #tokens: {n}, KV size: {x:.2f} GB"
    "[2026-01-05 10:01:31 TP0] KV Cache is allocated. #tokens: 580000, KV size: 37.96 GB",
    "[2026-01-05 10:01:31 TP1] KV Cache is allocated. #tokens: 580000, KV size: 37.96 GB",
    # model_runner.py 2162: "Capture cuda graph end. Time elapsed: ... s. mem usage=... GB. avail mem=..."
    "[2026-01-05 10:02:40 TP0] Capture cuda graph end. Time elapsed: 69.00 s. mem usage=0.80 GB. "
    "avail mem=25.1 GB.",
    # The draft worker after the target: its own weights, KV pool (memory_pool.py 652) and graphs.
    "[2026-01-05 10:02:41 TP0] Load weight begin. avail mem=25.00 GB",
    "[2026-01-05 10:02:45 TP0] Load weight end. elapsed=4.10 s, type=LlamaForCausalLMEagle3, "
    "dtype=torch.bfloat16, avail mem=24.20 GB, mem usage=0.80 GB.",
    "[2026-01-05 10:02:45 TP0] KV Cache is allocated. #tokens: 580000, K size: 1.11 GB, V size: 1.11 GB",
    # speculative/eagle_worker.py 256 and 271
    "[2026-01-05 10:03:20 TP0] Capture draft cuda graph end. Time elapsed: 30.00 s. "
    "mem usage=0.10 GB. avail mem=21.9 GB.",
    "[2026-01-05 10:03:50 TP0] Capture draft extend cuda graph end. Time elapsed: 30.00 s. "
    "mem usage=0.06 GB. avail mem=21.8 GB.",
]
LINES_0523 = [
    # model_runner.py 1274: f"Load weight begin. avail mem={...:.2f} GB"
    "[2026-01-05 10:00:01 TP0] Load weight begin. avail mem=137.29 GB",
    # model_runner.py 1373: "Load weight end. elapsed=, type=, [quantization, ]avail mem=, mem usage="
    "[2026-01-05 10:01:30 TP0] Load weight end. elapsed=89.12 s, type=KimiK25ForConditionalGeneration, "
    "quant=compressed-tensors, avail mem=65.40 GB, mem usage=71.89 GB.",
    "[2026-01-05 10:01:35 TP0] Load weight end. elapsed=4.10 s, type=LlamaForCausalLMEagle3, "
    "avail mem=64.60 GB, mem usage=0.80 GB.",
    # mem_cache/memory_pool.py 2097 (MLA), 2089 (K and V): "KV Cache is allocated. dtype: ..., #tokens:"
    "[2026-01-05 10:01:36 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 570000, "
    "KV size: 37.30 GB",
    "[2026-01-05 10:01:36 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 570000, "
    "K size: 1.09 GB, V size: 1.09 GB",
    # cuda_graph_setup.py 791: "Capture {name} CUDA graph end. bs=, elapsed=, mem usage=, avail mem="
    "[2026-01-05 10:02:40 TP0] Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 48], elapsed=60.00 s, "
    "mem usage=0.80 GB, avail mem=20.10 GB.",
    # cuda_graph_setup.py 696: the breakable prefill graph
    "[2026-01-05 10:02:50 TP0] Capture target prefill CUDA graph end. elapsed=9.00 s, mem usage=1.20 GB, "
    "avail mem=18.90 GB.",
    # speculative/eagle_worker_v2.py 533 and 654
    "[2026-01-05 10:03:20 TP0] Capture draft decode CUDA graph end. elapsed=30.00 s, mem usage=0.10 GB, "
    "avail mem=18.80 GB.",
    "[2026-01-05 10:03:50 TP0] Capture draft extend CUDA graph end. elapsed=30.00 s, mem usage=0.06 GB, "
    "avail mem=18.70 GB.",
]


def test_parse_memory_lines_reads_both_versions() -> None:
    old = mf.parse_memory_lines(["server_args=ServerArgs(mem_fraction_static=0.802, tp_size=8)", *LINES_059])
    new = mf.parse_memory_lines(LINES_0523)

    assert old == {
        "weights_mib": round(71.95 * 1024),  # the fullest rank
        "draft_weights_mib": round(0.80 * 1024),
        "kv_tokens": 580000,
        "draft_kv_tokens": 580000,
        "graph_mib": round(0.80 * 1024),
        "draft_graph_mib": round(0.10 * 1024) + round(0.06 * 1024),
        "baseline_mib": round(137.25 * 1024),  # the emptiest rank
        "mem_fraction_static": 0.802,
    }
    assert new["weights_mib"] == round(71.89 * 1024)
    assert new["draft_weights_mib"] == round(0.80 * 1024)
    assert (new["kv_tokens"], new["draft_kv_tokens"]) == (570000, 570000)
    assert new["graph_mib"] == round(0.80 * 1024) + round(1.20 * 1024)
    assert new["draft_graph_mib"] == round(0.10 * 1024) + round(0.06 * 1024)
    assert new["mem_fraction_static"] is None
    assert mf.parse_memory_lines([]) == dict.fromkeys(old)


def test_calibration_uses_the_measured_figures() -> None:
    server = {"sglang_version": "0.5.9", "tp_size": 8, "speculative": EAGLE3}
    plain = mf.predict(kimi(), drafter(), server, H200_MIB)
    logged = mf.parse_memory_lines(LINES_059)

    r = mf.predict(kimi(), drafter(), server, H200_MIB, calibration=logged)

    assert (plain["calibrated"], r["calibrated"]) == (False, True)
    assert r["weights_mib"] == logged["weights_mib"] != plain["weights_mib"]
    assert r["draft_weights_mib"] == logged["draft_weights_mib"]
    assert r["graph_mib"] == logged["graph_mib"] + logged["draft_graph_mib"]
    assert r["baseline_mib"] == logged["baseline_mib"]
    # The default fraction at TP 8 with a drafter (reserved 16,896 MiB), scaled for the vision tower.
    fraction = round((H200_MIB - 16896) / H200_MIB, 3) * vlm_factor(27, 1152)
    expected = profile_tokens(logged["baseline_mib"], logged["weights_mib"] * MIB, fraction, 70272)
    assert abs(r["kv_tokens"] - expected) <= 1


def test_calibration_without_the_begin_line_gives_back_the_measured_tokens() -> None:
    server = {"sglang_version": "0.5.23", "tp_size": 8}
    fraction = mf.predict(llama(), None, server, H200_MIB)["mem_fraction_static"]
    measured = {"weights_mib": 17100, "kv_tokens": 2_700_000, "mem_fraction_static": fraction}

    r = mf.predict(llama(), None, server, H200_MIB, calibration=measured)
    lower = mf.predict(llama(), None, {**server, "mem_fraction_static": 0.8}, H200_MIB, calibration=measured)

    assert r["weights_mib"] == 17100
    assert abs(r["kv_tokens"] - 2_700_000) <= 64
    assert lower["kv_tokens"] < r["kv_tokens"]


# --- properties ----------------------------------------------------------------------------------

SERVERS = st.fixed_dictionaries(
    {
        "sglang_version": st.sampled_from(["0.5.9", "0.5.23"]),
        "tp_size": st.integers(1, 64),
        "pp_size": st.integers(1, 4),
        "dp_size": st.integers(1, 8),
        "ep_size": st.integers(1, 8),
        "enable_dp_attention": st.booleans(),
        "mem_fraction_static": st.none() | st.floats(0.01, 0.99),
        "context_length": st.none() | st.integers(1, 1_048_576),
        "kv_cache_dtype": st.sampled_from(["auto", "fp8_e4m3", "fp8_e5m2", "bf16", "fp4_e2m1"]),
        "cuda_graph": st.booleans(),
        "cuda_graph_max_bs": st.none() | st.integers(1, 1024),
        "max_running_requests": st.none() | st.integers(1, 4096),
        "gpus_available": st.integers(1, 64),
        "speculative": st.none()
        | st.fixed_dictionaries(
            {
                "algorithm": st.sampled_from(["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]),
                "num_steps": st.integers(1, 8),
                "eagle_topk": st.integers(1, 8),
                "num_draft_tokens": st.integers(1, 64),
            }
        ),
    }
)
GPUS = st.sampled_from([16384, 24576, 46068, 81559, H200_MIB, 196608])


@settings(max_examples=200, deadline=None)
@given(server=SERVERS, gpu=GPUS, with_draft=st.booleans())
def test_predict_never_raises_and_every_problem_is_a_line(server: dict, gpu: int, with_draft: bool) -> None:
    r = mf.predict(llama(), drafter() if with_draft else None, server, gpu)

    assert r["kv_tokens"] >= 0
    assert all(isinstance(p, str) and "\n" not in p for p in r["problems"] + r["fixes"])
    assert not r["fixes"] or r["problems"]


@settings(max_examples=200, deadline=None)
@given(server=SERVERS, gpu=GPUS, tp=st.integers(1, 63))
def test_weights_per_gpu_never_grow_with_tp(server: dict, gpu: int, tp: int) -> None:
    small = mf.predict(llama(), None, {**server, "tp_size": tp}, gpu)
    large = mf.predict(llama(), None, {**server, "tp_size": tp + 1}, gpu)

    assert large["weights_mib"] <= small["weights_mib"]

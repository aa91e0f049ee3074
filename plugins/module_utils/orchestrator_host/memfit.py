"""GPU memory per GPU of one SGLang start, predicted before anything stops.

A failed start costs two restarts: the old server is already stopped when the new one dies at
weight load, at the KV cache or at the CUDA graph capture. `predict` does SGLang's own
arithmetic on the model's tensor headers and config.json. It gives the weights per GPU, the
static pool, the KV cache in tokens, the CUDA graph estimate, and one line per problem with a
fix that its own arithmetic says fits. `parse_memory_lines` reads what the server printed on its
last start, and `predict(..., calibration=...)` uses those measured figures instead.

Pure arithmetic on dicts: Python 3.9 standard library, no I/O. Sizes are MiB (ints) inside;
messages print GiB (2**30 bytes) as SGLang does.

What SGLang does, and where it was read (the PyPI wheels sglang 0.5.9 and 0.5.23,
python/sglang/srt/...):

Start-up memory. `total_gpu_memory` in SGLang is not the GPU's size: it is the memory free
after the CUDA context and the distributed init (0.5.9 model_runner.py init_torch_distributed,
`min_per_gpu_memory`; 0.5.23 distributed/bootstrap.py measure_pre_model_load_memory). We call it
the baseline. torch sees 139.81 GiB of an H200's 143,771 MiB (nvidia-smi), so 0.42 % goes to the
driver. The CUDA context takes 0.5 GiB. The distributed init took 2.0 GiB per GPU at TP 8 on an
H200 (log in sgl-project/sglang PR 11716: "Init torch distributed ends. mem usage=2.01 GB",
then "Load weight begin. avail mem=137.29 GB"). These three are estimates. A calibration
replaces them with the logged "Load weight begin. avail mem=".

mem_fraction_static default (0.5.9 server_args.py ServerArgs._handle_gpu_memory_settings;
0.5.23 arg_groups/memory_hook.py handle_gpu_memory_settings and reserve_for_graph_mb):
reserved MiB = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs
+ 1024 x tp x pp / 8 (+ dp-attention terms), at least 10 GiB on GPUs over 60 GiB;
fraction = round((gpu MiB - reserved) / gpu MiB, 3), gpu MiB as nvidia-smi prints it.
chunked_prefill_size and cuda_graph_max_bs come from tables by GPU memory and TP size.
Multimodal models scale the fraction by adjust_mem_fraction_for_vlm (0.95 x a factor from the
vision tower's layers and width: 0.9097 for Kimi-K2.5's MoonViT).

KV tokens (0.5.9 model_runner_kv_cache_mixin.py profile_max_num_token and
get_cell_size_per_token; 0.5.23 mem_cache/kv_cache_configurator.py _profile_available_bytes
and model_executor/pool_configurator.py): rest = free after the weights - baseline x
(1 - fraction); tokens = int(rest GiB x 2**30) // cell bytes. The cell is
(kv_lora_rank + qk_rope_head_dim) x layers x dtype bytes for MLA, not split by TP, and
max(1, kv_heads // attention TP) x (head_dim + v_head_dim) x layers x dtype bytes otherwise.
With pipeline stages each stage profiles its own layers; the smallest count wins.

What differs between the two versions:
- The drafter. In 0.5.9 the draft worker is built after the target's KV cache and CUDA graphs
  (speculative/eagle_worker.py EAGLEWorker.__init__). Its weights and its own KV pool
  (draft_runner_cache_size = the target's token count, with the drafter's own heads and layers)
  come out of the part outside the static pool. The default fraction leaves 2 GiB for that
  (6 GiB for STANDALONE). In 0.5.23 the drafter loads before the target's KV cache is sized
  (managers/scheduler.py init_memory_pools), so its weights count inside the static pool. The
  target's cell grows by int(target cell x draft layers / target layers) for the draft pool
  (pool_configurator.py). That assumes the drafter's KV per layer equals the target's. An
  EAGLE-3 drafter of an MLA target (MHA, 64 KV heads for Kimi-K2.5) needs more; the rest comes
  out of the part outside the pool.
- CUDA graphs. 0.5.23 also captures a "breakable" prefill graph by default (not with PP, nor
  for multimodal models off its list). Its reserve is 8 MiB per captured prefill size, or
  1.5 GiB for MLA. 0.5.23 adds nothing for speculative decoding.
- 0.5.23 keeps 100 MiB of the KV budget for a multimodal model's caches
  (mm_runtime_reservation_gb). It caps max_running_requests at tokens // 2
  (resolve_max_num_reqs), and it caps a default cuda_graph_max_bs at a given
  max_running_requests.
- GPUs of 20 to 35 GiB: 0.5.23 uses chunked prefill 4096 and max batch 48 / 160.
Versions below 0.5.20 follow 0.5.9; from 0.5.20 on, 0.5.23. The versions between were not read.

Weights per GPU follow the model code: TP-sharded linear layers; vocab-parallel embedding and
lm_head (rows padded to 64, then split); replicated norms, row-parallel biases, the MoE router
and its e_score_correction_bias, and MLA's q_a_proj and kv_a_proj_with_mqa (ReplicatedLinear in
models/deepseek_v2.py). K and V projections keep max(1, kv_heads // TP) heads per GPU. Experts
split by TP; with expert parallelism each GPU holds 1/ep of the experts split by TP / ep, the
same bytes. MLA models keep bf16 copies of kv_b_proj as w_kc and w_vc
(models/deepseek_common/deepseek_weight_loader.py post_load_weights). Vision towers are
replicated (Kimi-VL's MoonViT uses nn.Linear). Kimi-K2.5's MoonViT splits its attention
(wqkv, wo) by TP (models/kimi_k25.py, VisionAttention); its MLP and projector are replicated.
Pipeline stages split the layers as distributed/utils.py get_pp_indices does; the embedding
sits on the first stage, the lm_head on the last.

The EAGLE drafter (models/llama_eagle3.py): TP-sharded layer, replicated fc (torch.nn.Linear),
own lm_head over draft_vocab_size. Its embedding is allocated at load, then replaced by the
target's (set_embed) and freed. The drafter's "Load weight end" therefore includes it.

CUDA graphs and activations are estimates; nothing in SGLang computes them ahead. Graphs: 2 MiB
per token of the largest captured batch, per graph family (target decode or verify, draft
decode, draft extend). That is SGLang's own reserve unit (2 x cuda_graph_max_bs). Captured
batches stop at the request pool's size (model_executor/cuda_graph_runner.py
get_batch_sizes_to_capture): 48 with speculative decoding. Activations: the largest prefill
chunk's working set, from the model's widths, doubled for the caching allocator. SGLang's own
1.5 MiB per token is a reserve for its default fraction, not a measurement; we only use it
there. Calibration replaces the graph estimate with the logged capture figures.
"""

from __future__ import annotations

import math
import re
from typing import Any

MIB = 1 << 20
GIB_MIB = 1024
#: nvidia-smi's MiB of an H200 and what torch sees of it (139.81 GiB): the driver's share.
SMI_H200_MIB = 143771
TORCH_H200_MIB = round(139.81 * 1024)
CONTEXT_MIB = 512
#: The distributed init per GPU with more than one rank (NCCL, custom all-reduce buffers).
DIST_INIT_MIB = 2048
#: SGLang's "constant meta data (e.g., from attention backend)" in its reserve.
FIXED_RUNTIME_MIB = 512
VOCAB_PADDING = 64
MAX_PREFILL_TOKENS = 16384
DTYPE_BYTES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "U16": 2,
    "I32": 4,
    "U32": 4,
    "I64": 8,
    "U64": 8,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
VISION_PREFIXES = (
    "vision_tower.",
    "vision_model.",
    "visual.",
    "mm_projector.",
    "multi_modal_projector.",
    "vision_embed",
    "image_newline",
)
ROW_PARALLEL = frozenset(("o_proj", "down_proj", "dense", "out_proj", "c_proj", "w2", "wo"))
REPLICATED_MODULES = frozenset(("q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa"))
VOCAB_MODULES = frozenset(("embed_tokens", "lm_head", "wte", "word_embeddings"))
#: 0.5.9 configs/model_config.py: multimodal unless the architecture is one of these.
MM_DISABLED = frozenset(
    ("Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration", "Step3VLForConditionalGeneration")
)
#: 0.5.23 configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs.
MM_PREFILL_GRAPH = frozenset(
    (
        "MiniMaxM3SparseForConditionalGeneration",
        "Cohere2VisionForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "MiniMaxM3SparseForCausalLM",
    )
)
#: 0.5.9 server_args.py auto_choose_speculative_params: (steps, topk, draft tokens).
SPEC_DEFAULTS_WIDE = frozenset(("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"))
EAGLE_FAMILY = frozenset(("EAGLE", "EAGLE3", "NEXTN"))
DRAFT_WORKERS = frozenset(("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"))


# --- small helpers ------------------------------------------------------------------------------


def gib(mib: float, digits: int = 2) -> str:
    """MiB as SGLang prints GiB: `140.62`."""
    return f"{mib / GIB_MIB:.{digits}f}"


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return default
    return int(value)


def _text(config: dict) -> dict:
    """The language model's config: text_config when the checkpoint wraps one (Kimi-K2.5)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner else config


def _arch(config: dict) -> str:
    for source in (config, _text(config)):
        archs = source.get("architectures")
        if isinstance(archs, list) and archs:
            return str(archs[0])
    return ""


def _dtype_bytes(config: dict) -> int:
    for source in (_text(config), config):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.replace("torch.", "") in TORCH_DTYPE_BYTES:
                return TORCH_DTYPE_BYTES[value.replace("torch.", "")]
    return 2


def _version_rule(version: Any) -> str:
    """'0.5.9' or '0.5.23': the version whose source this prediction follows."""
    parts = re.findall(r"\d+", str(version))[:3]
    numbers = tuple(int(p) for p in parts) + (0,) * (3 - len(parts))
    return "0.5.9" if numbers < (0, 5, 20) else "0.5.23"


def _is_mla(text: dict) -> bool:
    return bool(text.get("kv_lora_rank")) and bool(text.get("qk_rope_head_dim"))


def _num_experts(text: dict) -> int:
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        value = _int(text.get(key), 0)
        if value > 0:
            return value
    return 0


class _Dims:
    """The widths of a language model that the arithmetic needs, read once."""

    def __init__(self, config: dict) -> None:
        text = _text(config)
        self.arch = _arch(config)
        self.hidden = max(1, _int(text.get("hidden_size"), 4096))
        self.layers = max(1, _int(text.get("num_hidden_layers"), 1))
        self.heads = max(1, _int(text.get("num_attention_heads"), 32))
        self.kv_heads = max(1, _int(text.get("num_key_value_heads"), self.heads))
        self.head_dim = max(1, _int(text.get("head_dim"), self.hidden // self.heads or 1))
        self.mla = _is_mla(text)
        self.kv_lora_rank = _int(text.get("kv_lora_rank"), 0)
        self.rope_dim = _int(text.get("qk_rope_head_dim"), 0)
        self.nope_dim = _int(text.get("qk_nope_head_dim"), 0)
        self.v_dim = _int(text.get("v_head_dim"), self.head_dim)
        self.inter = max(1, _int(text.get("intermediate_size"), 4 * self.hidden))
        self.experts = _num_experts(text)
        self.topk = max(1, _int(text.get("num_experts_per_tok"), 1))
        self.moe_inter = max(1, _int(text.get("moe_intermediate_size"), self.inter))
        self.shared = _int(text.get("n_shared_experts"), 0)
        self.vocab = max(1, _int(text.get("vocab_size"), 32000))
        self.dtype_bytes = _dtype_bytes(config)
        self.tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
        self.nextn = _int(text.get("num_nextn_predict_layers"), 0)
        self.context = _context_length(text)
        self.vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else None


def _context_length(text: dict) -> int:
    """SGLang's get_context_length (utils/hf_transformers_utils.py)."""
    scaling = text.get("rope_scaling")
    factor = 1.0
    if isinstance(scaling, dict) and scaling:
        factor = float(scaling.get("factor", 1) or 1)
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1.0
    for key in (
        "max_sequence_length",
        "seq_length",
        "max_seq_len",
        "model_max_length",
        "max_position_embeddings",
    ):
        value = text.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(factor * value)
    return 2048


# --- start-up memory ----------------------------------------------------------------------------


def baseline_mib(gpu_total_mib: int, world_size: int) -> int:
    """The memory free per GPU before the weights load: SGLang's `total_gpu_memory`.

    nvidia-smi's total, less the driver's share, the CUDA context and the distributed init."""
    driver = round(gpu_total_mib * (SMI_H200_MIB - TORCH_H200_MIB) / SMI_H200_MIB)
    dist = DIST_INIT_MIB if world_size > 1 else 0
    return max(1, gpu_total_mib - driver - CONTEXT_MIB - dist)


def _defaults_by_gpu(rule: str, gpu_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) that SGLang picks by GPU memory and TP size."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        if rule == "0.5.9":
            return 2048, 24 if tp < 4 else 80
        return 4096, 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _vlm_factor(vision: dict | None, arch: str) -> float:
    """adjust_mem_fraction_for_vlm's factor (0.5.9 server_args.py; 0.5.23 memory_hook.py)."""
    if vision is None:
        return 1.0
    kimi_k25 = arch == "KimiK25ForConditionalGeneration"
    layers = vision.get("num_hidden_layers", vision.get("vt_num_hidden_layers"))
    width = vision.get("hidden_size", vision.get("vt_hidden_size"))
    # KimiK25VisionConfig fills 27 layers of 1152 when config.json names neither (configs/kimi_k25.py).
    layers = _int(layers, 27 if kimi_k25 else 24)
    width = _int(width, 1152 if kimi_k25 else 1024)
    ratio = layers * width**2 / (24 * 1024**2)
    dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return 0.95 * dynamic


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many prefill sizes 0.5.23 captures (cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return len([s for s in sizes if s <= max_bs])


# --- the server's settings, resolved as SGLang resolves them ------------------------------------


class _Setup:
    """The server dict with SGLang's defaults filled in for one GPU type and version.

    The constructor runs long: it is the one place for every default SGLang fills in."""

    def __init__(self, server: dict, dims: _Dims, gpu_total_mib: int) -> None:
        self.version = str(server.get("sglang_version") or "0.5.23")
        self.rule = _version_rule(self.version)
        self.gpu_mib = max(1, _int(gpu_total_mib, 1))
        self.tp = max(1, _int(server.get("tp_size"), 1))
        self.pp = max(1, _int(server.get("pp_size"), 1))
        self.dp = max(1, _int(server.get("dp_size"), 1))
        self.dp_attention = bool(server.get("enable_dp_attention")) and self.dp > 1
        self.attn_tp = max(1, self.tp // self.dp) if self.dp_attention else self.tp
        self.gpus_available = max(0, _int(server.get("gpus_available"), self.tp * self.pp))
        self.kv_dtype = str(server.get("kv_cache_dtype") or "auto")
        self.cuda_graph = server.get("cuda_graph", True) is not False
        self.max_running = _positive(server.get("max_running_requests"))
        self.max_total_tokens = _positive(server.get("max_total_tokens"))
        self.page_size = _positive(server.get("page_size")) or 1
        self.context = _positive(server.get("context_length")) or dims.context
        #: The profile asks for this context (else it is the model's, which SGLang caps to fit).
        self.context_set = bool(_positive(server.get("context_length")))
        chunked_default, bs_default = _defaults_by_gpu(self.rule, self.gpu_mib, self.tp)
        chunked = server.get("chunked_prefill_size")
        self.chunked = _int(chunked, chunked_default) if chunked is not None else chunked_default
        user_bs = _positive(server.get("cuda_graph_max_bs"))
        self.max_bs = user_bs or bs_default
        if self.rule == "0.5.23" and user_bs is None and self.max_running is not None:
            # memory_hook.py caps a default max batch at a given max_running_requests.
            self.max_bs = min(self.max_bs, self.max_running)
        self.spec = _speculative(server.get("speculative"), dims.arch)
        self.multimodal = dims.vision is not None and dims.arch not in MM_DISABLED
        self.prefill_graph = (
            self.rule == "0.5.23"
            and self.cuda_graph
            and self.pp == 1
            and (not self.multimodal or dims.arch in MM_PREFILL_GRAPH)
        )
        fraction = server.get("mem_fraction_static")
        if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 < fraction < 1:
            self.fraction = float(fraction)
            self.fraction_source = "profile"
        else:
            self.fraction = _default_fraction(self, dims)
            what = f"SGLang {self.version} default for {gib(self.gpu_mib, 1)} GiB at TP {self.tp}"
            extras = [w for w, on in (("speculative", self.spec), ("multimodal", self.multimodal)) if on]
            self.fraction_source = ", ".join([what, *extras])
        if self.spec is not None and self.max_running is None and self.spec["algorithm"] != "OTHER":
            self.max_running = 48  # server_args _handle_speculative_decoding, both versions


def _positive(value: Any) -> int | None:
    number = _int(value, 0)
    return number if number > 0 else None


def _speculative(spec: Any, arch: str) -> dict | None:
    """The speculative settings with SGLang's defaults (auto_choose_speculative_params)."""
    if not isinstance(spec, dict) or not spec.get("algorithm"):
        return None
    algorithm = str(spec["algorithm"]).upper()
    if algorithm not in DRAFT_WORKERS and algorithm != "NGRAM":
        algorithm = "OTHER"
    steps = _positive(spec.get("num_steps"))
    topk = _positive(spec.get("eagle_topk"))
    tokens = _positive(spec.get("num_draft_tokens"))
    if steps is None or topk is None or tokens is None:
        steps, topk, tokens = (5, 4, 8) if arch in SPEC_DEFAULTS_WIDE else (3, 1, 4)
        if algorithm == "STANDALONE":
            steps, topk, tokens = 3, 1, 4
    if topk == 1:
        tokens = steps + 1  # SGLang overrides it silently
    return {"algorithm": algorithm, "num_steps": steps, "eagle_topk": topk, "num_draft_tokens": tokens}


def _default_fraction(setup: _Setup, dims: _Dims) -> float:
    """SGLang's mem_fraction_static when none is given, as its server_args computes it."""
    gpu = setup.gpu_mib
    activation_tokens = max(setup.chunked, 2048) if setup.chunked > 0 else max(MAX_PREFILL_TOKENS, 2048)
    reserved = 512 + activation_tokens * 1.5 + setup.tp * setup.pp / 8 * 1024
    bs = setup.max_bs
    dp_terms = 0.0
    if setup.dp_attention:
        dp_terms = bs * setup.dp * 3 + (bs * setup.dp * 1.5 if bs > 300 else 0)
    if setup.rule == "0.5.9":
        # cuda_graph_max_bs counts even with CUDA graphs off: 0.5.9 does not look.
        reserved += bs * 2 + dp_terms
        if gpu > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        if setup.spec is not None:
            algorithm = setup.spec["algorithm"]
            reserved += 6 * 1024 if algorithm == "STANDALONE" else 0 if algorithm == "NGRAM" else 2 * 1024
    else:
        graph = (bs * 2 if setup.cuda_graph else 0) + dp_terms
        if setup.prefill_graph:
            prefill_max = min(8192, setup.chunked) if dims.mla else setup.chunked
            graph += 1.5 * 1024 if dims.mla else _prefill_graph_sizes(prefill_max) * 8
        reserved += graph
        if gpu > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
    fraction = round((gpu - reserved) / gpu, 3)
    if setup.multimodal:
        fraction *= _vlm_factor(dims.vision, dims.arch)
    return fraction


# --- weights per GPU ----------------------------------------------------------------------------


def _strip_wrapper(name: str) -> str:
    """The text model's tensor name inside a multimodal wrapper."""
    if name.startswith("language_model."):
        return name[len("language_model.") :]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return name


def _is_vision(name: str) -> bool:
    bare = name[len("model.") :] if name.startswith("model.") else name
    return bare.startswith(VISION_PREFIXES)


def _kind(name: str, arch: str, draft: bool) -> str:
    """How SGLang places one tensor: skip, replicated, vocab, kv, attn (TP over attention), tp."""
    parts = name.split(".")
    leaf = parts[-1]
    module = parts[-2] if len(parts) > 1 else ""
    if leaf in ("d2t", "t2d") or "rotary_emb" in name:
        return "skip"
    if _is_vision(name):
        kimi_attention = arch == "KimiK25ForConditionalGeneration" and module in ("wqkv", "wo")
        return "tp" if kimi_attention and leaf == "weight" else "replicated"
    if "norm" in module or leaf == "e_score_correction_bias":
        return "replicated"
    if module == "gate" and len(parts) > 2 and parts[-3] == "mlp":
        return "replicated"  # the MoE router
    if module in REPLICATED_MODULES or (draft and module == "fc"):
        return "replicated"
    if module in VOCAB_MODULES or name.endswith("shared_head.head.weight"):
        return "vocab"
    if leaf == "bias" and module in ROW_PARALLEL:
        return "replicated"
    if module in ("k_proj", "v_proj"):
        return "kv"
    if "self_attn" in parts or "attention" in parts or "attn" in parts:
        return "attn"
    return "tp"


def _vocab_rows(rows: int, tp: int) -> int:
    """Rows of a vocab-parallel table on one rank (VocabParallelEmbedding pads to 64)."""
    padded = -(-rows // VOCAB_PADDING) * VOCAB_PADDING
    return -(-padded // tp)


def _gpu_bytes(group: dict, kind: str, tp: int, attn_tp: int, kv_heads: int) -> int:
    size = _int(group.get("bytes"), 0)
    if kind == "skip" or size <= 0:
        return 0
    if kind == "replicated":
        return size
    if kind == "vocab":
        shape = group.get("shape") or []
        rows = _int(shape[0], 0) if shape else 0
        return -(-size * _vocab_rows(rows, tp) // rows) if rows > 0 else -(-size // tp)
    if kind == "kv":
        return -(-size * max(1, kv_heads // attn_tp) // kv_heads)
    return -(-size // (attn_tp if kind == "attn" else tp))


def _elements(group: dict) -> int:
    shape = group.get("shape") or []
    count = max(1, _int(group.get("count"), 1))
    if shape and all(isinstance(d, int) for d in shape):
        return count * math.prod(shape)
    return _int(group.get("bytes"), 0) // DTYPE_BYTES.get(str(group.get("dtype")), 2)


def _pp_bounds(layers: int, pp: int) -> list[tuple[int, int]]:
    """get_pp_indices (distributed/utils.py): the last `remainder` stages take one more layer."""
    base, remainder = divmod(layers, pp)
    bounds = []
    for rank in range(pp):
        if rank >= pp - remainder:
            start = rank * (base + 1) - (pp - remainder)
            bounds.append((start, start + base + 1))
        else:
            bounds.append((rank * base, rank * base + base))
    return bounds


class _Weights:
    """A model's weight groups, classified once; bytes per GPU for any TP size."""

    def __init__(self, model: dict, dims: _Dims, draft: bool = False) -> None:
        config = model.get("config")
        self.config: dict = config if isinstance(config, dict) else {}
        self.dims = dims
        self.total = _int(model.get("tensor_bytes"), 0)
        self.shards = _int(model.get("shards"), 0)
        self.items: list[tuple[dict, str, int | None, bool, str]] = []
        self._memo: dict[tuple, list[int]] = {}
        groups = model.get("weights")
        for group in groups if isinstance(groups, list) else []:
            if not isinstance(group, dict):
                continue
            name = _strip_wrapper(str(group.get("pattern", "")))
            vision = _is_vision(name)
            # The scanner numbers vision blocks too ("blocks.*"): only text layers are layers here.
            layer = group.get("layer") if not vision and isinstance(group.get("layer"), int) else None
            self.items.append((group, _kind(name, dims.arch, draft), layer, vision, name))
        if not self.total:
            self.total = sum(_int(item[0].get("bytes"), 0) for item in self.items)

    def per_stage(self, tp: int, attn_tp: int, pp: int, mtp: bool = False) -> list[int]:
        """Bytes per GPU on each pipeline stage. `mtp`: the MTP layers only (the NEXTN drafter)."""
        key = (tp, attn_tp, pp, mtp)
        if key not in self._memo:
            self._memo[key] = self._per_stage(tp, attn_tp, pp, mtp)
        return self._memo[key]

    def _per_stage(self, tp: int, attn_tp: int, pp: int, mtp: bool) -> list[int]:
        bounds = _pp_bounds(self.dims.layers, pp)
        stages = [0] * pp
        for group, kind, layer, vision, name in self.items:
            if (layer is not None and layer >= self.dims.layers) != mtp:
                continue  # the target skips its MTP layers (layer >= num_hidden_layers)
            size = _gpu_bytes(group, kind, tp, attn_tp, self.dims.kv_heads)
            if self.dims.mla and name.endswith("kv_b_proj.weight"):
                size += -(-_elements(group) * 2 // attn_tp)  # w_kc and w_vc, bf16 copies
            for stage in self._stages(layer, vision, name, bounds, mtp):
                stages[stage] += size
        if not self.items and self.total and not mtp:
            stages = [-(-self.total // (tp * pp))] * pp
        return stages

    def _stages(self, layer: int | None, vision: bool, name: str, bounds: list, mtp: bool) -> list[int]:
        last = len(bounds) - 1
        if mtp:
            return [last]
        if layer is not None:
            return [i for i, (lo, hi) in enumerate(bounds) if lo <= layer < hi] or [last]
        if "embed_tokens" in name and self.dims.tied:
            return sorted({0, last})  # the last stage loads its lm_head from the embedding
        if vision or "embed_tokens" in name:
            return [0]
        if "lm_head" in name or name in ("model.norm.weight", "norm.weight"):
            return [last]
        return [0]


def _draft_bytes(weights: _Weights, tp: int, attn_tp: int, algorithm: str) -> tuple[int, int]:
    """(resident, held only while loading) bytes per GPU of an EAGLE or STANDALONE drafter.

    EAGLE shares the target's embedding and lm_head; EAGLE-3 shares the embedding and keeps its
    own lm_head over draft_vocab_size (models/llama_eagle3.py). A shared table is still
    allocated at load, then freed. STANDALONE keeps everything it loads."""
    dims = weights.dims
    resident = 0
    for group, kind, _layer, _vision, _name in weights.items:
        if kind != "vocab" or algorithm == "STANDALONE":
            resident += _gpu_bytes(group, kind, tp, attn_tp, dims.kv_heads)
    if algorithm == "STANDALONE":
        return resident, 0
    row = dims.hidden * dims.dtype_bytes
    embed = _vocab_rows(dims.vocab, tp) * row
    draft_vocab = _int(_text(weights.config).get("draft_vocab_size"), 0)
    own_head = algorithm == "EAGLE3" and draft_vocab > 0 and not dims.tied
    head = _vocab_rows(draft_vocab, tp) * row if own_head else 0
    shared_head = 0 if own_head or dims.tied else embed
    if _int(_text(weights.config).get("target_hidden_size"), dims.hidden) != dims.hidden:
        return resident + head + embed, shared_head  # set_embed keeps a drafter of another width
    return resident + head, embed + shared_head


# --- the KV cache -------------------------------------------------------------------------------


def _kv_elem_bytes(kv_dtype: str, model_bytes: int) -> float:
    """Bytes per cached element: fp8 halves bf16; fp4 keeps a scale per 16 (0.5.9 mixin)."""
    name = kv_dtype.lower()
    if name.startswith("fp8"):
        return 1.0
    if name == "mxfp8":
        return 1.0 + 1 / 32
    if "fp4" in name:
        return 0.5 + 1 / 16
    if name in ("bf16", "bfloat16", "fp16", "float16"):
        return 2.0
    return float(model_bytes)


def cell_bytes(dims: _Dims, attn_tp: int, layers: int, kv_dtype: str) -> int:
    """Bytes of KV cache per token on one GPU (get_cell_size_per_token)."""
    per_elem = _kv_elem_bytes(kv_dtype, dims.dtype_bytes)
    if dims.mla:
        elems = (dims.kv_lora_rank + dims.rope_dim) * layers
    else:
        elems = max(1, dims.kv_heads // attn_tp) * (dims.head_dim + dims.v_dim) * layers
    return int(elems * per_elem)


# --- graphs, activations and the request table ---------------------------------------------------


def _max_num_reqs(setup: _Setup, tokens: int) -> int:
    """The request pool's size (0.5.9 init_memory_pool; 0.5.23 resolve_max_num_reqs)."""
    estimated = min(max(int(tokens / max(1, setup.context) * 512), 2048), 4096)
    if setup.rule == "0.5.9":
        return max(1, setup.max_running or estimated)
    per_worker = (
        setup.max_running // setup.dp if setup.dp_attention and setup.max_running else setup.max_running
    )
    return max(1, min(per_worker or estimated, max(1, tokens // 2)))


def _graph_mib(setup: _Setup, dims: _Dims, reqs: int, has_draft: bool) -> int:
    """CUDA graphs: 2 MiB per token of the largest captured batch, per graph family."""
    if not setup.cuda_graph:
        return 0
    bs = max(1, min(setup.max_bs, reqs))
    spec = setup.spec
    verify = spec is not None and spec["algorithm"] != "OTHER"
    mib = 2 * bs * (spec["num_draft_tokens"] if spec and verify else 1)
    if spec and has_draft:
        if spec["num_steps"] > 1:
            mib += 2 * bs * spec["eagle_topk"]  # draft decode
        mib += 2 * bs * spec["num_draft_tokens"]  # draft extend
    if setup.prefill_graph:
        prefill_max = min(8192, setup.chunked) if dims.mla else setup.chunked
        mib += 1536 if dims.mla else 8 * _prefill_graph_sizes(prefill_max)
    return mib


def _activation_mib(setup: _Setup, dims: _Dims) -> int:
    """The largest prefill chunk's working set per GPU, doubled for the caching allocator."""
    tokens = max(setup.chunked, 2048) if setup.chunked > 0 else MAX_PREFILL_TOKENS
    heads = -(-dims.heads // setup.attn_tp)
    elems = 6 * dims.hidden
    if dims.mla:
        qk = dims.nope_dim + dims.rope_dim
        elems += heads * (qk + dims.nope_dim + 2 * dims.v_dim) + dims.kv_lora_rank + dims.rope_dim
    else:
        kv = max(1, dims.kv_heads // setup.attn_tp)
        elems += 2 * heads * dims.head_dim + 2 * kv * dims.head_dim
    if dims.experts:
        moe = -(-dims.moe_inter // setup.tp)
        elems += dims.topk * (3 * moe + dims.hidden) + 2 * dims.experts + 3 * moe * dims.shared
    else:
        elems += 3 * -(-dims.inter // setup.tp)
    return -(-(elems * 2 * tokens * 2) // MIB)


# --- one evaluation -----------------------------------------------------------------------------


class _Model:
    """Target and drafter, classified once; evaluated for any setup."""

    def __init__(self, target: dict, draft: dict | None) -> None:
        config = target.get("config")
        self.dims = _Dims(config if isinstance(config, dict) else {})
        self.weights = _Weights(target, self.dims)
        self.draft: _Weights | None = None
        if isinstance(draft, dict):
            config = draft.get("config")
            self.draft = _Weights(draft, _Dims(config if isinstance(config, dict) else {}), draft=True)


class _Cal:
    """What a calibration changes. Empty (present False) without one."""

    def __init__(self) -> None:
        self.present = False
        self.ratio = 1.0  # measured / predicted target weights
        self.draft_ratio = 1.0
        self.baseline_mib = 0
        self.kv_scale = 1.0
        self.graph_mib = 0


class _Draft:
    """The drafter on one GPU: bytes resident and held at load, its KV cell and layers."""

    def __init__(self, resident: int = 0, transient: int = 0, cell: int = 0, layers: int = 0) -> None:
        self.resident = resident
        self.transient = transient
        self.cell = cell
        self.layers = layers

    @property
    def load(self) -> int:
        return self.resident + self.transient


def _draft(model: _Model, setup: _Setup, cal: _Cal) -> _Draft:
    spec = setup.spec
    if spec is None or spec["algorithm"] not in DRAFT_WORKERS:
        return _Draft()
    if model.draft is not None:
        dims = model.draft.dims
        layers = dims.nextn or dims.layers
        resident, transient = _draft_bytes(model.draft, setup.tp, setup.attn_tp, spec["algorithm"])
        cell = cell_bytes(dims, setup.attn_tp, layers, setup.kv_dtype)
        return _Draft(int(resident * cal.draft_ratio), int(transient * cal.draft_ratio), cell, layers)
    if model.dims.nextn:
        # NEXTN / MTP without a drafter: SGLang drafts with the target's own MTP layers.
        resident = model.weights.per_stage(setup.tp, setup.attn_tp, 1, mtp=True)[0]
        layers = model.dims.nextn
        return _Draft(resident, 0, cell_bytes(model.dims, setup.attn_tp, layers, setup.kv_dtype), layers)
    return _Draft()


def _kv_tokens(
    model: _Model, setup: _Setup, stages: list[int], draft: _Draft, base: int
) -> tuple[int, int, int]:
    """(tokens, target cell, the draft pool's share of the cell) as the profile computes them.

    rest = free after the weights - baseline x (1 - fraction) (- 100 MiB for a multimodal
    model in 0.5.23); tokens = int(rest GiB x 2**30) // cell; the smallest stage wins."""
    dims, fraction = model.dims, setup.fraction
    mm_gib = 100 / 1024 if setup.rule == "0.5.23" and setup.multimodal else 0.0
    bounds = _pp_bounds(dims.layers, setup.pp)
    tokens, cell, share = None, 0, 0
    for stage, (lo, hi) in enumerate(bounds):
        layers = hi - lo
        stage_cell = cell_bytes(dims, setup.attn_tp, layers, setup.kv_dtype)
        stage_share = int(stage_cell * draft.layers / layers) if setup.rule == "0.5.23" and layers else 0
        used = stages[stage] + (draft.load if setup.rule == "0.5.23" and stage == len(bounds) - 1 else 0)
        if stage_cell + stage_share <= 0:
            continue
        rest = (base * MIB - used) / (1 << 30) - base / GIB_MIB * (1 - fraction) - mm_gib
        count = max(0, int(rest * (1 << 30)) // (stage_cell + stage_share))
        if tokens is None or count < tokens:
            tokens, cell, share = count, stage_cell, stage_share
    tokens = tokens or 0
    if setup.max_total_tokens:
        tokens = min(tokens, setup.max_total_tokens)
    return tokens // setup.page_size * setup.page_size, cell, share


def _outside_need(setup: _Setup, draft: _Draft, tokens: int, share: int, fixed: dict) -> int:
    """MiB the part outside the static pool must hold: graphs, activations, request table,
    and (0.5.9) the drafter; (0.5.23) the drafter's KV beyond its share of the cell."""
    need = FIXED_RUNTIME_MIB + fixed["request_table_mib"] + fixed["graph_mib"]
    draft_kv = tokens * draft.cell
    if setup.rule == "0.5.9":
        # The drafter's embedding is freed before the first request: it and activations never meet.
        need += max(fixed["activation_mib"], draft.transient // MIB)
        return need + -(-(draft.resident + draft_kv) // MIB)
    return need + fixed["activation_mib"] + max(0, draft_kv - tokens * share) // MIB


def _evaluate(model: _Model, setup: _Setup, cal: _Cal) -> dict:
    """The prediction for one setup: figures and problems, no fixes."""
    stages = [int(b * cal.ratio) for b in model.weights.per_stage(setup.tp, setup.attn_tp, setup.pp)]
    draft = _draft(model, setup, cal)
    base = cal.baseline_mib or baseline_mib(setup.gpu_mib, setup.tp * setup.pp)
    tokens, cell, share = _kv_tokens(model, setup, stages, draft, base)
    tokens = int(tokens * cal.kv_scale)
    reqs = _max_num_reqs(setup, tokens)
    extra = 4 + (setup.spec["num_draft_tokens"] if setup.spec else 0)
    slots = reqs + (1 if setup.rule == "0.5.23" else 0)
    has_draft = draft.layers > 0
    fixed = {
        "graph_mib": (cal.graph_mib if setup.cuda_graph else 0)
        or _graph_mib(setup, model.dims, reqs, has_draft),
        "activation_mib": _activation_mib(setup, model.dims),
        "request_table_mib": -(-slots * (setup.context + extra) * 4 // MIB),
    }
    result = {
        "weights_mib": -(-max(stages) // MIB),
        "draft_weights_mib": -(-draft.load // MIB),
        "static_mib": int(setup.fraction * base),
        "mem_fraction_static": round(setup.fraction, 4),
        "mem_fraction_source": setup.fraction_source,
        "baseline_mib": base,
        "kv_tokens": tokens,
        "kv_cell_bytes": cell,
        "draft_kv_cell_bytes": draft.cell,
        "kv_mib": -(-tokens * cell // MIB),
        "draft_kv_mib": -(-tokens * draft.cell // MIB),
        **fixed,
        "outside_mib": int(base * (1 - setup.fraction)),
        "outside_need_mib": _outside_need(setup, draft, tokens, share, fixed),
        "needs_tokens": _needs_tokens(setup),
        "problems": [],
        "fixes": [],
        "calibrated": cal.present,
    }
    result["problems"] = problems = _problems(model, setup, result)
    notes: list[str] = []
    if 0 < tokens < setup.context and not setup.context_set and not problems:
        notes.append(
            f"KV cache {tokens:,} tokens < the model's context length {setup.context:,}: "
            "SGLang starts, and caps a request's input to fit (set server.context_length to require more)"
        )
    result["notes"] = notes
    return result


def _needs_tokens(setup: _Setup) -> int:
    """One full context; 0.5.23 also keeps max_running_requests only with 2 tokens each."""
    needs = setup.context
    if setup.rule == "0.5.23" and setup.max_running:
        per_worker = setup.max_running // setup.dp if setup.dp_attention else setup.max_running
        needs = max(needs, 2 * per_worker)
    return needs


def _split_problem(dims: _Dims, setup: _Setup) -> str:
    tp = setup.attn_tp
    heads_ok = dims.heads % tp == 0
    kv_ok = dims.mla or (dims.kv_heads % tp == 0 if dims.kv_heads >= tp else tp % dims.kv_heads == 0)
    if heads_ok and kv_ok:
        return ""
    heads = f"{dims.heads} attention heads" + ("" if dims.mla else f" and {dims.kv_heads} KV heads")
    return f"tp_size {setup.tp} does not split the {heads} evenly: SGLang refuses it"


def _problems(model: _Model, setup: _Setup, r: dict) -> list[str]:
    out = [p for p in (_split_problem(model.dims, setup),) if p]
    tp, base = setup.tp, r["baseline_mib"]
    weights = r["weights_mib"] + (r["draft_weights_mib"] if setup.rule == "0.5.23" else 0)
    source = f"target {gib(model.weights.total / MIB)} GiB in total"
    if model.weights.shards:
        source += f" from {model.weights.shards} safetensors files"
    if r["draft_weights_mib"]:
        source += f"; drafter {gib(r['draft_weights_mib'])} GiB per GPU"
    if weights > base:
        out.append(
            f"weights {gib(weights)} GiB per GPU at TP {tp} > {gib(base)} GiB free on each GPU "
            f"of {gib(setup.gpu_mib)} GiB ({source}): the load runs out of memory"
        )
    elif r["kv_tokens"] <= 0:
        out.append(
            f"weights {gib(weights)} GiB per GPU at TP {tp} fill the static pool of "
            f"{gib(r['static_mib'])} GiB (mem_fraction_static {r['mem_fraction_static']:g} x "
            f"{gib(base)} GiB): no room for the KV cache ({source})"
        )
    elif r["kv_tokens"] < r["needs_tokens"] and (setup.context_set or r["needs_tokens"] > setup.context):
        what = f"context length {setup.context:,}"
        if r["needs_tokens"] > setup.context:
            what = f"{r['needs_tokens']:,} for max_running_requests {setup.max_running} at 2 tokens each"
        out.append(f"KV cache {r['kv_tokens']:,} tokens < {what}: longer requests are refused")
    if weights <= base and r["outside_need_mib"] > r["outside_mib"]:
        parts = f"CUDA graphs {gib(r['graph_mib'])}, prefill activations {gib(r['activation_mib'])}"
        if setup.rule == "0.5.9" and r["draft_weights_mib"]:
            parts += f", drafter weights and KV {gib(r['draft_weights_mib'] + r['draft_kv_mib'])}"
        out.append(
            f"{gib(r['outside_mib'])} GiB outside the static pool < {gib(r['outside_need_mib'])} GiB "
            f"needed ({parts} GiB): the graph capture or the first long prefill runs out of memory"
        )
    return out


# --- fixes --------------------------------------------------------------------------------------


def _fixes(model: _Model, server: dict, gpu_mib: int, cal: _Cal, r: dict) -> list[str]:
    """Changes that clear every problem by our own arithmetic: TP, fraction, KV dtype, context,
    graph batch size. Each is tried alone, from the profile as it is."""
    setup = _Setup(server, model.dims, gpu_mib)

    def fits(**changes: Any) -> dict | None:
        trial = _evaluate(model, _Setup({**server, **changes}, model.dims, gpu_mib), cal)
        return None if trial["problems"] else trial

    fixes = []
    tp = setup.tp * 2
    while tp <= 64:
        trial = fits(tp_size=tp)
        if trial:
            more = (
                ""
                if tp * setup.pp <= setup.gpus_available
                else f", on {tp * setup.pp} GPUs (this host has {setup.gpus_available})"
            )
            fixes.append(
                f"tp_size {tp} fits{more}: weights {gib(trial['weights_mib'])} GiB per GPU, "
                f"KV ~{trial['kv_tokens']:,} tokens"
            )
            break
        tp *= 2
    for hundredths in range(99, 49, -1):
        fraction = hundredths / 100
        trial = fits(mem_fraction_static=fraction)
        if trial and abs(fraction - r["mem_fraction_static"]) >= 0.005:
            fixes.append(
                f"mem_fraction_static {fraction:g} fits: KV ~{trial['kv_tokens']:,} tokens, "
                f"{gib(trial['outside_mib'])} GiB left for CUDA graphs and activations"
            )
        if trial:
            break
    if _kv_elem_bytes(setup.kv_dtype, model.dims.dtype_bytes) > 1 and (
        trial := fits(kv_cache_dtype="fp8_e4m3")
    ):
        fixes.append(f"kv_cache_dtype fp8_e4m3 fits: KV ~{trial['kv_tokens']:,} tokens")
    context = r["kv_tokens"] // 1024 * 1024
    if 1024 <= context < setup.context and fits(context_length=context):
        fixes.append(f"context_length {context:,} fits the KV cache of {r['kv_tokens']:,} tokens")
    for bs in (256, 128, 64, 32, 16, 8) if setup.cuda_graph else ():
        if bs < setup.max_bs and (trial := fits(cuda_graph_max_bs=bs)):
            fixes.append(f"cuda_graph_max_bs {bs} fits: CUDA graphs ~{gib(trial['graph_mib'])} GiB")
            break
    return fixes


# --- public -------------------------------------------------------------------------------------


def predict(
    target: dict,
    draft: dict | None,
    server: dict,
    gpu_total_mib: int,
    calibration: dict | None = None,
) -> dict:
    """GPU memory per GPU of one start, as SGLang will compute it, with problems and fixes.

    `target` and `draft`: {"config": config.json, "weights": the scanner's groups,
    "tensor_bytes": int}. `server`: the profile's settings (sglang_version, tp_size, pp_size,
    dp_size, ep_size, enable_dp_attention, mem_fraction_static, context_length, kv_cache_dtype,
    cuda_graph, cuda_graph_max_bs, max_running_requests, speculative, gpus_available).
    `gpu_total_mib`: nvidia-smi's memory.total. `calibration`: what parse_memory_lines read
    from the last start of the same files, TP size and GPU type.

    Returns weights_mib (the target's, per GPU), draft_weights_mib, static_mib,
    mem_fraction_static, mem_fraction_source, kv_tokens, kv_cell_bytes, graph_mib,
    needs_tokens, problems, fixes, calibrated, and the figures behind them: baseline_mib,
    kv_mib, draft_kv_cell_bytes, draft_kv_mib, activation_mib, request_table_mib, outside_mib
    (the part outside the static pool) and outside_need_mib (what it must hold).

    Calibration: the measured weights replace the header sum. They are kept as a ratio, so
    the fixes at other TP sizes scale too. The logged free memory before the load replaces
    the start-up estimate. Without that line, the start-up memory is solved from the measured
    KV tokens at the fraction the server ran with, so the same settings give back the measured
    count. With neither, the KV tokens are scaled by measured / predicted. The logged graph
    capture replaces the graph estimate.
    """
    model = _Model(target, draft)
    setup = _Setup(server, model.dims, gpu_total_mib)
    cal = _calibrate(model, setup, calibration)
    result = _evaluate(model, setup, cal)
    if result["problems"]:
        result["fixes"] = _fixes(model, server, gpu_total_mib, cal, result)
    return result


def _calibrate(model: _Model, setup: _Setup, calibration: dict | None) -> _Cal:
    """The calibration as _evaluate applies it (see predict)."""
    cal = _Cal()
    given = {k: v for k, v in calibration.items() if v is not None} if isinstance(calibration, dict) else {}
    if not given:
        return cal
    cal.present = True
    predicted = max(model.weights.per_stage(setup.tp, setup.attn_tp, setup.pp))
    measured = _int(given.get("weights_mib"), 0) * MIB
    if measured and predicted:
        cal.ratio = measured / predicted
    draft_predicted = _draft(model, setup, _Cal()).load
    draft_measured = _int(given.get("draft_weights_mib"), 0) * MIB
    if draft_measured and draft_predicted:
        cal.draft_ratio = draft_measured / draft_predicted
    cal.graph_mib = _int(given.get("graph_mib"), 0) + _int(given.get("draft_graph_mib"), 0)
    cal.baseline_mib = _int(given.get("baseline_mib"), 0)
    tokens = _int(given.get("kv_tokens"), 0)
    if not cal.baseline_mib and tokens:
        cal.baseline_mib = _baseline_from_kv(model, setup, cal, tokens, given.get("mem_fraction_static"))
        if not cal.baseline_mib:
            plain = _evaluate(model, setup, cal)["kv_tokens"]
            cal.kv_scale = tokens / plain if plain else 1.0
    return cal


def _baseline_from_kv(model: _Model, setup: _Setup, cal: _Cal, tokens: int, fraction: Any) -> int:
    """The free memory at start that explains `tokens` at `fraction`; 0 when none does.

    tokens x cell = baseline x fraction - weights (- drafter, - 100 MiB multimodal in 0.5.23)."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction < 1:
        return 0
    probe = _evaluate(model, setup, cal)
    draft = _draft(model, setup, cal)
    used = probe["weights_mib"] * MIB
    cell = probe["kv_cell_bytes"]
    if setup.rule == "0.5.23":
        used += draft.load + (100 * MIB if setup.multimodal else 0)
        cell += int(cell * draft.layers / max(1, model.dims.layers // setup.pp))
    base = (tokens * cell + used) / float(fraction) / MIB
    return int(base) if used / MIB < base <= setup.gpu_mib else 0


# --- the server's own log lines -----------------------------------------------------------------

_RANK = re.compile(r"^\[[^\]]*?\b(TP\d+)\b[^\]]*\]")
_WEIGHT_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_WEIGHT_END = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_KV = re.compile(r"(?:(\w+) )?KV Cache is allocated\..*?#tokens: (\d+)")
_GRAPH = re.compile(r"Capture ([\w ]*?)(?:cuda|CUDA) graph end\..*?mem usage=([\d.]+) GB")
_FRACTION = re.compile(r"mem_fraction_static=([\d.]+)")


def parse_memory_lines(lines: list[str]) -> dict:
    """The memory figures a server logged on its start, per SGLang 0.5.9 and 0.5.23 spellings.

    The first "Load weight end" of a rank is the target's, a later one the drafter's; the same
    for "KV Cache is allocated". Capture lines naming "draft" are the drafter's graphs. Across
    ranks: the largest weights and graphs, the smallest token count and free memory. Sizes are
    MiB; a figure not in the lines is None."""
    ranks: dict[str, dict] = {}
    fraction = None
    for raw in lines:
        line = str(raw).rsplit("\r", 1)[-1]
        found = _RANK.search(line)
        rank = ranks.setdefault(
            found.group(1) if found else "", {"weights": [], "kv": [], "graph": 0, "dg": 0}
        )
        if (m := _FRACTION.search(line)) and fraction is None:
            fraction = float(m.group(1))
        if (m := _WEIGHT_BEGIN.search(line)) and "begin" not in rank:
            rank["begin"] = round(float(m.group(1)) * GIB_MIB)
        elif m := _WEIGHT_END.search(line):
            rank["weights"].append(round(float(m.group(1)) * GIB_MIB))
        elif (m := _KV.search(line)) and m.group(1) != "SWA":
            rank["kv"].append(int(m.group(2)))
        elif m := _GRAPH.search(line):
            key = "dg" if m.group(1).strip().startswith("draft") else "graph"
            rank[key] += round(float(m.group(2)) * GIB_MIB)
    rows = [r for r in ranks.values() if r["weights"] or r["kv"] or r["graph"] or r["dg"] or "begin" in r]

    def pick(values: list, how: Any) -> Any:
        values = [v for v in values if v is not None]
        return how(values) if values else None

    return {
        "weights_mib": pick([r["weights"][0] if r["weights"] else None for r in rows], max),
        "draft_weights_mib": pick([r["weights"][1] if len(r["weights"]) > 1 else None for r in rows], max),
        "kv_tokens": pick([r["kv"][0] if r["kv"] else None for r in rows], min),
        "draft_kv_tokens": pick([r["kv"][1] if len(r["kv"]) > 1 else None for r in rows], min),
        "graph_mib": pick([r["graph"] or None for r in rows], max),
        "draft_graph_mib": pick([r["dg"] or None for r in rows], max),
        "baseline_mib": pick([r.get("begin") for r in rows], min),
        "mem_fraction_static": fraction,
    }

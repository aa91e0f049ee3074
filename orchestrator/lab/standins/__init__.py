"""Stand-ins for what a lab host cannot have: H200 GPUs, nvidia-smi, SGLang, model weights, and
Mooncake's RDMA transfer engine (importable only: the SGLang stand-in moves its PD KV itself).

`install(rootfs)` writes them into a lab host's root filesystem before it boots. So the tool's real
unit (`ExecStart=/usr/bin/python3 -m sglang.launch_server ...`) runs unchanged. Everything installed
is standard-library Python 3.11, because the hosts have no pip. The sources live in `host/`.
docs/standins.md describes the layout, the knobs and the speed model.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from orchestrator.profile import sglang_flags

HOST_SRC = Path(__file__).resolve().parent / "host"
DIST_PACKAGES = Path("usr/local/lib/python3.11/dist-packages")
GPU_CONFIG = Path("etc/nvidia-standin.json")
RUN_DIR = Path("run/nvidia-standin")
KIMI_DIR = Path("data/models/Kimi-K2.5")
EAGLE3_DIR = Path("data/eagle3/output_10k_sglang/4")
EAGLE1_DIR = Path("data/eagle/llama-eagle")
#: A dense model that fits on half an 8-GPU host (TP 4), for two servers per host.
LLAMA_DIR = Path("data/models/Llama-3.3-70B-Instruct")

_SCRIPT = "#!/usr/bin/python3\nimport sys\n\nfrom {module} import main\n\nsys.exit(main())\n"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _set_version_module() -> ModuleType:
    """The host's own version switcher, loaded by path (it must not be imported as `sglang`)."""
    spec = importlib.util.spec_from_file_location(
        "_standin_set_version", HOST_SRC / "sglang" / "_set_version.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _write_json(path: Path, data: dict) -> None:
    _write(path, json.dumps(data, indent=2) + "\n")


#: The transfer backend SGLang's `mooncake` PD backend imports: the stand-in's version, as the real
#: wheel (`mooncake-transfer-engine`) names itself. There is no `nixl` stand-in: the lab has none.
MOONCAKE_VERSION = "0.3.13.post1"


def install_packages(rootfs: Path, sglang_version: str) -> None:
    """sglang, nvidia_standin and mooncake into dist-packages (on Debian system python3's sys.path)."""
    dist = rootfs / DIST_PACKAGES
    for name in ("sglang", "nvidia_standin", "mooncake"):
        shutil.rmtree(dist / name, ignore_errors=True)
        shutil.copytree(HOST_SRC / name, dist / name, ignore=_IGNORE)
    _install_mooncake_metadata(dist)
    package = dist / "sglang"
    shutil.copy2(Path(sglang_flags.__file__), package / "_flags.py")
    (package / "_help").mkdir()
    for version in sglang_flags.SHIPPED:
        for path in (sglang_flags.help_path(version), sglang_flags.types_path(version)):
            shutil.copy2(path, package / "_help" / path.name)
    set_sglang_version(rootfs, sglang_version)


def _install_mooncake_metadata(dist: Path) -> None:
    """The dist-info `importlib.metadata.version("mooncake-transfer-engine")` reads."""
    for old in dist.glob("mooncake_transfer_engine-*.dist-info"):
        shutil.rmtree(old)
    info = dist / f"mooncake_transfer_engine-{MOONCAKE_VERSION}.dist-info"
    _write(
        info / "METADATA",
        "Metadata-Version: 2.1\nName: mooncake-transfer-engine\n"
        f"Version: {MOONCAKE_VERSION}\nSummary: Mooncake stand-in for the lab (no RDMA)\n",
    )
    _write(info / "INSTALLER", "orchestrator-lab\n")
    _write(info / "RECORD", "")
    _write(info / "top_level.txt", "mooncake\n")


def install_gpus(rootfs: Path, gpus: int) -> None:
    """nvidia-smi, gpu-hold, the GPU config, and a tmpfiles rule creating the registry dir at boot."""
    _write(rootfs / "usr/bin/nvidia-smi", _SCRIPT.format(module="nvidia_standin.smi"), 0o755)
    _write(rootfs / "usr/local/bin/gpu-hold", _SCRIPT.format(module="nvidia_standin.hold"), 0o755)
    _write_json(
        rootfs / GPU_CONFIG,
        {
            "gpus": gpus,
            "name": "NVIDIA H200",
            "memory_total_mib": 143771,
            "driver_version": "580.159.04",
            "cuda_version": "13.0",
        },
    )
    _write(rootfs / "etc/tmpfiles.d/nvidia-standin.conf", f"d /{RUN_DIR} 1777 root root -\n")


#: Kimi-K2.5's routed experts: INT4, packed 8 to an int32, one bf16 scale per 32 inputs (its
#: text_config.quantization_config, compressed-tensors "pack-quantized", group_size 32).
KIMI_QUANT: dict[str, object] = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}


def kimi_config() -> dict:
    """Kimi-K2.5's config.json shape: a multimodal wrapper around a DeepSeek-V3 text model."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 163840,
        "max_position_embeddings": 262144,
        "num_nextn_predict_layers": 0,
        "dtype": "bfloat16",
        "quantization_config": KIMI_QUANT,
    }
    vision = {
        "patch_size": 14,
        "init_pos_emb_height": 64,
        "init_pos_emb_width": 64,
        "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed",
        "vt_num_attention_heads": 16,
        "vt_num_hidden_layers": 27,
        "vt_hidden_size": 1152,
        "vt_intermediate_size": 4304,
        "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal",
        "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": 1152,
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-05,
        "text_hidden_size": 7168,
    }
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": vision,
    }


def llama70b_config() -> dict:
    """Llama-3.3-70B-Instruct's config.json (the fields SGLang and our checks read)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    }


def eagle3_config(target_hidden: int = 7168) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target_hidden,
        "intermediate_size": 18432,
        "num_hidden_layers": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 163840,
        "draft_vocab_size": 32000,
        "target_hidden_size": target_hidden,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
    }


def eagle1_config(target_hidden: int = 7168) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle"],
        "model_type": "llama",
        "hidden_size": target_hidden,
        "intermediate_size": 18432,
        "num_hidden_layers": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 163840,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    }


#: Meta-Llama-3-Instruct's chat template (as its tokenizer_config.json has it).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
#: A Kimi-K2-style template: a default system turn, then <|im_ROLE|>ROLE<|im_middle|>...<|im_end|>.
KIMI_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def tokenizer_config(chat_template: str, bos_token: str, eos_token: str) -> dict:
    """The fields of a tokenizer_config.json the stand-in reads (and a few it does not)."""
    return {
        "bos_token": bos_token,
        "eos_token": eos_token,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": chat_template,
    }


# --- weight files ---------------------------------------------------------------------------

#: (name, safetensors dtype, shape) of one tensor of a checkpoint.
TensorSpec = tuple[str, str, Sequence[int]]
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}


def _linear(name: str, rows: int, cols: int) -> list[TensorSpec]:
    return [(f"{name}.weight", "BF16", (rows, cols))]


def _norm(name: str, dim: int, bias: bool = False) -> list[TensorSpec]:
    out: list[TensorSpec] = [(f"{name}.weight", "BF16", (dim,))]
    return out + ([(f"{name}.bias", "BF16", (dim,))] if bias else [])


def _int4(name: str, rows: int, cols: int) -> list[TensorSpec]:
    """A compressed-tensors pack-quantized linear: 8 int4 to an int32, a bf16 scale per 32 inputs."""
    return [
        (f"{name}.weight_packed", "I32", (rows, cols // 8)),
        (f"{name}.weight_scale", "BF16", (rows, cols // 32)),
        (f"{name}.weight_shape", "I32", (2,)),
    ]


def kimi_tensors() -> list[TensorSpec]:
    """Kimi-K2.5's checkpoint, as its model.safetensors.index.json names it: a DeepSeek-V3 text model
    under `language_model.` (MLA attention, layer 0 dense, then 384 INT4 routed experts and a bf16
    shared expert per layer), a MoonViT vision tower and its projector."""
    text = kimi_config()["text_config"]
    h, vocab, heads = text["hidden_size"], text["vocab_size"], text["num_attention_heads"]
    q_lora, kv_lora, rope = text["q_lora_rank"], text["kv_lora_rank"], text["qk_rope_head_dim"]
    nope, v_dim, moe = text["qk_nope_head_dim"], text["v_head_dim"], text["moe_intermediate_size"]
    out: list[TensorSpec] = list(_linear("language_model.model.embed_tokens", vocab, h))
    for i in range(text["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}"
        out += _norm(f"{p}.input_layernorm", h)
        out += _linear(f"{p}.self_attn.q_a_proj", q_lora, h) + _norm(f"{p}.self_attn.q_a_layernorm", q_lora)
        out += _linear(f"{p}.self_attn.q_b_proj", heads * (nope + rope), q_lora)
        out += _linear(f"{p}.self_attn.kv_a_proj_with_mqa", kv_lora + rope, h)
        out += _norm(f"{p}.self_attn.kv_a_layernorm", kv_lora)
        out += _linear(f"{p}.self_attn.kv_b_proj", heads * (nope + v_dim), kv_lora)
        out += _linear(f"{p}.self_attn.o_proj", h, heads * v_dim)
        out += _norm(f"{p}.post_attention_layernorm", h)
        if i < text["first_k_dense_replace"]:
            inter = text["intermediate_size"]
            out += _linear(f"{p}.mlp.gate_proj", inter, h) + _linear(f"{p}.mlp.up_proj", inter, h)
            out += _linear(f"{p}.mlp.down_proj", h, inter)
            continue
        experts = text["n_routed_experts"]
        out += _linear(f"{p}.mlp.gate", experts, h)
        out.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", (experts,)))
        shared = moe * text["n_shared_experts"]
        out += _linear(f"{p}.mlp.shared_experts.gate_proj", shared, h)
        out += _linear(f"{p}.mlp.shared_experts.up_proj", shared, h)
        out += _linear(f"{p}.mlp.shared_experts.down_proj", h, shared)
        for e in range(experts):
            q = f"{p}.mlp.experts.{e}"
            out += (
                _int4(f"{q}.gate_proj", moe, h)
                + _int4(f"{q}.up_proj", moe, h)
                + _int4(f"{q}.down_proj", h, moe)
            )
    out += _norm("language_model.model.norm", h) + _linear("language_model.lm_head", vocab, h)
    return out + moonvit_tensors(kimi_config()["vision_config"])


def moonvit_tensors(vision: dict) -> list[TensorSpec]:
    """Kimi-K2.5's vision tower (MoonViT: 27 blocks of 1152) and its patch-merging projector."""
    d, mlp, patch = vision["vt_hidden_size"], vision["vt_intermediate_size"], vision["patch_size"]
    out: list[TensorSpec] = [
        ("vision_tower.patch_embed.proj.weight", "BF16", (d, 3, patch, patch)),
        ("vision_tower.patch_embed.proj.bias", "BF16", (d,)),
        (
            "vision_tower.patch_embed.pos_emb.weight",
            "BF16",
            (vision["init_pos_emb_height"], vision["init_pos_emb_width"], d),
        ),
    ]
    for i in range(vision["vt_num_hidden_layers"]):
        p = f"vision_tower.encoder.blocks.{i}"
        out += _norm(f"{p}.norm0", d, bias=True) + _norm(f"{p}.norm1", d, bias=True)
        out += [(f"{p}.wqkv.weight", "BF16", (3 * d, d)), (f"{p}.wqkv.bias", "BF16", (3 * d,))]
        out += [(f"{p}.wo.weight", "BF16", (d, d)), (f"{p}.wo.bias", "BF16", (d,))]
        out += [(f"{p}.mlp.fc0.weight", "BF16", (mlp, d)), (f"{p}.mlp.fc0.bias", "BF16", (mlp,))]
        out += [(f"{p}.mlp.fc1.weight", "BF16", (d, mlp)), (f"{p}.mlp.fc1.bias", "BF16", (d,))]
    out += _norm("vision_tower.encoder.final_layernorm", d, bias=True)
    merged = d * vision["merge_kernel_size"][0] * vision["merge_kernel_size"][1]
    out += _norm("mm_projector.pre_norm", d, bias=True)
    out += [
        ("mm_projector.proj.0.weight", "BF16", (merged, merged)),
        ("mm_projector.proj.0.bias", "BF16", (merged,)),
    ]
    out += [("mm_projector.proj.2.weight", "BF16", (vision["text_hidden_size"], merged))]
    return [*out, ("mm_projector.proj.2.bias", "BF16", (vision["text_hidden_size"],))]


def llama_tensors(config: dict) -> list[TensorSpec]:
    """A Llama checkpoint (Llama-3.3-70B-Instruct's names: model.layers.N...., lm_head), all bf16."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    out: list[TensorSpec] = list(_linear("model.embed_tokens", vocab, h))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += _norm(f"{p}.input_layernorm", h)
        out += _linear(f"{p}.self_attn.q_proj", q, h) + _linear(f"{p}.self_attn.k_proj", kv, h)
        out += _linear(f"{p}.self_attn.v_proj", kv, h) + _linear(f"{p}.self_attn.o_proj", h, q)
        out += _norm(f"{p}.post_attention_layernorm", h)
        out += _linear(f"{p}.mlp.gate_proj", inter, h) + _linear(f"{p}.mlp.up_proj", inter, h)
        out += _linear(f"{p}.mlp.down_proj", h, inter)
    return out + _norm("model.norm", h) + _linear("lm_head", vocab, h)


def eagle3_tensors(config: dict) -> list[TensorSpec]:
    """An EAGLE-3 drafter (SpecForge's names): one `midlayer` whose attention reads [embedding,
    hidden] (2 x hidden), `fc` folding three target layers' hidden states, a draft-vocab head and
    the draft<->target vocab maps."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    draft_vocab = config.get("draft_vocab_size") or config["vocab_size"]
    out: list[TensorSpec] = _norm("midlayer.input_layernorm", h) + _norm("midlayer.hidden_norm", h)
    out += _linear("midlayer.self_attn.q_proj", q, 2 * h) + _linear("midlayer.self_attn.k_proj", kv, 2 * h)
    out += _linear("midlayer.self_attn.v_proj", kv, 2 * h) + _linear("midlayer.self_attn.o_proj", h, q)
    out += _norm("midlayer.post_attention_layernorm", h)
    out += _linear("midlayer.mlp.gate_proj", inter, h) + _linear("midlayer.mlp.up_proj", inter, h)
    out += _linear("midlayer.mlp.down_proj", h, inter)
    out += _linear("fc", h, 3 * config.get("target_hidden_size", h)) + _norm("norm", h)
    out += _linear("lm_head", draft_vocab, h)
    return [*out, ("d2t", "I64", (draft_vocab,)), ("t2d", "BOOL", (config["vocab_size"],))]


def eagle1_tensors(config: dict) -> list[TensorSpec]:
    """An EAGLE-1 drafter: its own embedding, `fc` over [embedding, hidden] and one decoder layer
    without an input norm (the EAGLE repository's checkpoint names)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    out: list[TensorSpec] = (
        _linear("embed_tokens", vocab, h) + _linear("fc", h, 2 * h) + [("fc.bias", "BF16", (h,))]
    )
    out += _linear("layers.0.self_attn.q_proj", q, h) + _linear("layers.0.self_attn.k_proj", kv, h)
    out += _linear("layers.0.self_attn.v_proj", kv, h) + _linear("layers.0.self_attn.o_proj", h, q)
    out += _norm("layers.0.post_attention_layernorm", h)
    out += _linear("layers.0.mlp.gate_proj", inter, h) + _linear("layers.0.mlp.up_proj", inter, h)
    return out + _linear("layers.0.mlp.down_proj", h, inter)


def _tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    size = DTYPE_BYTES[dtype]
    for dim in shape:
        size *= dim
    return size


def _shard_names(shards: int) -> list[str]:
    if shards == 1:
        return ["model.safetensors"]
    return [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]


@functools.lru_cache(maxsize=8)
def _layout(tensors: tuple[tuple[str, str, tuple[int, ...]], ...], shards: int) -> tuple[list, bytes | None]:
    """[(file name, header bytes, file size)] and the index's bytes (None for one file): tensors in
    order, cut into `shards` files of about equal size. Cached: the lab writes the same models into
    every host."""
    total = sum(_tensor_bytes(d, s) for _, d, s in tensors)
    names = _shard_names(shards)
    files: list[tuple[str, bytes, int]] = []
    weight_map: dict[str, str] = {}
    done, start = 0, 0
    for k, name in enumerate(names):
        end, size = start, 0
        room = len(tensors) - (shards - 1 - k)  # leave a tensor for each file still to come
        while end < room and (k == shards - 1 or end == start or done + size < total * (k + 1) / shards):
            size += _tensor_bytes(tensors[end][1], tensors[end][2])
            end += 1
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for tname, dtype, shape in tensors[start:end]:
            nbytes = _tensor_bytes(dtype, shape)
            header[tname] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            weight_map[tname] = name
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes
        files.append((name, struct.pack("<Q", len(text)) + text, 8 + len(text) + offset))
        done, start = done + size, end
    if shards == 1:
        return files, None
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return files, (json.dumps(index, indent=2) + "\n").encode()


def write_weights(model_dir: Path, tensors: Sequence[TensorSpec], shards: int = 1) -> int:
    """Real safetensors files with these tensors (names, dtypes, shapes) in `shards` files, plus
    model.safetensors.index.json when more than one. Each file is its header (an 8-byte
    little-endian length, then JSON {name: {dtype, shape, data_offsets}}) truncated out to its full
    size: sparse, so a 600 GB checkpoint costs no disk, and reads return zeros. Returns the tensors'
    bytes."""
    frozen = tuple((name, dtype, tuple(shape)) for name, dtype, shape in tensors)
    files, index = _layout(frozen, max(1, min(shards, len(frozen))))
    model_dir.mkdir(parents=True, exist_ok=True)
    for old in model_dir.glob("*.safetensors"):
        old.unlink()
    for name, header, size in files:
        path = model_dir / name
        with path.open("wb") as f:
            f.write(header)
        os.truncate(path, size)
    if index is not None:
        (model_dir / "model.safetensors.index.json").write_bytes(index)
    return sum(_tensor_bytes(d, s) for _, d, s in frozen)


def write_model_dir(path: Path, config: dict, tokenizer: dict | None = None, **standin: object) -> Path:
    """A stand-in model directory: config.json as the real one, standin.json with its knobs, and
    `tokenizer` as tokenizer_config.json (its chat_template serves /v1/chat/completions)."""
    _write_json(path / "config.json", config)
    _write_json(path / "standin.json", standin)
    if tokenizer is not None:
        _write_json(path / "tokenizer_config.json", tokenizer)
    return path


def set_standin(model_dir: Path, **knobs: object) -> None:
    """Change a model dir's knobs (e.g. load_delay_s=10 for a demo); None removes a knob."""
    path = model_dir / "standin.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(knobs)
    _write_json(path, {k: v for k, v in data.items() if v is not None})


#: Shard files of the real checkpoints.
KIMI_SHARDS = 61
LLAMA_SHARDS = 30


def install_models(rootfs: Path, load_delay_s: float) -> None:
    """The reference profiles' model paths, each with config.json and sparse safetensors files whose
    tensors are the real checkpoint's (docs/standins.md, "Model dirs"): the stand-in reads their
    headers and holds on each GPU what SGLang would, so the files decide where a model fits."""
    kimi = write_model_dir(
        rootfs / KIMI_DIR,
        kimi_config(),
        tokenizer_config(KIMI_CHAT_TEMPLATE, "[BOS]", "[EOS]"),
        load_delay_s=load_delay_s,
        warmup_s=0.5,
        base_tok_s=90.0,
    )
    write_weights(kimi, kimi_tensors(), KIMI_SHARDS)
    llama = write_model_dir(
        rootfs / LLAMA_DIR,
        llama70b_config(),
        tokenizer_config(LLAMA3_CHAT_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
        load_delay_s=load_delay_s,
        warmup_s=0.5,
        base_tok_s=45.0,
    )
    write_weights(llama, llama_tensors(llama70b_config()), LLAMA_SHARDS)  # 70.6e9 bf16 parameters
    eagle3 = write_model_dir(rootfs / EAGLE3_DIR, eagle3_config(), accept_top1=0.44, trained_on="chat")
    write_weights(eagle3, eagle3_tensors(eagle3_config()))
    eagle1 = write_model_dir(rootfs / EAGLE1_DIR, eagle1_config(), accept_top1=0.44)
    write_weights(eagle1, eagle1_tensors(eagle1_config()))


def install_path(rootfs: Path) -> None:
    """On a root whose python3 is not 3.11 (a docker host: Debian trixie's 3.13), a .pth file that
    puts DIST_PACKAGES on its sys.path: the stand-ins stay where the lab's other code (and the
    tracebacks they print) say they are."""
    for lib in sorted((rootfs / "usr/lib").glob("python3.*")):
        if lib.name == DIST_PACKAGES.parent.name or not (lib / "os.py").exists():
            continue
        _write(
            rootfs / "usr/local/lib" / lib.name / "dist-packages/orchestrator-standins.pth",
            f"/{DIST_PACKAGES}\n",
        )


def install(
    rootfs: Path,
    *,
    gpus: int = 8,
    sglang_version: str = "0.5.9",
    load_delay_s: float = 1.0,
    models: bool = True,
) -> None:
    """Write all stand-ins into a (not running) host root filesystem; `models`: the reference
    profiles' model dirs too (their 61 + 30 headers take 0.3 s to write; a test with its own
    model dirs leaves them out)."""
    rootfs = Path(rootfs)
    install_packages(rootfs, sglang_version)
    install_path(rootfs)
    install_gpus(rootfs, gpus)
    if models:
        install_models(rootfs, load_delay_s)


#: Where a CDI device puts its GPU inside a container, as the real spec puts /dev/nvidiaN there.
CONTAINER_DEVICES = "/dev/nvidia-standin"
CDI_SPEC = Path("etc/cdi/nvidia.yaml")


def cdi_spec(gpus: int) -> dict:
    """The lab's CDI spec (kind nvidia.com/gpu), as `nvidia-ctk cdi generate` writes the real one:
    device N gives a container GPU N (here a file `gpuN` the stand-in reads as its device list,
    in place of /dev/nvidiaN), and any GPU brings what the driver is to the container: the GPU
    config and the memory registry, shared with the host, so the host's nvidia-smi sees the
    container's processes and theirs it (docs/standins.md, Containers)."""
    bind = ["ro", "nosuid", "nodev", "bind"]
    devices = [
        {
            "name": str(i),
            "containerEdits": {
                "mounts": [
                    {
                        "hostPath": f"/etc/nvidia-standin/devices/gpu{i}",
                        "containerPath": f"{CONTAINER_DEVICES}/gpu{i}",
                        "options": bind,
                    }
                ]
            },
        }
        for i in range(gpus)
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": [f"NVIDIA_STANDIN_DEVICES={CONTAINER_DEVICES}"],
            "mounts": [
                {"hostPath": f"/{GPU_CONFIG}", "containerPath": f"/{GPU_CONFIG}", "options": bind},
                {
                    "hostPath": f"/{RUN_DIR}",
                    "containerPath": f"/{RUN_DIR}",
                    "options": ["rw", "nosuid", "nodev", "bind"],
                },
            ],
        },
    }


def install_cdi(rootfs: Path, gpus: int) -> None:
    """/etc/cdi/nvidia.yaml and the device files it names, for podman's --device nvidia.com/gpu=N."""
    for i in range(gpus):
        _write(rootfs / f"etc/nvidia-standin/devices/gpu{i}", f"{i}\n")
    _write(
        rootfs / CDI_SPEC,
        "# Written by the orchestrator lab.\n" + json.dumps(cdi_spec(gpus), indent=2) + "\n",
    )


def set_sglang_version(rootfs_or_root: Path, version: str) -> None:
    """Give a host another SGLang version. Over ssh: `python3 -m sglang._set_version VERSION`.

    It rewrites sglang/version.py and the sglang-<V>.dist-info directory; a running server
    keeps its version until restarted, as a real upgrade would.
    """
    if version not in sglang_flags.SHIPPED:  # the stand-in acts a version by its real --help
        raise ValueError(f"unsupported SGLang version {version} (known: {', '.join(sglang_flags.SHIPPED)})")
    _set_version_module().set_version(Path(rootfs_or_root) / DIST_PACKAGES / "sglang", version)


__all__ = [
    "install",
    "install_cdi",
    "set_sglang_version",
    "set_standin",
    "tokenizer_config",
    "write_model_dir",
    "write_weights",
]

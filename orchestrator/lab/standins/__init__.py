"""Stand-ins for what a lab host cannot have: H200 GPUs, nvidia-smi, SGLang and model weights.

`install(rootfs)` writes them into a lab host's root filesystem before it boots. So the tool's real
unit (`ExecStart=/usr/bin/python3 -m sglang.launch_server ...`) runs unchanged. Everything installed
is standard-library Python 3.11, because the hosts have no pip. The sources live in `host/`.
docs/standins.md describes the layout, the knobs and the speed model.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
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


def install_packages(rootfs: Path, sglang_version: str) -> None:
    """sglang and nvidia_standin into dist-packages (on Debian system python3's sys.path)."""
    dist = rootfs / DIST_PACKAGES
    for name in ("sglang", "nvidia_standin"):
        shutil.rmtree(dist / name, ignore_errors=True)
        shutil.copytree(HOST_SRC / name, dist / name, ignore=_IGNORE)
    package = dist / "sglang"
    shutil.copy2(Path(sglang_flags.__file__), package / "_flags.py")
    (package / "_help").mkdir()
    for version in sglang_flags.SHIPPED:
        for path in (sglang_flags.help_path(version), sglang_flags.types_path(version)):
            shutil.copy2(path, package / "_help" / path.name)
    set_sglang_version(rootfs, sglang_version)


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


def kimi_config() -> dict:
    """Kimi-K2.5's config.json shape: a multimodal wrapper around a DeepSeek-V3 text model."""
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "vocab_size": 163840,
        "max_position_embeddings": 262144,
        "num_nextn_predict_layers": 0,
        "dtype": "bfloat16",
    }
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "dtype": "bfloat16",
        "text_config": text,
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


def install_models(rootfs: Path, gpus: int, load_delay_s: float) -> None:
    """The reference profiles' model paths. Kimi's weights count only where TP 8 can hold them."""
    weights = 576000 if gpus >= 8 else 0
    write_model_dir(
        rootfs / KIMI_DIR,
        kimi_config(),
        tokenizer_config(KIMI_CHAT_TEMPLATE, "[BOS]", "[EOS]"),
        load_delay_s=load_delay_s,
        warmup_s=0.5,
        base_tok_s=90.0,
        weights_mib_total=weights,
    )
    # 70.6e9 bf16 parameters: 134,700 MiB, a quarter per GPU at TP 4.
    write_model_dir(
        rootfs / LLAMA_DIR,
        llama70b_config(),
        tokenizer_config(LLAMA3_CHAT_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"),
        load_delay_s=load_delay_s,
        warmup_s=0.5,
        base_tok_s=45.0,
        weights_mib_total=134700,
    )
    write_model_dir(rootfs / EAGLE3_DIR, eagle3_config(), accept_top1=0.44, trained_on="chat")
    write_model_dir(rootfs / EAGLE1_DIR, eagle1_config(), accept_top1=0.44)


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


def install(rootfs: Path, *, gpus: int = 8, sglang_version: str = "0.5.9", load_delay_s: float = 1.0) -> None:
    """Write all stand-ins into a (not running) host root filesystem."""
    rootfs = Path(rootfs)
    install_packages(rootfs, sglang_version)
    install_path(rootfs)
    install_gpus(rootfs, gpus)
    install_models(rootfs, gpus, load_delay_s)


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
]

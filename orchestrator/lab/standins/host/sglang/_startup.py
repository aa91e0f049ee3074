"""Start-up of the stand-in, in the real server's order: argument checks (seconds), then
weight load, KV cache and CUDA graph capture (the load delay), each able to fail as SGLang does.

Here: the checks, and mem_fraction_static's default as server_args computes it for the GPU's
size, TP and speculative settings (default_mem_fraction). The memory itself: sglang/_load.py.

GPUs have two numberings, as on a real host: the server's logical device i (base_gpu_id + rank,
what torch names) is the i-th entry of CUDA_VISIBLE_DEVICES; nvidia-smi, and so the memory this
stand-in registers, uses the physical index.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from nvidia_standin import registry

from sglang import _adaptive, _speed
from sglang._args import ServerArgs, version_tuple
from sglang._common import (
    LAUNCH_FRAME,
    MTP_ARCHS,
    SRT,
    STALL_PHASES,
    ModelDir,
    config_error,
    die,
    env_knobs,
    log,
    read_model_dir,
)

MAX_FRACTION = 0.95
#: torch's total capacity against nvidia-smi's memory.total: 139.81 GiB (143165 MiB) of an H200's
#: 143771 MiB; the rest is the driver's.
TORCH_SHARE = 143165 / 143771
KNOWN_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"}
ARGS_FRAME = (
    f"{SRT}/server_args.py",
    4398,
    "prepare_server_args",
    "return ServerArgs.from_cli_args(raw_args)",
)


@dataclass
class Runtime:
    """Everything the serving part needs once start-up has passed its checks."""

    args: ServerArgs
    model: ModelDir
    drafter: ModelDir | None
    spec: _speed.SpecSettings | None
    decode: _speed.DecodeModel
    gpus: list[int]
    """Physical (nvidia-smi) indexes of this node's GPUs, rank order."""
    gpu_cfg: registry.GpuConfig
    mem_fraction: float
    trained_on: str = "chat"
    """What the drafter was trained on (its standin.json `trained_on`): "chat" gains through the
    chat template."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per start-up phase, for 0.5.23's `Engine startup timings` line."""
    adaptive_slots: dict[int, dict] | None = None
    """--speculative-adaptive's config, read at start (None: static speculative settings)."""
    adaptive: _adaptive.Controller | None = None
    """The tiers as they run: made once the draft worker built them (_load.adaptive_states)."""
    held_mib: float = 0.0
    """What this process holds on each of its GPUs (registered for nvidia-smi)."""
    pre_gib: float = 0.0
    """SGLang's memory before the weights (min_per_gpu_memory / pre_model_load_memory), GiB."""
    max_total_num_tokens: int = 0
    draft: dict = field(default_factory=dict)
    """The draft worker's figures when 0.5.23 computed them ahead of its lines (_load.draft_ahead)."""

    @property
    def stall(self) -> str | None:
        """The start-up phase the `stall` knob stops in, if any."""
        value = self.model.knob("stall")
        return str(value) if value else None

    @property
    def exact(self) -> bool:
        return bool(self.model.knob("exact"))

    @property
    def base_tok_s(self) -> float:
        return float(self.model.knob("base_tok_s"))

    @property
    def tp_label(self) -> str:
        """This node's first TP rank, as its log lines name it: TP0 on node rank 0."""
        return f"TP{self.args.node_rank * len(self.gpus)}"

    def logical(self, gpu: int) -> int:
        """The device index torch gives physical GPU `gpu` in this process."""
        return self.args.base_gpu_id + self.gpus.index(gpu)


def gib(mib: float) -> str:
    """MiB as SGLang prints GB: bytes / (1 << 30), two decimals."""
    return f"{mib / 1024:.2f}"


def check_model(path: str) -> ModelDir:
    model = read_model_dir(path)
    if model is None:
        frame = (
            f"{SRT}/utils/hf_transformers_utils.py",
            290,
            "get_config",
            "config = AutoConfig.from_pretrained(",
        )
        die([LAUNCH_FRAME, ARGS_FRAME, frame], config_error(path))
    assert model is not None
    env_knobs(model)
    stall = model.knob("stall")
    if stall and stall not in STALL_PHASES:
        die([], f"ValueError: stand-in knob stall={stall!r} is none of {', '.join(STALL_PHASES)}")
    return model


def _auto_spec_params(model: ModelDir) -> tuple[int, int, int]:
    """SGLang's auto_choose_speculative_params: (3, 1, 4) for DeepSeek-like targets, else (5, 4, 8)."""
    archs = set(model.architectures) | set((model.config.get("text_config") or {}).get("architectures") or [])
    return (3, 1, 4) if archs & {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"} else (5, 4, 8)


def check_speculative(args: ServerArgs, model: ModelDir) -> dict[int, dict] | None:
    """Resolve algorithm and tree settings, or die where SGLang's server_args dies; the adaptive
    config when --speculative-adaptive runs (check_adaptive)."""
    if args.algorithm is None:
        return None
    if args.algorithm not in KNOWN_ALGORITHMS:
        die([LAUNCH_FRAME, ARGS_FRAME], f"ValueError: Unknown speculative algorithm name: {args.algorithm}")
    if args.algorithm == "NEXTN":
        args.algorithm = "EAGLE"
    if args.max_running_requests is None:
        args.max_running_requests = 48
        log(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests."
        )
    if model.architectures[:1] and model.architectures[0] in MTP_ARCHS:
        args.draft_model_path = args.draft_model_path or args.model_path
    slots = check_adaptive(args)
    if slots is not None:  # each of the three resolved on its own: no all-or-none assertion
        return slots
    given = [v is not None for v in (args.steps, args.topk, args.draft_tokens)]
    if any(given) and not all(given):
        frame = (f"{SRT}/server_args.py", 1391, "_handle_speculative_decoding", "assert (")
        die([LAUNCH_FRAME, ARGS_FRAME, frame], "AssertionError")
    if not any(given):
        args.steps, args.topk, args.draft_tokens = _auto_spec_params(model)
    if args.topk == 1 and args.draft_tokens != (args.steps or 0) + 1:
        log(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
            "when speculative_eagle_topk == 1"
        )
        args.draft_tokens = (args.steps or 0) + 1
    return None


#: Why SGLang 0.5.23 runs static settings despite --speculative-adaptive
#: (adaptive_spec_params._maybe_disable_adaptive), by the flag that asks for it.
ADAPTIVE_OFF_FLAGS = {
    "enable_multi_layer_eagle": (
        "enable_multi_layer_eagle=True is not supported (MultiLayerEagleWorkerV2 does not implement adaptive)"
    ),
    "enable_two_batch_overlap": (
        "enable_two_batch_overlap=True is not supported "
        "(adaptive state swap would discard the TboAttnBackend wrapper)"
    ),
    "enable_pdmux": (
        "enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group)"
    ),
}
#: What SGLang 0.5.23 refuses to start with under --speculative-adaptive (lora_hook, hisparse_hook).
ADAPTIVE_REFUSED = {
    "enable_lora": (
        "LoRA with EAGLE/NEXTN/EAGLE3 speculative decoding does not support --speculative-adaptive: "
        "the draft is built from a static ServerArgs snapshot, and the runtime-state swap does not "
        "rebuild LoRA cuda-graph metadata."
    ),
    "enable_hisparse": (
        "HiSparse speculative decoding uses statically sized swap state; "
        "--speculative-adaptive is not supported."
    ),
}
ADAPTIVE_FRAME = (
    f"{SRT}/arg_groups/speculative_hook.py",
    1417,
    "_init_adaptive_speculative_params",
    "raise ValueError(",
)


def adaptive_off(args: ServerArgs) -> str | None:
    """The reason SGLang gives for running static settings despite --speculative-adaptive."""
    raw = args.raw
    if args.algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={args.algorithm} (only EAGLE/EAGLE3 are supported)"
    if args.topk is not None and args.topk != 1:
        return f"speculative_eagle_topk={args.topk} (only topk=1 is supported)"
    attn_dp = int(str(getattr(raw, "attn_dp_size", None) or 1))
    if attn_dp > 1 or (getattr(raw, "enable_dp_attention", False) and args.dp_size > 1):
        return "attention DP is not supported (adaptive tier decisions are not synchronized across DP ranks)"
    return next((reason for name, reason in ADAPTIVE_OFF_FLAGS.items() if getattr(raw, name, False)), None)


def _error_name(err: BaseException) -> str:
    """An exception's name as a traceback's last line gives it: json.decoder.JSONDecodeError."""
    kind = type(err)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def check_adaptive(args: ServerArgs) -> dict[int, dict] | None:
    """0.5.23's speculative_hook for --speculative-adaptive: off with SGLang's warning where it
    falls back, a config that fails to load or a num_steps outside its candidates is fatal; then
    top-k 1, num_steps the given one or the candidates' middle, draft tokens num_steps + 1."""
    if not args.adaptive:
        return None
    if version_tuple() < (0, 5, 23):
        log(
            "stand-in: --speculative-adaptive is modelled from SGLang 0.5.23 on; "
            "static speculative params run"
        )
        args.adaptive = False
        return None
    reason = adaptive_off(args)
    if reason:
        log(f"speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
        args.adaptive = False
        return None
    for name, message in ADAPTIVE_REFUSED.items():
        if getattr(args.raw, name, False) or (
            name == "enable_lora" and getattr(args.raw, "lora_paths", None)
        ):
            die([LAUNCH_FRAME, ARGS_FRAME], f"ValueError: {message}")
    try:
        slots = _adaptive.load_config(args.adaptive_config)
    except (OSError, ValueError, AttributeError) as err:
        die([LAUNCH_FRAME, ARGS_FRAME, ADAPTIVE_FRAME], f"{_error_name(err)}: {err}")
    union = _adaptive.candidates(slots)
    if args.steps is not None and args.steps not in union:
        die(
            [LAUNCH_FRAME, ARGS_FRAME, ADAPTIVE_FRAME],
            f"ValueError: --speculative-num-steps={args.steps} is not in the adaptive config candidate_steps "
            f"{union}. Pass one of those values.",
        )
    args.topk = args.topk or 1
    args.steps = _adaptive.start_steps(slots, args.steps)
    args.draft_tokens = args.steps + 1
    return slots


def visible_gpus(count: int, env: str | None) -> list[int]:
    """Physical indexes of the logical devices 0, 1, ...: CUDA_VISIBLE_DEVICES (`env`), or every GPU
    of the host when unset. Like the CUDA runtime, the list ends before its first entry that is not
    an index on this host."""
    if env is None:
        return list(range(count))
    visible = []
    for entry in env.split(","):
        entry = entry.strip()
        if not (entry.isascii() and entry.isdigit()) or int(entry) >= count:
            break
        visible.append(int(entry))
    return visible


def check_gpus(args: ServerArgs, cfg: registry.GpuConfig) -> list[int]:
    """Physical indexes of the GPUs this node's ranks use; a logical device past what
    CUDA_VISIBLE_DEVICES (or the host) has fails like torch.cuda.set_device."""
    per_node = max(1, args.tp_size * args.dp_size // args.nnodes)
    given = registry.container_gpus()  # in a container: the host's GPUs it was given, as its 0, 1, ...
    if given is None:
        visible = visible_gpus(cfg.count, os.environ.get("CUDA_VISIBLE_DEVICES"))
    else:
        visible = [given[i] for i in visible_gpus(len(given), os.environ.get("CUDA_VISIBLE_DEVICES"))]
    logical = list(range(args.base_gpu_id, args.base_gpu_id + per_node))
    bad = [g for g in logical if g >= len(visible)]
    if bad:
        rank = f"TP{bad[0] - args.base_gpu_id}"
        frame = (
            f"{SRT}/model_executor/model_runner.py",
            436,
            "init_torch_distributed",
            "torch.get_device_module(self.device).set_device(self.gpu_id)",
        )
        before = f"[{time.strftime('%Y-%m-%d %H:%M:%S')} {rank}] Scheduler hit an exception: "
        error = (
            "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, "
            "so the stacktrace below might be incorrect.\n"
            f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] Received sigquit from a child process. "
            "It usually means the child failed."
        )
        die(
            [
                (f"{SRT}/managers/scheduler.py", 2871, "run_scheduler_process", "scheduler = Scheduler("),
                frame,
            ],
            error,
            before,
        )
    return [visible[g] for g in logical]


def prepare(args: ServerArgs) -> Runtime:
    """The fast checks the real server makes before touching a GPU."""
    model = check_model(args.model_path)
    slots = check_speculative(args, model)
    drafter = None
    if args.algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and args.draft_model_path:
        drafter = read_model_dir(args.draft_model_path)
    cfg = registry.load_config()
    gpus = check_gpus(args, cfg)
    spec = None
    if args.algorithm is not None:
        a = float(drafter.knob("accept_top1")) if drafter else 0.30
        crippled = args.algorithm == "EAGLE" and drafter is not None and drafter.is_eagle3
        steps = args.steps if args.steps is not None else 1  # an adaptive tier may have 0
        spec = _speed.SpecSettings(steps, args.topk or 1, args.draft_tokens or 2, a, crippled)
    decode = _speed.decode_model(float(model.knob("base_tok_s")), spec, args.cuda_graph)
    if args.mem_fraction_static is None:
        args.mem_fraction_static = default_mem_fraction(args, model, cfg.total_mib)
    fraction = args.mem_fraction_static
    if args.max_running_requests is None:
        args.max_running_requests = 1024 if version_tuple() < (0, 5, 20) else 2048
    trained_on = str(drafter.knob("trained_on")) if drafter else "chat"
    return Runtime(args, model, drafter, spec, decode, gpus, cfg, fraction, trained_on, adaptive_slots=slots)


# --- mem_fraction_static ----------------------------------------------------------------------

#: The vision tower's size a ViT-L/14 has (server_args.adjust_mem_fraction_for_vlm's baseline), and
#: KimiK25VisionConfig's defaults (configs/kimi_k25.py: its config.json names them vt_*).
VIT_BASELINE = (24, 1024)
VISION_DEFAULTS = {"KimiK25ForConditionalGeneration": (27, 1152)}
#: Multimodal architectures whose prefill breakable CUDA graph 0.5.23 keeps on
#: (configs/model_config.py, multimodal_breakable_cuda_graph_supported_model_archs).
BCG_MULTIMODAL = {"KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration"}


def raw(args: ServerArgs, name: str, default: object = None) -> object:
    value = getattr(args.raw, name, None)
    return default if value is None else value


def uses_mla(model: ModelDir) -> bool:
    text = model.config.get("text_config") or model.config
    return text.get("kv_lora_rank") is not None


def is_multimodal(model: ModelDir) -> bool:
    return "vision_config" in model.config or model.architectures[:1] == ["KimiK25ForConditionalGeneration"]


def capacity_defaults(gpu_mem: float, tp: int, newer: bool) -> tuple[int, int]:
    """(chunked_prefill_size, decode max bs) by GPU memory: _handle_gpu_memory_settings (0.5.9),
    arg_groups/memory_hook.handle_gpu_memory_settings (0.5.23, which gives 20-35 GB cards 4096 and
    48/160)."""
    if gpu_mem < 20 * 1024:
        return 2048, 8
    if gpu_mem < 35 * 1024:
        return (4096, 48 if tp < 4 else 160) if newer else (2048, 24 if tp < 4 else 80)
    if gpu_mem < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """generate_prefill_cuda_graph_batch_sizes (0.5.23; 0.5.9's piecewise tokens are the same list)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64)]
    sizes += [*range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return [s for s in sizes if s <= max_bs]


def vlm_factor(model: ModelDir) -> float:
    """adjust_mem_fraction_for_vlm: 0.95 x (1 - 0.1 x (ViT size / ViT-L's - 1)), clamped to [0.8, 1.05]."""
    vision = model.config.get("vision_config") or {}
    layers, hidden = VISION_DEFAULTS.get((model.architectures or [""])[0], VIT_BASELINE)
    layers = int(vision.get("num_hidden_layers", layers))
    hidden = int(vision.get("hidden_size", hidden))
    ratio = layers * hidden**2 / (VIT_BASELINE[0] * VIT_BASELINE[1] ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def reserved_mib(args: ServerArgs, model: ModelDir, gpu_mem: float) -> float:
    """The MB server_args keeps out of the static pool for activations and graphs.

    0.5.9 server_args._handle_gpu_memory_settings:
        reserved_mem = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2
                       + tp_size * pp_size / 8 * 1024   [+ DP attention, piecewise graphs]
        reserved_mem = max(reserved_mem, 10 * 1024) if gpu_mem > 60 * 1024
        + 2 * 1024 for EAGLE-family drafts, + 6 * 1024 for STANDALONE
    0.5.23 memory_hook.handle_gpu_memory_settings: the same activation terms, then
    reserve_for_graph_mb (decode max_bs * 2 when decode graphs run; prefill graphs: 1.5 * 1024
    with MLA, else 8 per captured size), the 10 GB floor, + 2 * 1024 for DeepEP; no draft term
    (0.5.23 loads the draft before sizing the KV pool and counts its weights there).
    """
    newer = version_tuple() >= (0, 5, 20)
    tp, pp = args.tp_size, int(str(raw(args, "pp_size", 1)))
    chunked_default, max_bs = capacity_defaults(gpu_mem, tp, newer)
    chunked = int(str(raw(args, "chunked_prefill_size", chunked_default)))
    if args.cuda_graph_max_bs is not None:
        max_bs = args.cuda_graph_max_bs
    elif newer and raw(args, "max_running_requests") is not None:
        max_bs = min(max_bs, int(str(raw(args, "max_running_requests"))))
    tokens = (
        max(chunked, 2048) if chunked > 0 else max(int(str(raw(args, "max_prefill_tokens", 16384))), 2048)
    )
    reserved = 512 + tokens * 1.5 + tp * pp / 8 * 1024
    dp = args.dp_size if raw(args, "enable_dp_attention") else 1
    if not newer:
        reserved += max_bs * 2
        if dp > 1:
            reserved += max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
        if raw(args, "enable_piecewise_cuda_graph"):
            reserved += len(prefill_graph_sizes(2048 if uses_mla(model) else chunked)) * 8
        if gpu_mem > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        if args.algorithm == "STANDALONE":
            reserved += 6 * 1024
        elif args.algorithm not in (None, "NGRAM"):
            reserved += 2 * 1024
        return reserved
    explicit = raw(args, "cuda_graph_backend_decode")
    if explicit is not None:  # parse_cuda_graph_config: the per-phase backend wins over the off-switches
        decode = explicit != "disabled"
    else:
        decode = not (raw(args, "disable_cuda_graph") or raw(args, "disable_decode_cuda_graph"))
    if decode:
        reserved += max_bs * 2
        if dp > 1:
            reserved += max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
    if prefill_graphs(args, model):
        if uses_mla(model):
            reserved += 1.5 * 1024
        else:
            default = (
                chunked
                if raw(args, "max_total_tokens") is None
                else min(chunked, int(str(raw(args, "max_total_tokens"))))
            )
            reserved += (
                len(prefill_graph_sizes(int(str(raw(args, "cuda_graph_max_bs_prefill", default))))) * 8
            )
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    a2a = raw(args, "moe_a2a_backend", "none")
    return reserved + (2 * 1024 if decode and a2a == "deepep" else 0)


def prefill_graphs(args: ServerArgs, model: ModelDir) -> bool:
    """0.5.23's prefill CUDA graph: breakable by default on CUDA (cuda_graph_config.default_prefill_backend),
    off with the flags, and off where apply_cuda_graph_compatibility finds it incompatible (PP, two-batch
    overlap, an unvalidated all-to-all backend, a multimodal model not on the list)."""
    explicit = raw(args, "cuda_graph_backend_prefill")
    if explicit is not None:
        return explicit != "disabled"
    if raw(args, "disable_cuda_graph") or raw(args, "disable_prefill_cuda_graph"):
        return False
    if int(str(raw(args, "pp_size", 1))) > 1 or raw(args, "enable_two_batch_overlap"):
        return False
    if raw(args, "moe_a2a_backend", "none") not in ("none", "deepep", "megamoe", "flashinfer"):
        return False
    return not (is_multimodal(model) and (model.architectures or [""])[0] not in BCG_MULTIMODAL)


def default_mem_fraction(args: ServerArgs, model: ModelDir, gpu_mem: float) -> float:
    """mem_fraction_static when none is given: round((gpu_mem - reserved_mem) / gpu_mem, 3), then
    x vlm_factor for a multimodal model (not with --language-only). gpu_mem: nvidia-smi's
    memory.total in MiB (utils.get_nvgpu_memory_capacity)."""
    fraction = round((gpu_mem - reserved_mib(args, model, gpu_mem)) / gpu_mem, 3)
    text_only = raw(args, "language_only") or raw(args, "language_model_only")
    if is_multimodal(model) and not text_only:
        fraction *= vlm_factor(model)
    return fraction

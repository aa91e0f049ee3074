"""Start-up of the stand-in, in the real server's order: argument checks (seconds), then
weight load, KV cache and CUDA graph capture (the load delay), each able to fail as SGLang does.

GPU memory "allows" a start when, on every GPU the server uses, mem_fraction_static x total
fits in what other holders leave free; a fraction above 0.95 always fails (the real server
needs the rest for the CUDA context, activations and graphs, and dies capturing graphs).

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
from sglang._args import DEFAULT_MEM_FRACTION, ServerArgs, version_tuple
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
MIN_KV_MIB = 1024  # below this the KV pool has no room: "Not enough memory"
TORCH_GIB_PER_MIB = 139.81 / 143771  # torch reports 139.81 GiB where nvidia-smi shows 143771 MiB
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
    return f"{mib * TORCH_GIB_PER_MIB:.2f}"


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
    fraction = args.mem_fraction_static if args.mem_fraction_static is not None else DEFAULT_MEM_FRACTION
    args.mem_fraction_static = fraction
    if args.max_running_requests is None:
        args.max_running_requests = 1024 if version_tuple() < (0, 5, 20) else 2048
    trained_on = str(drafter.knob("trained_on")) if drafter else "chat"
    return Runtime(args, model, drafter, spec, decode, gpus, cfg, fraction, trained_on, adaptive_slots=slots)

"""The slow half of start-up, in SGLang's order and with its log lines per version: init, target
weights, KV cache, CUDA graphs (with DeepGEMM's JIT at the first capture), then the draft worker
(its weights, KV cache and graphs).

GPU memory is SGLang's arithmetic (docs/standins.md, "GPU memory"), per GPU, in MiB here and
GiB (bytes / 2**30) in the lines. torch sees TORCH_SHARE of nvidia-smi's total; free memory is that
less what the registry says other processes hold, less this process's own. In order:

- init: a CUDA context (CONTEXT_MIB); then SGLang measures what is free, min over the ranks
  (0.5.9 ModelRunner.init_torch_distributed `min_per_gpu_memory = get_available_gpu_memory(`;
  0.5.23 distributed/bootstrap.measure_pre_model_load_memory `pre_model_load_memory`), and
  refuses GPUs more than 10% apart ("The memory capacity is unbalanced").
- weights: the model dir's safetensors (sglang/_weights.py), this rank's share, allocated
  parameter by parameter; the one that does not fit raises torch's OutOfMemoryError.
- KV cache: model_runner_kv_cache_mixin.profile_max_num_token (0.5.9) /
  kv_cache_configurator._profile_available_bytes (0.5.23):
      rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)
      max_total_num_tokens = int(rest_memory * (1 << 30)) // cell_size   (then page-aligned)
  (0.5.23 also takes the multimodal embedding cache, and sizes the cell with the draft's layers.)
- graphs: GRAPH_MIB, the draft's DRAFT_GRAPH_MIB.

Timing: weights take their files' uncached bytes / read_mib_s + cached bytes / 20000 MiB/s (else
0.6 x load_delay_s); graphs capture_s_per_bs per batch size (else 0.4 x load_delay_s); the `stall`
knob stops a phase.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from nvidia_standin import registry

from sglang import _adaptive, _dist, _jit, _progress, _weights
from sglang._args import version_tuple
from sglang._common import MTP_ARCHS, SRT, START, ModelDir, config_error, die, log
from sglang._startup import MAX_FRACTION, TORCH_SHARE, Runtime, gib, is_multimodal, raw, uses_mla

CONTEXT_MIB = 512
#: NCCL and the custom all-reduce buffers of a distributed init (more than one rank): a real H200
#: at TP 8 then logs "Load weight begin. avail mem=137.29 GB" (sgl-project/sglang PR 11716).
DIST_INIT_MIB = 2048
SCHED_FRAME = (f"{SRT}/managers/scheduler.py", 2871, "run_scheduler_process", "scheduler = Scheduler(")
RUNNER_FRAME = (f"{SRT}/model_executor/model_runner.py", 1710, "init_memory_pool", "self.token_to_kv_pool = ")
GRAPH_FRAME = (f"{SRT}/model_executor/cuda_graph_runner.py", 452, "__init__", "self.capture()")
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
GRAPH_HINTS = """Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
3. disable torch compile by not using --enable-torch-compile
4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)
Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose"""
GRAPH_MIB = 820  # what the captured graphs take
DRAFT_GRAPH_MIB = 160
#: The multimodal embedding cache 0.5.23 keeps out of the KV budget (SGLANG_VLM_CACHE_SIZE_MB).
VLM_CACHE_MIB = 100
MIB = 1 << 20

#: Frames of the failures below, per version (the wheels' line numbers).
FRAMES = {
    "unbalanced": {
        False: [
            (
                f"{SRT}/model_executor/model_runner.py",
                845,
                "init_torch_distributed",
                "raise RuntimeError(msg)",
            )
        ],
        True: [
            (f"{SRT}/distributed/bootstrap.py", 450, "_check_tp_memory_balance", "raise RuntimeError(msg)")
        ],
    },
    "load": {
        False: [
            (
                f"{SRT}/model_executor/model_runner.py",
                980,
                "load_model",
                "self.model = self.loader.load_model(",
            ),
            (f"{SRT}/model_loader/loader.py", 671, "load_model", "model = _initialize_model("),
            (f"{SRT}/model_loader/loader.py", 277, "_initialize_model", "return model_class(**kwargs)"),
        ],
        True: [
            (
                f"{SRT}/model_executor/model_runner_components/load_model_utils.py",
                346,
                "load_model_with_memory_saver",
                "model = loader.load_model(",
            ),
            (f"{SRT}/model_loader/loader.py", 1014, "load_model", "model = _initialize_model("),
            (f"{SRT}/model_loader/loader.py", 309, "_initialize_model", "model = model_class(**kwargs)"),
        ],
    },
    "experts": {
        False: [
            (
                f"{SRT}/layers/moe/fused_moe_triton/layer.py",
                292,
                "__init__",
                "self.quant_method.create_weights(",
            ),
            (
                f"{SRT}/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16_moe.py",
                102,
                "create_weights",
                "torch.empty(",
            ),
        ],
        True: [
            (
                f"{SRT}/layers/moe/fused_moe_triton/layer.py",
                561,
                "__init__",
                "self.quant_method.create_weights(",
            ),
            (
                f"{SRT}/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16_moe.py",
                116,
                "create_weights",
                "torch.empty(",
            ),
        ],
    },
    "linear": {
        False: [(f"{SRT}/layers/quantization/unquant.py", 80, "create_weights", "torch.empty(")],
        True: [(f"{SRT}/layers/quantization/unquant.py", 520, "create_weights", "torch.empty(")],
    },
    "pool": {
        False: [
            (
                f"{SRT}/model_executor/model_runner.py",
                590,
                "initialize",
                "self.init_memory_pool(min_per_gpu_memory)",
            ),
            (
                f"{SRT}/model_executor/model_runner_kv_cache_mixin.py",
                416,
                "init_memory_pool",
                "raise RuntimeError(",
            ),
        ],
        True: [
            (
                f"{SRT}/model_executor/model_runner.py",
                982,
                "alloc_memory_pool",
                "result = self.kv_cache_configurator.configure(",
            ),
            (
                f"{SRT}/mem_cache/kv_cache_configurator.py",
                3050,
                "_profile_available_bytes",
                "raise ValueError(",
            ),
        ],
    },
}


def newer() -> bool:
    """0.5.23's spellings (elapsed=, dtype:, target/draft CUDA graph); 0.5.9's otherwise."""
    return version_tuple() >= (0, 5, 20)


def since(tic: float) -> float:
    return time.perf_counter() - tic


def stamp(rank: str = "") -> str:
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{' ' + rank if rank else ''}]"


def fail(frames: list, error: str, rank: str = "TP0") -> None:
    """A scheduler exception, as the real server prints it before killing itself."""
    die(
        [SCHED_FRAME, *frames],
        f"{error}\n{stamp()} {SIGQUIT}",
        f"{stamp(rank)} Scheduler hit an exception: ",
    )


# --- GPU memory as torch sees it -------------------------------------------------------------


def torch_total(rt: Runtime) -> float:
    return round(rt.gpu_cfg.total_mib * TORCH_SHARE)


def free_mib(rt: Runtime, gpu: int) -> float:
    """torch.cuda.mem_get_info's free memory of physical GPU `gpu`, in MiB."""
    return torch_total(rt) - registry.used_mib(gpu, exclude_pid=os.getpid()) - rt.held_mib


def local_free(rt: Runtime) -> float:
    """What this node's first rank sees (its lines are the ones printed)."""
    return free_mib(rt, rt.gpus[0])


def tightest_gpu(rt: Runtime) -> tuple[int, float]:
    """(gpu, free MiB) of the used GPU with the least memory free: the min SGLang takes over ranks."""
    free = {g: free_mib(rt, g) for g in rt.gpus}
    gpu = min(free, key=lambda g: free[g])
    return gpu, free[gpu]


def hold(rt: Runtime, mib: float) -> None:
    """Allocate `mib` more on each of this node's GPUs (nvidia-smi shows it at once)."""
    rt.held_mib += mib
    registry.register(rt.gpus, math.ceil(rt.held_mib))


def torch_size(nbytes: float) -> str:
    """c10's format_size: bytes, KiB, MiB or GiB with two decimals."""
    if nbytes <= 1024:
        return f"{int(nbytes)} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if nbytes <= scale << 10 or unit == "GiB":
            return f"{nbytes / scale:.2f} {unit}"
    raise AssertionError


def oom_text(rt: Runtime, gpu: int, wanted: float, free: float, own: float, allocated: float) -> str:
    """torch's out-of-memory message (bytes) for physical GPU `gpu`, which torch names by its logical
    index, naming the other processes on that GPU as torch does."""
    others = "".join(
        f"Process {h.pid} has {torch_size(h.mib_per_gpu * MIB)} memory in use. "
        for h in registry.holders()
        if gpu in h.gpus and h.pid != os.getpid()
    )
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {torch_size(wanted)}. "
        f"GPU {rt.logical(gpu)} has a total capacity of {torch_size(torch_total(rt) * MIB)} of which "
        f"{torch_size(max(free, 0))} is free. {others}Including non-PyTorch memory, this process has "
        f"{torch_size(own)} memory in use. Of the allocated memory {torch_size(allocated)} is allocated "
        "by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def check_balance(rt: Runtime) -> None:
    """SGLang's guard against a GPU that others hold: with TP > 1, a rank whose free memory exceeds
    the minimum by more than 1/0.9 raises (SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK, on by default)."""
    frees = [free_mib(rt, g) / 1024 for g in rt.gpus]
    low = min(frees)
    rt.pre_gib = low
    if rt.args.tp_size <= 1:
        return
    for i, local in enumerate(frees):
        if low < local * 0.9:
            name = "pre_model_load_memory" if newer() else "min_per_gpu_memory"
            msg = (
                "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
                f"processes. {name}={low!r}, local_gpu_memory={local!r}, "
                f"local_gpu_memory * 0.9={local * 0.9!r}"
            )
            fail(FRAMES["unbalanced"][newer()], msg, f"TP{rt.args.node_rank * len(rt.gpus) + i}")


def init(rt: Runtime, draft: bool = False) -> _dist.Group | None:
    """The process group (the draft worker joins none); `hang` and stall=init never return."""
    tic = time.perf_counter()
    log("Init torch distributed begin.", rt.tp_label)
    if draft:
        log(f"Init torch distributed ends. elapsed={since(tic):.2f} s, mem usage=0.00 GB", rt.tp_label)
        return None
    hold(rt, CONTEXT_MIB)
    if rt.model.knob("hang") or rt.stall == "init":
        _progress.forever()  # an NCCL init that never returns: no output, no port, until killed
    group = _dist.join(rt)
    dist = DIST_INIT_MIB if rt.args.tp_size > 1 else 0
    hold(rt, dist)
    check_balance(rt)
    log(
        f"Init torch distributed ends. elapsed={since(tic):.2f} s, mem usage={gib(CONTEXT_MIB + dist)} GB",
        rt.tp_label,
    )
    return group


# --- weights ---------------------------------------------------------------------------------


def read_seconds(rt: Runtime, files: list[Path], fallback: float) -> float:
    """Reading `files` at the storage's read_mib_s (what the page cache holds at 20000 MiB/s), and
    leaving them in the page cache as the real load does; `fallback` seconds without the knob."""
    speed = rt.model.knob("read_mib_s")
    if speed is None:
        return fallback
    seconds = _weights.read_seconds(files, float(str(speed)))[0]
    _weights.fill_page_cache(files)
    return seconds


def shards_bar(rt: Runtime, shards: int, seconds: float, stall: bool) -> None:
    desc = "Multi-thread loading shards" if newer() else "Loading safetensors checkpoint shards"
    _progress.run(_progress.SHARDS, lambda _: desc, max(1, shards), seconds, stall)


def quant_note(model: ModelDir) -> str:
    """0.5.23's `quant=<method>, ` (ModelConfig.get_quantization_config_log_str), from config.json or
    its text_config (KimiK25Config propagates the text model's quantization_config)."""
    text = model.config.get("text_config") or {}
    quant = model.config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(quant, dict):
        return ""
    note = f"quant={quant.get('quant_method', 'quantized')}"
    return note + "".join(
        f", {k}={quant[k]}" for k in ("bits", "quant_algo", "fmt", "requantization_method") if k in quant
    )


def weight_end(rt: Runtime, model: ModelDir, elapsed: float, avail_mib: float, used_mib: float) -> None:
    """model_runner.load_model's line: 0.5.9 names the dtype, 0.5.23 the quantization."""
    if newer():
        note = quant_note(model)
        detail = f"{note}, " if note else ""
    else:
        detail = "dtype=torch.bfloat16, "
    log(
        f"Load weight end. elapsed={elapsed:.2f} s, type={(model.architectures or ['?'])[0]}, {detail}"
        f"avail mem={gib(avail_mib)} GB, mem usage={gib(used_mib)} GB.",
        rt.tp_label,
    )


def check_fits(rt: Runtime, weights: _weights.Weights) -> None:
    """Allocate the parameters in construction order on the tightest GPU; the first that does not fit
    raises torch's OutOfMemoryError, naming its size and what was free then."""
    gpu, free = tightest_gpu(rt)
    budget, done = free * MIB, 0
    for name, size in weights.groups:
        if done + size > budget:
            own = rt.held_mib * MIB + done
            allocated = (rt.held_mib - CONTEXT_MIB) * MIB + done
            kind = "experts" if ".experts.w" in name else "linear"
            frames = FRAMES["load"][newer()] + FRAMES[kind][newer()]
            fail(frames, oom_text(rt, gpu, size, budget - done, own, allocated), rt.tp_label)
        done += size


def load_weights(rt: Runtime) -> float:
    """The target's share of its checkpoint (MiB per GPU), after the load time; dies where it does
    not fit."""
    tic = time.perf_counter()
    weights = _weights.load(rt.model.path, rt.args.tp_size, rt.model.config, "target")
    log(f"Load weight begin. avail mem={gib(local_free(rt))} GB", rt.tp_label)
    check_fits(rt, weights)
    seconds = read_seconds(rt, weights.files, float(str(rt.model.knob("load_delay_s"))) * 0.6)
    shards = len(weights.files) or int(float(str(rt.model.knob("shards"))))
    shards_bar(rt, shards, seconds, rt.stall == "weights")
    mib = weights.total / MIB
    hold(rt, mib)
    rt.timings["load_weight"] = since(tic)
    weight_end(rt, rt.model, since(tic), local_free(rt), mib)
    return mib


# --- the KV cache ----------------------------------------------------------------------------

KV_DTYPES = {
    "fp8_e4m3": ("torch.float8_e4m3fn", 1),
    "fp8_e5m2": ("torch.float8_e5m2", 1),
    "float16": ("torch.float16", 2),
}


def kv_dtype(rt: Runtime) -> tuple[str, int]:
    """--kv-cache-dtype: auto is the model's dtype (bfloat16 for the lab's models)."""
    return KV_DTYPES.get(str(raw(rt.args, "kv_cache_dtype", "auto")), ("torch.bfloat16", 2))


def cell_bytes(model: ModelDir, tp: int, layers: int | None, size: int) -> tuple[int, bool]:
    """(bytes per token, MLA?) as get_cell_size_per_token computes it:
    MLA:  (kv_lora_rank + qk_rope_head_dim) * num_layers * kv_size
    else: get_num_kv_heads(tp) * (head_dim + v_head_dim) * num_layers * kv_size,
          get_num_kv_heads = max(1, num_key_value_heads // tp)."""
    text = model.config.get("text_config") or model.config
    layers = int(text.get("num_hidden_layers") or 1) if layers is None else layers
    if uses_mla(model):
        return (int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 64)) * layers * size, True
    heads = int(text.get("num_attention_heads") or 1)
    head_dim = int(text.get("head_dim") or int(text.get("hidden_size") or 4096) // heads)
    kv_heads = max(1, int(text.get("num_key_value_heads") or heads) // tp)
    return kv_heads * (head_dim + head_dim) * layers * size, False


def kv_line(tokens: int, nbytes: float, mla: bool, dtype: str = "torch.bfloat16") -> str:
    """memory_pool._finalize_allocation_log: MLA one KV buffer, MHA K and V."""
    shown = f"dtype: {dtype}, " if newer() else ""
    if mla:
        return f"KV Cache is allocated. {shown}#tokens: {tokens}, KV size: {nbytes / (1 << 30):.2f} GB"
    half = nbytes / 2 / (1 << 30)
    return f"KV Cache is allocated. {shown}#tokens: {tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB"


def draft_layers(rt: Runtime) -> int:
    """The draft's KV layers: its num_nextn_predict_layers, else its num_hidden_layers
    (spec_aux_hidden_state.resolve_spec_aux_hidden_state_config)."""
    assert rt.drafter is not None
    text = rt.drafter.config.get("text_config") or rt.drafter.config
    return int(text.get("num_nextn_predict_layers") or text.get("num_hidden_layers") or 1)


def profile_tokens(rt: Runtime, cell: int) -> int:
    """max_total_num_tokens, or the death SGLang's profiling dies with."""
    fraction, page = rt.mem_fraction, int(str(raw(rt.args, "page_size", 1)))
    available = tightest_gpu(rt)[1] / 1024  # get_available_gpu_memory(distributed=True), GiB
    rest = available - rt.pre_gib * (1 - fraction)
    if newer():
        if is_multimodal(rt.model):
            rest -= VLM_CACHE_MIB / 1024  # mm_runtime_reservation_gb
        if rest <= 0:
            minimum = 1 - available / rt.pre_gib
            msg = (
                "ValueError: Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={fraction}. Raise --mem-fraction-static above "
                f"{math.ceil(minimum * 1000) / 1000:.3f} (minimum viable = 1 - available/pre = "
                f"{minimum:.4f}). If using speculative decoding, draft weights are now counted."
            )
            fail(FRAMES["pool"][True], msg, rt.tp_label)
        if rt.draft:  # pool_configurator: the draft's pool, as many tokens, shares the budget
            text = rt.model.config.get("text_config") or rt.model.config
            cell += int(cell * draft_layers(rt) / int(text.get("num_hidden_layers") or 1))
    tokens = int(rest * (1 << 30)) // cell
    cap = raw(rt.args, "max_total_tokens")
    if cap is not None:
        tokens = min(tokens, int(str(cap)))
    tokens = tokens // page * page
    if tokens <= 0:
        msg = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
        if not newer():
            msg += f" Current value: self.server_args.mem_fraction_static={fraction}"
        frames = FRAMES["pool"][False] if not newer() else FRAMES["pool"][True][:1]
        fail(frames, msg, rt.tp_label)
    return tokens


def allocate_pool(rt: Runtime) -> None:
    """The target's KV pool: max_total_num_tokens from the profile, then (tokens + page_size) slots
    of every layer's buffers (slot 0 is the padding slot)."""
    tic = time.perf_counter()
    if rt.stall == "kv_cache":
        _progress.forever()
    dtype, size = kv_dtype(rt)
    cell, mla = cell_bytes(rt.model, rt.args.tp_size, None, size)
    tokens = profile_tokens(rt, cell)
    rt.max_total_num_tokens = tokens
    nbytes = (tokens + int(str(raw(rt.args, "page_size", 1)))) * cell
    hold(rt, nbytes / MIB)
    log(kv_line(tokens, nbytes, mla, dtype), rt.tp_label)
    log(f"Memory pool end. avail mem={gib(local_free(rt))} GB", rt.tp_label)
    rt.timings["kv_cache_allocation"] = since(tic)


# --- CUDA graphs -----------------------------------------------------------------------


def default_max_bs(total_mib: int, tp_size: int) -> int:
    """server_args' choice by GPU memory when no max batch size is given (H200: 256 below TP 4, else 512)."""
    gib_total = total_mib / 1024
    small = tp_size < 4
    for limit, few, many in ((20, 8, 8), (35, 24, 80), (60, 32, 160), (160, 256, 512)):
        if gib_total < limit:
            return few if small else many
    return 512


def capture_batch_sizes(max_bs: int, speculative: bool, max_running: int | None) -> list[int]:
    """The batch sizes SGLang captures up to max_bs (a finer list with speculative decoding),
    cut at the request pool's size, which is added when it falls between two of them."""
    if speculative:
        sizes = [
            *range(1, 9),
            *range(10, 33, 2),
            *range(40, 65, 4),
            *range(72, 257, 8),
            *range(272, max_bs + 1, 16),
        ]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, max_bs + 1, 16)]
    sizes = [bs for bs in sizes if bs <= max_bs] or [max_bs]
    if max_running is not None and max_running < sizes[-1]:
        sizes = [bs for bs in sizes if bs < max_running] + [max_running]
    return sizes


def batch_sizes(rt: Runtime) -> list[int]:
    max_bs = rt.args.cuda_graph_max_bs or default_max_bs(rt.gpu_cfg.total_mib, rt.args.tp_size)
    return capture_batch_sizes(max_bs, rt.args.algorithm is not None, rt.args.max_running_requests)


def capture_bar(
    sizes: list[int], avail_mib: float, seconds: float, stall: bool, first_only: bool = False
) -> None:
    """Largest batch first, as SGLang captures them; the description names the size at hand.
    `first_only`: the bar as drawn before the first capture (which then fails)."""
    order = list(reversed(sizes))
    avail = avail_mib / 1024

    def desc(n: int) -> str:
        return f"Capturing batches (bs={order[min(n, len(order) - 1)]} avail_mem={avail:.2f} GB)"

    if first_only:
        _progress.first(_progress.DEFAULT, desc(0), len(order))
        return
    _progress.run(_progress.DEFAULT, desc, len(order), seconds, stall)


def graph_begin(rt: Runtime, what: str, sizes: list[int], tokens: int, avail_mib: float) -> None:
    """`what`: target decode / target verify / draft decode / draft extend."""
    if newer():
        log(
            f"Capture {what} CUDA graph begin. backend=full, num_tokens_per_req={tokens}, "
            f"bs={sizes}, avail mem={gib(avail_mib)} GB",
            rt.tp_label,
        )
        return
    name = {
        "target decode": "",
        "target verify": "",
        "draft decode": "draft ",
        "draft extend": "draft extend ",
    }[what]
    log(
        f"Capture {name}cuda graph begin. This can take up to several minutes. avail mem={gib(avail_mib)} GB",
        rt.tp_label,
    )
    if not name:
        log(f"Capture cuda graph bs {sizes}", rt.tp_label)


def graph_end(rt: Runtime, what: str, elapsed: float, used_mib: float, avail_mib: float) -> None:
    if newer():
        log(
            f"Capture {what} CUDA graph end. elapsed={elapsed:.2f} s, mem usage={gib(used_mib)} GB, "
            f"avail mem={gib(avail_mib)} GB.",
            rt.tp_label,
        )
        return
    name = {
        "target decode": "",
        "target verify": "",
        "draft decode": "draft ",
        "draft extend": "draft extend ",
    }[what]
    log(
        f"Capture {name}cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={gib(used_mib)} GB. "
        f"avail mem={gib(avail_mib)} GB.",
        rt.tp_label,
    )


def capture_seconds(rt: Runtime, count: int) -> float:
    per_bs = rt.model.knob("capture_s_per_bs")
    if per_bs is None:
        return float(rt.model.knob("load_delay_s")) * 0.4
    return count * float(per_bs)


def deep_gemm(rt: Runtime, avail_mib: float) -> None:
    """DeepGEMM's JIT at the first forward pass, when the jit_s knob asks for one."""
    seconds = float(rt.model.knob("jit_s"))
    if seconds <= 0 and rt.stall != "jit":
        return
    tic = time.perf_counter()
    hidden, tp = rt.model.hidden_size, rt.args.tp_size
    avail = round(avail_mib / 1024, 2)
    _jit.run(rt.tp_label, rt.args.model_path, hidden, tp, seconds, avail, rt.stall == "jit")
    rt.timings["jit"] = since(tic)


def graph_failure(rt: Runtime, left: float) -> str | None:
    """What kills the capture: a fraction leaving no room (above MAX_FRACTION the rest cannot hold
    the activations and graphs), or an EAGLE-1 drafter under EAGLE3."""
    if rt.mem_fraction > MAX_FRACTION:
        own = rt.held_mib * MIB
        oom = oom_text(rt, rt.gpus[0], 1536 * MIB, max(left - 1024, 0) * MIB, own, own - CONTEXT_MIB * MIB)
        if rt.args.cuda_graph:
            oom += "\n\nDuring handling of the above exception, another exception occurred:\n\n" + (
                f"Exception: Capture cuda graph failed: {oom.split(': ', 1)[1]}\n{GRAPH_HINTS}"
            )
        return oom
    if rt.args.algorithm == "EAGLE3" and rt.drafter is not None and not rt.drafter.is_eagle3:
        hidden = rt.model.hidden_size
        shapes = f"(4x{3 * hidden} and {2 * hidden}x{hidden})"
        error = f"RuntimeError: mat1 and mat2 shapes cannot be multiplied {shapes}"
        if rt.args.cuda_graph:
            error = f"Exception: Capture cuda graph failed: {error.split(': ', 1)[1]}\n{GRAPH_HINTS}"
        return error
    return None


def capture_graphs(rt: Runtime) -> None:
    """Graph capture runs the drafter too: a too-big fraction or a wrong drafter dies here,
    after the first (largest) batch size; without CUDA graphs they die in the first forward."""
    left = local_free(rt)
    failure = graph_failure(rt, left)
    if not rt.args.cuda_graph:
        if failure:
            fail([GRAPH_FRAME], failure, rt.tp_label)
        return
    tic = time.perf_counter()
    sizes = batch_sizes(rt)
    what = "target decode" if rt.args.algorithm is None else "target verify"
    tokens = 1 if rt.args.algorithm is None else rt.args.draft_tokens or 1
    graph_begin(rt, what, sizes, tokens, left)
    deep_gemm(rt, left)
    if failure:
        capture_bar(sizes, left - 20, 0.0, stall=False, first_only=True)
        fail([GRAPH_FRAME], failure, rt.tp_label)
    capture_bar(sizes, left - 20, capture_seconds(rt, len(sizes)), rt.stall == "graphs")
    rt.timings["decode" if rt.args.algorithm is None else "target_verify"] = since(tic)
    hold(rt, GRAPH_MIB)
    graph_end(rt, what, since(tic), GRAPH_MIB, left - GRAPH_MIB)


# --- the draft worker ----------------------------------------------------------------------


def check_drafter(rt: Runtime) -> None:
    """EAGLE-family algorithms build a draft worker from the draft model path, like SGLang."""
    path = rt.args.draft_model_path
    frame = (
        f"{SRT}/speculative/eagle_worker.py",
        112,
        "__init__",
        "model_path=server_args.speculative_draft_model_path,",
    )
    if path is None:
        fail(
            [frame],
            "OSError: None is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'",
            rt.tp_label,
        )
    if rt.drafter is None:
        fail([frame], config_error(str(path)), rt.tp_label)


def draft_graphs(rt: Runtime, left: float) -> None:
    """The draft decode graphs (only with more than one step) and the draft extend graphs."""
    sizes = batch_sizes(rt)
    total = float(rt.model.knob("draft_capture_s"))
    steps = rt.args.steps or 1
    parts = [("draft decode", rt.args.topk or 1)] if steps > 1 else []
    parts.append(("draft extend", rt.args.draft_tokens or 1))
    for what, tokens in parts:
        tic = time.perf_counter()
        graph_begin(rt, what, sizes, tokens, left)
        capture_bar(sizes, left - 20, total / len(parts), rt.stall == "draft_graphs")
        rt.timings[what.replace(" ", "_")] = since(tic)
        hold(rt, DRAFT_GRAPH_MIB / len(parts))
        graph_end(rt, what, since(tic), DRAFT_GRAPH_MIB / len(parts), left - DRAFT_GRAPH_MIB / len(parts))
        left -= DRAFT_GRAPH_MIB / len(parts)


def drafter_weights(rt: Runtime) -> _weights.Weights:
    """The draft model's share: its own dir's files, or the target's MTP layers when it drafts with
    them (NEXTN: the draft path is the target's)."""
    assert rt.drafter is not None
    same = rt.drafter.path.resolve() == rt.model.path.resolve()
    return _weights.load(rt.drafter.path, rt.args.tp_size, rt.drafter.config, "mtp" if same else "all")


def draft_pool(rt: Runtime) -> tuple[int, float, bool]:
    """(tokens, bytes, MLA?) of the draft's KV pool: as many tokens as the target's
    (0.5.9 init_memory_pool: `self.max_total_num_tokens = self.server_args.draft_runner_cache_size`,
    set to the target's; 0.5.23: the target's memory_pool_config), in the draft's own geometry."""
    assert rt.drafter is not None
    size = kv_dtype(rt)[1]
    mtp = rt.drafter.architectures[:1] and rt.drafter.architectures[0] in MTP_ARCHS
    drafter = rt.model if mtp else rt.drafter
    cell, mla = cell_bytes(drafter, rt.args.tp_size, draft_layers(rt), size)
    tokens = rt.max_total_num_tokens
    return tokens, (tokens + int(str(raw(rt.args, "page_size", 1)))) * cell, mla


def load_draft(rt: Runtime, weights: _weights.Weights) -> None:
    """The draft worker's weights in memory (dies where they do not fit); its figures for its lines."""
    rt.draft = {"weights": weights, "begin": local_free(rt)}
    check_fits(rt, weights)
    hold(rt, weights.total / MIB)
    rt.draft["end"] = local_free(rt)


def load_draft_pool(rt: Runtime) -> None:
    tokens, nbytes, mla = draft_pool(rt)
    gpu, free = tightest_gpu(rt)
    if nbytes > free * MIB:
        own = rt.held_mib * MIB
        layer = nbytes / draft_layers(rt) / (1 if mla else 2)  # one layer's buffer (K or V)
        frames = FRAMES["pool"][newer()][:1]
        fail(frames, oom_text(rt, gpu, layer, free * MIB, own, own - CONTEXT_MIB * MIB), rt.tp_label)
    hold(rt, nbytes / MIB)
    rt.draft["kv"] = kv_line(tokens, nbytes, mla, kv_dtype(rt)[0])
    rt.draft["pool_end"] = local_free(rt)


def draft_ahead(rt: Runtime) -> None:
    """0.5.23 (scheduler.init_model_worker) loads the draft's weights before any KV pool, so they
    count against mem_fraction_static. Its memory is taken here, its lines come where the stand-in
    always printed them (after the target's graphs: the start-up phases a tool reads)."""
    if rt.args.algorithm not in ("EAGLE", "EAGLE3", "STANDALONE") or rt.drafter is None:
        return  # no draft worker, or one that dies at its creation (check_drafter)
    weights = drafter_weights(rt)
    if weights.total > tightest_gpu(rt)[1] * MIB:
        init(rt, draft=True)  # where the real one dies: its lines come first
        log(f"Load weight begin. avail mem={gib(local_free(rt))} GB", rt.tp_label)
    load_draft(rt, weights)
    rt.draft["ahead"] = True


def draft_worker(rt: Runtime) -> None:
    """After the target is ready, as EAGLEWorker: its own init, weights, KV cache and graphs."""
    if rt.args.algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return
    check_drafter(rt)
    assert rt.drafter is not None
    init(rt, draft=True)
    tic = time.perf_counter()
    ahead = bool(rt.draft.get("ahead"))
    if not ahead:
        weights = drafter_weights(rt)
        log(f"Load weight begin. avail mem={gib(local_free(rt))} GB", rt.tp_label)
        load_draft(rt, weights)
    else:
        weights = rt.draft["weights"]
        log(f"Load weight begin. avail mem={gib(rt.draft['begin'])} GB", rt.tp_label)
    seconds = read_seconds(rt, weights.files, float(str(rt.model.knob("draft_load_s"))))
    shards_bar(rt, len(weights.files) or 1, seconds, rt.stall == "draft")
    rt.timings["load_weight"] = rt.timings.get("load_weight", 0.0) + since(tic)
    weight_end(rt, rt.drafter, since(tic), rt.draft["end"], weights.total / MIB)
    if not ahead:
        load_draft_pool(rt)
    log(rt.draft["kv"], rt.tp_label)
    log(f"Memory pool end. avail mem={gib(rt.draft['pool_end'])} GB", rt.tp_label)
    if rt.args.cuda_graph:
        draft_graphs(rt, local_free(rt))
    if rt.adaptive_slots is not None:
        adaptive_states(rt)


def adaptive_states(rt: Runtime) -> None:
    """--speculative-adaptive: the tiers' controller, then a runtime state for each step of the
    config other than the start-up one (its draft and verify graphs: draft_capture_s each, with
    CUDA graphs), as EAGLEWorkerV2.init_cuda_graphs builds them."""
    assert rt.adaptive_slots is not None and rt.args.steps is not None
    graph_bs = batch_sizes(rt) if rt.args.cuda_graph else None
    rt.adaptive = _adaptive.Controller(rt.adaptive_slots, rt.args.steps, graph_bs)
    log(rt.adaptive.init_line(), rt.tp_label)
    for steps in _adaptive.candidates(rt.adaptive_slots):
        if steps == rt.args.steps:
            continue
        tic = time.perf_counter()
        if rt.args.cuda_graph:
            time.sleep(float(rt.model.knob("draft_capture_s")))
        mem = (GRAPH_MIB + DRAFT_GRAPH_MIB) / 1024 * (steps + 1) / 8 if rt.args.cuda_graph else 0.0
        log(
            f"Built adaptive runtime state steps={steps}: elapsed={since(tic):.2f}s, mem={mem:.2f}GB",
            rt.tp_label,
        )


def startup_timings(rt: Runtime) -> str:
    """0.5.23's summary line (the tokenizer manager's, before uvicorn starts)."""
    t = rt.timings
    graphs = ", ".join(
        f"{k}={t.get(k, 0.0):.2f}"
        for k in ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
    )
    return (
        f"Engine startup timings (s): load_weight={t.get('load_weight', 0.0):.2f}, "
        f"kv_cache_allocation={t.get('kv_cache_allocation', 0.0):.2f}, "
        f"scheduler_e2e={t.get('scheduler_e2e', 0.0):.2f}, cuda_graph={{{graphs}}}, "
        f"tokenizer_e2e={since(START):.2f}"
    )


def load(rt: Runtime) -> _dist.Group | None:
    """Start-up spent the way the real server spends it; with several nodes, after all of them
    met (the group is returned to watch while serving)."""
    group = init(rt)
    load_weights(rt)
    if newer():
        draft_ahead(rt)
    allocate_pool(rt)
    if rt.draft.get("ahead"):
        load_draft_pool(rt)
    capture_graphs(rt)
    draft_worker(rt)
    log(
        f"max_total_num_tokens={rt.max_total_num_tokens}, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, "
        f"max_running_requests={rt.args.max_running_requests}, "
        f"context_len={rt.args.context_length or 262144}, "
        f"available_gpu_mem={gib(local_free(rt))} GB",
        rt.tp_label,
    )
    rt.timings["scheduler_e2e"] = since(START)
    return group

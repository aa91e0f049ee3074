"""The slow half of start-up, in SGLang's order and with its log lines per version: init, target
weights, KV cache, CUDA graphs (with DeepGEMM's JIT at the first capture), then the draft worker
(its weights, KV cache and graphs).

GPU memory shows up in nvidia-smi as it would: a CUDA context first, then the weights, then
the whole static pool (mem_fraction_static x total per GPU), held until the process ends.
Timing: weights take weights_mib_total / tp / read_mib_s (else 0.6 x load_delay_s), graphs
capture_s_per_bs per batch size (else 0.4 x load_delay_s); the `stall` knob stops a phase.
"""

from __future__ import annotations

import os
import time

from nvidia_standin import registry

from sglang import _adaptive, _dist, _jit, _progress
from sglang._args import version_tuple
from sglang._common import MTP_ARCHS, SRT, START, config_error, die, log
from sglang._startup import MAX_FRACTION, MIN_KV_MIB, TORCH_GIB_PER_MIB, Runtime, gib

CONTEXT_MIB = 512
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


def oom_text(rt: Runtime, gpu: int, wanted_mib: float, free_mib: float, own_mib: float) -> str:
    """torch's out-of-memory message for physical GPU `gpu`, which torch names by its logical index,
    naming the other processes on that GPU as torch does."""
    others = "".join(
        f"Process {h.pid} has {gib(h.mib_per_gpu)} GiB memory in use. "
        for h in registry.holders()
        if gpu in h.gpus and h.pid != os.getpid()
    )
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib(wanted_mib)} GiB. "
        f"GPU {rt.logical(gpu)} has a total capacity of {gib(rt.gpu_cfg.total_mib)} GiB of which "
        f"{gib(max(free_mib, 0))} GiB is free. {others}Including non-PyTorch memory, this process has "
        f"{gib(own_mib)} GiB memory in use. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )


def tightest_gpu(rt: Runtime) -> tuple[int, int]:
    """(gpu, free MiB) of the used GPU with the least memory left by other holders."""
    me = os.getpid()
    free = {g: rt.gpu_cfg.total_mib - registry.used_mib(g, exclude_pid=me) for g in rt.gpus}
    gpu = min(free, key=lambda g: free[g])
    return gpu, free[gpu]


def init(rt: Runtime, draft: bool = False) -> _dist.Group | None:
    """The process group (the draft worker joins none); `hang` and stall=init never return."""
    tic = time.perf_counter()
    log("Init torch distributed begin.", rt.tp_label)
    if draft:
        log(f"Init torch distributed ends. elapsed={since(tic):.2f} s, mem usage=0.00 GB", rt.tp_label)
        return None
    registry.register(rt.gpus, CONTEXT_MIB)
    if rt.model.knob("hang") or rt.stall == "init":
        _progress.forever()  # an NCCL init that never returns: no output, no port, until killed
    group = _dist.join(rt)
    log(
        f"Init torch distributed ends. elapsed={since(tic):.2f} s, mem usage={gib(CONTEXT_MIB)} GB",
        rt.tp_label,
    )
    return group


def weights_seconds(rt: Runtime) -> float:
    """The target's weights per rank over the storage's read speed, else 0.6 x load_delay_s."""
    speed = rt.model.knob("read_mib_s")
    if speed is None:
        return float(rt.model.knob("load_delay_s")) * 0.6
    return float(rt.model.knob("weights_mib_total")) / rt.args.tp_size / float(speed)


def shards_bar(rt: Runtime, shards: int, seconds: float, stall: bool) -> None:
    desc = "Multi-thread loading shards" if newer() else "Loading safetensors checkpoint shards"
    _progress.run(_progress.SHARDS, lambda _: desc, max(1, shards), seconds, stall)


def weight_end(rt: Runtime, arch: str, elapsed: float, avail_mib: float, used_mib: float) -> None:
    dtype = "" if newer() else "dtype=torch.bfloat16, "
    log(
        f"Load weight end. elapsed={elapsed:.2f} s, type={arch}, {dtype}"
        f"avail mem={gib(avail_mib)} GB, mem usage={gib(used_mib)} GB.",
        rt.tp_label,
    )


def load_weights(rt: Runtime) -> float:
    """Weights per GPU, after the load time; dies when other holders left too little room."""
    tic = time.perf_counter()
    weights = float(rt.model.knob("weights_mib_total")) / rt.args.tp_size
    gpu, free = tightest_gpu(rt)
    log(f"Load weight begin. avail mem={gib(free - CONTEXT_MIB)} GB", rt.tp_label)
    shards_bar(rt, int(float(rt.model.knob("shards"))), weights_seconds(rt), rt.stall == "weights")
    if weights + CONTEXT_MIB > free:
        frame = (
            f"{SRT}/model_loader/loader.py",
            596,
            "load_weights_and_postprocess",
            "model.load_weights(weights)",
        )
        fail([frame], oom_text(rt, gpu, min(weights, 2048), free - CONTEXT_MIB, CONTEXT_MIB), rt.tp_label)
    registry.register(rt.gpus, int(weights + CONTEXT_MIB))
    rt.timings["load_weight"] = since(tic)
    weight_end(rt, (rt.model.architectures or ["?"])[0], since(tic), free - weights - CONTEXT_MIB, weights)
    return weights


def kv_line(tokens: int, mib: float, mla: bool) -> str:
    dtype = "dtype: torch.bfloat16, " if newer() else ""
    size = f"KV size: {gib(mib)} GB" if mla else f"K size: {gib(mib / 2)} GB, V size: {gib(mib / 2)} GB"
    return f"KV Cache is allocated. {dtype}#tokens: {tokens}, {size}"


def allocate_pool(rt: Runtime, weights: float) -> None:
    tic = time.perf_counter()
    if rt.stall == "kv_cache":
        _progress.forever()
    need = rt.mem_fraction * rt.gpu_cfg.total_mib
    gpu, free = tightest_gpu(rt)
    if need < weights + MIN_KV_MIB:
        msg = (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={rt.mem_fraction}"
        )
        fail([RUNNER_FRAME], msg, rt.tp_label)
    if need > free:
        own = weights + CONTEXT_MIB
        text = oom_text(rt, gpu, need - own, free - own, own)
        fail(
            [RUNNER_FRAME],
            f"{text}\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            rt.tp_label,
        )
    registry.register(rt.gpus, int(need))
    tokens = int((need - weights) * 1024 / 70)  # ~70 KiB of MLA cache per token
    log(kv_line(tokens, need - weights, mla=True), rt.tp_label)
    log(f"Memory pool end. avail mem={gib(rt.gpu_cfg.total_mib - need)} GB", rt.tp_label)
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
    avail = avail_mib * TORCH_GIB_PER_MIB

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
    avail = round(avail_mib * TORCH_GIB_PER_MIB, 2)
    _jit.run(rt.tp_label, rt.args.model_path, hidden, tp, seconds, avail, rt.stall == "jit")
    rt.timings["jit"] = since(tic)


def graph_failure(rt: Runtime, left: float) -> str | None:
    """What kills the capture: a fraction leaving no room, or an EAGLE-1 drafter under EAGLE3."""
    if rt.mem_fraction > MAX_FRACTION:
        oom = oom_text(rt, rt.gpus[0], 1536, left - 1024, rt.mem_fraction * rt.gpu_cfg.total_mib + 1024)
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
    left = rt.gpu_cfg.total_mib * (1 - rt.mem_fraction)
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
        graph_end(rt, what, since(tic), DRAFT_GRAPH_MIB / len(parts), left - DRAFT_GRAPH_MIB / len(parts))
        left -= DRAFT_GRAPH_MIB / len(parts)


def draft_worker(rt: Runtime) -> None:
    """After the target is ready, as EAGLEWorker: its own init, weights, KV cache and graphs."""
    if rt.args.algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return
    check_drafter(rt)
    assert rt.drafter is not None
    init(rt, draft=True)
    tic = time.perf_counter()
    left = rt.gpu_cfg.total_mib * (1 - rt.mem_fraction) - (GRAPH_MIB if rt.args.cuda_graph else 0)
    log(f"Load weight begin. avail mem={gib(left)} GB", rt.tp_label)
    shards_bar(rt, 1, float(rt.model.knob("draft_load_s")), rt.stall == "draft")
    rt.timings["load_weight"] = rt.timings.get("load_weight", 0.0) + since(tic)
    weight_end(rt, rt.drafter.architectures[0], since(tic), left, 0.0)
    mla = rt.drafter.architectures[0] in MTP_ARCHS
    log(kv_line(int(rt.mem_fraction * 40000), 1024, mla), rt.tp_label)
    log(f"Memory pool end. avail mem={gib(left)} GB", rt.tp_label)
    if rt.args.cuda_graph:
        draft_graphs(rt, left)
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
    weights = load_weights(rt)
    allocate_pool(rt, weights)
    capture_graphs(rt)
    draft_worker(rt)
    log(
        f"max_total_num_tokens=1000000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests={rt.args.max_running_requests}, "
        f"context_len={rt.args.context_length or 262144}, "
        f"available_gpu_mem={gib(rt.gpu_cfg.total_mib * (1 - rt.mem_fraction))} GB",
        rt.tp_label,
    )
    rt.timings["scheduler_e2e"] = since(START)
    return group

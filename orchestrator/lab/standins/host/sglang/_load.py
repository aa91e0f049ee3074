"""The slow half of start-up: weights, draft worker, KV cache, CUDA graphs (the load delay).

GPU memory shows up in nvidia-smi as it would: a CUDA context first, then the weights, then
the whole static pool (mem_fraction_static x total per GPU), held until the process ends.
"""

from __future__ import annotations

import os
import time

from nvidia_standin import registry

from sglang import _dist
from sglang._common import SRT, config_error, die, log
from sglang._startup import MAX_FRACTION, MIN_KV_MIB, Runtime, gib

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


def load_weights(rt: Runtime, seconds: float) -> float:
    """Weights per GPU, after the load time; dies when other holders left too little room."""
    weights = float(rt.model.knob("weights_mib_total")) / rt.args.tp_size
    gpu, free = tightest_gpu(rt)
    log(f"Load weight begin. avail mem={gib(free - CONTEXT_MIB)} GB", rt.tp_label)
    time.sleep(seconds)
    if weights + CONTEXT_MIB > free:
        frame = (
            f"{SRT}/model_loader/loader.py",
            596,
            "load_weights_and_postprocess",
            "model.load_weights(weights)",
        )
        fail([frame], oom_text(rt, gpu, min(weights, 2048), free - CONTEXT_MIB, CONTEXT_MIB), rt.tp_label)
    registry.register(rt.gpus, int(weights + CONTEXT_MIB))
    arch = (rt.model.architectures or ["?"])[0]
    log(
        f"Load weight end. type={arch}, dtype=torch.bfloat16, "
        f"avail mem={gib(free - weights - CONTEXT_MIB)} GB, "
        f"mem usage={gib(weights)} GB.",
        rt.tp_label,
    )
    return weights


def init_draft_worker(rt: Runtime) -> None:
    """EAGLE-family algorithms build a draft worker from the draft model path, like SGLang."""
    if rt.args.algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
        return
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
    arch = rt.drafter.architectures[0]
    log(f"Load weight end. type={arch}, dtype=torch.bfloat16 (draft model)", rt.tp_label)


def allocate_pool(rt: Runtime, weights: float) -> None:
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
    log(f"KV Cache is allocated. #tokens: {tokens}, KV size: {gib(need - weights)} GB", rt.tp_label)
    log(f"Memory pool end. avail mem={gib(rt.gpu_cfg.total_mib - need)} GB", rt.tp_label)


def capture_graphs(rt: Runtime, seconds: float) -> None:
    """Graph capture runs the drafter too: a too-big fraction or a wrong drafter dies here."""
    left = rt.gpu_cfg.total_mib * (1 - rt.mem_fraction)
    if rt.args.cuda_graph:
        begin = f"Capture cuda graph begin. This can take up to several minutes. avail mem={gib(left)} GB"
        log(begin, rt.tp_label)
    time.sleep(seconds)
    mismatch = rt.args.algorithm == "EAGLE3" and rt.drafter is not None and not rt.drafter.is_eagle3
    if rt.mem_fraction > MAX_FRACTION:
        oom = oom_text(rt, rt.gpus[0], 1536, left - 1024, rt.mem_fraction * rt.gpu_cfg.total_mib + 1024)
        if rt.args.cuda_graph:
            oom += "\n\nDuring handling of the above exception, another exception occurred:\n\n" + (
                f"Exception: Capture cuda graph failed: {oom.split(': ', 1)[1]}\n{GRAPH_HINTS}"
            )
        fail([GRAPH_FRAME], oom, rt.tp_label)
    if mismatch:
        hidden = rt.model.hidden_size
        drafter_in = 2 * hidden
        shapes = f"(4x{3 * hidden} and {drafter_in}x{hidden})"
        error = f"RuntimeError: mat1 and mat2 shapes cannot be multiplied {shapes}"
        if rt.args.cuda_graph:
            error = f"Exception: Capture cuda graph failed: {error.split(': ', 1)[1]}\n{GRAPH_HINTS}"
        fail([GRAPH_FRAME], error, rt.tp_label)
    if rt.args.cuda_graph:
        log(
            f"Capture cuda graph end. Time elapsed: {seconds:.2f} s. mem usage=0.80 GB. "
            f"avail mem={gib(left - 820)} GB.",
            rt.tp_label,
        )


def load(rt: Runtime) -> _dist.Group | None:
    """The load delay of the target's standin.json, spent the way the real server spends it;
    with several nodes, after all of them met (the group is returned to watch while serving)."""
    delay = float(rt.model.knob("load_delay_s"))
    log("Init torch distributed begin.", rt.tp_label)
    registry.register(rt.gpus, CONTEXT_MIB)
    if rt.model.knob("hang"):
        while True:  # an NCCL init that never returns: no output, no port, until killed
            time.sleep(3600)
    group = _dist.join(rt)
    log(f"Init torch distributed ends. mem usage={gib(CONTEXT_MIB)} GB", rt.tp_label)
    weights = load_weights(rt, delay * 0.6)
    init_draft_worker(rt)
    allocate_pool(rt, weights)
    capture_graphs(rt, delay * 0.4)
    log(
        f"max_total_num_tokens=1000000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests={rt.args.max_running_requests}, "
        f"context_len={rt.args.context_length or 262144}, "
        f"available_gpu_mem={gib(rt.gpu_cfg.total_mib * (1 - rt.mem_fraction))} GB",
        rt.tp_label,
    )
    return group

"""DeepGEMM's JIT warm-up at start-up (sglang/srt/layers/deep_gemm_wrapper/compile_utils.py).

The real server meets each FP8 GEMM shape at its first forward pass (the first CUDA graph
captured, or the warm-up request without graphs) and, on the first rank of each node,
"compiles" it for all Ms: it prints the same lines every start, and the time is what differs.
A cold cache costs minutes; a warm one (kernels already in DeepGEMM's cache dir) about nothing.

The stand-in keeps one marker file per model and TP size in that cache dir, the directory
SGLang hands DeepGEMM: `SGLANG_DG_CACHE_DIR`, else `~/.cache/deep_gemm` of the running user.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sglang import _progress
from sglang._common import log

ENTERING = (
    "Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) "
    "if you have not run `sglang.compile_deep_gemm`. It is recommended to run "
    "`sglang.compile_deep_gemm` with same args as `sglang.launch_server` for pre-compilation to "
    "reduce the overhead if you have not run it before. For example: "
    "`python3 -m sglang.compile_deep_gemm --model deepseek-ai/DeepSeek-V3 --tp 8 --trust-remote-code`"
)
TRY = (
    "Try DeepGEMM JIT Compiling for <{kind}> N={n}, K={k}, num_groups={groups} with all Ms. "
    "It only takes a little time (typically 1 sec) if you have run "
    "`python3 -m sglang.compile_deep_gemm`. "
)
M_MAX = 16 * 1024  # compile_utils' m_max for a chunked prefill size up to 8192
WARM_S_PER_KERNEL = 0.02  # a kernel found in the cache: loaded, not compiled
_GIB = 1 << 30


def cache_dir() -> Path:
    """Where DeepGEMM keeps compiled kernels; expanduser reads HOME, else the password database."""
    return Path(
        os.environ.get("SGLANG_DG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "deep_gemm")
    )


def marker(model_path: str, tp_size: int) -> Path:
    key = f"{os.path.realpath(model_path)}|tp={tp_size}".encode()
    return cache_dir() / f"standin-{hashlib.sha256(key).hexdigest()[:16]}.done"


def kernels(hidden: int, tp_size: int) -> list[tuple[int, int]]:
    """(N, K) of the GEMMs met (the stand-in's choice, after DeepSeek-V3's MLA projections:
    fused q/kv down-projection, q up-projection and output projection split over TP)."""
    return [(2112, hidden), (24576 // tp_size, 1536), (hidden, 16384 // tp_size)]


def run(
    rank: str, model_path: str, hidden: int, tp_size: int, seconds: float, avail_gib: float, stall: bool
) -> None:
    """The JIT lines for every kernel, `seconds` in all when the cache lacks this model's kernels."""
    done = marker(model_path, tp_size)
    shapes = kernels(hidden, tp_size)
    cold = not done.exists()
    per_kernel = seconds / len(shapes) if cold else WARM_S_PER_KERNEL
    for n, k in shapes:
        log(ENTERING, rank)
        log(TRY.format(kind="GEMM_NT_F8F8BF16", n=n, k=k, groups=1), rank)
        required = (M_MAX * k + n * k + M_MAX * n * 2) / _GIB
        log(f"Required memory for warmup: {required}GB, Available memory: {avail_gib}GB", rank)
        _progress.run(_progress.DEFAULT, lambda _: "DeepGEMM warmup", M_MAX, per_kernel, stall)
    if cold:
        try:
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(f"{model_path} tp={tp_size}\n")
        except OSError as err:
            log(
                f"DeepGEMM JIT cache dir {done.parent} is not writable ({err.strerror}): "
                "the kernels will be compiled again at the next start",
                rank,
            )

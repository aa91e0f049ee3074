"""A server's start-up as the controller sees it.

This module holds each phase's usual length, from the ledger. It holds the stall limits a deploy
gives the health wait. It draws the live line, and the summary of where a start went.

The phases themselves are read on the host, from the server's own log lines. That happens in
plugins/module_utils/orchestrator_host/startup.py, shipped with the health wait. This module only
names them, so the two agree on one list.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import ledger
from orchestrator.hosts.module_results import Phase, Progress
from orchestrator.paths import module_utils

#: How often the health wait reports a start still under way (a live view; each report costs a
#: round trip to the host).
HEALTH_REPORT_S = 5.0
#: Healthy starts of the same model on the same host whose median is a phase's usual length.
HISTORY = 5


_parser = module_utils("orchestrator_host.startup")
PHASES: tuple[str, ...] = _parser.PHASES
LABELS: dict[str, str] = _parser.LABELS


def label(phase: str) -> str:
    return LABELS.get(phase, phase)


def usual(host: str, model: str) -> dict[str, float]:
    """Each phase's median seconds over the last HISTORY healthy starts of `model` on `host`."""
    seen: dict[str, list[float]] = {}
    for start in ledger.starts(host, model, HISTORY) if model else []:
        for p in start:
            if isinstance(p.get("phase"), str) and isinstance(p.get("s"), int | float):
                seen.setdefault(p["phase"], []).append(float(p["s"]))
    return {phase: statistics.median(values) for phase, values in seen.items()}


def limits(history: Mapping[str, float], factor: float, floor_s: float) -> dict[str, float]:
    """The stall limit of each phase: `factor` times its usual length, at least `floor_s`; a phase
    with no history has none (the health timeout bounds it), but distributed init, which a healthy
    server finishes in seconds once its ranks are up, gets the floor."""
    out = {p: round(max(floor_s, factor * s), 1) for p, s in history.items() if p in PHASES and p != "ready"}
    out.setdefault("init", float(floor_s))
    return out


def clock(seconds: float) -> str:
    """6m12s, 1m12s, 22s, 0.4s."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    m, s = divmod(whole, 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def summary(elapsed_s: float, phases: Sequence[Phase], shown: int = 4) -> str:
    """`healthy after 6m12s: weights 4m10s, CUDA graphs 1m40s, warm-up 22s`: the longest phases in
    their order (launch and phases under a tenth of a second left out)."""
    said = longest(phases, shown)
    return f"healthy after {clock(elapsed_s)}" + (f": {said}" if said else "")


def longest(phases: Sequence[Phase], shown: int = 3) -> str:
    """`weights 4m10s, CUDA graphs 1m40s, warm-up 22s`: a start's longest phases in their order."""
    long = sorted((p for p in phases if p.s >= 0.1 and p.phase != "ready"), key=lambda p: -p.s)[:shown]
    return ", ".join(f"{label(p.phase)} {clock(p.s)}" for p in phases if p in long)


def live(phase: str, progress: Progress | None, phase_s: float, eta_s: float | None) -> str:
    """`CUDA graphs 23/36 (bs 96), 1m12s, ~40 s left`."""
    what = label(phase)
    if progress is not None:
        what += f" {progress.done}/{progress.total}" + (f" ({progress.detail})" if progress.detail else "")
    left = f", ~{eta_s:.0f} s left" if eta_s is not None else ""
    return f"{what}, {clock(phase_s)}{left}"


def eta(history: Mapping[str, float], phase: str, phase_s: float, done: Sequence[str]) -> float | None:
    """Seconds left by history: the rest of this phase and every usual phase not yet reached; None
    without history of this phase."""
    if phase not in history:
        return None
    later = [p for p in PHASES if p not in done and p != phase and p in history and p != "ready"]
    return max(0.0, history[phase] - phase_s) + sum(history[p] for p in later)


def nccl_of(environment: Mapping[str, Any]) -> list[str]:
    """The profile's NCCL variables, NAME=value, for a diagnosis of a hang in distributed init."""
    return [f"{k}={v}" for k, v in sorted(environment.items()) if k.startswith("NCCL_")]


def stall_diagnosis(phase: str, quiet_s: float, limit_s: float, nccl: Sequence[str], nnodes: int) -> str:
    """The line a stalled start gets, naming the phase and, for known hangs, what to look at."""
    head = f"start-up stalled in {label(phase)}: no new log line for {quiet_s:.0f} s (limit {limit_s:.0f} s)"
    hint = {
        "init": "an NCCL/torch.distributed init that never completes"
        + (f" (ranks of {nnodes} nodes must all start and reach --dist-init-addr)" if nnodes > 1 else "")
        + (
            f"; the profile sets {' '.join(nccl)}: try without them"
            if nccl
            else "; set NCCL_DEBUG=INFO to see where"
        ),
        "weights": "the weight load stopped reading: check the model's storage (a network mount that hangs)",
        "kv_cache": "the KV cache allocation hangs: check GPU memory and other processes on the GPUs",
        "jit": "a JIT kernel build hangs: check the cache directory's space and a compiler process",
        "graphs": "the CUDA graph capture hangs: try a smaller --cuda-graph-max-bs or without CUDA graphs",
        "draft": "the draft model's load hangs: check speculative.draft_model_path's storage",
        "draft_graphs": "the draft model's CUDA graph capture hangs: try without CUDA graphs",
        "warmup": "the warm-up request never completes: the scheduler is stuck",
    }.get(phase, "")
    return f"{head}; {hint}" if hint else head

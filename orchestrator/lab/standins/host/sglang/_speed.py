"""Decode speed model of the SGLang stand-in: deterministic, so profiles rank as on the real host.

Single-stream decode speed, in tokens/s:

    speed = base_tok_s * accept_len / round_cost

One "round" is what SGLang does per decode step: without speculation one target forward
(cost 1, one token); with EAGLE it is `steps` draft forwards, one target verify forward
over `draft_tokens` tokens and the draft-extend/bookkeeping after it:

    round_cost = 1 + C_ROUND + C_VERIFY * (draft_tokens - 1) + C_DRAFT * steps
                 (+ C_LAUNCH * (steps + 2) without CUDA graphs; plain decode: 1 + C_LAUNCH)

Acceptance is geometric over the draft tree. The tree keeps a chain of depth
n = min(steps, draft_tokens - 1); the remaining draft_tokens - 1 - n nodes widen the
shallowest levels first, up to topk candidates per level (widths w_1..w_n). With `a` the
drafter's top-1 acceptance (its standin.json `accept_top1`, default 0.44), a level of width
w accepts with alpha_w = 1 - (1 - a)^w, and

    accept_len = 1 + sum_{i=1..n} prod_{j<=i} alpha_{w_j}

The constants were solved so the reference deployment's measured speeds come out
(base 90 tok/s): no speculation 90.0; EAGLE3 3/4/5 with CUDA graphs 82.3; 5/4/16 with
CUDA graphs 74.9; 5/4/16 without 53.2. An EAGLE-3 drafter run under `EAGLE` gets
accept_len 1.00 (it sees one layer's hidden state instead of three) at full round cost.
Concurrent streams each keep the single-stream speed (the lab has no real batching).
"""

from __future__ import annotations

from dataclasses import dataclass

BASE_TOK_S = 90.0
ACCEPT_TOP1 = 0.44
C_ROUND = 0.29484
C_VERIFY = 0.24123
C_DRAFT = 0.02
C_LAUNCH = 0.29213


@dataclass(frozen=True)
class SpecSettings:
    """The resolved speculative settings that decide speed."""

    steps: int
    topk: int
    draft_tokens: int
    accept_top1: float = ACCEPT_TOP1
    crippled: bool = False  # EAGLE-3 drafter under --speculative-algorithm EAGLE


@dataclass(frozen=True)
class DecodeModel:
    """What one decode round of one stream takes and yields."""

    tok_s: float
    accept_len: float
    round_s: float


def tree_widths(steps: int, topk: int, draft_tokens: int) -> list[int]:
    """Candidates per level of the verified tree: a chain, then siblings at shallow levels."""
    depth = max(0, min(steps, draft_tokens - 1))
    spare = draft_tokens - 1 - depth
    widths = []
    for _ in range(depth):
        extra = min(max(topk - 1, 0), spare)
        spare -= extra
        widths.append(1 + extra)
    return widths


def accept_length(spec: SpecSettings | None) -> float:
    if spec is None or spec.crippled:
        return 1.0
    total, reach = 1.0, 1.0
    for width in tree_widths(spec.steps, spec.topk, spec.draft_tokens):
        reach *= 1.0 - (1.0 - spec.accept_top1) ** width
        total += reach
    return total


def round_cost(spec: SpecSettings | None, cuda_graph: bool) -> float:
    """Time of one decode round, in target-forward units (1 = one plain decode step)."""
    if spec is None:
        return 1.0 + (0.0 if cuda_graph else C_LAUNCH)
    cost = 1.0 + C_ROUND + C_VERIFY * (spec.draft_tokens - 1) + C_DRAFT * spec.steps
    if not cuda_graph:
        cost += C_LAUNCH * (spec.steps + 2)
    return cost


def decode_model(base_tok_s: float, spec: SpecSettings | None, cuda_graph: bool) -> DecodeModel:
    length = accept_length(spec)
    cost = round_cost(spec, cuda_graph)
    return DecodeModel(tok_s=base_tok_s * length / cost, accept_len=length, round_s=cost / base_tok_s)


def accept_rate(spec: SpecSettings | None, length: float) -> float:
    """SGLang's `accept rate`: accepted draft tokens over proposed ones per round."""
    if spec is None or spec.draft_tokens <= 1:
        return 0.0
    return (length - 1.0) / (spec.draft_tokens - 1)

"""Decode speed model of the SGLang stand-in: what a tuning decision depends on, in closed form.

Single-stream decode speed, in tokens/s:

    speed = base_tok_s * accept_len / round_cost

One "round" is what SGLang does per decode step: without speculation one target forward
(cost 1, one token); with EAGLE it is `steps` draft forwards, one target verify forward
over `draft_tokens` tokens and the draft-extend/bookkeeping after it:

    round_cost = 1 + C_ROUND + C_VERIFY * (draft_tokens - 1) + C_DRAFT * steps
                 (+ C_LAUNCH * (steps + 2) without CUDA graphs; plain decode: 1 + C_LAUNCH)

Batching: a round of a batch of B requests costs more than a round of one, in proportion to
the tokens the target verifies for the others (draft_tokens each with speculation, 1 without):

    round_cost(B) = round_cost(1) + C_BATCH * (B - 1) * verified_tokens

so total throughput grows with B, sublinearly, each stream slows down, and speculation, which
verifies draft_tokens per request, loses its gain at a batch that comes earlier the more draft
tokens it verifies and the lower its accept length (docs/standins.md has the sources).

Acceptance is geometric over the draft tree. The tree keeps a chain of depth
n = min(steps, draft_tokens - 1); the remaining draft_tokens - 1 - n nodes widen the
shallowest levels first, up to topk candidates per level (widths w_1..w_n). With `a` the
request's top-1 acceptance, a level of width w accepts with alpha_w = 1 - (1 - a)^w, and

    accept_len = 1 + sum_{i=1..n} prod_{j<=i} alpha_{w_j}

`a` is the drafter's `accept_top1` (default 0.44) moved by the request (`request_accept`):
up when the answer will be code or math (the request asks for it, or its prompt holds it), up
through the chat template for a drafter trained on chat data, down at temperature > 0. Plain
English raw text at temperature 0 keeps `accept_top1`, so the reference figures stay: no
speculation 90.0; EAGLE3 3/4/5 with CUDA graphs 82.3; 5/4/16 with CUDA graphs 74.9; 5/4/16
without 53.2 (base 90 tok/s, one stream). An EAGLE-3 drafter run under `EAGLE` gets accept_len
1.00 (it sees one layer's hidden state instead of three) at full round cost.

Run-to-run noise and a per-host speed factor (`host_speed`, `RunNoise`) scale base_tok_s;
both are 1 in exact mode.

Prefill, the time to first token's own part, is linear in the prompt:

    prefill_s = prompt_tokens / (prefill_tok_s x host x run)      (prefill_tok_s: 20000 by default)

A colocated server spends it before its first decode round; a PD pair spends it on the prefill
server only (sglang/_pd.py).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

BASE_TOK_S = 90.0
#: Prompt tokens one prefill forward takes per second (the `prefill_tok_s` knob's default).
PREFILL_TOK_S = 20000.0
ACCEPT_TOP1 = 0.44
C_ROUND = 0.29484
C_VERIFY = 0.24123
C_DRAFT = 0.02
C_LAUNCH = 0.29213
#: Cost of one more verified token of another request in the batch, in target-forward units.
#: Chosen so that cg_5tok with code prompts through the chat template (accept_top1 0.65,
#: accept length 2.82) beats plain decode up to a batch of 8 and loses from 9 on.
C_BATCH = 0.03

#: Top-1 acceptance added for a request whose answer is code / math (scaled by its domain score).
CODE_BONUS = 0.16
MATH_BONUS = 0.10
#: Added for a request rendered through the chat template when the drafter was trained on chat.
TEMPLATE_BONUS = 0.05
#: Fraction of the top-1 acceptance lost at temperature 1 (linear below, flat above).
TEMPERATURE_LOSS = 0.15
MAX_ACCEPT = 0.95

#: Default stddev of the per-run speed factor, and the slowest host factor.
RUN_NOISE = 0.015
HOST_SPEED_MIN = 0.96


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


def accept_length(spec: SpecSettings | None, accept_top1: float | None = None) -> float:
    """Mean tokens per round; `accept_top1` overrides the drafter's (a request's own figure)."""
    if spec is None or spec.crippled:
        return 1.0
    a = spec.accept_top1 if accept_top1 is None else accept_top1
    total, reach = 1.0, 1.0
    for width in tree_widths(spec.steps, spec.topk, spec.draft_tokens):
        reach *= 1.0 - (1.0 - a) ** width
        total += reach
    return total


def verified_tokens(spec: SpecSettings | None) -> int:
    """Tokens the target runs per request and round: the draft tree, or the one new token."""
    return 1 if spec is None else spec.draft_tokens


def round_cost(spec: SpecSettings | None, cuda_graph: bool, batch: int = 1) -> float:
    """Time of one decode round, in target-forward units (1 = one plain decode step of one stream)."""
    if spec is None:
        cost = 1.0 + (0.0 if cuda_graph else C_LAUNCH)
    else:
        cost = 1.0 + C_ROUND + C_VERIFY * (spec.draft_tokens - 1) + C_DRAFT * spec.steps
        if not cuda_graph:
            cost += C_LAUNCH * (spec.steps + 2)
    return cost + C_BATCH * (max(batch, 1) - 1) * verified_tokens(spec)


def decode_model(
    base_tok_s: float,
    spec: SpecSettings | None,
    cuda_graph: bool,
    *,
    accept_top1: float | None = None,
    batch: int = 1,
) -> DecodeModel:
    """Per-stream speed with `batch` requests decoding together (tokens/s of one of them)."""
    length = accept_length(spec, accept_top1)
    cost = round_cost(spec, cuda_graph, batch)
    return DecodeModel(tok_s=base_tok_s * length / cost, accept_len=length, round_s=cost / base_tok_s)


def prefill_seconds(prompt_tokens: int, prefill_tok_s: float) -> float:
    """Time of the prefill forward of a prompt: linear in its tokens, no batching effect."""
    return max(prompt_tokens, 0) / prefill_tok_s if prefill_tok_s > 0 else 0.0


def accept_rate(spec: SpecSettings | None, length: float) -> float:
    """The stand-in's `accept rate`: accepted draft tokens over proposed ones per round."""
    if spec is None or spec.draft_tokens <= 1:
        return 0.0
    return (length - 1.0) / (spec.draft_tokens - 1)


# --- acceptance of one request ---------------------------------------------------------------

_CODE_CUES = (
    re.compile(r"```"),
    re.compile(r"\bdef \w+\(|\bfunction \w+\(|\bclass \w+[:(]"),
    re.compile(r"^\s*return\b", re.M),
    re.compile(r"^\s*(import|from \S+ import|#include)\b", re.M),
    re.compile(r"[{}]"),
    re.compile(r";\s*$", re.M),
    re.compile(r"\w+\([^()]*\)"),
)
_MATH_CUES = (
    re.compile(r"\d\s*[-+*/^=<>]\s*\d"),
    re.compile(r"\b(solve|equation|integral|derivative|prove|theorem|calculate|compute)\b", re.I),
    re.compile(r"\b[xyn]\s*[=^]|\b\d+[xyn]\b"),
    re.compile(r"\b(how many|what is the (sum|product|value))\b", re.I),
)


def prompt_domain(text: str) -> tuple[float, float]:
    """(code, math) scores in [0, 1] from cues in the text; plain prose scores (0, 0)."""
    code = sum(1 for cue in _CODE_CUES if cue.search(text))
    math = sum(1 for cue in _MATH_CUES if cue.search(text))
    return min(1.0, code / 3), min(1.0, math / 2)


# What a request asks for decides what the answer is, and a drafter predicts the answer. So an
# instruction to write code counts as code, though the prompt holds none. The stand-in's own
# output is filler words, so it cannot tell; the ask stands for the answer.
_LANGUAGE = r"(?:python|rust|go|golang|java|javascript|typescript|c\+\+|c#|ruby|kotlin|swift|bash|sql|php)"
_CODE_NOUN = (
    r"(?:functions?|methods?|class(?:es)?|programs?|scripts?|snippets?|code|quer(?:y|ies)|regex(?:es)?"
    r"|regular expressions?|decorators?|unit tests?|one-liners?)"
)
_CODE_ASKS = (
    # "write a Python function", "give me a regex", "fix this script": a verb, at most two words, a noun
    re.compile(
        r"\b(?:write|implement|create|code|fix|refactor|debug|give me|show me)\s+"
        rf"(?:(?:a|an|the|this|some|me)\s+)?(?:[\w+#-]+\s+){{0,2}}?{_CODE_NOUN}\b",
        re.I,
    ),
    # "implement binary search in Rust", "write quicksort in Go"
    re.compile(
        rf"\b(?:write|implement)\s+(?:(?:a|an|the|some)\s+)?(?:[\w-]+\s+){{0,3}}?in {_LANGUAGE}\b", re.I
    ),
    # things that are code by name
    re.compile(r"\b(?:sql query|regex|regular expression|(?:bash|shell|python) script)\b", re.I),
)
#: An ask to work something out on numbers: two of them at least ("a flight in 2024" is chat).
_MATH_ASK = re.compile(
    r"\b(?:solve|compute|calculate|evaluate|simplify|prove|how (?:many|much)"
    r"|what is the (?:probability|sum|product|value|area|volume|average)"
    r"|find the (?:value|sum|area|probability|roots?|derivative|integral)"
    r"|\d+ (?:times|plus|minus|divided by|percent of) \d+)\b",
    re.I,
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def ask_domain(text: str) -> tuple[float, float]:
    """(code, math) scores in [0, 1] from what the text asks for: 1 for an ask to write code, or
    to work a problem out on numbers; 0 otherwise."""
    code = 1.0 if any(ask.search(text) for ask in _CODE_ASKS) else 0.0
    math = 1.0 if _MATH_ASK.search(text) and len(_NUMBER.findall(text)) >= 2 else 0.0
    return code, math


def request_domain(text: str) -> tuple[float, float]:
    """(code, math) scores of a request: what it asks for, or what its prompt holds, the higher."""
    ask_code, ask_math = ask_domain(text)
    cue_code, cue_math = prompt_domain(text)
    return max(ask_code, cue_code), max(ask_math, cue_math)


def request_accept(
    accept_top1: float,
    text: str,
    *,
    chat_template: bool = False,
    trained_on: str = "chat",
    temperature: float = 0.0,
) -> float:
    """A request's top-1 acceptance: the drafter's, moved by domain, template and temperature."""
    code, math = request_domain(text)
    a = accept_top1 + max(CODE_BONUS * code, MATH_BONUS * math)
    if chat_template and trained_on == "chat":
        a += TEMPLATE_BONUS
    a *= 1.0 - TEMPERATURE_LOSS * min(max(temperature, 0.0), 1.0)
    return min(max(a, 0.0), MAX_ACCEPT)


# --- noise ------------------------------------------------------------------------------------


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by `text`."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def host_speed(hostname: str) -> float:
    """This host's speed factor, fixed by its name: in [HOST_SPEED_MIN, 1.0]."""
    return HOST_SPEED_MIN + (1.0 - HOST_SPEED_MIN) * _unit(f"{hostname}/speed")


def noise_seed(hostname: str, port: int) -> int:
    return int(_unit(f"{hostname}:{port}/noise") * 2**32)


class RunNoise:
    """One speed factor per busy period (idle -> busy), as GPU clocks and kernels vary from run
    to run: normal around 1 with stddev `sigma`, clipped to 3 sigma; seeded, so repeatable."""

    def __init__(self, sigma: float, seed: int) -> None:
        self.sigma = sigma
        self.rng = random.Random(seed)

    def draw(self) -> float:
        if self.sigma <= 0:
            return 1.0
        return 1.0 + max(-3.0, min(3.0, self.rng.gauss(0.0, 1.0))) * self.sigma

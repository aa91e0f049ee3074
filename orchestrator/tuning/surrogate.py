"""What a campaign learns from its trials: a model of speculative decoding fitted to what each measured.

Engine layer: never prints. `fit(observations)` returns a `Fit`. It predicts every point of a
space, at every level of the traffic, with its uncertainty. The search (search.py) asks it where the
next restart pays most.

A trial measures more than its score. Each bench run gives the accept length (tokens per verify
round), the per-request decode speed, the total throughput, p99 TTFT and p99 ITL. The model uses
the known structure of speculative decoding, not the stand-in's formula:

- Speed is accept length over round time: tok_s = L / T. That is the identity SGLang's own
  `bench_speculative.py` and the EAGLE papers report by (tokens per step over the step's time).
- Accept length grows with the tree's depth and width and saturates. A drafter accepts each
  level of the chain with a chance that falls with depth (EAGLE-3, arXiv 2503.01840, fig. 6:
  the acceptance rate of position n falls as n grows). So level j accepts with
  a_j = a * r^(j-1), and a level of w candidates with 1 - (1 - a_j)^(w^g). a, r and g are fitted
  (r = 1, g = 1 is a geometric drafter; real ones are not, and the fit finds their own). The
  tree is a chain of depth min(steps, draft_tokens - 1), its spare nodes at the shallowest
  levels first, as SGLang keeps the draft tokens with the highest path scores (Medusa and EAGLE-2
  trees: arXiv 2401.10774, 2406.16858).
- A round's time is linear in the work it does: one target forward, `draft_tokens` verified
  tokens, `steps` draft forwards, kernel launches without CUDA graphs, and at each load level a
  cost per verified token of the other requests in the batch (SGLang RFC #15319: the best step
  count falls as the batch grows because verify cost grows with it). The coefficients are fitted
  with bounds (none negative) by scipy's lsq_linear. A varied field the model knows nothing
  about (an NCCL setting, a chunked-prefill size) gets a free term per value.
- Each host is a few percent faster or slower. Its factor multiplies every round time it measured.
  It is estimated from the fit's residuals, shrunk towards 1 by the prior that hosts differ by a
  few percent (HOST_SIGMA). A point measured on two hosts ties them directly.
- p99 ITL follows the round time (a streamed chunk is one round's accepted tokens); the ratio
  per level is fitted. p99 TTFT has no such structure: a ridge regression of its log on the same
  features.

The uncertainty comes from a parametric bootstrap (Efron and Tibshirani, 1993): the fit is
repeated on the same runs, each figure drawn again with the runs' own noise. search.py adds what
the model's form may miss, growing with the distance to the nearest measured point.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: SGLang's own choice when a speculative field is not set (its auto settings for EAGLE-3).
AUTO_STEPS, AUTO_TOPK, AUTO_DRAFT = 3, 1, 4
#: How much hosts differ, as a prior on each host's factor (a log standard deviation).
HOST_SIGMA = 0.03
#: Run-to-run noise assumed until the runs show their own.
RUN_SIGMA = 0.015
#: Refits of the bootstrap.
BOOTSTRAP = 32
#: A small ridge on the round-time coefficients, relative to the data's scale.
RIDGE = 1e-3


@dataclass(frozen=True)
class Shape:
    """What the model reads of a profile: the speculative tree, CUDA graphs, and the values of
    varied fields it has no structure for (as text)."""

    spec: bool
    steps: int
    topk: int
    draft: int
    cuda_graph: bool
    other: tuple[tuple[str, str], ...] = ()

    @property
    def verified(self) -> int:
        """Tokens the target verifies per request and round."""
        return self.draft if self.spec else 1


#: Fields the model has structure for; every other varied field is a free term per value.
KNOWN = (
    "speculative.algorithm",
    "speculative.num_steps",
    "speculative.eagle_topk",
    "speculative.num_draft_tokens",
    "server.cuda_graph",
)


def shape_of(profile: Any, varied: Sequence[str] = ()) -> Shape:
    """A profile's shape; `varied` names the space's fields (the unknown ones become terms)."""
    s = profile.speculative
    spec = s.algorithm is not None
    data = profile.model_dump()
    other = []
    for dotted in varied:
        if dotted in KNOWN:
            continue
        node: Any = data
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        other.append((dotted, repr(node)))
    return Shape(
        spec,
        int(s.num_steps or AUTO_STEPS) if spec else 0,
        int(s.eagle_topk or AUTO_TOPK) if spec else 0,
        int(s.num_draft_tokens or AUTO_DRAFT) if spec else 0,
        bool(profile.server.cuda_graph),
        tuple(other),
    )


@dataclass(frozen=True)
class Observation:
    """One bench run of one point on one host at one level."""

    point: str  # the point's key (the baseline's profile name for the baseline)
    shape: Shape
    host: str
    level: int  # index into the traffic's levels
    tok_s: float
    accept_len: float | None = None
    total_tok_s: float | None = None
    itl_p99_s: float | None = None
    ttft_p99_s: float | None = None

    def metric(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)


# --- accept length ------------------------------------------------------------------------------


def tree_widths(steps: int, topk: int, draft: int) -> list[int]:
    """Candidates per level of the verified tree: a chain, then spare nodes at shallow levels."""
    depth = max(0, min(steps, draft - 1))
    spare = draft - 1 - depth
    widths = []
    for _ in range(depth):
        extra = min(max(topk - 1, 0), spare)
        spare -= extra
        widths.append(1 + extra)
    return widths


def accept_len(shape: Shape, a: float, r: float, g: float) -> float:
    """Mean tokens per round: 1 + the expected accepted depth of the tree."""
    if not shape.spec:
        return 1.0
    total, reach = 1.0, 1.0
    for j, w in enumerate(tree_widths(shape.steps, shape.topk, shape.draft)):
        aj = min(0.999, max(1e-6, a * r**j))
        reach *= 1.0 - (1.0 - aj) ** (w**g)
        total += reach
    return total


def _fit_accept(obs: Sequence[Observation]) -> tuple[float, float, float]:
    """(a, r, g) by least squares on the measured accept lengths, with a prior at r = g = 1 that
    matters only while few tree shapes were measured."""
    from scipy.optimize import least_squares

    data = [(o.shape, o.accept_len) for o in obs if o.shape.spec and o.accept_len is not None]
    if not data:
        return 0.5, 1.0, 1.0

    def residuals(x: Any) -> list[float]:
        a, r, g = x
        out = [(accept_len(s, a, r, g) - length) / 0.05 for s, length in data]
        return [*out, (r - 1.0) / 0.15, (g - 1.0) / 0.3]

    found = least_squares(residuals, [0.5, 1.0, 1.0], bounds=([0.01, 0.5, 0.3], [0.99, 1.3, 1.5]))
    a, r, g = (float(v) for v in found.x)
    return a, r, g


# --- round time ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Design:
    """How a shape at a level becomes a row of round-time features, and which terms are free."""

    levels: int
    others: tuple[tuple[str, str], ...]

    @property
    def size(self) -> int:
        return 5 + 2 * (self.levels - 1) + len(self.others)

    def row(self, s: Shape, level: int) -> list[float]:
        spec = 1.0 if s.spec else 0.0
        launches = (s.steps + 2 if s.spec else 1) if not s.cuda_graph else 0
        x = [1.0, spec, spec * (s.draft - 1), spec * s.steps, float(launches)]
        for lv in range(1, self.levels):
            x += [1.0 if level == lv else 0.0, float(s.verified) if level == lv else 0.0]
        x += [1.0 if term in s.other else 0.0 for term in self.others]
        return x

    def bounds(self) -> tuple[list[float], list[float]]:
        fixed = 5 + 2 * (self.levels - 1)
        low = [0.0] * fixed + [-math.inf] * len(self.others)
        return low, [math.inf] * self.size


def _lsq(rows: list[list[float]], y: list[float], design: _Design, scale: float) -> list[float]:
    import numpy as np
    from scipy.optimize import lsq_linear

    a = np.array(rows + (np.eye(design.size) * math.sqrt(RIDGE) * scale).tolist())
    b = np.array(y + [0.0] * design.size)
    low, high = design.bounds()
    return [float(v) for v in lsq_linear(a, b, bounds=(low, high), method="bvls").x]


# --- the fit ------------------------------------------------------------------------------------


@dataclass
class _One:
    """One fit: the accept model, the round-time coefficients, host factors and per-level ratios."""

    accept: tuple[float, float, float]
    beta: list[float]
    hosts: dict[str, float]
    total_per_tok: dict[int, float]
    itl_per_round: dict[int, float]
    ttft: list[float] | None
    design: _Design

    def length(self, s: Shape) -> float:
        return accept_len(s, *self.accept)

    def round_s(self, s: Shape, level: int) -> float:
        return max(1e-9, sum(b * x for b, x in zip(self.beta, self.design.row(s, level), strict=True)))

    def predict(self, s: Shape, level: int, metric: str) -> float | None:
        """A metric of `s` at `level` on an average host (factor 1)."""
        tok = self.length(s) / self.round_s(s, level)
        if metric == "tok_s":
            return tok
        if metric == "total_tok_s":
            k = self.total_per_tok.get(level)
            return None if k is None else tok * k
        if metric == "itl_p99_s":
            k = self.itl_per_round.get(level)
            return None if k is None else self.round_s(s, level) * k
        if metric == "ttft_p99_s":
            if self.ttft is None:
                return None
            x = self.design.row(s, level)
            return math.exp(sum(b * v for b, v in zip(self.ttft, x, strict=True)))
        raise ValueError(f"no model of {metric}")


def _fit_one(obs: Sequence[Observation], design: _Design, host_sigma: float, run_sigma: float) -> _One:
    accept = _fit_accept(obs)
    lengths = {o.shape: accept_len(o.shape, *accept) for o in obs}
    # a run's round time: its own accept length where it measured one, the model's otherwise
    rounds = [((o.accept_len if o.accept_len and o.shape.spec else lengths[o.shape]) / o.tok_s) for o in obs]
    scale = statistics.fmean(rounds)
    rows = [design.row(o.shape, o.level) for o in obs]
    hosts = {o.host: 1.0 for o in obs}
    beta: list[float] = []
    shrink = (run_sigma / host_sigma) ** 2
    for _ in range(40):  # alternate: coefficients given the host factors, factors given them
        before = hosts
        beta = _lsq(rows, [t / hosts[o.host] for t, o in zip(rounds, obs, strict=True)], design, scale)
        model = [max(1e-9, sum(b * x for b, x in zip(beta, r, strict=True))) for r in rows]
        logs: dict[str, list[float]] = {}
        for t, m, o in zip(rounds, model, obs, strict=True):
            logs.setdefault(o.host, []).append(math.log(t / m))
        hosts = {h: math.exp(sum(v) / (len(v) + shrink)) for h, v in logs.items()}
        mean = statistics.fmean(math.log(v) for v in hosts.values())
        hosts = {h: v / math.exp(mean) for h, v in hosts.items()}  # the average host is 1
        if all(abs(hosts[h] - before.get(h, 1.0)) < 1e-4 for h in hosts):
            break
    one = _One(accept, beta, hosts, {}, {}, None, design)
    for level in {o.level for o in obs}:
        at = [o for o in obs if o.level == level]
        totals = [o.total_tok_s / o.tok_s for o in at if o.total_tok_s]
        if totals:
            one.total_per_tok[level] = statistics.median(totals)
        itl = [o.itl_p99_s / (one.round_s(o.shape, level) * hosts[o.host]) for o in at if o.itl_p99_s]
        if itl:
            one.itl_per_round[level] = statistics.median(itl)
    ttft = [
        (r, math.log(o.ttft_p99_s / hosts[o.host])) for r, o in zip(rows, obs, strict=True) if o.ttft_p99_s
    ]
    if ttft:
        import numpy as np

        a = np.array([r for r, _ in ttft] + (np.eye(design.size) * 0.3).tolist())
        b = np.array([y for _, y in ttft] + [0.0] * design.size)
        one.ttft = [float(v) for v in np.linalg.lstsq(a, b, rcond=None)[0]]
    return one


@dataclass
class Prediction:
    """A metric at one level: the bootstrap's mean and standard deviation."""

    mean: float
    std: float


@dataclass
class Fit:
    """The model fitted on every observation, and its bootstrap refits."""

    main: _One
    boots: list[_One]
    #: point key -> its shape (every point observed)
    shapes: dict[str, Shape] = field(default_factory=dict)
    run_sigma: float = RUN_SIGMA

    @property
    def hosts(self) -> dict[str, float]:
        """Each host's speed factor (>1: faster than the average host)."""
        return {h: 1.0 / v for h, v in self.main.hosts.items()}

    @property
    def accept(self) -> tuple[float, float, float]:
        return self.main.accept

    def host_time_factor(self, host: str) -> float:
        """What multiplies a time this host measured (1 for a host never seen)."""
        return self.main.hosts.get(host, 1.0)

    def predict(self, s: Shape, level: int, metric: str) -> Prediction | None:
        mean = self.main.predict(s, level, metric)
        if mean is None:
            return None
        values = [v for b in self.boots if (v := b.predict(s, level, metric)) is not None]
        spread = statistics.pstdev(values) if len(values) > 1 else abs(mean)
        return Prediction(mean, spread)


def _jitter(o: Observation, sigma: float, rng: random.Random) -> Observation:
    """One run drawn again: each figure moved by the run-to-run noise."""

    # log-normal: a figure drawn again stays positive however large the runs' noise (a hand-edited
    # ledger row can make it so); for small noise it is the same as 1 + N(0, sigma)
    def moved(value: float | None) -> float | None:
        return None if value is None else value * math.exp(rng.gauss(0.0, sigma))

    speed = math.exp(rng.gauss(0.0, sigma))
    length = o.accept_len * math.exp(rng.gauss(0.0, sigma / 2)) if o.accept_len else o.accept_len
    return replace(
        o,
        tok_s=o.tok_s * speed,
        accept_len=length,
        total_tok_s=None if o.total_tok_s is None else o.total_tok_s * speed,
        itl_p99_s=moved(o.itl_p99_s),
        ttft_p99_s=moved(o.ttft_p99_s),
    )


def fit(
    obs: Sequence[Observation],
    levels: int,
    *,
    seed: int = 0,
    boots: int = BOOTSTRAP,
    host_sigma: float = HOST_SIGMA,
    run_sigma: float | None = None,
) -> Fit:
    """The model on every observation, and `boots` refits of it on the same runs, each figure drawn
    again with the runs' own noise (a parametric bootstrap). Their spread is what the measured
    runs leave unknown about each point. What the model's form may miss is search.py's part:
    it widens the spread with the distance to the nearest measured point."""
    if not obs:
        raise ValueError("a fit needs at least one observation")
    others = tuple(sorted({t for o in obs for t in o.shape.other}))
    design = _Design(levels, others)
    sigma = run_sigma or RUN_SIGMA
    main = _fit_one(obs, design, host_sigma, sigma)
    rng = random.Random(seed)
    refits = []
    for _ in range(boots):
        drawn = [_jitter(o, sigma, rng) for o in obs]
        refits.append(_fit_one(drawn, design, host_sigma, sigma))
    return Fit(main, refits, {o.point: o.shape for o in obs}, sigma)

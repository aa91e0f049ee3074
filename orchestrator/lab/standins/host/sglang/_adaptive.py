"""Adaptive speculative decoding as SGLang 0.5.23 runs it (`--speculative-adaptive`).

Each tier of the config ("slot") serves the batch sizes from its key up to the next key. It keeps
an EMA of the accepted draft tokens per request and picks its draft steps from its candidate list.
The running tier has num_steps = steps, top-k 1 and draft tokens = steps + 1 (0 steps: no
drafting). Sources, in the 0.5.23 wheel: speculative/adaptive_spec_params.py (the loader, the
slots, the decision) and speculative/eagle_worker_v2.py (the switch). docs/standins.md has the rule.

Standard library only, and free of other `sglang` imports: the unit tests load it by path.
"""

from __future__ import annotations

import bisect
import json
import math
from typing import Any

#: SGLang's DEFAULT_ADAPTIVE_CONFIG, used without --speculative-adaptive-config.
DEFAULT_CONFIG: dict[str, Any] = {
    "1": {
        "candidate_steps": [1, 3, 5, 7],
        "up_hysteresis": 0.0,
        "down_hysteresis": -0.25,
        "ceiling_coeff": 0,
    },
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


def load_config(path: str | None) -> dict[int, dict[str, Any]]:
    """_load_adaptive_config: each digit key is a slot; every other key is a default of every slot
    (a slot's own value wins); only candidate_steps is checked. Raises what SGLang raises."""
    if path is None:
        raw: Any = DEFAULT_CONFIG
    else:
        with open(path) as fh:
            raw = json.load(fh)
    keys = [key for key in raw if key.isdigit()]
    if not keys:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(raw)}'
        )
    shared = {key: value for key, value in raw.items() if not key.isdigit()}
    slots = {}
    for key in keys:
        entry = raw[key]
        steps = entry.get("candidate_steps")  # a slot that is no mapping: AttributeError, as there
        good = isinstance(steps, list) and steps
        if not good or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        slots[int(key)] = {**shared, **entry}
    return slots


def candidates(slots: dict[int, dict[str, Any]]) -> list[int]:
    """Every slot's steps together, ascending: what --speculative-num-steps may be."""
    return sorted({step for cfg in slots.values() for step in cfg["candidate_steps"]})


def start_steps(slots: dict[int, dict[str, Any]], num_steps: int | None) -> int:
    """The resolved --speculative-num-steps: the given one, else the middle of `candidates`."""
    if num_steps is not None:
        return num_steps
    union = candidates(slots)
    return union[len(union) // 2]


class Slot:
    """One batch-size range: its EMA, its batch count and its current steps (AdaptiveStepSlot)."""

    def __init__(self, cfg: dict[str, Any], start: int) -> None:
        self.candidates = sorted(cfg["candidate_steps"])
        self.alpha = float(cfg.get("ema_alpha", 0.2))
        self.update_interval = int(cfg.get("update_interval", 5))
        self.warmup_batches = int(cfg.get("warmup_batches", 10))
        self.down_hysteresis = float(cfg.get("down_hysteresis", -0.25))
        self.up_hysteresis = float(cfg.get("up_hysteresis", 0.0))
        self.ceiling_coeff = float(cfg.get("ceiling_coeff", 0))
        mid = self.candidates[len(self.candidates) // 2]
        self.steps = start if start in self.candidates else mid
        self.ema = float(self.steps - 1)
        self.batches = 0

    def observe(self, accepted: float) -> tuple[int, int] | None:
        """One verify batch: `accepted` is its mean of accepted draft tokens per request. Returns
        (old, new) steps when this batch's decision changes them."""
        if self.steps > 0:  # a batch that drafted nothing says nothing about acceptance
            self.ema = (1 - self.alpha) * self.ema + self.alpha * accepted
        self.batches += 1
        after = self.batches - self.warmup_batches
        if after <= 0 or after % self.update_interval:
            return None
        old, self.steps = self.steps, self.decide()
        return (old, self.steps) if self.steps != old else None

    def decide(self) -> int:
        """_recompute_params: from 0 steps, probe the next tier up. Else down while the EMA is at
        or below the drop threshold of the tier below; if it did not move down, up while the EMA
        is above the current tier's rise threshold. Several tiers in one decision are allowed."""
        tiers, i = self.candidates, self.candidates.index(self.steps)
        if self.steps == 0:
            return tiers[min(i + 1, len(tiers) - 1)]
        j = i
        while j > 0:
            below = tiers[j - 1]
            drop = (0.5 if below == 0 else below - 0.5) + self.down_hysteresis
            if self.ema > drop:
                break
            j -= 1
        if j == i:
            while j < len(tiers) - 1 and self.ema > tiers[j] - 0.5 + self.up_hysteresis:
                j += 1
        target = tiers[j]
        if self.ceiling_coeff > 0:  # a cap on what a high tier keeps, never a reason to climb
            cap = max(1, math.ceil(self.ema * self.ceiling_coeff))
            if cap < target <= self.steps:
                target = max([s for s in tiers if s <= cap] or tiers[:1])
        return target


class Controller:
    """The slots of one server and the tier running now (AdaptiveController). Its methods return
    the log lines SGLang prints for what they did; the caller prints them."""

    def __init__(self, slots: dict[int, dict[str, Any]], start: int, graph_bs: list[int] | None) -> None:
        self.keys = sorted(slots)
        self.slots = {key: Slot(slots[key], start) for key in self.keys}
        #: The decode CUDA-graph batch sizes a batch is padded up to; None without CUDA graphs.
        self.graph_bs = sorted(graph_bs) if graph_bs else None
        self.steps = start
        self._pending: list[float] = []

    @property
    def draft_tokens(self) -> int:
        return self.steps + 1

    def init_line(self) -> str:
        first = self.slots[self.keys[0]]
        return (
            f"AdaptiveSpeculativeParams initialized: steps={first.steps}, candidate_steps={first.candidates}"
        )

    def slot_key(self, batch: int) -> int:
        """The slot of a batch: its size padded to the next captured graph size (as it is beyond
        the largest one, or without graphs), then the largest key at or below it; below every
        key, the smallest."""
        padded = batch
        if self.graph_bs and batch <= self.graph_bs[-1]:
            padded = self.graph_bs[bisect.bisect_left(self.graph_bs, batch)]
        fitting = [key for key in self.keys if key <= padded]
        return fitting[-1] if fitting else self.keys[0]

    def activate(self, batch: int) -> list[str]:
        """Before a decode round of `batch` requests: the tier of its slot runs."""
        return self._switch(self.slots[self.slot_key(batch)].steps)

    def verify_done(self, accepted: float, batch: int) -> list[str]:
        """One verify batch of `batch` requests, `accepted` its mean accepted draft tokens per
        request: the slot's EMA, and its decision, which takes effect at once."""
        slot = self.slots[self.slot_key(batch)]
        change = slot.observe(accepted)
        if change is None:
            return []
        old, new = change
        line = f"Adaptive spec params updated: steps {old} -> {new} (ema_accept_len={slot.ema:.2f})"
        return [line, *self._switch(new)]

    def request_round(self, accepted: float, batch: int) -> list[str]:
        """One request's round, in a stand-in that paces each request on its own: `batch` of them
        make one verify batch, fed with their mean."""
        self._pending.append(accepted)
        if len(self._pending) < batch:
            return []
        mean = sum(self._pending) / len(self._pending)
        self._pending.clear()
        return self.verify_done(mean, batch)

    def _switch(self, steps: int) -> list[str]:
        if steps == self.steps:
            return []
        old, self.steps = self.steps, steps
        return [
            f"Switch adaptive runtime state: steps {old} -> {steps}, draft_tokens {old + 1} -> {steps + 1}"
        ]

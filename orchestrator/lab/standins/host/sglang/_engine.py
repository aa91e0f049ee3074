"""Token generation of the stand-in: paced by the speed model, counted like SGLang's scheduler.

Each request runs decode rounds of `round_s` seconds, each yielding the accept length's
worth of tokens (fractional parts carried over), against an absolute schedule so that a
client measuring tokens/s sees the model's speed. Streams do not slow each other down
(the lab has no batching); requests beyond --max-running-requests wait in a queue.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from sglang import _speed
from sglang._common import log
from sglang._startup import Runtime

WORDS = ("the", "lab", "host", "serves", "tokens", "at", "a", "steady", "pace", "while", "drafts", "verify")
MAX_TOTAL_TOKENS = 1_000_000


@dataclass
class Chunk:
    """What one decode round adds to a request."""

    text: str  # the new tokens' text
    completion_tokens: int  # so far
    verify_ct: int  # rounds so far
    done: bool


class Engine:
    """Counters shared by all requests, and the pacing loop each request runs."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(rt.args.max_running_requests or 48)
        self.running = 0
        self.queued = 0
        self.tokens_in_use = 0
        self.rounds = 0
        self.accepted = 0
        self.last_throughput = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.ready = False

    @property
    def model(self) -> _speed.DecodeModel:
        return self.rt.decode

    def _log_decode(self) -> None:
        """SGLang's periodic decode line (every --decode-log-interval rounds)."""
        spec = ""
        if self.rt.spec is not None:
            rate = _speed.accept_rate(self.rt.spec, self.model.accept_len)
            spec = f"accept len: {self.model.accept_len:.2f}, accept rate: {rate:.2f}, "
        self.last_throughput = self.model.tok_s * self.running
        log(
            f"Decode batch, #running-req: {self.running}, #token: {self.tokens_in_use}, "
            f"token usage: {self.tokens_in_use / MAX_TOTAL_TOKENS:.2f}, {spec}"
            f"cuda graph: {self.rt.args.cuda_graph}, gen throughput (token/s): {self.last_throughput:.2f}, "
            f"#queue-req: {self.queued}",
            "TP0",
        )

    def _admit(self, prompt_tokens: int) -> None:
        with self.lock:
            self.queued += 1
        self.slots.acquire()
        with self.lock:
            self.queued -= 1
            self.running += 1
            self.tokens_in_use += prompt_tokens
            self.prompt_tokens_total += prompt_tokens
            log(
                f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
                f"token usage: {self.tokens_in_use / MAX_TOTAL_TOKENS:.2f}, "
                f"#running-req: {self.running - 1}, "
                f"#queue-req: {self.queued}",
                "TP0",
            )

    def _release(self, tokens: int) -> None:
        with self.lock:
            self.running -= 1
            self.tokens_in_use -= tokens
        self.slots.release()

    def _count_round(self, new_tokens: int) -> None:
        with self.lock:
            self.rounds += 1
            self.accepted += new_tokens
            self.tokens_in_use += new_tokens
            self.generation_tokens_total += new_tokens
            if self.rounds % self.rt.args.decode_log_interval == 0:
                self._log_decode()

    def generate(self, prompt_tokens: int, max_new_tokens: int) -> Iterator[Chunk]:
        """Decode rounds for one request, each yielded when its time has come."""
        self._admit(prompt_tokens)
        produced = verify = 0
        words = itertools.cycle(WORDS)
        try:
            start = time.monotonic()
            while produced < max_new_tokens:
                verify += 1
                reach = min(int(verify * self.model.accept_len + 1e-9), max_new_tokens)
                new, produced = reach - produced, reach
                delay = start + verify * self.model.round_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._count_round(new)
                text = "".join(" " + next(words) for _ in range(new))
                yield Chunk(text, produced, verify, produced >= max_new_tokens)
        finally:
            self._release(prompt_tokens + produced)


def request_id() -> str:
    return uuid.uuid4().hex


def count_prompt_tokens(text: object) -> int:
    """About one token per word; the lab has no tokenizer."""
    if isinstance(text, list):
        return max(1, len(text))
    return max(1, len(str(text or "").split()))

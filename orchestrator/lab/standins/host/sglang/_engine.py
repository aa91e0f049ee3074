"""Token generation of the stand-in: paced by the speed model, counted like SGLang's scheduler.

Each request runs decode rounds against an absolute schedule: a round takes
`round_cost(B) / speed` seconds, B being the requests running when the round is scheduled, so
a stream slows down while others run and speeds up when they finish. Each round yields the
request's own accept length (from its prompt, template and temperature; fractional parts
carried over). Requests beyond --max-running-requests wait in a queue.

speed = base_tok_s x host factor x run factor: the host factor is fixed by the host name, the
run factor is drawn each time the engine goes from idle to busy (run-to-run noise); both are 1
in exact mode (`exact` knob, SGLANG_STANDIN_EXACT=1).

Speculative figures are counted as SGLang's scheduler counts them (scheduler_metrics_mixin.py):
accept length = accepted tokens / (requests x rounds), per decode-log interval for the log line
and /metrics, and over the server's lifetime (folded in at each decode log) for
/get_server_info's avg_spec_accept_length. The stand-in counts each round's expected accept
length rather than the whole tokens it released, so the figures equal the model's exactly.

With --speculative-adaptive (0.5.23) each round runs the tier of the running batch's slot
(sglang._adaptive): the speed model with SpecSettings(steps, 1, steps + 1). The rounds of a batch's
requests feed that slot's EMA as one verify batch, with the accepted draft tokens they expect.

Each request spends its prefill time (`_speed.prefill_seconds`) after admission and before its
first round. A PD pair splits the two: the prefill server runs `prefill_only` (the prefill and the
one token it yields), the decode server `generate(..., prefill=False)`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from sglang import _speed
from sglang._common import log
from sglang._startup import Runtime

WORDS = ("the", "lab", "host", "serves", "tokens", "at", "a", "steady", "pace", "while", "drafts", "verify")
MAX_TOTAL_TOKENS = 1_000_000
_SPECIAL = re.compile(r"<\|[^|<>]{1,64}\|>")


@dataclass
class Chunk:
    """What one decode round adds to a request."""

    text: str  # the new tokens' text
    completion_tokens: int  # so far
    verify_ct: int  # rounds so far
    done: bool
    histogram: list[int] = field(default_factory=list)
    """Rounds that accepted exactly i draft tokens, at index i (SGLang's spec_accept_histogram)."""


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
        self.last_throughput = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.ready = False
        self.mode = rt.args.disaggregation_mode
        # A PD server's queues (sglang._pd keeps them): a prefill's requests waiting for their
        # decode's handshake (prealloc) or for it to take their KV (inflight); a decode's in the
        # handshake (prealloc) or waiting for their KV (transfer).
        self.disagg = {"prealloc": 0, "inflight": 0, "transfer": 0}
        # SGLang's spec counters: this decode-log interval, and the server's lifetime.
        self.spec_accepted = self.spec_forward_ct = 0.0
        self.spec_total_accepted = self.spec_total_forward_ct = 0.0
        self.last_accept_len = 0.0
        self._tokens_since_log = 0
        self._last_log = time.monotonic()
        host = socket.gethostname()
        seed = rt.model.knob("noise_seed")
        sigma = 0.0 if rt.exact else float(rt.model.knob("run_noise") or 0.0)
        self.noise = _speed.RunNoise(
            sigma, int(seed) if seed is not None else _speed.noise_seed(host, rt.args.port)
        )
        speed = rt.model.knob("host_speed")
        self.host_speed = 1.0 if rt.exact else float(speed) if speed is not None else _speed.host_speed(host)
        self.run_factor = 1.0
        self.run_factors: list[float] = []  # one per busy period, for tests and the curious

    @property
    def model(self) -> _speed.DecodeModel:
        return self.rt.decode

    @property
    def active_spec(self) -> _speed.SpecSettings | None:
        """The speculative settings running now: with adaptive, the current tier's."""
        ctrl, spec = self.rt.adaptive, self.rt.spec
        if ctrl is None or spec is None:
            return spec
        return dataclasses.replace(spec, steps=ctrl.steps, topk=1, draft_tokens=ctrl.draft_tokens)

    def _log_lines(self, lines: list[str]) -> None:
        for line in lines:
            log(line, self.rt.tp_label)

    @property
    def avg_spec_accept_length(self) -> float | None:
        """/get_server_info's figure: None until a decode log has folded in some rounds."""
        if self.rt.spec is None or self.spec_total_forward_ct <= 0:
            return None
        return self.spec_total_accepted / self.spec_total_forward_ct

    def _log_decode(self) -> None:
        """SGLang's periodic decode line (every --decode-log-interval rounds); holds the lock."""
        now = time.monotonic()
        self.last_throughput = self._tokens_since_log / max(now - self._last_log, 1e-9)
        self._tokens_since_log, self._last_log = 0, now
        spec = ""
        if self.rt.spec is not None:
            length = self.spec_accepted / self.spec_forward_ct if self.spec_forward_ct else 0.0
            rate = _speed.accept_rate(self.active_spec, length)  # over the tier's draft tokens now
            self.spec_total_accepted += self.spec_accepted
            self.spec_total_forward_ct += self.spec_forward_ct
            self.spec_accepted = self.spec_forward_ct = 0.0
            self.last_accept_len = length
            spec = f"accept len: {length:.2f}, accept rate: {rate:.2f}, "
        if self.mode == "decode":
            spec += (
                f"pre-allocated usage: 0.00, #prealloc-req: {self.disagg['prealloc']}, "
                f"#transfer-req: {self.disagg['transfer']}, #retracted-req: 0, "
            )
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
            if self.running == 0:  # idle -> busy: a new run, a new speed factor
                self.run_factor = self.noise.draw()
                self.run_factors.append(self.run_factor)
            self.running += 1
            self.tokens_in_use += prompt_tokens
            self.prompt_tokens_total += prompt_tokens
            if self.mode == "decode":
                return  # its KV came from the prefill server: no prefill batch here
            queues = ""
            if self.mode == "prefill":
                pending = self.disagg
                queues = f", #prealloc-req: {pending['prealloc']}, #inflight-req: {pending['inflight']}"
            log(
                f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
                f"token usage: {self.tokens_in_use / MAX_TOTAL_TOKENS:.2f}, "
                f"#running-req: {self.running - 1}, "
                f"#queue-req: {self.queued}{queues}",
                "TP0",
            )

    def _release(self, tokens: int) -> None:
        with self.lock:
            self.running -= 1
            self.tokens_in_use -= tokens
        self.slots.release()

    def _count_round(self, new_tokens: int, accept_len: float, batch: int) -> None:
        with self.lock:
            self.rounds += 1
            self.spec_accepted += accept_len
            self.spec_forward_ct += 1
            self.tokens_in_use += new_tokens
            self.generation_tokens_total += new_tokens
            self._tokens_since_log += new_tokens
            if self.rt.adaptive is not None:
                self._log_lines(self.rt.adaptive.request_round(accept_len - 1.0, batch))
            if self.rounds % self.rt.args.decode_log_interval == 0:
                self._log_decode()

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """This prompt's prefill time at the engine's speed now (host and run factors included)."""
        speed = float(self.rt.model.knob("prefill_tok_s")) * self.host_speed * self.run_factor
        return _speed.prefill_seconds(prompt_tokens, speed)

    def prefill_only(self, prompt_tokens: int) -> Chunk:
        """A PD prefill server's part of a request: admission, the prefill, and the one token it
        samples (SGLang's prefill sets max_new_tokens to 1 and hands that token to the decode)."""
        self._admit(prompt_tokens)
        try:
            time.sleep(self.prefill_seconds(prompt_tokens))
            with self.lock:
                self.tokens_in_use += 1
                self.generation_tokens_total += 1
            return Chunk(" " + WORDS[0], 1, 0, True)
        finally:
            self._release(prompt_tokens + 1)

    def schedule(self) -> tuple[_speed.SpecSettings | None, int, float]:
        """The round scheduled now: its speculative settings (with adaptive, the tier of the
        running batch's slot, switched to before the round as SGLang does before its draft), the
        batch, and its seconds."""
        with self.lock:
            batch, factor = self.running, self.run_factor
            if self.rt.adaptive is not None:
                self._log_lines(self.rt.adaptive.activate(batch))
            spec = self.active_spec
        speed = self.rt.base_tok_s * self.host_speed * factor
        # a tier of 0 steps drafts nothing (SGLang's "no drafting" tier): a plain decode step
        costed = None if spec is not None and spec.steps == 0 else spec
        return spec, batch, _speed.round_cost(costed, self.rt.args.cuda_graph, batch) / speed

    def generate(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        accept_top1: float | None = None,
        *,
        prefill: bool = True,
    ) -> Iterator[Chunk]:
        """Decode rounds for one request, each yielded when its time has come. `accept_top1`:
        the request's own top-1 acceptance (`_speed.request_accept`); None: the drafter's.
        `prefill`: spend the prompt's prefill time first (False on a PD decode server, whose
        prefill ran on the prefill server)."""
        self._admit(prompt_tokens)
        length = _speed.accept_length(self.rt.spec, accept_top1)
        produced = verify = 0
        reached = 0.0  # tokens the rounds so far are worth, fractions carried over
        histogram: list[int] = []
        words = itertools.cycle(WORDS)
        try:
            if prefill:
                time.sleep(self.prefill_seconds(prompt_tokens))
            due = time.monotonic()
            while produced < max_new_tokens:
                verify += 1
                spec, batch, seconds = self.schedule()
                if self.rt.adaptive is not None:  # each round its tier's accept length
                    length = _speed.accept_length(spec, accept_top1)
                    reached += length
                else:
                    reached = verify * length
                reach = min(int(reached + 1e-9), max_new_tokens)
                new, produced = reach - produced, reach
                due += seconds
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._count_round(new, length, batch)
                if self.rt.spec is not None:
                    accepted = max(new - 1, 0)
                    histogram += [0] * (accepted + 1 - len(histogram))
                    histogram[accepted] += 1
                text = "".join(" " + next(words) for _ in range(new))
                yield Chunk(text, produced, verify, produced >= max_new_tokens, list(histogram))
        finally:
            self._release(prompt_tokens + produced)


def request_id() -> str:
    return uuid.uuid4().hex


def count_prompt_tokens(text: object) -> int:
    """About one token per word, and one per special token such as `<|eot_id|>`; the lab has
    no tokenizer."""
    if isinstance(text, list):
        return max(1, len(text))
    return max(1, len(_SPECIAL.sub(" <s> ", str(text or "")).split()))

"""bench: timed streaming requests against the deployed SGLang server, and the maths on them.

Engine layer: never prints.
- `find_target()` says which server answers HTTP. That is the first host of the inventory or
  --limit, at its `ansible_host`, on the deployed unit's port.
- `run()` warms it up, streams requests at one load level, and returns a `BenchResult`.
- `curve()` runs every level (concurrency or request rate) and repeat of a `Traffic`.
- `record()` writes a result to the ledger.

Endpoints:
- `generate`: SGLang's native /generate, the prompt as raw text.
- `completions`: /v1/completions, raw text.
- `chat`: /v1/chat/completions with messages. So the server applies the model's chat template, as
  production traffic does.

Tokens are the server's own counts. On /generate they are the cumulative
meta_info.completion_tokens. On the OpenAI endpoints they are `usage`: per chunk with
`continuous_usage_stats`, else the final usage chunk, spread over the chunks by their share of the
text.

What is measured, and why this way:
- Decode speed of a request = tokens after its first chunk / time from its first chunk to its last
  full one. It leaves out queueing and prefill, which TTFT covers. So it is the number the reference
  deployment quotes per profile (90 tok/s with no speculation).
- Total speed = all output tokens / wall time of the measured phase, TTFT included.
- Inter-token latency is per token. With speculation, one chunk carries the accept length's worth
  of tokens, so a chunk's gap is shared by its tokens. sglang's bench_serving reports per-chunk
  gaps, which makes a speculative profile look slower per token than it is.
- A run's accept length is its own: on /generate, completion tokens / meta_info `spec_verify_ct`
  of its requests, the only per-request speculative figure SGLang returns. The OpenAI endpoints
  carry none, so there it is the mean of the `accept len` lines the server logs during the run.
  `/get_server_info` internal_states gives SGLang's figure too, but cumulative since the server
  started. The ledger's `accept_len` column keeps that one; what is printed names it
  `accept_len_server_cumulative` (printed_row).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import math
import random
import statistics
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from orchestrator import ledger
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.hosts.logs_play import accept_from_log
from orchestrator.hosts.secrets import api_key
from orchestrator.paths import CHECKOUT
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch
from orchestrator.tuning import datasets

#: Prompts when no --prompts file is given: varied lengths, no meaning needed for a speed test.
DEFAULT_PROMPTS = (
    "Explain speculative decoding to a new engineer in a few paragraphs.",
    "Write a short story about a lighthouse keeper who collects maps.",
    "List the steps to replace a bicycle chain, with the tools needed.",
    "Summarise the history of the printing press for a school report.",
    "Describe how a compiler turns source code into machine instructions.",
    "Give ten ideas for a rainy weekend with children, one line each.",
)
#: Accept lengths from the server and from its log further apart than this get a note.
ACCEPT_TOLERANCE = 0.05
#: Newest journal entries read for the cross-check: decode lines come every 40 rounds, so the
#: newest 200 hold several. Not more: above about 250 entries the logs play came back empty on
#: the lab (journalctl's JSON through ansible-runner's events), silently.
LOG_LINES = 200
#: entries one read after several runs asks for (the newest, within its --since window); only
#: SGLang's decode lines (journalctl --grep), so a trial's window stays far below that limit
LOG_WINDOW_LINES = 200
ACCEPT_GREP = "accept len"
#: seconds a journal's clock may be off the control machine's: a run takes the lines of its
#: window and those this close to it (the next run's warm-up comes later than that)
CLOCK_SLACK_S = 1.0


class BenchError(OrchestratorError):
    """The server could not be benchmarked (not deployed, not reachable, every request failed)."""


#: The endpoints bench can drive, and their paths.
ENDPOINTS = {"generate": "/generate", "chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Settings:
    """How hard and how long bench pushes the server, and with what traffic, at one level."""

    requests: int = 16
    concurrency: int = 1
    max_tokens: int = 256
    warmup: int = 2
    warmup_tokens: int = 16
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    timeout_s: float = 600.0
    endpoint: str = "generate"
    #: None: the built-in prompts (or `prompts`)
    dataset: datasets.Dataset | None = None
    temperature: float = 0.0
    seed: int = 0
    #: Poisson arrivals at this many requests/s (open loop, `concurrency` caps what is in
    #: flight); None: `concurrency` closed-loop clients
    request_rate: float | None = None

    #: Each count's range: bench's options and the tune space's traffic take the same.
    #: concurrency 0 is an open loop with no cap on the requests in flight.
    WHOLE_RANGES = {
        "requests": (1, 100_000),
        "concurrency": (0, 1024),
        "max_tokens": (2, 1_000_000),
        "warmup": (0, 1000),
        "warmup_tokens": (1, 1_000_000),
        "seed": (0, 2**31 - 1),
    }
    #: Each number's range; never nan or inf. SGLang refuses a negative temperature; OpenAI's
    #: API takes at most 2.
    NUMBER_RANGES = {
        "temperature": (0, 2),
        "request_rate": (0.001, 100_000),
        "timeout_s": (0.001, 86_400),
    }

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise InputError(f"--endpoint {self.endpoint!r}: give one of {', '.join(ENDPOINTS)}")
        for name, (low, high) in self.WHOLE_RANGES.items():
            value = getattr(self, name)
            if type(value) is not int or not low <= value <= high:  # bool is an int subclass
                raise InputError(f"bench settings: {name} {value!r}: give a whole number in {low}..{high}")
        for name, (low_f, high_f) in self.NUMBER_RANGES.items():
            number = getattr(self, name)
            if number is None and name == "request_rate":
                continue
            is_number = isinstance(number, int | float) and not isinstance(number, bool)
            if not (is_number and low_f <= number <= high_f):  # nan fails every comparison
                raise InputError(f"bench settings: {name} {number!r}: give a number in {low_f:g}..{high_f:g}")

    @property
    def source(self) -> datasets.Dataset:
        return self.dataset if self.dataset is not None else datasets.builtin(self.prompts)

    def chosen(self) -> tuple[datasets.Request, ...]:
        """The requests of one run: `requests` drawn from the dataset with `seed` (the built-in
        prompts are taken in turn, as before datasets)."""
        if self.dataset is None:
            pool = self.source.requests
            return tuple(pool[i % len(pool)] for i in range(self.requests))
        return datasets.sample(self.dataset, self.requests, self.seed)

    @property
    def level(self) -> str:
        """`c=8` or `4/s` (with its cap when one is set)."""
        if self.request_rate is None:
            return f"c={self.concurrency}"
        return f"{self.request_rate:g}/s"


@dataclass(frozen=True)
class Traffic:
    """What one bench invocation measures: the same requests at each level, `repeat` times."""

    base: Settings = Settings()
    concurrency: tuple[int, ...] = (1,)
    request_rates: tuple[float, ...] = ()
    repeat: int = 1

    def levels(self) -> list[Settings]:
        if self.request_rates:
            return [dataclasses.replace(self.base, request_rate=r) for r in self.request_rates]
        return [dataclasses.replace(self.base, concurrency=c) for c in self.concurrency]


@dataclass(frozen=True)
class Target:
    """The server bench talks to, and what is deployed there."""

    host: str
    address: str
    port: int
    profile: str = ""
    digest: str = ""
    plan_digest: str = ""
    api_key: str = ""
    #: The gateway the traffic goes through ("": straight to the server). The server (host,
    #: address, port) is then the one whose logs and /get_server_info give the accept length:
    #: a PD fleet's first decode server.
    gateway: str = ""
    #: JSON of the fleet behind the gateway: {gateway, servers: [{host, role, profile, digest}]}.
    fleet: str = ""

    @property
    def url(self) -> str:
        addr = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{addr}:{self.port}"

    @property
    def traffic_url(self) -> str:
        """Where the requests go: the gateway, else the server."""
        return self.gateway or self.url


# --- the maths ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """mean, p50, p90, p99 of some samples (all None without samples)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            return cls()
        ordered = sorted(values)
        return cls(
            statistics.fmean(ordered),
            percentile(ordered, 50),
            percentile(ordered, 90),
            percentile(ordered, 99),
        )


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of sorted samples, linearly interpolated (numpy's default method)."""
    if not ordered:
        raise ValueError("percentile of no samples")
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Stream:
    """One request as the client saw it: when it was sent, each chunk's arrival and token count."""

    sent: float
    events: list[tuple[float, int]] = field(default_factory=list)
    done: float = 0.0
    verify_ct: int = 0
    error: str = ""
    #: the server counted tokens per chunk (False: an OpenAI stream without per-chunk usage,
    #: whose chunks' counts are the final usage spread by text share)
    counted: bool = True
    #: an OpenAI stream that gave no usage at all: one token counted per chunk
    no_usage: bool = False

    @property
    def tokens(self) -> int:
        return self.events[-1][1] if self.events else 0

    @property
    def ttft_s(self) -> float | None:
        return self.events[0][0] - self.sent if self.events else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first chunk over the time after it; None with fewer than two chunks.

        With three or more chunks the last is left out: max_tokens cuts its round short, so it
        would count a whole round's time for part of a round's tokens (2.5% low at 64 tokens
        and accept length 2.1; 0.1% without it).
        """
        if len(self.events) < 2:
            return None
        last = self.events[-2] if len(self.events) >= 3 else self.events[-1]
        (t0, n0), (t1, n1) = self.events[0], last
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def itl_s(self) -> list[float]:
        """One latency per token after the first chunk: each chunk's gap shared by its tokens."""
        samples: list[float] = []
        for (t_prev, n_prev), (t, n) in zip(self.events, self.events[1:], strict=False):
            new = n - n_prev
            samples += [(t - t_prev) / new] * new
        return samples


def accept_from_server_info(info: dict[str, Any]) -> float | None:
    """Mean avg_spec_accept_length over the DP ranks' internal_states (absent without speculation)."""
    states = info.get("internal_states") or []
    values = [
        float(s["avg_spec_accept_length"])
        for s in states
        if isinstance(s, dict) and s.get("avg_spec_accept_length")
    ]
    return statistics.fmean(values) if values else None


# --- the result -----------------------------------------------------------------------------


@dataclass
class BenchResult:
    """Every number of one bench run, with what it ran against."""

    target: Target
    settings: Settings
    streams: list[Stream]
    duration_s: float
    sglang_version: str = ""
    speculative: bool = False
    accept_len: float | None = None
    accept_len_log: float | None = None
    notes: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: the measurement's window on this machine's clock (epoch seconds), for a log read later
    began_epoch: float = 0.0
    ended_epoch: float = 0.0
    curve_id: str = ""
    repeat: int = 0

    @property
    def ok_streams(self) -> list[Stream]:
        return [s for s in self.streams if not s.error]

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.streams if s.error]

    @property
    def output_tokens(self) -> int:
        return sum(s.tokens for s in self.ok_streams)

    def per_request_tok_s(self) -> list[float]:
        return [v for v in (s.decode_tok_s for s in self.ok_streams) if v is not None]

    @property
    def tok_s(self) -> Stats:
        return Stats.of(self.per_request_tok_s())

    @property
    def total_tok_s(self) -> float | None:
        return self.output_tokens / self.duration_s if self.duration_s > 0 and self.ok_streams else None

    @property
    def ttft(self) -> Stats:
        return Stats.of([s.ttft_s for s in self.ok_streams if s.ttft_s is not None])

    @property
    def itl(self) -> Stats:
        return Stats.of([v for s in self.ok_streams for v in s.itl_s()])

    @property
    def accept_len_client(self) -> float | None:
        """Completion tokens per verify round, as the server's meta_info counts them."""
        verify = sum(s.verify_ct for s in self.ok_streams)
        return self.output_tokens / verify if verify else None

    @property
    def accept_len_level(self) -> float | None:
        """This level's own accept length: the client's count on /generate, else the log's
        (the server_info figure is cumulative since the server started)."""
        return self.accept_len_client if self.accept_len_client is not None else self.accept_len_log

    def row(self, sweep_id: str = "") -> dict[str, Any]:
        """The ledger row (bench_results columns)."""
        speeds = self.per_request_tok_s()
        tok, ttft, itl, t = self.tok_s, self.ttft, self.itl, self.target
        return {
            "run_id": self.run_id,
            "sweep_id": sweep_id,
            "host": t.host,
            "address": t.address,
            "port": t.port,
            "profile": t.profile,
            "digest": t.digest,
            "plan_digest": t.plan_digest,
            "fleet": t.fleet,
            "speculative": int(self.speculative),
            "sglang_version": self.sglang_version,
            "git_commit": git_commit(),
            "result": "ok" if self.ok_streams else "failed",
            "diagnosis": "; ".join(sorted(set(self.errors)))[:500],
            "requests": self.settings.requests,
            "concurrency": self.settings.concurrency,
            "max_tokens": self.settings.max_tokens,
            "errors": len(self.errors),
            "output_tokens": self.output_tokens,
            "duration_s": self.duration_s,
            "tok_s": tok.mean,
            "tok_s_p50": tok.p50,
            "tok_s_min": min(speeds, default=None),
            "tok_s_max": max(speeds, default=None),
            "total_tok_s": self.total_tok_s,
            **{f"ttft_{k}_s": getattr(ttft, k) for k in ("mean", "p50", "p90", "p99")},
            **{f"itl_{k}_s": getattr(itl, k) for k in ("mean", "p50", "p90", "p99")},
            "accept_len": self.accept_len,
            "accept_len_log": self.accept_len_log,
            "accept_len_client": self.accept_len_client,
            "notes": "; ".join(self.notes),
            **self.traffic_columns(),
            "curve_id": self.curve_id or self.run_id,
            "repeat": self.repeat,
        }

    def to_json(self, ledger_id: int | None = None) -> dict[str, Any]:
        """The run as `bench --json` prints it: its ledger row (with its id), accept lengths named
        as printed_row names them."""
        return printed_row({"ledger_id": ledger_id, **self.row()})

    def traffic_columns(self) -> dict[str, Any]:
        """What traffic the row measured (ledger migration 4)."""
        s, source = self.settings, self.settings.source
        return {
            "endpoint": s.endpoint,
            "dataset": source.name,
            "dataset_digest": source.digest,
            "request_rate": s.request_rate,
            "temperature": s.temperature,
            "seed": s.seed if s.dataset is not None or s.request_rate is not None else None,
        }


#: The printed name of the ledger's accept_len column: /get_server_info's figure, which SGLang
#: counts since the server started, so it mixes every earlier run on that server.
SERVER_ACCEPT = "accept_len_server_cumulative"


def own_accept(row: Mapping[str, Any]) -> float | None:
    """A run's own accept length from its ledger row: the client's count (/generate's
    spec_verify_ct), else the server log's lines during the run. Without speculation it is the
    recorded 1.0. None where neither was read: the server's cumulative figure is not the run's."""
    for name in ("accept_len_client", "accept_len_log"):
        if row.get(name) is not None:
            return float(row[name])
    if not row.get("speculative") and row.get("accept_len") is not None:
        return float(row["accept_len"])
    return None


def printed_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A bench_results row as `bench --json` and `results` print it. `accept_len` is the run's own
    figure (own_accept); the ledger's accept_len column, the server's since it started, is printed
    as SERVER_ACCEPT, beside the client's and the log's. The ledger keeps its column names."""
    shown: dict[str, Any] = {}
    for name, value in row.items():
        if name == "accept_len":
            shown[name] = own_accept(row)
        elif name != SERVER_ACCEPT:
            shown[name] = value
        if name == "accept_len_client" or (name == "accept_len" and "accept_len_client" not in row):
            shown[SERVER_ACCEPT] = row.get("accept_len")
    return shown


def git_commit() -> str:
    """The tool's commit, so a result can be traced to the code that measured it; an installed
    wheel has none and gives its version, v0.1.0 (git would name whatever repository holds the venv)."""
    if CHECKOUT is None:
        return f"v{importlib.metadata.version('orchestrator')}"
    try:
        done = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def record(result: BenchResult, sweep_id: str = "") -> int:
    return ledger.record_bench(result.row(sweep_id))


# --- talking to the server ------------------------------------------------------------------


def _headers(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


def server_info(target: Target, timeout_s: float = 10.0) -> dict[str, Any]:
    """`/get_server_info`: SGLang's version, its resolved arguments and internal_states."""
    url = f"{target.url}/get_server_info"
    try:
        resp = httpx.get(url, headers=_headers(target), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise BenchError(f"{target.host}: cannot reach {url}: {exc}") from None
    if resp.status_code == 401:
        raise BenchError(f"{target.host}: the server wants an API key: give --profile with its api_key")
    if resp.status_code != 200:
        raise BenchError(f"{target.host}: {url} answered {resp.status_code}: {resp.text[:200]}")
    try:
        info = resp.json()
    except ValueError:
        raise BenchError(f"{target.host}: {url} did not answer JSON: {resp.text[:200]}") from None
    return info if isinstance(info, dict) else {}


def request_body(
    settings: Settings, request: datasets.Request, max_tokens: int, model: str
) -> dict[str, Any]:
    """The JSON one request sends, as SGLang's own bench_serving sends it for that endpoint:
    greedy at temperature 0, `ignore_eos` so the output length is the one asked for."""
    if settings.endpoint == "generate":
        params = {"max_new_tokens": max_tokens, "temperature": settings.temperature, "ignore_eos": True}
        return {"text": request.prompt, "sampling_params": params, "stream": True}
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": settings.temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if settings.endpoint == "chat":
        body["messages"] = [dict(m) for m in request.messages]
    else:
        body["prompt"] = request.prompt
    return body


async def _stream(
    client: httpx.AsyncClient,
    target: Target,
    settings: Settings,
    body: dict[str, Any],
    sent: float | None = None,
) -> Stream:
    """One streamed request, timed chunk by chunk from `sent` (default: now; an open loop's
    arrival time, so its TTFT holds the wait for a free slot under --concurrency)."""
    stream = Stream(sent=time.perf_counter() if sent is None else sent)
    path = ENDPOINTS[settings.endpoint]
    try:
        async with client.stream("POST", path, json=body, headers=_headers(target)) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                stream.error = f"HTTP {resp.status_code}: {text[:200]}"
            elif settings.endpoint == "generate":
                await _read_events(resp, stream)
            else:
                await _read_openai(resp, stream, chat=settings.endpoint == "chat")
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"[:300]
    stream.done = time.perf_counter()
    if not stream.error and not stream.events:
        stream.error = "the stream ended without a token"
    return stream


async def _sse(resp: httpx.Response) -> AsyncIterator[tuple[float, str]]:
    """Each `data:` payload of a Server-Sent Events stream with its arrival time, up to
    `data: [DONE]` (SGLang's native and OpenAI streams both end so)."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield time.perf_counter(), data


async def _read_events(resp: httpx.Response, stream: Stream) -> None:
    """SGLang's SSE: `data: {text, meta_info}` with cumulative counts, then `data: [DONE]`. An
    error object fails the request: smg 1.x ends a stream its worker cut so, then `[DONE]`."""
    async for now, data in _sse(resp):
        meta = _chunk(data)["meta_info"]
        tokens = int(meta["completion_tokens"])
        stream.verify_ct = int(meta.get("spec_verify_ct") or 0)
        if tokens > stream.tokens:
            stream.events.append((now, tokens))


class StreamError(ValueError):
    """The server said, inside a 200 stream, that the request failed."""


def _chunk(data: str) -> dict[str, Any]:
    """One SSE payload as a JSON object; StreamError for anything else, and for an error object
    (the server's, or a gateway's: smg 1.x sends `{"error": {..., "type": "stream_error"}}`)."""
    item = json.loads(data)
    if not isinstance(item, dict):
        raise StreamError(f"a chunk that is not a JSON object: {data[:80]}")
    if "error" in item or item.get("object") == "error":
        raise StreamError(f"the server reported an error mid-stream: {data[:200]}")
    return item


async def _read_openai(resp: httpx.Response, stream: Stream, chat: bool) -> None:
    """OpenAI SSE chunks: text in `choices[0].delta.content` (chat) or `choices[0].text`; the
    token counts from `usage.completion_tokens` (cumulative on every chunk with
    continuous_usage_stats, else only on the last, choice-less chunk). A chunk whose tokens
    decode to no text (special tokens under ignore_eos) still counts its tokens; an error
    object in the stream fails the request."""
    chunks: list[tuple[float, int, int | None]] = []  # (arrival, text length so far, tokens so far)
    chars, final = 0, None
    async for now, data in _sse(resp):
        item = _chunk(data)
        usage = item.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        choices = item.get("choices")
        text = _chunk_text(choices[0], chat) if isinstance(choices, list) and choices else ""
        if tokens is not None:
            final = int(tokens)
        if text or (
            tokens is not None and chunks and chunks[-1][2] is not None and int(tokens) > chunks[-1][2]
        ):
            chars += len(text)
            chunks.append((now, chars, None if tokens is None else int(tokens)))
    if chunks and all(n is not None for _, _, n in chunks):
        stream.events = [(t, int(n)) for t, _, n in chunks if n]
        return
    # No per-chunk usage: the server's final count spread by each chunk's share of the text
    # (the first chunk holds at least one token); no usage at all: one token per chunk (the
    # result's notes say which).
    stream.counted = False
    last = 0
    for t, so_far, _ in chunks:
        if final is None:
            last += 1
        else:
            last = max(last, min(final, max(1, round(final * so_far / max(chars, 1)))))
        if not stream.events or last > stream.events[-1][1]:
            stream.events.append((t, last))
    if final is not None and stream.events and final > stream.events[-1][1]:
        stream.events[-1] = (stream.events[-1][0], final)
    if final is None:
        stream.no_usage = True


def _chunk_text(choice: object, chat: bool) -> str:
    if not isinstance(choice, dict):
        return ""
    if chat:
        delta = choice.get("delta")
        return str(delta.get("content") or "") if isinstance(delta, dict) else ""
    return str(choice.get("text") or "")


def arrivals(count: int, rate: float | None, seed: int) -> list[float]:
    """Send times (seconds from the start) of `count` requests: all at 0 without a rate, else
    a Poisson process of `rate` per second (exponential gaps, seeded), as bench_serving's."""
    if rate is None:
        return [0.0] * count
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def _streams(
    target: Target,
    settings: Settings,
    chosen: Sequence[datasets.Request],
    max_tokens: int | None,
    progress: Callable[[int], None],
    model: str = "default",
) -> tuple[list[Stream], float]:
    """One request per `chosen` item, at most `settings.concurrency` at a time (closed loop),
    or sent at Poisson arrival times (`request_rate`) with `concurrency` as the cap (0: none).
    Returns the streams and when the first could be sent (the client made: its set-up is not
    the server's time)."""
    cap = settings.concurrency or max(len(chosen), 1)
    gate = asyncio.Semaphore(cap)
    limits = httpx.Limits(max_connections=cap)
    timeout = httpx.Timeout(settings.timeout_s, connect=10.0)
    when = arrivals(len(chosen), settings.request_rate, settings.seed)
    async with httpx.AsyncClient(base_url=target.traffic_url, timeout=timeout, limits=limits) as client:
        began = time.perf_counter()

        async def one(i: int) -> Stream:
            delay = began + when[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tokens = max_tokens or datasets.output_tokens(chosen[i], settings.max_tokens)
            body = request_body(settings, chosen[i], tokens, model)
            arrival = began + when[i] if settings.request_rate is not None else None
            async with gate:
                stream = await _stream(client, target, settings, body, arrival)
            progress(1)
            return stream

        return list(await asyncio.gather(*(one(i) for i in range(len(chosen))))), began


def run(
    target: Target,
    settings: Settings = Settings(),
    on_progress: Callable[[str, int, int], None] | None = None,
    log_messages: Callable[[float], list[str]] | None = None,
    *,
    log_later: bool = False,
) -> BenchResult:
    """Warm up, then measure one level; `on_progress(phase, done, total)` after each request.

    `log_messages(since_epoch)` gives the server's log lines since the measurement began,
    for the accept-length cross-check (None: no log to read, e.g. a server outside any inventory).
    `log_later`: the caller reads the log once for several runs and gives each its lines
    (`logged`); the run's notes come then.
    """
    info = server_info(target)
    model = str(info.get("served_model_name") or info.get("model_path") or "default")
    report = on_progress or (lambda phase, done, total: None)
    counts = {"warm-up": 0, "measure": 0}

    def tick(phase: str, total: int) -> Callable[[int], None]:
        def step(n: int) -> None:
            counts[phase] += n
            report(phase, counts[phase], total)

        return step

    chosen = settings.chosen()
    warm = dataclasses.replace(settings, request_rate=None)
    warm_requests = [chosen[i % len(chosen)] for i in range(settings.warmup)]
    asyncio.run(_streams(target, warm, warm_requests, settings.warmup_tokens, tick("warm-up", 0), model))
    flushed = flush_cache(target)  # every run starts cold: no level prefills its prompts from the last
    began_epoch = time.time()
    streams, began = asyncio.run(
        _streams(target, settings, chosen, None, tick("measure", settings.requests), model)
    )
    duration = max(s.done for s in streams) - began  # the first send to the last answer
    after = server_info(target)
    result = BenchResult(target, settings, streams, duration, sglang_version=str(info.get("version", "")))
    result.speculative = bool(after.get("speculative_algorithm"))
    result.accept_len = accept_from_server_info(after) or (None if result.speculative else 1.0)
    result.began_epoch, result.ended_epoch = began_epoch, time.time()
    if log_messages is not None and result.speculative and not log_later:
        result.accept_len_log = accept_from_log(log_messages(began_epoch))
    if flushed:
        result.notes.append(
            f"prefix cache not flushed before the run ({flushed}): prompts seen before prefill faster"
        )
    if not log_later:
        result.notes += _notes(result)
    if not result.ok_streams:
        raise BenchError(f"{target.host}: every request failed: {'; '.join(sorted(set(result.errors)))}")
    return result


def flush_cache(target: Target) -> str:
    """SGLang's /flush_cache, as bench_serving's --flush-cache: the radix cache emptied, so a
    run does not prefill the warm-up's or the previous level's prompts from it. '' when done,
    else why not (the server refuses while requests run; an old server has no such path).
    Through a gateway it is the gateway's /flush_cache: smg flushes every worker, prefill included."""
    url = f"{target.traffic_url}/flush_cache"
    try:
        resp = httpx.post(url, headers=_headers(target), timeout=30.0)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:120]
    return "" if resp.status_code == 200 else f"HTTP {resp.status_code}"


def curve(
    target: Target,
    traffic: Traffic,
    on_progress: Callable[[str, int, int], None] | None = None,
    log_messages: Callable[[float], list[str]] | None = None,
    on_level: Callable[[Settings, int], None] | None = None,
    on_result: Callable[[BenchResult], None] | None = None,
    on_failure: Callable[[Settings, int, str, str], None] | None = None,
) -> list[BenchResult]:
    """Every level of `traffic` in turn, `repeat` times each (repeats of a level back to back),
    all under one curve_id. `on_result(result)` as each run ends (so a later failure or Ctrl-C
    keeps what was measured); a run where every request failed is `on_failure(settings, repeat,
    why, curve_id)` and the curve goes on. None measured at all: BenchError."""
    curve_id = uuid.uuid4().hex[:12]
    results, failures = [], []
    for settings in traffic.levels():
        for k in range(traffic.repeat):
            if on_level:
                on_level(settings, k)
            try:
                result = run(target, settings, on_progress, log_messages)
            except BenchError as exc:
                failures.append(f"{settings.level}: {exc}")
                if on_failure:
                    on_failure(settings, k, str(exc), curve_id)
                continue
            result.curve_id, result.repeat = curve_id, k
            results.append(result)
            if on_result:
                on_result(result)
    if not results:
        raise BenchError("; ".join(dict.fromkeys(failures)))
    return results


def failure_row(
    target: Target, settings: Settings, why: str, curve_id: str = "", repeat: int = 0, sweep_id: str = ""
) -> dict[str, Any]:
    """The ledger row of a run that measured nothing: which traffic, at which level, and why."""
    row = BenchResult(target, settings, [], 0.0, curve_id=curve_id, repeat=repeat).row(sweep_id)
    keep: tuple[str, ...] = ("run_id", "sweep_id", "host", "address", "port", "profile", "digest")
    keep += ("plan_digest", "requests", "concurrency", "max_tokens", "git_commit", "curve_id", "repeat")
    return {k: row[k] for k in keep} | row_traffic(row) | {"result": "failed", "diagnosis": why[:500]}


def row_traffic(row: dict[str, Any]) -> dict[str, Any]:
    names = ("endpoint", "dataset", "dataset_digest", "request_rate", "temperature", "seed")
    return {k: row[k] for k in names}


#: A speculative profile accepting no more than this many tokens per round gains nothing
#: from its drafter: the round costs more than a plain decode step and yields one token.
DRAFTER_FLOOR = 1.05
DRAFTER_WARNING = "drafter not helping: check algorithm and drafter"


def _notes(result: BenchResult, log_read: bool = True) -> list[str]:
    """What a reader of the numbers should know: a useless drafter, disagreeing sources, a
    different deployment. `log_read` False: the log was not read (its own note says why), so a
    missing line in it says nothing."""
    notes = []
    t, server, logged = result.target, result.accept_len, result.accept_len_log
    # The run's own figure; the server's, cumulative since it started, only where there is none.
    own = result.accept_len_level
    accept = own if own is not None else server
    since = "" if own is not None else " (the server's since it started)"
    if result.speculative and accept is not None and accept <= DRAFTER_FLOOR:
        notes.append(
            f"{DRAFTER_WARNING}: accept length {accept:.2f}{since} with speculative decoding on, so every "
            "round yields one token at extra cost (an EAGLE-3 drafter under --speculative-algorithm "
            "EAGLE runs exactly like this)"
        )
    if t.plan_digest and t.digest and t.plan_digest != t.digest:
        notes.append(
            f"deployed digest {t.digest} ({t.profile or 'unknown profile'}) differs from the given "
            f"profile's plan digest {t.plan_digest}: bench measured what runs"
        )
    if log_read and result.speculative and result.accept_len_log is None and server is not None:
        notes.append("no `accept len` line in the server log to cross-check the accept length")
    # The cross-check is between this run's own figures (server_info's is cumulative since start).
    client = result.accept_len_client
    if client is not None and logged is not None and abs(client - logged) > ACCEPT_TOLERANCE * client:
        notes.append(
            f"accept length: the requests' spec_verify_ct gives {client:.2f}, the log says {logged:.2f}"
        )
    s = result.settings
    if s.request_rate is None and s.requests < s.concurrency:
        notes.append(
            f"{s.requests} requests at concurrency {s.concurrency}: at most {s.requests} ran at once "
            f"(give --requests {s.concurrency} or more)"
        )
    if any(st.no_usage for st in result.ok_streams):
        notes.append("the server sent no `usage`: tokens counted one per chunk (too low with speculation)")
    elif not all(st.counted for st in result.ok_streams):
        notes.append(
            "no per-chunk usage: each chunk's tokens are the final usage spread by its share of the text"
        )
    if result.errors:
        notes.append(f"{len(result.errors)} of {len(result.streams)} requests failed")
    return notes


# --- finding the server -------------------------------------------------------------------


def find_target(
    inventory: Path,
    limit: str | None = None,
    prof: profile_mod.Profile | None = None,
    unit_name: str = "sglang.service",
) -> Target:
    """The node serving HTTP (the first host selected), what runs there, and its port (from the
    facts stored with the unit, else --profile's plan)."""
    from orchestrator.hosts.inventory import selected
    from orchestrator.hosts.status_play import status

    first = selected(inventory, limit)[0]
    host = first.name
    plan = launch.build(prof) if prof else None
    row = next(iter(status(inventory, unit_name=unit_name, limit=host)), None)
    if row is None or not row.reachable:
        raise BenchError(f"{host}: unreachable, cannot read what it runs")
    if row.message:  # the play failed there (sudo refused, ...): say why, not "deploy first"
        raise BenchError(f"{host}: {row.message}")
    if row.active_state != "active":
        raise BenchError(f"{host}: {unit_name} is {row.active_state}; deploy a profile first")
    port = row.port or (plan.port if plan else None)
    if port is None:
        raise BenchError(
            f"{host}: its unit has no recorded port (deployed by an older orchestrator); give --profile"
        )
    return Target(
        host=host,
        address=first.address,
        port=port,
        profile=row.profile,
        digest=row.digest,
        plan_digest=plan.digest if plan else "",
        api_key=api_key(prof) if prof else "",
    )


def gateway_target(
    inventory: Path,
    limit: str | None = None,
    prof: profile_mod.Profile | None = None,
    unit_name: str = "sglang.service",
) -> Target:
    """Traffic through the selected hosts' gateway (orchestrator_gateway_url, one for all): the fleet
    behind it as its hosts say they run it (a PD fleet: the hosts of the groups prefill and decode),
    and the server whose logs give the accept length (its first decode server, else the first host)."""
    from orchestrator.hosts.inventory import selected
    from orchestrator.hosts.status_play import status

    hosts = selected(inventory, limit)
    hosts = [h for h in hosts if h.pd_role] or hosts  # a PD fleet: the hosts of its two groups
    urls = {h.gateway_url.rstrip("/") for h in hosts if h.gateway_url}
    if len(urls) != 1 or any(not h.gateway_url for h in hosts):
        raise BenchError(
            "--gateway benches through the hosts' gateway: give every selected host one "
            f"orchestrator_gateway_url (found: {', '.join(sorted(urls)) or 'none'})"
        )
    gateway = urls.pop()
    rows = {r.host: r for r in status(inventory, unit_name=unit_name, limit=limit) if r.unit}
    down = [h.name for h in hosts if h.name not in rows or rows[h.name].active_state != "active"]
    if down:
        raise BenchError(f"{', '.join(down)}: {unit_name} is not active; deploy the fleet first")
    servers = [
        {
            "host": h.name,
            "role": h.pd_role or "",
            "profile": rows[h.name].profile,
            "digest": rows[h.name].digest,
        }
        for h in hosts
    ]
    first = next((h for h in hosts if h.pd_role == "decode"), hosts[0])
    row = rows[first.name]
    profiles = list(
        dict.fromkeys(s["profile"] for s in sorted(servers, key=lambda s: s["role"] != "prefill"))
    )
    return Target(
        host=first.name,
        address=first.address,
        port=row.port or 30000,
        profile="+".join(profiles),
        digest=row.digest if len(profiles) == 1 else "",
        api_key=api_key(prof) if prof else "",
        gateway=gateway,
        fleet=json.dumps({"gateway": gateway, "servers": servers}, sort_keys=True),
    )


def deployed_target(inventory: Path, limit: str | None, prof: profile_mod.Profile) -> Target:
    """The server right after a healthy deploy of `prof`: what runs is its plan, so no
    probe is needed (sweep saves a play per bench)."""
    from orchestrator.hosts.inventory import selected

    first = selected(inventory, limit)[0]
    plan = launch.build(prof)
    return Target(first.name, first.address, plan.port, prof.name, plan.digest, plan.digest, api_key(prof))


def journal_messages(
    inventory: Path, host: str, unit_name: str = "sglang.service"
) -> Callable[[float], list[str]]:
    """A reader of the host's unit journal since a time, with the logs engine."""

    def read(since_epoch: float) -> list[str]:
        from orchestrator.hosts import logs_play

        since = datetime.fromtimestamp(since_epoch, UTC)
        batch = logs_play.read(inventory, unit_name=unit_name, lines=LOG_LINES, limit=host)
        return [line.message for line in batch.lines if line.time >= since]

    return read


def journal_lines(
    inventory: Path, host: str, unit_name: str = "sglang.service"
) -> Callable[[float], list[tuple[float, str]]]:
    """A reader of the host's unit journal since a time: (epoch seconds, message) of each entry.
    One read covers several runs (a tune trial's), so it asks journalctl for the window itself."""

    def read(since_epoch: float) -> list[tuple[float, str]]:
        from orchestrator.hosts import logs_play

        since = datetime.fromtimestamp(since_epoch, UTC)
        window = f"@{int(since_epoch)}"  # systemd.time's epoch form; the filter below is exact
        batch = logs_play.read(
            inventory, unit_name=unit_name, lines=LOG_WINDOW_LINES, since=window, limit=host, grep=ACCEPT_GREP
        )
        if batch.failures:  # the runs stand; their notes say the log was not read, and why
            raise BenchError(f"{host}: the server log was not read: {batch.failures[0].message}")
        return [(line.time.timestamp(), line.message) for line in batch.lines if line.time >= since]

    return read


def logged(result: BenchResult, lines: Sequence[tuple[float, str]], unread: str = "") -> None:
    """A `log_later` run's accept length from the log lines of its own window, and its notes.
    `unread`: why the log could not be read (the run stands without the cross-check)."""
    if unread:
        result.notes.append(f"server log not read: {unread}")
    elif result.speculative:
        began, ended = result.began_epoch - CLOCK_SLACK_S, result.ended_epoch + CLOCK_SLACK_S
        mine = [m for t, m in lines if began <= t <= ended]
        result.accept_len_log = accept_from_log(mine)
    result.notes += _notes(result, log_read=not unread)

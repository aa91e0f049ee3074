"""HTTP API of the stand-in: the endpoints a deployment tool and a benchmark touch.

Shapes follow SGLang: /generate streams Server-Sent Events of the cumulative text and ends
with `data: [DONE]`; /v1/chat/completions and /v1/completions are OpenAI-shaped, the chat one
rendering the model folder's chat template; health and /metrics need no key.

Each request's acceptance comes from its prompt text and temperature (`_speed.request_accept`).
An unset temperature is 1.0, SGLang's SamplingParams default.

On a PD server (sglang._pd) a request's chunks come from its role: a prefill's one token, or a
decode's rounds once the KV came. A request the role fails ends as SGLang's aborted ones: 500
`{"object": "error", "message", "type": "500", "param": null, "code": 500}` (400 without a
bootstrap room: /generate's `{"error": {"message"}}`, OpenAI's BadRequestError body); a stream
ends with an `abort` finish reason and `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sglang import _pd, _speed, _template
from sglang._args import version_tuple
from sglang._common import log
from sglang._engine import Chunk, Engine, count_prompt_tokens, request_id
from sglang.version import __version__

OPEN_PATHS = ("/health", "/health_generate", "/metrics")
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_TEMPERATURE = 1.0  # SGLang's SamplingParams default


def bad_request(message: str) -> dict:
    """SGLang's OpenAI error body (create_error_response), sent with status 400."""
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def temperature_of(value: object) -> float:
    try:
        return DEFAULT_TEMPERATURE if value is None else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_TEMPERATURE


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 2048  # uvicorn's backlog; socketserver's 5 resets a burst of 16 clients

    def __init__(self, address: tuple[str, int], engine: Engine, pd: _pd.Role | None = None) -> None:
        super().__init__(address, Handler)
        self.engine = engine
        self.pd = pd


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: Server

    # --- plumbing -------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        return self.server.engine

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        phrase = self.responses.get(int(code), ("",))[0] if str(code).isdigit() else ""
        log(
            f"INFO:     {self.client_address[0]}:{self.client_address[1]} - "
            f'"{self.requestline}" {code} {phrase}'
        )

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, code: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_event(self, payload: object | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = f"data: {text}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_events(self) -> None:
        self.send_event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def read_json(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {}

    def authorized(self) -> bool:
        key = self.engine.rt.args.api_key
        if not key or self.path.split("?")[0].startswith(OPEN_PATHS):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    # --- dispatch -------------------------------------------------------------------

    def do_GET(self) -> None:
        self.dispatch(GET_ROUTES)

    def do_POST(self) -> None:
        self.dispatch(POST_ROUTES)

    def dispatch(self, routes: dict[str, str]) -> None:
        path = self.path.split("?")[0]
        if path == "/server_info" and version_tuple() <= (0, 5, 9):
            path = "/not-in-this-version"
        name = routes.get(path)
        if name is None:
            known = path in GET_ROUTES or path in POST_ROUTES
            self.send_json(405 if known else 404, {"detail": "Method Not Allowed" if known else "Not Found"})
            return
        if not self.authorized():
            return
        try:
            getattr(self, name)()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # --- endpoints ------------------------------------------------------------------

    def health(self) -> None:
        if self.engine.ready:
            self.send_text(200, "")
        else:
            self.send_text(503, "")

    def model_info(self) -> None:
        args = self.engine.rt.args
        self.send_json(
            200,
            {
                "model_path": args.model_path,
                "tokenizer_path": args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": self.engine.rt.model.config.get("model_type"),
                "architectures": self.engine.rt.model.architectures,
            },
        )

    def server_info(self) -> None:
        eng = self.engine
        state: dict[str, object] = {
            "last_gen_throughput": eng.last_throughput,
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 1000000, "graph": 0.8},
        }
        if eng.avg_spec_accept_length is not None:  # lifetime figure, folded in at each decode log
            state["avg_spec_accept_length"] = eng.avg_spec_accept_length
        spec = active_spec(eng)
        if spec is not None and version_tuple() >= (0, 5, 23):
            # 0.5.23's internal state is the server args with the runtime's overrides: the tier
            # adaptive runs now (the top level keeps the start-up values).
            state.update(speculative_num_steps=spec.steps, speculative_num_draft_tokens=spec.draft_tokens)
        info = eng.rt.args.as_dict()
        info.update(version=__version__, internal_states=[dict(state) for _ in range(eng.rt.args.dp_size)])
        self.send_json(200, info)

    def models(self) -> None:
        args = self.engine.rt.args
        self.send_json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": args.served_model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": args.model_path,
                        "max_model_len": args.context_length or 262144,
                    }
                ],
            },
        )

    def metrics(self) -> None:
        if not self.engine.rt.args.enable_metrics:
            self.send_json(404, {"detail": "Not Found"})
            return
        self.send_text(200, prometheus_text(self.engine), "text/plain; version=0.0.4; charset=utf-8")

    def flush_cache(self) -> None:
        """SGLang's /flush_cache (GET or POST): the radix cache emptied, refused (400) while
        requests run or wait. The stand-in caches no prefixes; the answer is the real one's."""
        eng = self.engine
        with eng.lock:
            idle = eng.running == 0 and eng.queued == 0
        text = (
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )
        self.send_text(200 if idle else 400, text)

    def get_load(self) -> None:
        """One entry per DP rank, as SGLang's /get_load; the stand-in's one engine counts on rank 0.
        In PD mode 0.5.9 counts the bootstrap and pre-allocation queues too (a prefill's requests
        whose KV is still being sent, its inflight queue, are not counted)."""
        eng = self.engine
        with eng.lock:
            running, waiting, tokens = eng.running, eng.queued, eng.tokens_in_use
            waiting += eng.disagg["prealloc"] + eng.disagg["transfer"]
        loads = [
            {"dp_rank": rank, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
            for rank in range(eng.rt.args.dp_size)
        ]
        loads[0].update(num_reqs=running + waiting, num_waiting_reqs=waiting, num_tokens=tokens)
        self.send_json(200, loads)

    def accept_top1(self, text: str, *, chat: bool, temperature: float) -> float | None:
        """This request's top-1 acceptance (None without speculation)."""
        rt = self.engine.rt
        if rt.spec is None:
            return None
        return _speed.request_accept(
            rt.spec.accept_top1, text, chat_template=chat, trained_on=rt.trained_on, temperature=temperature
        )

    def generate(self) -> None:
        body = self.read_json()
        if not self.engine.ready:
            self.send_json(503, {"error": {"message": "The server is not ready yet."}})
            return
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        prompt = count_prompt_tokens(body.get("input_ids") or body.get("text"))
        text_in = body.get("text") if isinstance(body.get("text"), str) else ""
        accept = self.accept_top1(text_in, chat=False, temperature=temperature_of(params.get("temperature")))
        rid, start, text = request_id(), time.monotonic(), ""
        stream = bool(body.get("stream"))
        meta = self.meta_info(rid, prompt, Chunk("", 0, 0, True), start)
        if stream:
            self.start_events()
        chunks = _pd.tokens(self.server.pd, self.engine, body, rid, prompt, max_new, accept)
        if isinstance(chunks, _pd.Failure):
            self.generate_failed(chunks, stream, rid, prompt, start)
            return
        for chunk in chunks:
            text += chunk.text
            if stream or chunk.done:
                meta = self.meta_info(rid, prompt, chunk, start)
                if stream:
                    self.send_event({"text": text, "meta_info": meta, "index": 0})
        if stream:
            self.end_events()
        else:
            self.send_json(200, {"text": text, "meta_info": meta})

    def generate_failed(
        self, failure: _pd.Failure, stream: bool, rid: str, prompt: int, start: float
    ) -> None:
        """/generate's answer to an aborted request: the abort's output in a stream, else an error."""
        if stream:
            meta = self.meta_info(rid, prompt, Chunk("", 0, 0, False), start)
            meta["finish_reason"] = {
                "type": "abort",
                "message": failure.message,
                "status_code": failure.status,
                "err_type": None,
            }
            self.send_event({"text": "", "meta_info": meta, "index": 0})
            self.end_events()
        elif failure.status == 400:
            self.send_json(400, {"error": {"message": failure.message}})
        else:
            self.send_json(failure.status, server_error(failure))

    def meta_info(self, rid: str, prompt: int, chunk: Chunk, start: float) -> dict:
        # a PD prefill finishes with length 0 (FINISH_LENGTH(length=0) once its KV is sent)
        length = (
            0 if self.server.pd is not None and self.server.pd.mode == "prefill" else chunk.completion_tokens
        )
        meta: dict[str, object] = {
            "id": rid,
            "finish_reason": {"type": "length", "length": length} if chunk.done else None,
            "prompt_tokens": prompt,
            "completion_tokens": chunk.completion_tokens,
            "cached_tokens": 0,
            "e2e_latency": round(time.monotonic() - start, 4),
        }
        spec = self.engine.rt.spec
        if spec is not None:
            meta.update(spec_meta(spec.draft_tokens, chunk))
        return meta

    def chat_completions(self) -> None:
        self.openai(chat=True)

    def completions(self) -> None:
        self.openai(chat=False)

    def openai(self, chat: bool) -> None:
        body = self.read_json()
        if not self.engine.ready:
            self.send_json(503, {"error": {"message": "The server is not ready yet."}})
            return
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_NEW_TOKENS)
        if chat:
            text = self.chat_prompt(body.get("messages"))
            if text is None:
                return
            prompt = count_prompt_tokens(text)
        else:
            source = body.get("prompt")
            if isinstance(source, list) and source and isinstance(source[0], str):
                source = source[0]  # a batch of prompts: the stand-in answers the first
            text = source if isinstance(source, str) else ""
            prompt = count_prompt_tokens(source)
        accept = self.accept_top1(text, chat=chat, temperature=temperature_of(body.get("temperature")))
        reply = OpenAIReply(self, chat, body, prompt)
        chunks = _pd.tokens(self.server.pd, self.engine, body, reply.id, prompt, max_new, accept)
        if isinstance(chunks, _pd.Failure):
            reply.fail(chunks)
            return
        for chunk in chunks:
            reply.add(chunk)
        reply.finish()

    def chat_prompt(self, messages: object) -> str | None:
        """The messages through the model folder's chat template; None when a 400 went out."""
        if not isinstance(messages, list) or not messages:
            self.send_json(400, bad_request("messages: a non-empty list is required"))
            return None
        template, bos = _template.load(Path(self.engine.rt.args.model_path))
        if template is None:
            self.send_json(400, bad_request(_template.NO_TEMPLATE))
            return None
        turns = [m if isinstance(m, dict) else {"role": "user", "content": str(m)} for m in messages]
        turns = [{**m, "content": content_text(m.get("content"))} for m in turns]
        try:
            return _template.render(template, turns, bos_token=bos, add_generation_prompt=True)
        except Exception as exc:  # TemplateError, or any of the kinds jinja2 raises
            self.send_json(400, bad_request(f"chat template: {exc}"))
            return None


def server_error(failure: _pd.Failure) -> dict:
    """SGLang's answer to an HTTPException (a scheduler abort with status 500 or 503)."""
    return {
        "object": "error",
        "message": failure.message,
        "type": str(failure.status),
        "param": None,
        "code": failure.status,
    }


def content_text(content: object) -> str:
    """A message's content as text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def spec_meta(draft_tokens: int, chunk: Chunk) -> dict[str, object]:
    """meta_info's speculative fields, computed as SGLang's tokenizer manager does
    (_calculate_spec_decoding_metrics): accept rate = accepted draft tokens / (rounds x
    (draft_tokens - 1)), accept length = completion tokens / rounds; the histogram of accepted
    draft tokens per round only in the newer version."""
    meta: dict[str, object] = {
        "spec_verify_ct": chunk.verify_ct,
        "spec_accept_rate": 0.0,
        "spec_accept_length": 0,
    }
    proposed = chunk.verify_ct * (draft_tokens - 1)
    if chunk.verify_ct > 0 and proposed > 0:
        accepted = sum(i * n for i, n in enumerate(chunk.histogram))
        meta.update(
            spec_accept_rate=accepted / proposed,
            spec_accept_length=chunk.completion_tokens / chunk.verify_ct,
            spec_accept_token_num=accepted,
            spec_draft_token_num=proposed,
        )
    if version_tuple() >= (0, 5, 23):
        meta["spec_accept_histogram"] = list(chunk.histogram)
    return meta


class OpenAIReply:
    """One /v1/chat/completions or /v1/completions answer, streamed or whole."""

    def __init__(self, handler: Handler, chat: bool, body: dict, prompt: int) -> None:
        self.h, self.chat, self.prompt = handler, chat, prompt
        self.stream = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.usage_wanted = bool(options.get("include_usage"))
        # SGLang's should_include_usage (openai/utils.py): usage on every chunk when asked,
        # include_usage or not
        self.continuous = bool(options.get("continuous_usage_stats"))
        self.id, self.created, self.text, self.tokens = request_id(), int(time.time()), "", 0
        self.model = handler.engine.rt.args.served_model_name
        if self.stream:
            handler.start_events()
            if chat:
                self.event({"role": "assistant", "content": ""}, None)

    def event(
        self, content: object, finish: str | None, usage: dict | None = None, final: bool = False
    ) -> None:
        """One chunk; `final` is the usage-only chunk (no choices)."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        choice: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = content
        else:
            choice["text"] = content
        self.h.send_event(
            {
                "id": self.id,
                "object": kind,
                "created": self.created,
                "model": self.model,
                "choices": [] if final else [choice],
                "usage": usage if final or self.continuous else None,
            }
        )

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt + self.tokens,
        }

    def add(self, chunk: Any) -> None:
        self.text += chunk.text
        self.tokens = chunk.completion_tokens
        if self.stream:
            self.event({"content": chunk.text} if self.chat else chunk.text, None, self.usage())

    def fail(self, failure: _pd.Failure) -> None:
        """An aborted request: a stream's last chunk says `abort`; else the error body."""
        if self.stream:
            self.event({} if self.chat else "", "abort")
            self.h.end_events()
        elif failure.status == 400:
            self.h.send_json(400, bad_request(failure.message))
        else:
            self.h.send_json(failure.status, server_error(failure))

    def finish(self) -> None:
        if self.stream:
            self.event({} if self.chat else "", "length", self.usage())
            if self.usage_wanted:
                self.event(None, None, self.usage(), final=True)
            self.h.end_events()
            return
        if self.chat:
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": self.text,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
        else:
            choice = {
                "index": 0,
                "text": self.text,
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
        kind = "chat.completion" if self.chat else "text_completion"
        self.h.send_json(
            200,
            {
                "id": self.id,
                "object": kind,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(),
            },
        )


def active_spec(engine: Engine) -> Any:
    """The engine's speculative settings now (the adaptive tier), read under its lock."""
    with engine.lock:
        return engine.active_spec


def prometheus_text(engine: Engine) -> str:
    """The gauges and counters a benchmark reads, labelled as SGLang labels them; 0.5.23's
    active speculative settings with speculation (with adaptive: the tier running now)."""
    labels = (
        f'{{model_name="{engine.rt.args.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
    )
    accept = engine.last_accept_len if engine.rt.spec is not None else 0.0  # the last decode log's
    series = [
        ("gauge", "sglang:num_running_reqs", "The number of running requests.", engine.running),
        ("gauge", "sglang:num_queue_reqs", "The number of requests in the waiting queue.", engine.queued),
        ("gauge", "sglang:token_usage", "The token usage.", engine.tokens_in_use / 1_000_000),
        ("gauge", "sglang:gen_throughput", "The generation throughput (token/s).", engine.last_throughput),
        (
            "gauge",
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            accept,
        ),
        (
            "counter",
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            engine.prompt_tokens_total,
        ),
        (
            "counter",
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            engine.generation_tokens_total,
        ),
    ]
    spec = active_spec(engine)
    if spec is not None and version_tuple() >= (0, 5, 23):
        series += [
            ("gauge", "sglang:spec_num_steps", "Currently active speculative_num_steps.", spec.steps),
            (
                "gauge",
                "sglang:spec_num_draft_tokens",
                "Currently active speculative_num_draft_tokens.",
                spec.draft_tokens,
            ),
        ]
    lines = []
    for kind, name, help_text, value in series:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


GET_ROUTES = {
    "/health": "health",
    "/health_generate": "health",
    "/get_model_info": "model_info",
    "/get_server_info": "server_info",
    "/get_load": "get_load",
    "/server_info": "server_info",
    "/v1/models": "models",
    "/metrics": "metrics",
    "/flush_cache": "flush_cache",
}
POST_ROUTES = {
    "/flush_cache": "flush_cache",
    "/health_generate": "health",
    "/generate": "generate",
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
}

"""bench's traffic: the endpoints, datasets, levels and arrivals a user asks for are what the
server receives, and tokens are the server's own counts.

Wire-level parts run against httpx.MockTransport (what the client sends, how it reads each
stream shape); the rest against the SGLang stand-in on 127.0.0.1, as test_bench_standin does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from test_bench_standin import BASE_TOK_S, LoggedLab
from test_bench_standin import lab as lab  # the fixture
from test_standin_sglang import speed_module

from orchestrator.cli.main import cli
from orchestrator.tuning import bench, datasets

AGREE = 0.03
CHAT = datasets.Request.plain("Write a haiku about GPUs.")


def sse(items: list[object]) -> bytes:
    lines = [f"data: {json.dumps(i) if not isinstance(i, str) else i}\n\n" for i in items]
    return "".join(lines).encode()


def read_with(endpoint: str, payload: bytes) -> tuple[bench.Stream, list[dict]]:
    """Run one request of `endpoint` against a transport answering `payload`; (stream, bodies sent)."""
    sent: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append({"path": request.url.path, **json.loads(request.content)})
        return httpx.Response(200, content=payload, headers={"content-type": "text/event-stream"})

    settings = bench.Settings(endpoint=endpoint, max_tokens=8, temperature=0.7)
    target = bench.Target("t", "127.0.0.1", 1)

    async def go() -> bench.Stream:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(base_url=target.url, transport=transport) as client:
            body = bench.request_body(settings, CHAT, 8, "kimi")
            return await bench._stream(client, target, settings, body)

    return asyncio.run(go()), sent


def chat_chunk(text: str, tokens: int | None = None, usage_only: bool = False) -> dict:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    usage = None if tokens is None else {"prompt_tokens": 9, "completion_tokens": tokens}
    return {"object": "chat.completion.chunk", "choices": [] if usage_only else [choice], "usage": usage}


def test_chat_sends_messages_with_sampling_and_counts_per_chunk_usage() -> None:
    chunks = [chat_chunk("", 0), chat_chunk(" a b", 2), chat_chunk(" c d e", 5), chat_chunk(" f g h", 8)]
    stream, sent = read_with("chat", sse([*chunks, chat_chunk("", 8, usage_only=True), "[DONE]"]))
    body = sent[0]
    assert body["path"] == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "Write a haiku about GPUs."}]
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (
        8,
        0.7,
        True,
        True,
    )
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert [n for _, n in stream.events] == [2, 5, 8] and stream.counted and not stream.error


def test_without_per_chunk_usage_the_final_usage_is_spread_by_text_share() -> None:
    chunks = [
        chat_chunk(" aaaa"),
        chat_chunk(" bb"),
        chat_chunk(" cccccc"),
        chat_chunk("", 30, usage_only=True),
    ]
    stream, _ = read_with("chat", sse([*chunks, "[DONE]"]))
    # 5, 3 and 7 characters of 15: 10, 16 and 30 of the server's 30 tokens
    assert [n for _, n in stream.events] == [10, 16, 30] and not stream.counted and not stream.no_usage


def test_a_stream_with_no_usage_at_all_counts_chunks_and_says_so() -> None:
    stream, _ = read_with("chat", sse([chat_chunk(" a"), chat_chunk(" b c"), "[DONE]"]))
    assert [n for _, n in stream.events] == [1, 2] and stream.no_usage


def test_tokens_in_a_chunk_without_text_still_count() -> None:
    chunks = [chat_chunk(" a", 1), chat_chunk(" b", 2), chat_chunk("", 3), chat_chunk("", 3, usage_only=True)]
    stream, _ = read_with("chat", sse([*chunks, "[DONE]"]))
    assert [n for _, n in stream.events] == [1, 2, 3]


def test_spread_counts_give_the_first_chunk_a_token() -> None:
    chunks = [
        chat_chunk("x"),
        chat_chunk(" " + "y" * 199),
        chat_chunk(" " + "z" * 199),
        chat_chunk("", 40, usage_only=True),
    ]
    stream, _ = read_with("chat", sse([*chunks, "[DONE]"]))
    assert [n for _, n in stream.events] == [1, 20, 40]


@pytest.mark.parametrize(
    "bad",
    [
        {"object": "error", "message": "out of memory", "code": 500},
        {"error": {"message": "context too long"}},
        "null",
        {"choices": [None]},
        {"usage": "x", "choices": [{"delta": "a"}]},
    ],
)
def test_an_error_or_odd_chunk_fails_that_request_only(bad: object) -> None:
    stream, _ = read_with("chat", sse([chat_chunk(" a", 1), bad, chat_chunk(" b", 2), "[DONE]"]))
    if isinstance(bad, dict) and ("error" in bad or bad.get("object") == "error"):
        assert "error mid-stream" in stream.error
    elif bad == "null":
        assert "not a JSON object" in stream.error
    else:  # shapes that carry nothing are skipped, the stream goes on
        assert not stream.error and stream.tokens == 2


def test_a_failed_level_is_recorded_and_the_curve_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(target, settings, on_progress, log):
        if settings.concurrency == 8:
            raise bench.BenchError("lab: every request failed: HTTP 503")
        s = bench.Stream(0.0, [(0.1, 1), (1.1, 101)], 1.2)
        return bench.BenchResult(target, settings, [s], 1.2)

    monkeypatch.setattr(bench, "run", run)
    seen, failed = [], []
    results = bench.curve(
        bench.Target("lab", "a", 1),
        bench.Traffic(bench.Settings(requests=8), (1, 8, 32)),
        on_result=lambda r: seen.append(r.settings.level),
        on_failure=lambda s, k, why, curve: failed.append((s.level, why)),
    )
    assert seen == ["c=1", "c=32"] == [r.settings.level for r in results]
    assert failed == [("c=8", "lab: every request failed: HTTP 503")]
    row = bench.failure_row(bench.Target("lab", "a", 1), bench.Settings(concurrency=8), "HTTP 503", "cid", 1)
    assert (row["result"], row["concurrency"], row["curve_id"], row["repeat"]) == ("failed", 8, "cid", 1)


def test_completions_sends_the_prompt_as_text() -> None:
    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": " x y"}], "usage": None}
    final = {"object": "text_completion", "choices": [], "usage": {"completion_tokens": 2}}
    stream, sent = read_with("completions", sse([chunk, final, "[DONE]"]))
    assert sent[0]["path"] == "/v1/completions" and sent[0]["prompt"] == CHAT.prompt
    assert "messages" not in sent[0] and [n for _, n in stream.events] == [2]


def test_generate_sends_raw_text_and_the_temperature() -> None:
    meta = {"meta_info": {"completion_tokens": 3, "spec_verify_ct": 2}, "text": "a b c"}
    stream, sent = read_with("generate", sse([meta, "[DONE]"]))
    assert sent[0]["text"] == CHAT.prompt and sent[0]["sampling_params"]["temperature"] == 0.7
    assert stream.verify_ct == 2


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate() -> None:
    times = bench.arrivals(4000, 20.0, seed=3)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times == bench.arrivals(4000, 20.0, seed=3) != bench.arrivals(4000, 20.0, seed=4)
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.08)  # exponential: sd = mean
    assert bench.arrivals(3, None, 0) == [0.0, 0.0, 0.0]


def test_levels_of_a_traffic() -> None:
    base = bench.Settings(requests=4)
    assert [s.level for s in bench.Traffic(base, (1, 8, 32)).levels()] == ["c=1", "c=8", "c=32"]
    assert [s.level for s in bench.Traffic(base, (1,), (2.0, 0.5)).levels()] == ["2/s", "0.5/s"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "1,x"], "'x' in '1,x' is not a whole number"),
        (["--concurrency", "1,,8"], "an empty item in '1,,8' is not a whole number"),
        (["--concurrency", "0"], "0 is not in 1..1024"),
        (["--concurrency", "4,4"], "4 is given twice"),
        (["--request-rate", "nan"], "is not in"),
        (["--request-rate", "2", "--concurrency", "1,8"], "give a curve of one or the other"),
        (["--endpoint", "grpc"], "'grpc' is not one of"),
    ],
)
def test_bad_traffic_options_are_one_clear_error(args: list[str], message: str) -> None:
    done = CliRunner().invoke(cli, ["bench", *args])
    assert done.exit_code == 2 and message in done.output, done.output
    assert "Traceback" not in done.output


# --- against the stand-in -------------------------------------------------------------------


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def test_chat_counts_the_servers_tokens_and_measures_the_models_speed(lab: LoggedLab) -> None:
    server, _ = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    settings = bench.Settings(requests=3, concurrency=3, max_tokens=120, warmup=1, endpoint="chat")
    result = bench.run(target, settings)
    assert result.errors == [] and result.output_tokens == 3 * 120
    assert all(s.counted for s in result.streams)
    model = speed_module(lab).decode_model(BASE_TOK_S, None, cuda_graph=True, batch=3)
    assert result.tok_s.mean == pytest.approx(model.tok_s, rel=AGREE)
    assert result.row()["endpoint"] == "chat" and result.row()["dataset"] == ""


def test_dataset_answer_lengths_set_output_lengths_capped_by_max_tokens(
    lab: LoggedLab, tmp_path: Path
) -> None:
    items = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "w " * n}]}
        for i, n in enumerate((40, 400))
    ]
    ds = datasets.load(write_jsonl(tmp_path / "two.jsonl", items))
    server, _ = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    settings = bench.Settings(requests=2, concurrency=2, max_tokens=64, warmup=0, endpoint="chat", dataset=ds)
    result = bench.run(target, settings)
    expected = sorted(datasets.output_tokens(r, 64) for r in ds.requests)
    assert sorted(s.tokens for s in result.streams) == expected and expected[-1] == 64
    row = result.row()
    assert (row["dataset"], row["dataset_digest"], row["seed"]) == ("two.jsonl", ds.digest, 0)


def test_a_curve_runs_each_level_and_repeat_under_one_curve_id(lab: LoggedLab) -> None:
    server, _ = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    base = bench.Settings(requests=2, max_tokens=24, warmup=0, endpoint="completions")
    results = bench.curve(target, bench.Traffic(base, (1, 2), repeat=2))
    rows = [r.row() for r in results]
    assert [(r["concurrency"], r["repeat"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len({r["curve_id"] for r in rows}) == 1 and len({r["run_id"] for r in rows}) == 4


def test_each_run_starts_with_a_flushed_cache_and_a_thin_level_says_so(lab: LoggedLab) -> None:
    server, log = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    result = bench.run(target, bench.Settings(requests=2, concurrency=4, max_tokens=8, warmup=1))
    assert '"POST /flush_cache HTTP/1.1" 200' in log.read_text()
    assert result.notes == ["2 requests at concurrency 4: at most 2 ran at once (give --requests 4 or more)"]


def test_an_open_loop_times_each_request_from_its_arrival(lab: LoggedLab) -> None:
    server, _ = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    # 50/s with room for one at a time: each request waits for the one before it
    settings = bench.Settings(requests=4, concurrency=1, max_tokens=30, warmup=0, request_rate=50.0, seed=2)
    result = bench.run(target, settings)
    ttfts = [s.ttft_s for s in sorted(result.streams, key=lambda s: s.sent)]
    assert ttfts[-1] > 2 * (30 / BASE_TOK_S), ttfts  # queued behind at least two others
    assert result.row()["concurrency"] == 1


def test_a_request_rate_spreads_the_sends(lab: LoggedLab) -> None:
    server, _ = lab.start_logged()
    target = bench.Target("local", "127.0.0.1", server.port)
    settings = bench.Settings(requests=6, concurrency=0, max_tokens=8, warmup=0, request_rate=10.0, seed=5)
    result = bench.run(target, settings)
    sent = sorted(s.sent for s in result.streams)
    planned = bench.arrivals(6, 10.0, 5)
    assert [b - sent[0] for b in sent] == pytest.approx(planned, abs=0.05)
    assert result.row()["request_rate"] == 10.0 and result.settings.level == "10/s"


#: What smg 1.13 sent, captured, when the worker of a /generate stream went away mid-stream.
SMG1_CUT = {
    "error": {
        "message": "Stream error: error decoding response body: request or response body error: error "
        "reading a body from connection: unexpected EOF during chunk size line",
        "type": "stream_error",
    }
}


def test_a_generate_stream_a_gateway_ended_with_an_error_fails() -> None:
    """smg 1.x ends a stream its worker cut with an error event, then `[DONE]`: a failed request
    named so, not a KeyError on the missing meta_info."""
    meta = {"text": " a", "meta_info": {"completion_tokens": 1}}
    stream, _ = read_with("generate", sse([meta, SMG1_CUT, "[DONE]"]))
    assert stream.error.startswith("StreamError: the server reported an error mid-stream: "), stream.error
    assert "stream_error" in stream.error

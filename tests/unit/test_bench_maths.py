"""The numbers bench and sweep report, computed from hand-made timelines: no server, no lab."""

from __future__ import annotations

import pytest

from orchestrator.cli.bench_commands import parse_since
from orchestrator.errors import InputError
from orchestrator.hosts import logs_play
from orchestrator.tuning import bench
from orchestrator.tuning.bench import DRAFTER_WARNING
from orchestrator.tuning.sweep import ranking


def test_percentiles_interpolate_like_numpy() -> None:
    samples = [1.0, 2.0, 3.0, 4.0]
    assert bench.percentile(samples, 50) == 2.5
    assert bench.percentile(samples, 90) == pytest.approx(3.7)
    assert bench.percentile(samples, 99) == pytest.approx(3.97)
    assert bench.percentile([5.0], 99) == 5.0
    stats = bench.Stats.of([4.0, 1.0, 3.0, 2.0])  # unsorted input
    assert (stats.mean, stats.p50) == (2.5, 2.5)
    assert bench.Stats.of([]) == bench.Stats()


def stream(*events: tuple[float, int], sent: float = 0.0, verify: int = 0) -> bench.Stream:
    return bench.Stream(
        sent=sent, events=list(events), done=events[-1][0] if events else sent, verify_ct=verify
    )


def test_a_streams_ttft_decode_speed_and_per_token_latency() -> None:
    # Speculation: 2 tokens per 20 ms round after a 100 ms first chunk.
    s = stream((0.10, 2), (0.12, 4), (0.14, 6), (0.16, 8), sent=0.0, verify=4)
    assert s.ttft_s == pytest.approx(0.10)
    # TTFT and the first chunk left out, and the last (max_tokens may cut its round short).
    assert s.decode_tok_s == pytest.approx(4 / 0.04)
    cut = stream((0.10, 2), (0.12, 4), (0.14, 6), (0.16, 7))
    assert cut.decode_tok_s == pytest.approx(4 / 0.04)
    assert stream((0.10, 2), (0.12, 4)).decode_tok_s == pytest.approx(2 / 0.02)
    assert s.itl_s() == pytest.approx([0.01] * 6)  # each 20 ms gap shared by its 2 tokens
    assert 1 / bench.Stats.of(s.itl_s()).mean == pytest.approx(s.decode_tok_s)


def test_a_single_chunk_has_no_decode_speed() -> None:
    assert stream((0.5, 16)).decode_tok_s is None
    assert stream((0.5, 16)).itl_s() == []


def test_result_totals_errors_and_client_accept_length() -> None:
    ok1 = stream((0.1, 2), (0.2, 4), (0.3, 6), verify=3)  # decode speed up to its second-last chunk
    ok2 = stream((0.1, 3), (0.3, 6), verify=3)
    bad = bench.Stream(sent=0.0, done=0.1, error="HTTP 500: boom")
    r = bench.BenchResult(bench.Target("h", "127.0.0.1", 1), bench.Settings(), [ok1, ok2, bad], 2.0)
    assert r.output_tokens == 12
    assert r.total_tok_s == 6.0
    assert r.errors == ["HTTP 500: boom"]
    assert r.accept_len_client == 2.0
    assert sorted(r.per_request_tok_s()) == pytest.approx([15.0, 20.0])  # (4-2)/0.1 and (6-3)/0.2
    row = r.row()
    assert (row["errors"], row["result"]) == (1, "ok")
    assert (row["tok_s_min"], row["tok_s_max"]) == pytest.approx((15.0, 20.0))
    assert row["diagnosis"] == "HTTP 500: boom"


def test_accept_length_from_the_log_and_from_server_info() -> None:
    lines = [
        "[2026-11-29 13:00:00 TP0] Decode batch, #running-req: 1, #token: 1234, token usage: 0.00, "
        "accept len: 2.12, accept rate: 0.28, cuda graph: True, gen throughput (token/s): 82.30, "
        "#queue-req: 0",
        "[2026-11-29 13:00:01 TP0] Decode batch, #running-req: 1, accept len: 2.20, accept rate: 0.30",
        "[2026-11-29 13:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 12",
    ]
    assert logs_play.accept_from_log(lines) == pytest.approx(2.16)
    assert logs_play.accept_from_log(lines[2:]) is None
    info = {"internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 2.5}]}
    assert bench.accept_from_server_info(info) == 2.25
    assert bench.accept_from_server_info({"internal_states": [{"last_gen_throughput": 1.0}]}) is None


def test_a_deployed_digest_other_than_the_profiles_is_noted() -> None:
    target = bench.Target("h", "a", 1, profile="cg_5tok", digest="aaa", plan_digest="bbb")
    r = bench.BenchResult(target, bench.Settings(), [stream((0.1, 2), (0.2, 4))], 1.0)
    assert any(
        "differs from the given profile's plan digest bbb: bench measured what runs" in n
        for n in bench._notes(r)
    )


def row(profile: str, tok_s: float | None, accept: float | None, spec: bool, diagnosis: str = "") -> dict:
    result = "ok" if tok_s is not None else "failed"
    return {"profile": profile, "tok_s": tok_s, "accept_len": accept, "speculative": int(spec)} | {
        "accept_len_log": accept if spec else None,  # the run's own figure, from its log
        "result": result,
        "diagnosis": diagnosis,
    }


def test_ranking_speedups_failures_and_the_drafter_warning() -> None:
    rows = [
        row("baseline", 90.0, 1.0, False),
        row("cg_5tok", 82.0, 2.12, True),
        row("cg_5tok", 83.0, 2.12, True),
        row("broken", None, None, True, "lab2: CUDA out of memory"),
        row("eagle_wrong", 38.8, 1.0, True),
        row("weak", 60.0, 1.06, True),
    ]
    entries = ranking(rows, "baseline")
    assert [e.profile for e in entries] == ["baseline", "cg_5tok", "weak", "eagle_wrong", "broken"]
    by = {e.profile: e for e in entries}
    assert by["cg_5tok"].mean == 82.5 and by["cg_5tok"].tok_s == [82.0, 83.0]
    assert by["cg_5tok"].speedup == pytest.approx(82.5 / 90)
    assert by["baseline"].speedup == 1.0
    assert by["eagle_wrong"].warning == DRAFTER_WARNING
    assert by["weak"].warning == "" and by["baseline"].warning == ""  # not speculative: 1.0 is expected
    assert (by["broken"].ok, by["broken"].diagnosis) == (False, "lab2: CUDA out of memory")


def test_since_accepts_relative_and_absolute_times() -> None:
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("2026-11-29 14:00") > parse_since("2026-11-29")
    with pytest.raises(InputError, match="--since 'yesterday'"):
        parse_since("yesterday")

"""bench with production traffic on the lab: the chat endpoint over real dataset files, a
concurrency curve from one deploy, and noise (the lab's stand-in varies run to run and host to
host, as GPUs do) told apart from a real gap. Figures are printed; the test asserts what the
tuning decision reads: who wins at each level, and whether the tool says it can tell."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from labutil import orchestrator, write_profile
from orchestrator.paths import ROOT

pytestmark = pytest.mark.lab

HOST = "lab4"
CODE = str(ROOT / "tests/data/datasets/code.jsonl")
SHAREGPT = str(ROOT / "tests/data/datasets/chat_sharegpt.json")
#: 32 requests fill concurrency 32; 16 tokens keep a run at c=1 near 5 s at ~110 tok/s. Three
#: repeats: the least that tells a gap from the lab's run-to-run noise (docs/tuning.md, Noise).
CURVE = ["--endpoint", "chat", "--concurrency", "1,4,32", "--requests", "32", "--max-tokens", "16"]
CURVE += ["--warmup", "1", "--repeat", "3"]
TOP = 32


def run_json(*args: str, timeout: float = 400) -> dict | list:
    done = orchestrator(*args, "--json", timeout=timeout)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def levels(curve: dict) -> dict[int, dict]:
    return {level["concurrency"]: level for level in curve["levels"]}


def test_a_chat_curve_shows_where_speculation_stops_paying(lab, tmp_path) -> None:
    """One deploy per profile: a curve each for cg_5tok and baseline, a second dataset on
    cg_5tok, and a twin of cg_5tok (a setting that changes no speed) benched at c=1, which must
    come out within noise of it."""
    twin = write_profile(
        tmp_path,
        "cg_5tok_twin",
        "description: cg_5tok with NCCL's debug level set, which changes no speed\n"
        "extends: cg_5tok\nnccl:\n  NCCL_DEBUG: WARN\n",
    )
    inv = ["-i", str(lab.inventory), "--limit", HOST]
    began = datetime.now().isoformat(timespec="seconds")  # compare this test's runs only
    run_json("deploy", "--profile", "cg_5tok", *inv)
    spec = run_json("bench", "--profile", "cg_5tok", *inv, *CURVE, "--dataset", CODE)
    chat = run_json("bench", "--profile", "cg_5tok", *inv, "--endpoint", "chat", "--dataset", SHAREGPT,
                    "--requests", "4", "--max-tokens", "48", "--warmup", "1")  # fmt: skip
    run_json("deploy", "--profile", twin, *inv)
    # the same level as cg_5tok's c=1 (requests are not part of a level): 8 requests a run
    at_1 = [{"1,4,32": "1", "32": "8"}.get(arg, arg) for arg in CURVE]
    twin_runs = run_json("bench", "--profile", twin, *inv, *at_1, "--dataset", CODE)
    run_json("deploy", "--profile", "baseline", *inv)
    ends = [{"1,4,32": "1,32"}.get(arg, arg) for arg in CURVE]  # the baseline where it is compared
    base = run_json("bench", "--profile", "baseline", *inv, *ends, "--dataset", CODE)

    s, b = levels(spec), levels(base)
    print(f"\n{HOST} chat over code.jsonl, decode tok/s per request (95% interval), accept length:")
    for c in (1, 4, TOP):
        there = (
            f"; baseline {b[c]['tok_s']:.1f} ({b[c]['tok_s_low']:.1f}..{b[c]['tok_s_high']:.1f})"
            if c in b
            else ""
        )
        print(
            f"  c={c}: cg_5tok {s[c]['tok_s']:.1f} ({s[c]['tok_s_low']:.1f}..{s[c]['tok_s_high']:.1f}), "
            f"accept {s[c]['accept_len']}{there}"
        )
    t = twin_runs["levels"][0]
    print(f"  twin at c=1: {t['tok_s']:.1f} ({t['tok_s_low']:.1f}..{t['tok_s_high']:.1f})")
    print(f"  ShareGPT chat at c=1: accept {chat['accept_len_log']:.2f}, {chat['tok_s']:.1f} tok/s")
    assert [lv["runs"] for lv in spec["levels"]] == [3, 3, 3] and len(spec["runs"]) == 9
    assert len({r["curve_id"] for r in spec["runs"]}) == 1
    assert all(lv["tok_s_low"] < lv["tok_s"] < lv["tok_s_high"] for lv in spec["levels"])
    # the curve: speculation wins alone, loses once the batch is big
    assert s[1]["tok_s"] > b[1]["tok_s"] and s[TOP]["tok_s"] < b[TOP]["tok_s"]
    # per-stream speed falls with concurrency; total throughput still grows
    totals = [s[c]["total_tok_s"] for c in (1, 4, TOP)]
    assert s[1]["tok_s"] > s[4]["tok_s"] > s[TOP]["tok_s"] and totals == sorted(totals)
    # code through the chat template is accepted more often than open chat
    assert s[1]["accept_len"] > chat["accept_len_log"] + 0.2
    row = spec["runs"][0]
    assert (row["endpoint"], row["dataset"], row["temperature"]) == ("chat", "code.jsonl", 0.0)

    def verdicts(profile: str, *baseline: str) -> dict[int, str]:
        args = ("--endpoint", "chat", "--dataset", row["dataset_digest"], "--since", began, *baseline)
        args += ("--format", "json")
        done = orchestrator("results", *args)
        assert done.returncode == 0, done.stderr
        return {
            r["concurrency"]: r["comparison"]["verdict"]
            for r in json.loads(done.stdout)
            if r["profile"] == profile
            and r["comparison"]
            and r["curve_id"] in (spec["curve_id"], twin_runs["curve_id"])
        }

    found = verdicts("cg_5tok")
    assert {c: found.get(c) for c in (1, TOP)} == {1: "faster", TOP: "slower"}, found
    assert verdicts("cg_5tok_twin", "--baseline", "cg_5tok") == {1: "within noise"}
    table = orchestrator(
        "results", "--endpoint", "chat", "--dataset", row["dataset_digest"], "--since", began
    )
    assert table.returncode == 0 and "faster" in table.stdout and "slower" in table.stdout

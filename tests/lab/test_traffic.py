"""bench with production traffic on the lab: the chat endpoint over real dataset files, a
concurrency curve from one deploy, and noise (the lab's stand-in varies run to run and host to
host, as GPUs do) told apart from a real gap. Figures are printed; the test asserts what the
tuning decision reads: who wins at each level, and whether the tool says it can tell."""

from __future__ import annotations

import json

import pytest

from labutil import orchestrator, write_profile
from orchestrator.paths import ROOT

pytestmark = pytest.mark.lab

HOST = "lab4"
CODE = str(ROOT / "tests/data/datasets/code.jsonl")
SHAREGPT = str(ROOT / "tests/data/datasets/chat_sharegpt.json")
#: 32 requests fill concurrency 32; 16 tokens keep a run at c=1 near 5 s at ~110 tok/s. Three
#: repeats: the least that tells a gap from the lab's run-to-run noise (README, Noise).
CURVE = ["--endpoint", "chat", "--concurrency", "1,4,32", "--requests", "32", "--max-tokens", "16"]
CURVE += ["--warmup", "1", "--repeat", "3"]
TOP = 32


def run_json(*args: str, timeout: float = 400) -> dict | list:
    done = orchestrator(*args, "--json", timeout=timeout)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def levels(curve: dict) -> dict[int, dict]:
    return {level["concurrency"]: level for level in curve["levels"]}


def test_a_chat_curve_shows_where_speculation_stops_paying(lab) -> None:
    inv = ["-i", str(lab.inventory), "--limit", HOST]
    run_json("deploy", "--profile", "cg_5tok", *inv)
    spec = run_json("bench", "--profile", "cg_5tok", *inv, *CURVE, "--dataset", CODE)
    chat = run_json("bench", "--profile", "cg_5tok", *inv, "--endpoint", "chat", "--dataset", SHAREGPT,
                    "--requests", "8", "--max-tokens", "48", "--warmup", "1")  # fmt: skip
    run_json("deploy", "--profile", "baseline", *inv)
    base = run_json("bench", "--profile", "baseline", *inv, *CURVE, "--dataset", CODE)

    s, b = levels(spec), levels(base)
    print(f"\n{HOST} chat over code.jsonl, decode tok/s per request (95% interval), accept length:")
    for c in (1, 4, TOP):
        print(
            f"  c={c}: cg_5tok {s[c]['tok_s']:.1f} ({s[c]['tok_s_low']:.1f}..{s[c]['tok_s_high']:.1f}), "
            f"accept {s[c]['accept_len']}; baseline {b[c]['tok_s']:.1f} "
            f"({b[c]['tok_s_low']:.1f}..{b[c]['tok_s_high']:.1f})"
        )
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

    done = orchestrator(
        "results", "--endpoint", "chat", "--dataset", row["dataset_digest"], "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    compared = json.loads(done.stdout)
    verdicts = {
        r["concurrency"]: r["comparison"]["verdict"]
        for r in compared
        if r["profile"] == "cg_5tok" and r["comparison"] and r["curve_id"] == spec["curve_id"]
    }
    assert verdicts == {1: "faster", 4: verdicts[4], TOP: "slower"}, verdicts
    table = orchestrator("results", "--endpoint", "chat", "--dataset", row["dataset_digest"])
    assert table.returncode == 0 and "faster" in table.stdout and "slower" in table.stdout


def test_a_pair_that_differs_only_by_noise_is_reported_within_noise(lab, tmp_path) -> None:
    twin = write_profile(
        tmp_path,
        "cg_5tok_twin",
        "description: cg_5tok with NCCL's debug level set, which changes no speed\n"
        "extends: cg_5tok\nnccl:\n  NCCL_DEBUG: WARN\n",
    )
    inv = ["-i", str(lab.inventory), "--limit", HOST]
    load = ["--requests", "4", "--concurrency", "2", "--max-tokens", "32", "--warmup", "1", "--repeat", "3"]
    report = run_json("sweep", "cg_5tok", twin, "--baseline", "cg_5tok", *inv, *load)
    entries = {e["profile"]: e for e in report["ranking"]}
    print(
        "\nsweep of a twin pair:",
        {p: (e["mean_tok_s"], e["ci95_low"], e["ci95_high"]) for p, e in entries.items()},
    )
    assert entries["cg_5tok_twin"]["verdict"] == "within noise", entries
    assert entries["cg_5tok_twin"]["runs"] == entries["cg_5tok"]["runs"] == 3
    assert entries["cg_5tok"]["ci95_low"] < entries["cg_5tok"]["mean_tok_s"] < entries["cg_5tok"]["ci95_high"]

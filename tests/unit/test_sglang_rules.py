"""Rules SGLang enforces only after start, checked before it (issue 13).

Each case follows a check of SGLang's own server_args (0.5.9: python/sglang/srt/server_args.py;
0.5.23: the arg_groups/ modules it was split into), cited in orchestrator/profile/sglang_rules.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.profile import model as profile_mod
from orchestrator.profile import sglang_rules

# --- GPUs needed: tp x pp per replica; DP attention shares the TP group ----------------


@pytest.mark.parametrize(
    ("version", "tp", "dp", "extra", "gpus"),
    [
        ("0.5.9", 8, 1, [], 8),
        ("0.5.9", 8, 2, [], 16),  # plain DP: dp_size replicas of tp_size GPUs
        ("0.5.9", 8, 2, ["--enable-dp-attention"], 8),  # was 16: tp x dp
        ("0.5.9", 8, 4, ["--enable-dp-attention"], 8),
        ("0.5.9", 8, 1, ["--enable-dp-attention"], 8),  # dp_size 1 switches it off
        ("0.5.9", 8, 2, ["--enable-dp-att", "--pp-size", "2"], 16),  # a prefix, and PP
        ("0.5.23", 8, 3, [], 24),
        ("0.5.23", 8, 2, ["--enable-dp-attention"], 8),  # deprecated spelling of --attn-dp-size 2
        ("0.5.23", 8, 1, ["--attn-dp-size", "4"], 8),
        ("0.5.23", 4, 1, ["--pipeline-parallel-size=2"], 8),
    ],
)
def test_gpus_needed(version: str, tp: int, dp: int, extra: list[str], gpus: int) -> None:
    assert sglang_rules.gpus_needed(sglang_version=version, tp_size=tp, dp_size=dp, extra_args=extra) == gpus


def test_server_gpus_needed_is_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("extends: base\nserver: {dp_size: 2, extra_args: [--enable-dp-attention]}\n")
    assert profile_mod.load(str(path)).server.gpus_needed == 8
    path.write_text("extends: base\nserver: {dp_size: 2}\n")
    assert profile_mod.load(str(path)).server.gpus_needed == 16


def _parallel(version: str, tp: int, dp: int, extra: list[str]) -> list[str]:
    return [
        f"{loc}: {m}"
        for loc, m in sglang_rules.check_parallel(
            sglang_version=version, tp_size=tp, dp_size=dp, extra_args=extra
        )
    ]


@pytest.mark.parametrize(
    ("version", "tp", "dp", "extra", "expected"),
    [
        ("0.5.9", 8, 3, ["--enable-dp-attention"], "asserts tp_size % 3 == 0"),
        ("0.5.9", 8, 3, [], None),  # three replicas of 8 GPUs: no split
        ("0.5.9", 8, 4, ["--enable-dp-attention"], None),
        ("0.5.23", 8, 3, ["--enable-dp-attention"], "asserts tp_size % 3 == 0"),
        ("0.5.23", 8, 1, ["--attn-dp-size", "3"], "asserts tp_size % 3 == 0"),
        ("0.5.23", 8, 2, ["--attn-dp-size", "2"], "refuses --dp-size 2 with --attn-dp-size 2"),
    ],
)
def test_dp_attention_divides_tp(
    version: str, tp: int, dp: int, extra: list[str], expected: str | None
) -> None:
    messages = _parallel(version, tp, dp, extra)
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages


# --- speculative settings against the server's -------------------------------------------


def _spec(version: str, algorithm: str, topk: int | None, extra: list[str], dp: int = 1) -> list[str]:
    return [
        f"{loc}: {m}"
        for loc, m in sglang_rules.check_speculative_server(
            sglang_version=version, algorithm=algorithm, eagle_topk=topk, dp_size=dp, extra_args=extra
        )
    ]


@pytest.mark.parametrize(
    ("version", "algorithm", "topk", "extra", "expected"),
    [
        # 0.5.9 ServerArgs._handle_speculative_decoding: topk > 1, page > 1, not flashinfer/fa3.
        ("0.5.9", "EAGLE3", 4, ["--page-size", "16"], "needs attention backend flashinfer or fa3"),
        ("0.5.9", "EAGLE3", 4, ["--page-size", "16", "--attention-backend", "flashinfer"], None),
        ("0.5.9", "EAGLE3", 4, ["--page-size", "16", "--attention-backend", "fa3"], None),
        (
            "0.5.9",
            "EAGLE3",
            4,
            ["--page-size", "16", "--attention-backend", "triton"],
            "it refuses triton at start",
        ),
        ("0.5.9", "EAGLE3", 1, ["--page-size", "16"], None),
        ("0.5.9", "EAGLE", 4, ["--page-size", "1"], None),
        # flashmla forces page 64 (_handle_attention_backend_compatibility), so topk > 1 fails.
        (
            "0.5.9",
            "EAGLE3",
            4,
            ["--attention-backend", "flashmla"],
            "page size 64 (forced by the flashmla backend)",
        ),
        ("0.5.9", "EAGLE3", 4, ["--decode-attention-backend", "flashmla"], "forced by the flashmla backend"),
        ("0.5.9", "EAGLE3", 1, ["--attention-backend", "flashmla"], None),
        (
            "0.5.9",
            "STANDALONE",
            2,
            ["--attention-backend", "trtllm_mha"],
            "refuses top-k 2 with the trtllm_mha",
        ),
        ("0.5.9", "EAGLE3", 1, ["--attention-backend", "trtllm_mha"], None),
        # 0.5.23 speculative_hook._handle_eagle_family: _PAGE_TREE_SPEC_BACKENDS adds triton.
        ("0.5.23", "EAGLE3", 4, ["--page-size", "16", "--attention-backend", "triton"], None),
        (
            "0.5.23",
            "EAGLE3",
            4,
            ["--attention-backend", "flashmla"],
            "flashinfer or fa3 or triton in SGLang 0.5.23",
        ),
        ("0.5.23", "EAGLE3", 4, ["--attention-backend", "trtllm_mha"], "refuses top-k 4 with the trtllm_mha"),
        # NGRAM: top-k is --speculative-ngram-max-bfs-breadth (10), flashinfer only.
        ("0.5.9", "NGRAM", None, ["--page-size", "16"], "NGRAM with top-k 10 and page size 16"),
        (
            "0.5.23",
            "NGRAM",
            None,
            ["--page-size", "16", "--attention-backend", "fa3"],
            "needs attention backend flashinfer",
        ),
        ("0.5.23", "NGRAM", None, ["--page-size", "16", "--attention-backend", "flashinfer"], None),
        ("0.5.9", "NGRAM", None, ["--page-size", "16", "--speculative-ngram-max-bfs-breadth", "1"], None),
        ("0.5.9", "NGRAM", None, [], None),
    ],
)
def test_top_k_over_pages(
    version: str, algorithm: str, topk: int | None, extra: list[str], expected: str | None
) -> None:
    messages = _spec(version, algorithm, topk, extra)
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
@pytest.mark.parametrize("algorithm", ["STANDALONE", "NGRAM"])
def test_standalone_and_ngram_refuse_dp_attention(version: str, algorithm: str) -> None:
    (message,) = _spec(version, algorithm, None, ["--enable-dp-attention"], dp=2)
    assert message.startswith(
        f"speculative.algorithm: SGLang {version} refuses {algorithm} with DP attention"
    )
    assert _spec(version, algorithm, None, ["--enable-dp-attention"], dp=1) == []  # dp 1: no DP attention
    assert _spec(version, "EAGLE3", None, ["--enable-dp-attention"], dp=2) == []


def test_standalone_refuses_attn_dp_size_in_0523() -> None:
    (message,) = _spec("0.5.23", "STANDALONE", None, ["--attn-dp-size", "2"])
    assert "speculative_hook._handle_eagle_family" in message


def test_ngram_overwrites_top_k_and_ignores_the_drafter() -> None:
    findings = dict(
        sglang_rules.check_speculative(
            algorithm="NGRAM", draft_model_path="/d", num_steps=3, eagle_topk=4, num_draft_tokens=8
        )
    )
    assert "--speculative-ngram-max-bfs-breadth (default 10)" in findings["speculative.eagle_topk"]
    assert "NGRAM loads no draft model" in findings["speculative.draft_model_path"]
    assert "speculative" not in findings  # not the trio rule: NGRAM has no draft tree of its own
    clean = sglang_rules.check_speculative(
        algorithm="NGRAM", draft_model_path=None, num_steps=None, eagle_topk=None, num_draft_tokens=None
    )
    assert list(clean) == []

"""The stand-in's speed model as a tuning decision sees it: batching, acceptance per request, run
noise and the host factor; and the chat-template renderer a lab host uses without jinja2.

Pure functions of the installed host code, loaded by path (they must not be imported as `sglang`).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator.lab.standins import HOST_SRC, KIMI_CHAT_TEMPLATE, LLAMA3_CHAT_TEMPLATE
from orchestrator.tuning import datasets
from orchestrator.tuning.bench import DEFAULT_PROMPTS


def host_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"standin_{name}", HOST_SRC / "sglang" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


speed = host_module("_speed")
template = host_module("_template")
CG_5TOK = speed.SpecSettings(3, 4, 5)
CG_16TOK = speed.SpecSettings(5, 4, 16)
CODE = "```python\ndef add(a, b):\n    return a + b\n```\nWrite tests for this function."
MATH = "Solve the equation 3x + 5 = 20 and explain each step."
CHAT = "Write a short story about a lighthouse keeper who collects maps."
CODE_DATASET = Path(__file__).parents[1] / "data" / "datasets" / "code.jsonl"


def tok_s(spec, batch: int = 1, a: float | None = None) -> float:
    return speed.decode_model(speed.BASE_TOK_S, spec, True, accept_top1=a, batch=batch).tok_s


def crossover(spec, a: float) -> int:
    """The first concurrency at which speculation is slower than plain decode."""
    return next(b for b in range(1, 257) if tok_s(spec, b, a) < tok_s(None, b))


def test_the_reference_figures_stay_at_concurrency_1_on_raw_prompts() -> None:
    assert speed.decode_model(90.0, None, True) == speed.decode_model(90.0, None, True, batch=1)
    assert tok_s(None) == pytest.approx(90.0)
    assert tok_s(CG_5TOK) == pytest.approx(82.3, abs=0.005)
    assert speed.accept_length(CG_5TOK) == pytest.approx(2.12, abs=0.005)
    for prompt in DEFAULT_PROMPTS:  # bench's prompts: plain English, raw text, temperature 0
        assert speed.request_accept(0.44, prompt) == 0.44


def test_batching_slows_each_stream_and_grows_the_total_sublinearly() -> None:
    batches = [1, 2, 4, 8, 16, 32]
    for spec in (None, CG_5TOK):
        per_stream = [tok_s(spec, b) for b in batches]
        total = [s * b for s, b in zip(per_stream, batches, strict=True)]
        assert per_stream == sorted(per_stream, reverse=True) and per_stream[-1] < per_stream[0]
        assert total == sorted(total) and total[-1] < 32 * per_stream[0] / 1.5
        print(
            f"\n{'cg_5tok' if spec else 'plain'}: "
            + ", ".join(f"c{b} {t:.0f}" for b, t in zip(batches, total, strict=True))
        )


def test_speculation_wins_alone_and_loses_under_load_earlier_with_more_draft_tokens() -> None:
    a = speed.request_accept(0.44, CODE, chat_template=True)  # code through the chat template
    assert a == pytest.approx(0.65)
    assert tok_s(CG_5TOK, 1, a) > tok_s(None, 1)
    assert tok_s(CG_5TOK, 16, a) < tok_s(None, 16) and tok_s(CG_5TOK, 32, a) < tok_s(None, 32)
    assert crossover(CG_16TOK, a) < crossover(CG_5TOK, a)
    assert crossover(CG_5TOK, 0.70) > crossover(CG_5TOK, a)  # a better drafter holds out longer
    print(f"\ncrossover at a={a:.2f}: cg_5tok c{crossover(CG_5TOK, a)}, cg_16tok c{crossover(CG_16TOK, a)}")


def test_acceptance_follows_the_prompt_the_template_and_the_temperature() -> None:
    code, math, chat = (speed.request_accept(0.44, p) for p in (CODE, MATH, CHAT))
    assert code > math > chat == 0.44
    assert speed.request_accept(0.44, CHAT, chat_template=True) > chat
    assert speed.request_accept(0.44, CHAT, chat_template=True, trained_on="raw") == chat
    assert speed.request_accept(0.44, CODE, temperature=1.0) < code
    assert speed.accept_length(CG_5TOK, code) > speed.accept_length(CG_5TOK, chat)


def through_template(messages: list[dict[str, str]]) -> str:
    """The text /v1/chat/completions decodes from: the messages through the Llama 3 template."""
    context = {"messages": messages, "bos_token": "<|begin_of_text|>", "add_generation_prompt": True}
    return template.render_subset(LLAMA3_CHAT_TEMPLATE, context)


ASK_CODE = "Write a Python function that merges two sorted lists."
ASK_MATH = "A train leaves at 3 pm at 60 km/h. How many km has it gone by 5 pm?"
ASK_CHAT = "What should I see in Lisbon in two days?"


@pytest.mark.parametrize("chat", [False, True], ids=["raw", "chat-template"])
def test_a_request_for_code_accepts_more_than_chat_though_its_prompt_holds_no_code(chat: bool) -> None:
    # The drafter predicts the answer, and the answer to "write a function" is code.
    assert speed.prompt_domain(ASK_CODE) == speed.prompt_domain(ASK_CHAT) == (0.0, 0.0)
    asks = (ASK_CODE, ASK_MATH, ASK_CHAT)
    texts = [through_template([{"role": "user", "content": p}]) if chat else p for p in asks]
    code, math, plain = (speed.request_accept(0.44, t, chat_template=chat) for t in texts)
    assert code == pytest.approx(0.65 if chat else 0.60)  # as much as code.jsonl, code in its prompts
    assert code > math > plain == pytest.approx(0.49 if chat else 0.44)
    length = {p: speed.accept_length(CG_5TOK, a) for p, a in (("code", code), ("chat", plain))}
    assert length["code"] > 1.2 * length["chat"]
    print(
        f"\ncg_5tok accept length, {'chat template' if chat else 'raw'}: "
        + ", ".join(f"{p} {v:.2f}" for p, v in length.items())
    )


def test_only_an_ask_for_code_or_for_a_sum_counts() -> None:
    for prompt in (
        "Write a cover letter for a job in Python development.",
        "Write a speech for my class reunion.",
        "How much does a flight to Lisbon cost in 2024?",
        "Give me a recipe for pancakes.",
    ):
        assert speed.request_accept(0.44, prompt) == 0.44, prompt
    for prompt in ("Implement binary search in Rust.", "Give me a regex that matches ISO dates."):
        assert speed.request_accept(0.44, prompt) == pytest.approx(0.60), prompt
    assert speed.request_accept(0.44, "What is 17 times 23?") == pytest.approx(0.54)


def test_the_code_dataset_through_the_template_accepts_what_the_tuning_tests_assume() -> None:
    # tests/unit/test_tune.py models code.jsonl at a top-1 acceptance of 0.65.
    requests = datasets.load(CODE_DATASET).requests
    accepts = [
        speed.request_accept(0.44, through_template(list(r.messages)), chat_template=True) for r in requests
    ]
    assert accepts == pytest.approx([0.65] * len(requests))


def test_run_noise_is_seeded_about_one_and_a_half_percent_and_hosts_differ_by_name() -> None:
    draws = [speed.RunNoise(0.015, 7).draw() for _ in range(3)]
    assert len(set(draws)) == 1  # a fresh source with the same seed: the same first factor
    source = speed.RunNoise(0.015, 7)
    series = [source.draw() for _ in range(400)]
    assert series[0] == draws[0] and len(set(series)) == 400
    assert 0.01 < statistics.stdev(series) < 0.02 and abs(statistics.mean(series) - 1) < 0.005
    assert speed.RunNoise(0.0, 7).draw() == 1.0
    factors = {h: speed.host_speed(h) for h in ("lab1", "lab2", "lab3", "lab4")}
    assert factors == {h: speed.host_speed(h) for h in factors}
    assert all(0.96 <= f <= 1.0 for f in factors.values()) and len(set(factors.values())) == 4
    assert speed.noise_seed("lab1", 30000) != speed.noise_seed("lab1", 30001)


CHATS = [
    [{"role": "user", "content": " Write a function. "}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ],
]


@pytest.mark.parametrize("text", [LLAMA3_CHAT_TEMPLATE, KIMI_CHAT_TEMPLATE], ids=["llama3", "kimi"])
@pytest.mark.parametrize("messages", CHATS, ids=["user", "three-turns"])
def test_the_subset_renderer_renders_the_installed_templates_as_jinja2_does(
    text: str, messages: list
) -> None:
    context = {"messages": messages, "bos_token": "<|begin_of_text|>", "add_generation_prompt": True}
    ours = template.render_subset(text, context)
    jinja2 = pytest.importorskip("jinja2.sandbox")
    env = jinja2.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    assert ours == env.from_string(text).render(**context)


def test_the_subset_renderer_output_and_its_errors() -> None:
    context = {"messages": CHATS[0], "bos_token": "<|begin_of_text|>", "add_generation_prompt": True}
    assert template.render_subset(LLAMA3_CHAT_TEMPLATE, context) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWrite a function.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    with pytest.raises(template.TemplateError, match="unknown tag: macro"):
        template.render_subset("{% macro x() %}{% endmacro %}", context)
    with pytest.raises(template.TemplateError, match="unknown filter: tojson"):
        template.render_subset("{{ messages | tojson }}", context)

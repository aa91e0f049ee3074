"""--dataset FILE: each format loads to the requests bench sends, and a bad file is one line
naming the file, the line and the fix. Real files in a temp dir; no server."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.tuning import datasets
from orchestrator.tuning.datasets import Request

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"


def write(tmp_path: Path, name: str, body: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body, encoding="utf-8")
    return path


def jsonl(*items: object) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def turn(who: str, text: str) -> dict[str, str]:
    return {"from": who, "value": text}


# --- the formats -------------------------------------------------------------------------


def test_sharegpt_takes_the_first_two_turns_and_leaves_out_what_bench_serving_does(tmp_path: Path) -> None:
    items = [
        {"id": "a", "conversations": [turn("human", "Explain TCP slow start."), turn("gpt", "A" * 400)]},
        {"id": "b", "conversations": [turn("human", "Only a question, no answer")]},
        {"id": "c", "conversations": []},
        {
            "id": "d",
            "conversation": [turn("human", "Name three rivers."), turn("gpt", "Nile, Amazon, Rhine.")],
        },
        {"id": "e", "conversations": [turn("human", "hi"), turn("gpt", "Hello! How can I help?")]},
        {"id": "f", "conversations": [turn("gpt", "I start here."), turn("human", "Then me, and more")]},
        {
            "id": "g",
            "conversations": [
                turn("human", "Write a haiku."),
                turn("gpt", "Autumn moonlight, a worm digs"),
                turn("human", "Another one"),
                turn("gpt", "ignored: only the first two turns count"),
            ],
        },
    ]
    path = write(tmp_path, "chat.json", json.dumps(items, indent=2))
    ds = datasets.load(path)
    assert (ds.name, ds.fmt) == ("chat.json", "sharegpt")
    assert ds.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert ds.requests == (
        Request("Explain TCP slow start.", ({"role": "user", "content": "Explain TCP slow start."},), 100),
        Request.plain("Name three rivers.", 5),
        Request.plain("I start here.", 5),  # turn 0 whatever its "from" says, as bench_serving
        Request.plain("Write a haiku.", 8),
    )
    assert ds.skipped == 3
    assert ds.skipped_why == (
        "2 with fewer than 2 turns, 1 with a prompt or answer under 2 tokens (estimated); "
        "bench_serving leaves them out too"
    )


def test_openai_jsonl_a_last_assistant_message_is_the_answer_and_is_not_sent(tmp_path: Path) -> None:
    system = {"role": "system", "content": "You are a careful Python reviewer."}
    ask = {"role": "user", "content": "Write a function that reverses a list."}
    answer = {"role": "assistant", "content": "def rev(xs):\n    return xs[::-1]\n"}  # 33 bytes
    parts = {"role": "user", "content": [{"type": "text", "text": "Sum"}, {"type": "text", "text": "1..10"}]}
    path = write(
        tmp_path,
        "code.jsonl",
        jsonl(
            {"messages": [system, ask, answer]},
            {"messages": [ask]},
            {"messages": [ask, answer], "max_tokens": 64, "model": "ignored", "id": 7},
            {"messages": [parts, answer, {"role": "user", "content": "again"}]},
        ),
    )
    ds = datasets.load(path)
    assert ds.fmt == "openai"
    first, bare, capped, multi = ds.requests
    assert first.messages == (system, ask)
    assert first.prompt == "You are a careful Python reviewer.\n\nWrite a function that reverses a list."
    assert first.output_len == 9
    assert (bare.messages, bare.output_len) == ((ask,), None)
    assert capped.output_len == 64  # max_tokens, as bench_serving's sample_openai_requests reads it
    assert multi.messages[0] == {"role": "user", "content": "Sum 1..10"}  # text parts, as SGLang joins them
    assert multi.messages[-1]["content"] == "again" and multi.output_len is None


def test_bench_serving_custom_jsonl_reads_content_or_value(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "custom.jsonl",
        jsonl(
            {
                "conversations": [
                    {"role": "user", "content": "Why is the sky blue?"},
                    {"content": "Rayleigh."},
                ]
            },
            {
                "conversations": [
                    {"from": "human", "value": "Capital of France?"},
                    {"value": "Paris, a city."},
                ]
            },
            {"conversations": [{"content": "one turn only"}]},
        ),
    )
    ds = datasets.load(path)
    assert ds.fmt == "bench-custom"
    assert ds.requests == (Request.plain("Why is the sky blue?", 3), Request.plain("Capital of France?", 4))
    assert (ds.skipped, ds.skipped_why) == (1, "1 with fewer than 2 turns; bench_serving leaves them out too")


def test_todays_prompt_files_still_load(tmp_path: Path) -> None:
    text = write(tmp_path, "p.txt", "[INST] first prompt\r\n\n  second prompt \n")
    assert [r.prompt for r in datasets.load(text).requests] == ["[INST] first prompt", "  second prompt "]
    assert datasets.load(text).fmt == "lines"
    lines = write(tmp_path, "p.jsonl", jsonl({"prompt": "a"}, "b", {"text": "c", "source": "kept as before"}))
    ds = datasets.load(lines)
    assert (ds.fmt, [r.prompt for r in ds.requests]) == ("lines", ["a", "b", "c"])
    assert ds.requests[0] == Request("a", ({"role": "user", "content": "a"},), None)
    # By content, not by name: JSON lines in a .txt are JSONL, a JSON array in a .data file ShareGPT.
    assert datasets.load(write(tmp_path, "q.txt", jsonl("x", "y"))).requests[1].prompt == "y"
    convo = [{"conversations": [turn("human", "A question"), turn("gpt", "An answer")]}]
    assert datasets.load(write(tmp_path, "s.data", json.dumps(convo))).fmt == "sharegpt"
    bom = write(tmp_path, "bom.json", "\ufeff" + json.dumps(convo))  # as some Windows editors save it
    assert datasets.load(bom).requests[0].prompt == "A question"


def test_builtin_prompts() -> None:
    ds = datasets.builtin(("a", "b"))
    assert (ds.name, ds.digest, ds.fmt) == ("", "", "builtin")
    assert ds.requests == (Request.plain("a"), Request.plain("b"))


def test_the_sample_datasets_for_the_lab_load(tmp_path: Path) -> None:
    chat = datasets.load(DATA / "chat_sharegpt.json")
    code = datasets.load(DATA / "code.jsonl")
    assert (chat.fmt, len(chat.requests), chat.skipped) == ("sharegpt", 12, 0)
    assert (code.fmt, len(code.requests)) == ("openai", 12)
    assert all(r.output_len and r.output_len >= 100 for r in chat.requests + code.requests)
    assert all("```" in json.loads(line)["messages"][-1]["content"] for line in (DATA / "code.jsonl").open())
    assert all(p.stat().st_size < 40_000 for p in DATA.iterdir())


# --- lengths and sampling ----------------------------------------------------------------


def test_the_answer_length_is_capped_by_max_tokens() -> None:
    assert datasets.output_tokens(Request.plain("p", 300), 256) == 256
    assert datasets.output_tokens(Request.plain("p", 40), 256) == 40
    assert datasets.output_tokens(Request.plain("p"), 256) == 256
    assert datasets.output_tokens(Request.plain("p", 0), 256) == 1


def test_tokens_are_estimated_at_four_bytes_each() -> None:
    assert [datasets.estimate_tokens(t) for t in ("", "abc", "abcd", "abcde")] == [0, 1, 1, 2]
    assert datasets.estimate_tokens("数据库") == 3  # 9 bytes of UTF-8, not 3 characters / 4


def test_sampling_is_seeded_and_cycles_past_the_end() -> None:
    ds = datasets.builtin([f"prompt {i}" for i in range(50)])
    one = datasets.sample(ds, 10, seed=1)
    assert one == datasets.sample(ds, 10, seed=1)
    assert one != datasets.sample(ds, 10, seed=2)
    assert len({r.prompt for r in one}) == 10
    everything = datasets.sample(ds, 120, seed=3)
    assert sorted(r.prompt for r in everything[:50]) == sorted(r.prompt for r in ds.requests)
    assert everything[50:100] == everything[:50] and everything[100:] == everything[:20]
    assert datasets.sample(ds, 0, seed=1) == ()


# --- bad files ---------------------------------------------------------------------------

SHARE = '[\n  {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},\n'
MSG = {"role": "user", "content": "hello"}

#: (file name, its text, the line named, a fragment of what the message says)
BAD = [
    (
        "a.json",
        SHARE + '  {"conversations": [{"from": "human", "value": 3}, {}]}\n]',
        3,
        '"value" is a number',
    ),
    (
        "a.json",
        SHARE + '  {\n    "id": "x"\n  }\n]',
        3,
        'conversation 2: no "conversations": give {"conversations"',
    ),
    ("a.json", SHARE + '  "just a string"\n]', 3, "conversation 2: a string: give"),
    (
        "a.json",
        SHARE + '  {"conversations": "text"}\n]',
        3,
        '"conversations" is a string: give a list of turns',
    ),
    (
        "a.json",
        SHARE + '  {"conversations": [{"from": "human"}, {"value": "a"}]}\n]',
        3,
        'conversations[0] has no "value"',
    ),
    ("a.json", '[\n  {"conversations": [],}\n]', 2, "not valid JSON: Expecting property name"),
    ("a.json", '{"a": 1}', 1, 'an object with "a": give "messages", "conversations" or "prompt"'),
    ("a.json", "[INST] a prompt", 1, "not valid JSON"),
    ("a.jsonl", jsonl({"messages": [MSG]}) + "{oops\n", 2, "not JSON: Expecting property name"),
    ("a.jsonl", "\n" + jsonl({"messages": [MSG]}, {"conversations": []}), 3, 'but line 2 is {"messages"'),
    ("a.jsonl", jsonl("a prompt", {"messages": [MSG]}), 2, "one kind of line a file"),
    ("a.jsonl", jsonl({"messages": [MSG], "prompt": "x"}), 1, 'both {"messages": [...]}'),
    (
        "a.jsonl",
        jsonl({"question": "x", "answer": "y"}),
        1,
        'an object with "question", "answer": give "messages"',
    ),
    ("a.jsonl", jsonl({"messages": [MSG]}, 42), 2, 'a number: give {"messages"'),
    ("a.jsonl", "not json at all\n", 1, "each line of a JSONL dataset is a JSON object or string"),
    (
        "a.jsonl",
        '{\n  "messages": []\n}\n',
        1,
        "one JSON object over several lines: JSONL is one object a line",
    ),
    ("a.jsonl", jsonl({"messages": []}), 1, '"messages" must be a non-empty list'),
    (
        "a.jsonl",
        jsonl({"messages": [{"role": "User", "content": "x"}]}),
        1,
        'role "User": give one of system',
    ),
    (
        "a.jsonl",
        jsonl({"messages": [{"role": "user", "content": None}]}),
        1,
        "content is null: give a string",
    ),
    ("a.jsonl", jsonl({"messages": [{"role": "user"}]}), 1, 'messages[0] has no "content"'),
    ("a.jsonl", jsonl({"messages": [MSG, {"role": "assistant", "content": " "}]}), 1, "answer, is empty"),
    (
        "a.jsonl",
        jsonl({"messages": [{"role": "assistant", "content": "hi"}]}),
        1,
        "ends with nothing but the answer",
    ),
    (
        "a.jsonl",
        jsonl({"messages": [{"role": "system", "content": "s"}]}),
        1,
        "ends with system: the message before",
    ),
    ("a.jsonl", jsonl({"messages": [MSG], "temperature": 0.7}), 1, '"temperature" is a request parameter'),
    (
        "a.jsonl",
        jsonl({"messages": [MSG], "tools": []}),
        1,
        '"tools" is a request parameter bench does not send',
    ),
    ("a.jsonl", jsonl({"messages": [MSG], "max_tokens": 0}), 1, '"max_tokens" is 0: give a whole number'),
    ("a.jsonl", jsonl({"messages": [MSG], "max_tokens": 9, "max_completion_tokens": 9}), 1, "keep one"),
    ("a.jsonl", jsonl({"messages": [{**MSG, "tool_calls": []}]}), 1, '"tool_calls" is not sent by bench'),
    (
        "a.jsonl",
        jsonl({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        1,
        'content[0] is "image_url": bench sends text',
    ),
    (
        "a.jsonl",
        jsonl({"conversations": [{"content": "q", "value": "other"}, {"content": "a"}]}),
        1,
        "differ",
    ),
    ("a.jsonl", jsonl({"conversations": [{"role": "user"}, {"content": "a"}]}), 1, 'no "content" or "value"'),
    ("a.jsonl", jsonl({"prompt": 5}), 1, '"prompt" is a number: give a string'),
    ("a.jsonl", jsonl({"conversations": [], "image": "cat.png"}), 1, '"image": bench sends text only'),
    ("a.jsonl", jsonl({"prompt": "a", "text": "b"}), 1, 'both "prompt" and "text": keep one'),
    ("a.txt", jsonl("fine", "  "), 2, "an empty prompt"),
    ("p.txt", '{"prompt": "a"}\nthen plain text\n', 2, "(line 1 is JSON, so this file is JSONL)"),
    ("p.txt", '{"prompt": "a"}\r{"prompt": 5}\r', 2, '"prompt" is a number'),
    ("a.jsonl", jsonl({"prompt": "a"}) + '{"prompt": 1' + "0" * 5000 + "}\n", 2, "a number too long to read"),
]


@pytest.mark.parametrize(("name", "body", "line", "fragment"), BAD, ids=[c[3][:40] for c in BAD])
def test_a_bad_file_is_one_line_naming_the_file_the_line_and_the_fix(
    tmp_path: Path, name: str, body: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, name, body)
    with pytest.raises(InputError) as caught:
        datasets.load(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--dataset {path}:{line}: "), message
    assert fragment in message, message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("", "the file is empty: give one prompt per line, JSONL, or a ShareGPT JSON array"),
        (" \n\n\t\n", "the file is empty"),
        (
            jsonl({"conversations": [{"content": "one turn"}]}),
            "no usable prompts (1 with fewer than 2 turns)",
        ),
        ("[]", "no usable prompts"),
    ],
)
def test_a_file_with_nothing_to_send(tmp_path: Path, body: str, fragment: str) -> None:
    path = write(tmp_path, "d.jsonl", body)
    with pytest.raises(InputError, match="^" + re.escape(f"--dataset {path}: {fragment}")):
        datasets.load(path)


def test_files_that_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def error(path: Path) -> str:
        with pytest.raises(InputError) as caught:
            datasets.load(path)
        return str(caught.value)

    assert error(tmp_path) == f"--dataset {tmp_path}: is a directory: give a dataset file"
    assert error(tmp_path / "missing.json") == f"--dataset {tmp_path}/missing.json: no such file"
    latin1 = write(tmp_path, "l.txt", "first\ncaf\xe9 au lait\n".encode("latin-1"))
    assert error(latin1) == f"--dataset {latin1}:2: not UTF-8 (byte 0xe9 at column 4): save the file as UTF-8"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block until a writer came
    assert error(fifo) == f"--dataset {fifo}: is not a regular file: give a dataset file"
    monkeypatch.setattr(datasets, "MAX_BYTES", 10)
    big = write(tmp_path, "big.txt", "x" * 11)
    assert error(big) == f"--dataset {big}: larger than 10 bytes, the most a dataset may hold: sample it down"


def test_hostile_text_in_a_file_reaches_the_message_escaped(tmp_path: Path) -> None:
    hostile = "\x1b]0;pwned\x07\x1b[2J\u202eé"
    path = write(tmp_path, "bad\x1b[2J.jsonl", jsonl({"messages": [{"role": hostile, "content": "x"}]}))
    with pytest.raises(InputError) as caught:
        datasets.load(path)
    message = str(caught.value)
    assert message.isprintable()
    assert "bad\\x1b[2J.jsonl:1: " in message
    assert 'role "\\u001b]0;pwned\\u0007\\u001b[2J\\u202eé"' in message
    key = write(tmp_path, "k.jsonl", jsonl({"messages": [{**MSG, "\x1b[31mred": 1}]}))
    with pytest.raises(InputError) as caught:
        datasets.load(key)
    assert str(caught.value).isprintable()


# --- files that once crashed the loader or meant something else ---------------------------


def error(path: Path) -> str:
    """The one-line message load() gives for `path`."""
    with pytest.raises(InputError) as caught:
        datasets.load(path)
    message = str(caught.value)
    assert "\n" not in message and message.isprintable(), message
    return message


def test_deep_nesting_is_refused_with_the_file_and_line(tmp_path: Path) -> None:
    deep = write(tmp_path, "deep.json", "[" * 100_000)
    assert error(deep) == (
        f"--dataset {deep}:1: conversation 1: lists and objects nested more than 100 deep: "
        "a dataset's items nest 3 or 4 deep"
    )
    line = write(tmp_path, "deep.jsonl", jsonl({"prompt": "fine"}) + '{"prompt": ' + "[" * 100_000 + "\n")
    assert error(line).startswith(f"--dataset {line}:2: lists and objects nested more than 100 deep")
    first = write(tmp_path, "deep.txt", '{"a": ' + "[" * 100_000 + "\n")
    assert error(first).startswith(f"--dataset {first}:1: lists and objects nested more than 100 deep")


LONE = "\\ud800"  # the JSON escape, six characters, as the file holds it
SURROGATE_CASES = [
    (
        "s.json",
        SHARE + '  {"conversations": [{"value": "ab' + LONE + '"}, {"value": "an answer"}]}\n]',
        3,
        'conversation 2: conversations[0]: "value" has a lone surrogate, \\ud800, at character 3: '
        "it is half a character, not text a server can take: write the whole character, or remove it",
    ),
    (
        "s.json",
        SHARE + '  {"conversations": [{"value": "a question"}, {"value": "\\udc00 answer"}]}\n]',
        3,
        'conversation 2: conversations[1]: "value" has a lone surrogate, \\udc00, at character 1',
    ),
    ("s.txt", f'"a prompt {LONE}"\n"another"\n', 1, "the prompt has a lone surrogate, \\ud800, at character"),
    ("s.jsonl", f'{{"text": "{LONE}"}}\n', 1, '"text" has a lone surrogate'),
    (
        "s.jsonl",
        f'{{"messages": [{{"role": "user", "content": "x{LONE}"}}]}}\n',
        1,
        "messages[0]: content has a lone surrogate, \\ud800, at character 2",
    ),
    (
        "s.jsonl",
        f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "{LONE}"}}]}}]}}\n',
        1,
        "messages[0]: content[0].text has a lone surrogate",
    ),
    (
        "s.jsonl",
        f'{{"messages": [{{"role": "user", "content": "x", "name": "{LONE}"}}]}}\n',
        1,
        "messages[0]: name has a lone surrogate",
    ),
    (
        "s.jsonl",
        f'{{"conversations": [{{"content": "a question"}}, {{"content": "an answer{LONE}"}}]}}\n',
        1,
        'conversations[1]: "content" has a lone surrogate',
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "line", "fragment"), SURROGATE_CASES, ids=[c[3][:40] for c in SURROGATE_CASES]
)
def test_a_lone_surrogate_is_refused_at_load(
    tmp_path: Path, name: str, body: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, name, body)
    message = error(path)
    assert message.startswith(f"--dataset {path}:{line}: "), message
    assert fragment in message, message


def test_the_same_escape_in_plain_text_is_text(tmp_path: Path) -> None:
    # Not all of the file is JSON, so it is plain text: the prompt is the six characters as written.
    path = write(tmp_path, "p.txt", f'"a prompt {LONE}"\nthen plain text\n')
    assert [r.prompt for r in datasets.load(path).requests] == [f'"a prompt {LONE}"', "then plain text"]


DUPLICATES = [
    (
        "d.json",
        SHARE + '  {"conversations": [], "conversations": [{"value": "question"}, {"value": "answer"}]}\n]',
        3,
        'conversation 2: "conversations" is given twice in one object: keep one',
    ),
    (
        "d.json",
        '[{"conversations": [{"value": "question", "from": "me", "value": "other"}, {"value": "answer"}]}]',
        1,
        'conversation 1: "value" is given twice in one object: keep one',
    ),
    (
        "d.jsonl",
        jsonl({"prompt": "a"}) + '{"prompt": "b", "prompt": "c"}\n',
        2,
        '"prompt" is given twice in one object: keep one',
    ),
    (
        "d.jsonl",
        '{"messages": [{"role": "user", "content": "a", "content": "b"}]}\n',
        1,
        '"content" is given twice in one object',
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "line", "fragment"), DUPLICATES, ids=[c[3][:40] for c in DUPLICATES]
)
def test_a_key_given_twice_is_refused(tmp_path: Path, name: str, body: str, line: int, fragment: str) -> None:
    path = write(tmp_path, name, body)
    message = error(path)
    assert message.startswith(f"--dataset {path}:{line}: "), message
    assert fragment in message, message


def test_a_lone_cr_ends_a_line_and_no_other_character_does(tmp_path: Path) -> None:
    inside = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg"  # str.splitlines() would split at each of these
    path = write(tmp_path, "mac.txt", f"first prompt\rsecond prompt\r\n\rthird {inside}\r")
    assert [r.prompt for r in datasets.load(path).requests] == [
        "first prompt",
        "second prompt",
        f"third {inside}",
    ]
    lines = write(tmp_path, "mac.jsonl", '{"prompt": "a"}\r\r{"prompt": "b"}\r')
    assert [r.prompt for r in datasets.load(lines).requests] == ["a", "b"]
    bad = write(tmp_path, "mac.json", '[\r  {"conversations": [],}\r]')
    assert error(bad).startswith(f"--dataset {bad}:2: not valid JSON: Expecting property name")
    latin1 = write(tmp_path, "l.txt", "first\rcaf\xe9 au lait\r".encode("latin-1"))
    assert error(latin1) == f"--dataset {latin1}:2: not UTF-8 (byte 0xe9 at column 4): save the file as UTF-8"


@pytest.mark.parametrize(
    ("body", "prompts"),
    [
        ('"a quoted first prompt"\nthen plain text\n', ['"a quoted first prompt"', "then plain text"]),
        ('["a", "b"] sort these\nnext\n', ['["a", "b"] sort these', "next"]),
        ('[ "x" marks the spot\n', ['[ "x" marks the spot']),
        ('"one"\n["a", "b"] sort these\n', ['"one"', '["a", "b"] sort these']),
    ],
)
def test_a_prompt_that_looks_like_json_on_its_first_line_is_text(
    tmp_path: Path, body: str, prompts: list[str]
) -> None:
    ds = datasets.load(write(tmp_path, "p.txt", body))
    assert (ds.fmt, [r.prompt for r in ds.requests]) == ("lines", prompts)


def test_a_file_that_is_all_json_is_still_json(tmp_path: Path) -> None:
    strings = write(tmp_path, "s.txt", '"a quoted first prompt"\n"another"\n')
    assert [r.prompt for r in datasets.load(strings).requests] == ["a quoted first prompt", "another"]
    array = write(tmp_path, "a.txt", '["a", "b"]\n')
    assert error(array) == f'--dataset {array}:1: conversation 1: a string: give {{"conversations": [...]}}'
    lists = write(tmp_path, "l.txt", '["a", "b"]\n["c"]\n')
    assert error(lists).startswith(f"--dataset {lists}:1: a list: give")
    named = write(tmp_path, "n.jsonl", '"a quoted first prompt"\nthen plain text\n')
    assert error(named).startswith(f"--dataset {named}:2: not JSON")


def test_a_bad_item_is_refused_before_the_rest_is_parsed(tmp_path: Path) -> None:
    # Item 1 is wrong; item 3 is not even JSON. Item 1 is named: the parse stopped there.
    path = write(tmp_path, "a.json", "[\n  [],\n" + SHARE[2:] + '  {"conversations": [1,}\n]')
    assert error(path) == f'--dataset {path}:2: conversation 1: a list: give {{"conversations": [...]}}'


def test_an_item_too_big_to_parse_safely_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "MAX_ITEM", 1000)
    many = write(tmp_path, "many.json", '[\n{"conversations": [' + ",".join(["[]"] * 400) + "]}\n]")
    assert error(many) == (
        f"--dataset {many}:2: conversation 1: over 1,000 characters, the most one item may hold: shorten it"
    )
    string = write(tmp_path, "string.json", '[{"conversations": [{"value": "' + "x" * 1000 + '"}]}]')
    assert "conversation 1: over 1,000 characters" in error(string)
    line = write(tmp_path, "line.jsonl", jsonl({"prompt": "a"}, {"prompt": "x" * 1000}))
    assert error(line) == f"--dataset {line}:2: over 1,000 characters, the most one line may hold: shorten it"
    # Broken JSON is named as broken, though its scan ran past the limit.
    broken = write(tmp_path, "broken.json", '[{"conversations": "unclosed\n' + "x" * 1000 + '"}]')
    assert error(broken).startswith(f"--dataset {broken}:1: not valid JSON: Invalid control character")
    # Items under the limit load, however big the file.
    items = [{"conversations": [turn("human", f"question {i}"), turn("gpt", "answer")]} for i in range(200)]
    assert len(datasets.load(write(tmp_path, "fine.json", json.dumps(items))).requests) == 200

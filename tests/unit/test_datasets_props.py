"""--dataset FILE, for any file: load() gives prompts a server can take, or InputError naming the
file, never another exception. And prompts written as JSONL or plain text read back exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError
from orchestrator.tuning import datasets

NAMES = st.sampled_from(["d.txt", "d.json", "d.jsonl", "d"])
#: Characters that end lines somewhere, or that a JSON reader or a scan of brackets may trip on.
TRICKY = '\r\n\u0085\u2028\u2029\x0b\x0c\x1c\x00\ufeff"\\[]{},:'
#: Any character, with the tricky ones and lone surrogates often (they are 1 in 500 of all).
CHARS = st.one_of(st.characters(), st.sampled_from(TRICKY), st.characters(categories=["Cs"]))
#: Text without lone surrogates, as a file or a prompt can hold it.
TEXT_CHARS = st.one_of(st.characters(codec="utf-8"), st.sampled_from(TRICKY))
#: Pieces of JSON and of text that tripped the loader: deep nesting, the escape of a lone
#: surrogate, a key twice, line ends, a number too long for Python to read.
PIECES = ["[", "]", "{", "}", '"', ":", ",", "\\", "\\ud800", "\\udc00", '"prompt"', '"value"', "\r", "\n"]
PIECES += ['"conversations"', '"messages"', "\u2028", "\ufeff", "[" * 1200, "1" * 4400, '{"a": 1, "a": 2}']
#: Text made of those pieces and of any characters.
SOUP = st.lists(st.one_of(st.sampled_from(PIECES), st.text(CHARS, max_size=5)), max_size=24).map("".join)
#: Bytes likewise, with bytes that are not UTF-8: a surrogate as UTF-8 would write it, a lone 0xff.
BYTE_PIECES = [piece.encode() for piece in PIECES] + [b"\xed\xa0\x80", b"\xff", b"\xc3"]
BYTE_SOUP = st.lists(st.one_of(st.sampled_from(BYTE_PIECES), st.binary(max_size=5)), max_size=24).map(
    b"".join
)
#: Keys the loader reads, and others.
READ_KEYS = "conversations conversation from value content messages role prompt text type max_tokens"
KEYS = st.one_of(
    st.sampled_from([*READ_KEYS.split(), "max_completion_tokens", "name", "id", "image"]),
    st.text(CHARS, max_size=4),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.sampled_from(["human", "gpt", "user", "assistant", "system", "text", "a question", "an answer here"]),
    st.text(CHARS, max_size=12),
)


def _json_values() -> st.SearchStrategy[Any]:
    """JSON values; an object is a list of pairs, so that a key may come twice."""
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.builds(lambda pairs: ("object", pairs), st.lists(st.tuples(KEYS, inner), max_size=4)),
        ),
        max_leaves=12,
    )


def dump(value: Any, ascii_only: bool) -> str:
    """`value` as JSON text, keys repeated where the pairs repeat them."""
    if isinstance(value, tuple):
        pairs = (f"{dump(key, ascii_only)}: {dump(item, ascii_only)}" for key, item in value[1])
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(item, ascii_only) for item in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def obj(*pairs: tuple[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    return ("object", list(pairs))


#: Text of any characters, lone surrogates too.
TEXTS = st.text(CHARS, max_size=16)
EXTRA = st.lists(st.tuples(KEYS, SCALARS), max_size=1)  # a key bench does not take, or one twice
TURN = st.builds(
    lambda who, text, extra: obj(("from", who), ("value", text), *extra),
    st.sampled_from(["human", "gpt"]),
    TEXTS,
    EXTRA,
)
SHAREGPT = st.builds(
    lambda key, turns, extra: obj((key, turns), *extra),
    st.sampled_from(["conversations", "conversation"]),
    st.lists(TURN, max_size=3),
    EXTRA,
)
CUSTOM = st.builds(
    lambda turns: obj(("conversations", turns)),
    st.lists(st.builds(lambda text, extra: obj(("content", text), *extra), TEXTS, EXTRA), max_size=3),
)
PART = st.builds(lambda text, extra: obj(("type", "text"), ("text", text), *extra), TEXTS, EXTRA)
MESSAGE = st.builds(
    lambda role, content, extra: obj(("role", role), ("content", content), *extra),
    st.sampled_from(["system", "user", "assistant", "tool", "User"]),
    st.one_of(TEXTS, st.lists(PART, max_size=2)),
    EXTRA,
)
OPENAI = st.builds(
    lambda messages, extra: obj(("messages", messages), *extra), st.lists(MESSAGE, max_size=3), EXTRA
)
PROMPT = st.one_of(
    TEXTS, st.builds(lambda key, text: obj((key, text)), st.sampled_from(["prompt", "text"]), TEXTS)
)
#: The items of one file: mostly of one shape the loader reads, or anything.
ITEMS = st.one_of([st.lists(shape, min_size=1, max_size=4) for shape in (SHAREGPT, CUSTOM, OPENAI, PROMPT)])


@st.composite
def json_files(draw: st.DrawFn) -> str:
    """A ShareGPT array or JSONL, mostly of the shapes the loader reads, sometimes broken."""
    values = draw(st.one_of(ITEMS, st.lists(_json_values(), min_size=1, max_size=4)))
    ascii_only = draw(st.booleans())
    end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    if draw(st.booleans()):
        text = "[" + end + ("," + end).join(dump(v, ascii_only) for v in values) + end + "]"
    else:
        text = "".join(dump(v, ascii_only) + end for v in values)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # break it a little
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(CHARS, max_size=3)) + text[at + draw(st.integers(0, 3)) :]
    return text


def check(path: Path) -> datasets.Dataset | None:
    """Load `path`: the dataset, or None where InputError names the file in one printable line."""
    try:
        ds = datasets.load(path)
    except InputError as exc:
        message = str(exc)
        assert message.startswith(f"--dataset {path}"), message
        assert "\n" not in message and message.isprintable(), message
        return None
    assert ds.requests
    for request in ds.requests:  # what a server is sent encodes as UTF-8
        request.prompt.encode("utf-8")
        for message_fields in request.messages:
            for field in message_fields.values():
                field.encode("utf-8")
    return ds


def write(directory: Path, name: str, body: bytes) -> Path:
    path = directory / name
    path.write_bytes(body)
    return path


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(body=BYTE_SOUP, name=NAMES)
def test_any_bytes_give_prompts_or_our_error(
    tmp_path_factory: pytest.TempPathFactory, body: bytes, name: str
) -> None:
    check(write(tmp_path_factory.mktemp("bytes"), name, body))


@SETTINGS
@given(text=SOUP, name=NAMES)
def test_any_text_gives_prompts_or_our_error(
    tmp_path_factory: pytest.TempPathFactory, text: str, name: str
) -> None:
    body = text.encode("utf-8", "surrogatepass")  # a lone surrogate so written is not UTF-8
    check(write(tmp_path_factory.mktemp("text"), name, body))


@SETTINGS
@given(text=json_files(), name=NAMES, small=st.booleans())
def test_any_json_gives_prompts_or_our_error(
    tmp_path_factory: pytest.TempPathFactory, text: str, name: str, small: bool
) -> None:
    path = write(tmp_path_factory.mktemp("json"), name, text.encode("utf-8", "surrogatepass"))
    with pytest.MonkeyPatch.context() as patch:
        if small:  # so that items meet the bounds on size and depth
            patch.setattr(datasets, "MAX_ITEM", 40)
            patch.setattr(datasets, "MAX_DEPTH", 2)
        check(path)


PROMPTS = st.lists(st.text(TEXT_CHARS, min_size=1, max_size=30).filter(str.strip), min_size=1, max_size=8)


@SETTINGS
@given(
    prompts=PROMPTS,
    shape=st.sampled_from(["string", "prompt", "text"]),
    ascii_only=st.booleans(),
    end=st.sampled_from(["\n", "\r\n", "\r"]),
    name=NAMES,
)
def test_prompts_written_as_jsonl_read_back_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[str],
    shape: str,
    ascii_only: bool,
    end: str,
    name: str,
) -> None:
    lines = [prompt if shape == "string" else {shape: prompt} for prompt in prompts]
    body = "".join(json.dumps(line, ensure_ascii=ascii_only) + end for line in lines)
    ds = check(write(tmp_path_factory.mktemp("jsonl"), name, body.encode("utf-8")))
    assert ds is not None
    assert [r.prompt for r in ds.requests] == prompts
    assert [r.messages for r in ds.requests] == [({"role": "user", "content": p},) for p in prompts]


LINE_CHARS = st.characters(codec="utf-8", exclude_characters="\r\n")


@SETTINGS
@given(
    lines=st.lists(st.text(LINE_CHARS, max_size=30), min_size=1, max_size=8),
    end=st.sampled_from(["\n", "\r\n", "\r"]),
    name=st.sampled_from(["d.txt", "d"]),
)
def test_prompts_written_as_plain_text_read_back_exactly(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], end: str, name: str
) -> None:
    prompts = ["p " + line for line in lines]  # a letter first: no line is JSON, none blank
    ds = check(write(tmp_path_factory.mktemp("lines"), name, end.join(prompts).encode("utf-8")))
    assert ds is not None and ds.fmt == "lines"
    assert [r.prompt for r in ds.requests] == prompts

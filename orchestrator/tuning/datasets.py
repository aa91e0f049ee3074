"""datasets: the prompts `orchestrator bench --dataset FILE` sends, read from the files people have.

Engine layer: never prints.
- `load()` reads a file, finds its format from its content, and returns a `Dataset` of `Request`s.
  Or it raises InputError with one line: `--dataset FILE:LINE: what is wrong: what to write instead`.
- `sample()` draws the requests of a run.
- `output_tokens()` says how many tokens each may generate.

The formats come from SGLang's bench_serving. It was read at 0.5.9 in
python/sglang/bench_serving.py, and at 0.5.23 in python/sglang/benchmark/datasets/. The rules are
the same in both.

- "sharegpt": a JSON array of `{"conversations": [{"from": "human", "value": "..."}, ...]}`.
  "conversation" is read too. It is read as bench_serving's `sample_sharegpt_requests` reads it. A
  conversation of fewer than 2 turns is left out. Turn 0's "value" is the prompt and turn 1's the
  answer, whatever their "from" says. A pair whose prompt or answer is under 2 tokens is left out.
  bench_serving counts with the model's tokenizer. We estimate.
- "bench-custom": the JSONL of bench_serving's `--dataset-name custom` (`sample_custom_requests`,
  0.5.9 and 0.5.23). It has one `{"conversations": [...]}` a line. Each turn's text is in
  "content", or else "value". The same two turns and filters apply as for ShareGPT.
- "openai": JSONL of `{"messages": [{"role": ..., "content": ...}, ...]}`, the chat request itself.
  This is bench_serving's `--dataset-name openai` (`sample_openai_requests`). It sends the messages
  as they are, and takes "max_tokens" as the output length, 256 without it. Here a last message
  from the assistant is the reference answer. Its length is the output length, and it is not sent.
  "max_tokens" (or "max_completion_tokens"), where given, wins over it.
- "lines": today's `--prompts` file. It is JSONL of JSON strings or `{"prompt": ...}` /
  `{"text": ...}` objects. Or it is plain text, one prompt per line, with blank lines skipped.
- "builtin": the prompts bench sends when no file is given.

How the format is found. Lines end at "\\n", "\\r\\n" or a lone "\\r", as in Python's universal
newlines. No other character ends a line: a U+2028 or U+0085 stays inside its prompt. The first
non-blank line decides:
- "[" then "{", "[", "]" or the end of the file opens a JSON array. The file is ShareGPT.
- A JSON object makes the file JSONL. Then each line's keys say its kind: "messages",
  "conversations", "prompt"/"text", or a string. A file has one kind.
- A JSON string, or another line that starts with "[", may be a prompt: a quotation, "[INST] ...",
  '["a", "b"] sort these'. Such a file is JSON only if all of it is: one JSON array, or JSON on
  every line (JSONL). Otherwise it is plain text.
- Any other line makes the file plain text, one prompt per line. Blank lines are skipped.
A file named .json or .jsonl must be JSON. It is never read as plain text.

Bounds. A file holds at most MAX_BYTES. A JSON array is parsed one item at a time, and JSONL one
line at a time. So a bad item is refused before the rest of the file is parsed. One item (a
conversation, or a line of JSONL) holds at most MAX_ITEM characters, nested at most MAX_DEPTH deep.
Both are checked before the item is parsed: parsing builds objects of up to 25 times its size.

Some things bench_serving passes silently, and we refuse. The reason: the benchmark would not be
the one the file describes. They are:
- a line that is not JSON. bench_serving skips it.
- a request parameter such as "temperature" or "tools" in an OpenAI line. bench_serving sends it,
  but bench would not.
- a turn with no text. bench_serving reads it as "".
- an "image" in a custom line. Newer custom.py on SGLang's main sends it. bench sends text only.
- a key given twice in one object. JSON readers keep one of the two silently.
- a lone surrogate, such as the escape "\\ud800". It is half a character, and no server takes it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import stat
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError, one_line, short_path

#: The largest dataset file read. ShareGPT_V3_unfiltered_cleaned_split.json, the file
#: bench_serving downloads, is about 0.7 GB. Its bytes and its text are held whole (its parsed
#: items are not), so a bigger file is better sampled down first.
MAX_BYTES = 1 << 30
#: The most characters one item may hold: a line of JSONL, or a conversation of a ShareGPT array.
#: Parsing builds objects of up to 25 times an item's size ("[]" is 2 characters, a list 56
#: bytes), so an item is measured before it is parsed. 16 million characters is about 4 million
#: tokens.
MAX_ITEM = 16_000_000
#: The deepest an item's lists and objects may nest. A dataset's items nest 3 or 4 deep. Python's
#: JSON parser recurses once a level, and stops at about 1000.
MAX_DEPTH = 100

#: Roles SGLang's chat API takes (0.5.9, protocol.py: ChatCompletionMessageUserParam and
#: ChatCompletionMessageGenericParam), lower case as the user role must be.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
#: Keys of an OpenAI line that describe no request parameter: read ("max_tokens") or ignored
#: ("model": bench talks to the deployed model; "id", "metadata": bookkeeping).
OPENAI_KEYS = {"messages", "max_tokens", "max_completion_tokens", "model", "id", "metadata"}
#: Keys of a message bench passes on, each a string.
MESSAGE_KEYS = {"role", "content", "name", "tool_call_id"}

#: A JSONL line's kind -> the format of a file of such lines.
_FORMAT = {"messages": "openai", "conversations": "bench-custom", "prompt": "lines"}
#: How a kind of line is written, for messages.
_SHAPE = {
    "messages": '{"messages": [...]} (OpenAI chat)',
    "conversations": '{"conversations": [...]} (bench_serving custom)',
    "prompt": 'a {"prompt": "..."} or "..." (one prompt)',
}
_WS = re.compile(r"[ \t\n\r]*")
#: A text that opens like a JSON array of items, not like a prompt such as "[INST] ..." or
#: '["a", "b"] sort these'.
_ARRAY_START = re.compile(r"\[[ \t\n\r]*(?:[\[{\]]|\Z)")
#: A JSON string, for _bound: "fast", or "strict", which stops at a control character as a JSON
#: string must, so that an unclosed one ends at its line.
_STRING = {
    "fast": r'"[^"\\]*+(?:\\.[^"\\]*+)*+"',
    "strict": r'"[^"\\\x00-\x1f]*+(?:\\.[^"\\\x00-\x1f]*+)*+"',
}
#: A string at the scan's position: it closes beyond the scan's end, or it does not close.
_WHOLE_STRING = {name: re.compile(pattern, re.S) for name, pattern in _STRING.items()}
#: Text up to the next bracket, stepping over whole strings.
_GAP = {name: re.compile(rf'[^"\[\]{{}}]*+(?:{p}[^"\[\]{{}}]*+)*+', re.S) for name, p in _STRING.items()}


@dataclass(frozen=True)
class Request:
    """One request a dataset holds, ready for either kind of endpoint."""

    prompt: str
    """Text for the raw endpoints (/generate, /v1/completions). From OpenAI messages: the sent
    messages' contents joined by a blank line, with no roles and no chat template."""
    messages: tuple[dict[str, str], ...]
    """For /v1/chat/completions. A plain prompt is one user message, as bench_serving sends it."""
    output_len: int | None = None
    """The dataset's own answer length in tokens (estimate_tokens), None where it has none."""

    @classmethod
    def plain(cls, prompt: str, output_len: int | None = None) -> Request:
        return cls(prompt, ({"role": "user", "content": prompt},), output_len)


@dataclass(frozen=True)
class Dataset:
    """The requests of one file (or of the built-in prompts), and what identifies them."""

    name: str
    """The file's name ('' for the built-in prompts)."""
    digest: str
    """sha256 of the file's bytes, its first 16 hex digits ('' for the built-in prompts)."""
    fmt: str
    """The format: one of "sharegpt", "openai", "bench-custom", "lines", "builtin"."""
    requests: tuple[Request, ...]
    skipped: int = 0
    """Conversations left out, as bench_serving leaves them out (sharegpt and bench-custom)."""
    skipped_why: str = ""
    """Why, for a note: e.g. "3 with fewer than 2 turns; bench_serving leaves them out too"."""


class _Problem(Exception):
    """What is wrong at one line of the file (0: the file as a whole); load() names the file."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


# --- the public functions ----------------------------------------------------------------


def load(path: Path) -> Dataset:
    """The requests in `path`, its format found from its content (see the module's docstring)."""
    try:
        data = _read(path)
        text = _decode(data)
        fmt, requests, skipped = _parse(text, path.suffix.lower())
        if not requests:
            raise _Problem(0, f"no usable prompts{_skip_note(skipped, ' (', ')')}")
    except _Problem as exc:
        where = f":{exc.line}" if exc.line else ""
        raise InputError(f"--dataset {short_path(path)}{where}: {exc}") from None
    return Dataset(
        name=path.name,
        digest=hashlib.sha256(data).hexdigest()[:16],
        fmt=fmt,
        requests=tuple(requests),
        skipped=sum(skipped.values()),
        skipped_why=_skip_note(skipped, "", "; bench_serving leaves them out too"),
    )


def builtin(prompts: Sequence[str]) -> Dataset:
    """The prompts bench sends when no --dataset is given."""
    return Dataset(name="", digest="", fmt="builtin", requests=tuple(Request.plain(p) for p in prompts))


def sample(dataset: Dataset, n: int, seed: int) -> tuple[Request, ...]:
    """`n` requests: the dataset shuffled by random.Random(seed), then taken in that order, as
    bench_serving shuffles (it seeds the global random with --seed, then random.shuffle) and
    takes the first --num-prompts. Where `n` is more than the dataset holds, the shuffled order
    is repeated (bench_serving sends fewer requests instead). The same seed gives the same
    requests; it need not pick the ones bench_serving picks, which shuffles before its filters."""
    if n < 0:
        raise ValueError(f"sample of {n} requests")
    if not dataset.requests and n:
        raise ValueError("sample from a dataset with no requests")
    order = list(range(len(dataset.requests)))
    random.Random(seed).shuffle(order)
    return tuple(dataset.requests[order[i % len(order)]] for i in range(n))


def output_tokens(request: Request, max_tokens: int) -> int:
    """The tokens a request may generate: its dataset's answer length capped by --max-tokens
    (as bench_serving's --sharegpt-output-len overrides the answer length), --max-tokens for a
    request without one; at least 1."""
    cap = max(1, max_tokens)
    return cap if request.output_len is None else max(1, min(request.output_len, cap))


def estimate_tokens(text: str) -> int:
    """Tokens in `text`, estimated without the model's tokenizer: one per 4 bytes of UTF-8,
    rounded up. For English that is OpenAI's rule of thumb (a token is about 4 characters);
    counting bytes rather than characters keeps Chinese or Japanese text (3 bytes a character,
    about one token) from being counted at a quarter of its length."""
    size = len(text) if text.isascii() else len(text.encode())
    return (size + 3) // 4


# --- reading the file --------------------------------------------------------------------


def _read(path: Path) -> bytes:
    """The file's bytes, read once (the digest and the text both come from them)."""
    size = f"{MAX_BYTES >> 30} GiB" if MAX_BYTES >= 1 << 30 else f"{MAX_BYTES} bytes"
    too_big = _Problem(0, f"larger than {size}, the most a dataset may hold: sample it down")
    try:
        mode = path.stat()
        if stat.S_ISDIR(mode.st_mode):
            raise _Problem(0, "is a directory: give a dataset file")
        if not stat.S_ISREG(mode.st_mode):  # a FIFO would block, /dev/zero never end
            raise _Problem(0, "is not a regular file: give a dataset file")
        if mode.st_size > MAX_BYTES:
            raise too_big
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # the file may have grown since stat
    except FileNotFoundError:
        raise _Problem(0, "no such file") from None
    except OSError as exc:
        raise _Problem(0, f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise too_big
    return data


def _decode(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = _newlines(data[: exc.start].decode("utf-8"))
        line, column = _where(before, len(before))
        raise _Problem(
            line, f"not UTF-8 (byte 0x{data[exc.start]:02x} at column {column}): save the file as UTF-8"
        ) from None
    return _newlines(text.removeprefix("\ufeff"))  # a byte order mark, which some Windows editors write


def _newlines(text: str) -> str:
    """`text` with each "\\r\\n" and lone "\\r" made "\\n", as Python's universal newlines read
    a file. JSON means the same by it: whitespace, or a control character a string cannot hold."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _parse(text: str, suffix: str) -> tuple[str, list[Request], Counter[str]]:
    """The format (the module's docstring says how), the requests, the counts of what was left out."""
    first = next(((n, start, line) for n, start, line in _lines(text) if line.strip()), None)
    if first is None:
        raise _Problem(0, "the file is empty: give one prompt per line, JSONL, or a ShareGPT JSON array")
    number, start, line = first
    pos = _past_ws(text, start)
    bracket = text.startswith("[", pos)
    if bracket and (suffix == ".json" or _ARRAY_START.match(text, pos)):
        return ("sharegpt", *_sharegpt(text, pos))
    try:
        head = _json_kind_of(line)
    except _Problem as exc:
        raise _Problem(number, str(exc)) from None
    if isinstance(head, dict) or (suffix in (".json", ".jsonl") and head is not None):
        return _jsonl(text)
    if suffix in (".json", ".jsonl"):
        raise _Problem(number, _not_json(line, text))
    if isinstance(head, str) or bracket:  # a prompt, or JSON: JSON only if all of the file is
        if bracket and _all_json(item for _, item in _items(text, pos, _PLAIN)):
            return ("sharegpt", *_sharegpt(text, pos))
        if _all_json(_json_line(line, _PLAIN) for _, _, line in _lines(text) if line.strip()):
            return _jsonl(text)
    return "lines", [Request.plain(line) for _, _, line in _lines(text) if line.strip()], Counter()


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """Each line of `text` (after _newlines): its number, where it starts, and its text. One at a
    time: a file of 35 million short lines is not split up front."""
    start, number = 0, 1
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield number, start, text[start:end]
        start, number = end + 1, number + 1


def _where(text: str, pos: int) -> tuple[int, int]:
    """The line and the column of `pos` in `text`, both from 1 (only when something is wrong)."""
    return text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)


def _all_json(values: Iterable[object]) -> bool:
    """Whether every value parses. None of them is kept."""
    try:
        for _ in values:
            pass
    except (ValueError, _Problem):  # json.JSONDecodeError is a ValueError
        return False
    return True


def _json_kind_of(line: str) -> object:
    """`line` as JSON, if it is an object or a string (what a JSONL dataset's lines are). One too
    big or too deep to parse is refused."""
    if not line.lstrip(" \t").startswith(("{", '"')):
        return None
    try:
        item = _json_line(line, _PLAIN)
    except ValueError:
        return None
    return item if isinstance(item, dict | str) else None


def _not_json(line: str, text: str) -> str:
    try:
        _json_line(line, _PLAIN)
    except json.JSONDecodeError as exc:
        why = f"not JSON: {_json_why(exc)}"
    except _Problem as exc:
        why = str(exc)
    else:
        why = "a JSON value that is neither an object nor a string"
    pos = _past_ws(text, 0)
    if text.startswith("{", pos):
        try:
            whole, end = _value(text, pos, _PLAIN)
        except (ValueError, _Problem):
            whole, end = None, pos
        if isinstance(whole, dict) and _past_ws(text, end) == len(text):
            return "one JSON object over several lines: JSONL is one object a line (jq -c), ShareGPT an array"
    return f"{why}: each line of a JSONL dataset is a JSON object or string"


# --- JSON, one item at a time ------------------------------------------------------------


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if it gives a key twice: json keeps the last one silently."""
    item = dict(pairs)
    if len(item) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Problem(0, f"{_show(key)} is given twice in one object: keep one")
            seen.add(key)
    return item


#: Parses a dataset's items (see _object).
_DECODER = json.JSONDecoder(object_pairs_hook=_object)
#: Only finds out whether a text is JSON, where that decides the format.
_PLAIN = json.JSONDecoder()


def _lone_surrogate(text: str) -> str:
    """What is wrong with `text` if it holds a lone surrogate, else "". The escape "\\ud800" makes
    one: half a character, which no UTF-8 text holds. Sending it would fail. Each text a request
    takes from the file is checked; text bench does not send ("id", "from") is not."""
    if text.isascii():
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"has a lone surrogate, \\u{ord(text[exc.start]):04x}, at character {exc.start + 1}: it is "
            "half a character, not text a server can take: write the whole character, or remove it"
        )
    return ""


def _value(text: str, pos: int, decoder: json.JSONDecoder, *, measured: bool = False) -> tuple[Any, int]:
    """The JSON value at `pos` and where it ends. A list or an object is measured first, unless
    the caller has `measured` it."""
    if not measured and text.startswith(("[", "{"), pos):
        _bound(text, pos)
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer longer than Python reads (4300 digits unless set otherwise)
        most = sys.get_int_max_str_digits()
        raise _Problem(0, f"a number too long to read: give one of at most {most} digits") from None
    except RecursionError:  # under MAX_DEPTH, but called from deep in the stack
        why = "lists and objects nested too deep to parse: a dataset's items nest 3 or 4 deep"
        raise _Problem(0, why) from None


def _bound(text: str, start: int) -> None:
    """Refuse the list or object at `start` if it is over MAX_ITEM characters or nests deeper than
    MAX_DEPTH. A scan from bracket to bracket finds out, and builds nothing. The fast scan may
    misread broken JSON, so the strict one confirms a refusal. Where the JSON is broken, the
    strict scan stops, and the parser says what is wrong."""
    if _scan(text, start, "fast"):
        why = _scan(text, start, "strict")
        if why:
            raise _Problem(0, why)


def _scan(text: str, start: int, how: str) -> str:
    """What is wrong with the size or depth of the list or object at `start`, else ""."""
    gaps, strings = _GAP[how], _WHOLE_STRING[how]
    end = min(len(text), start + MAX_ITEM)
    pos, depth = start, 0
    while pos < end:
        if text[pos] in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return (
                    f"lists and objects nested more than {MAX_DEPTH} deep: a dataset's items nest 3 or 4 deep"
                )
        elif text[pos] in "]}":
            depth -= 1
            if depth == 0:
                return ""
        elif strings.match(text, pos) is None:  # a string that does not close
            return ""
        else:  # a string that closes beyond `end`
            break
        gap = gaps.match(text, pos + 1, end)
        assert gap is not None  # it matches the empty string too
        pos = gap.end()
    return f"over {MAX_ITEM:,} characters, the most one item may hold: shorten it" if end < len(text) else ""


def _items(text: str, pos: int, decoder: json.JSONDecoder) -> Iterator[tuple[int, Any]]:
    """The items of the JSON array that opens at `pos`, each with where it starts. One at a time:
    a bad item is refused before the rest are parsed."""
    pos = _past_ws(text, pos + 1)
    index = 0
    while not text.startswith("]", pos):
        try:
            item, end = _value(text, pos, decoder)
        except json.JSONDecodeError as exc:
            raise _not_valid(text, exc.pos, exc.msg) from None
        except _Problem as exc:
            raise _Problem(_where(text, pos)[0], f"conversation {index + 1}: {exc}") from None
        yield pos, item
        pos = _past_ws(text, end)
        if text.startswith(",", pos):
            pos, index = _past_ws(text, pos + 1), index + 1
        elif not text.startswith("]", pos):
            raise _not_valid(text, pos, "Expecting ',' delimiter" if pos < len(text) else "Expecting ']'")
    pos = _past_ws(text, pos + 1)
    if pos < len(text):
        raise _not_valid(text, pos, "Extra data")


def _not_valid(text: str, pos: int, why: str) -> _Problem:
    line, column = _where(text, pos)
    return _Problem(line, f"not valid JSON: {why} at column {column}")


def _json_line(line: str, decoder: json.JSONDecoder) -> Any:
    """One line of JSONL, parsed. It raises json.JSONDecodeError where the line is not JSON."""
    if len(line) > MAX_ITEM:
        raise _Problem(0, f"over {MAX_ITEM:,} characters, the most one line may hold: shorten it")
    few = line.count("[") + line.count("{") <= MAX_DEPTH  # then it cannot nest deeper
    value, end = _value(line, _past_ws(line, 0), decoder, measured=few)
    if _past_ws(line, end) < len(line):
        raise json.JSONDecodeError("Extra data", line, _past_ws(line, end))
    return value


# --- ShareGPT and bench_serving's custom JSONL -------------------------------------------


def _sharegpt(text: str, pos: int) -> tuple[list[Request], Counter[str]]:
    """The requests of the ShareGPT array that opens at `pos`."""
    requests: list[Request] = []
    skipped: Counter[str] = Counter()
    for index, (start, item) in enumerate(_items(text, pos, _DECODER)):
        try:
            if not isinstance(item, dict):
                raise _Problem(0, f'{_a(item)}: give {{"conversations": [...]}}')
            pair = _two_turns(item, "value")
        except _Problem as exc:
            raise _Problem(_where(text, start)[0], f"conversation {index + 1}: {exc}") from None
        _add_pair(pair, requests, skipped)
    return requests, skipped


def _two_turns(item: dict[str, Any], text_keys: str) -> tuple[str, str] | None:
    """Turn 0 and turn 1 of a conversation, as bench_serving takes them; None for fewer than 2
    turns. `text_keys`: "value" for ShareGPT, "content" (else "value") for bench-custom."""
    key = _one_of(item, ("conversations", "conversation"))
    if key is None:
        raise _Problem(
            0, 'no "conversations": give {"conversations": [{"from": "human", "value": "..."}, ...]}'
        )
    turns = item[key]
    if not isinstance(turns, list):
        raise _Problem(0, f'"{key}" is {_a(turns)}: give a list of turns')
    if len(turns) < 2:
        return None
    return _turn_text(turns[0], key, 0, text_keys), _turn_text(turns[1], key, 1, text_keys)


def _turn_text(turn: object, key: str, index: int, text_keys: str) -> str:
    where = f"{key}[{index}]"
    if not isinstance(turn, dict):
        raise _Problem(0, f'{where} is {_a(turn)}: give {{"from": "human", "value": "..."}}')
    names = ("content", "value") if text_keys == "content" else ("value",)
    found = [name for name in names if name in turn]
    if not found:
        wanted = " or ".join(f'"{n}"' for n in names)
        raise _Problem(0, f"{where} has no {wanted}: give the turn's text there")
    if len(found) == 2 and turn["content"] != turn["value"]:
        raise _Problem(0, f'{where} has both "content" and "value", and they differ: keep one')
    text = turn[found[0]]
    if not isinstance(text, str):
        raise _Problem(0, f'{where}: "{found[0]}" is {_a(text)}: give a string')
    if why := _lone_surrogate(text):
        raise _Problem(0, f'{where}: "{found[0]}" {why}')
    return text


def _add_pair(pair: tuple[str, str] | None, requests: list[Request], skipped: Counter[str]) -> None:
    """bench_serving's filters: fewer than 2 turns, prompt or answer under 2 tokens."""
    if pair is None:
        skipped["turns"] += 1
        return
    prompt, answer = pair
    answer_len = estimate_tokens(answer)
    if estimate_tokens(prompt) < 2 or answer_len < 2:
        skipped["short"] += 1
        return
    requests.append(Request.plain(prompt, answer_len))


def _skip_note(skipped: Counter[str], before: str, after: str) -> str:
    parts = []
    if skipped["turns"]:
        parts.append(f"{skipped['turns']} with fewer than 2 turns")
    if skipped["short"]:
        parts.append(f"{skipped['short']} with a prompt or answer under 2 tokens (estimated)")
    return f"{before}{', '.join(parts)}{after}" if parts else ""


def _past_ws(text: str, pos: int) -> int:
    """Where the JSON whitespace that starts at `pos` ends."""
    match = _WS.match(text, pos)
    assert match is not None  # it matches the empty string too
    return match.end()


# --- JSONL -------------------------------------------------------------------------------


def _jsonl(text: str) -> tuple[str, list[Request], Counter[str]]:
    """The requests of a JSONL file, read a line at a time: a bad line stops it."""
    requests: list[Request] = []
    skipped: Counter[str] = Counter()
    kind, kind_line = "", 0
    for number, _, line in _lines(text):
        if not line.strip():
            continue
        try:
            item = _json_line(line, _DECODER)
        except json.JSONDecodeError as exc:
            why = f"not JSON: {_json_why(exc)}: each line of a JSONL file is one JSON value"
            raise _Problem(number, f"{why} (line {kind_line} is JSON, so this file is JSONL)") from None
        except _Problem as exc:
            raise _Problem(number, str(exc)) from None
        try:
            this = _line_kind(item)
            if not kind:
                kind, kind_line = this, number
            elif this != kind:
                raise _Problem(
                    0, f"{_SHAPE[this]}, but line {kind_line} is {_SHAPE[kind]}: one kind of line a file"
                )
            if this == "messages":
                requests.append(_openai(item))
            elif this == "conversations":
                if "image" in item:
                    raise _Problem(
                        0, '"image": bench sends text only: remove it, or bench images with bench_serving'
                    )
                _add_pair(_two_turns(item, "content"), requests, skipped)
            else:
                requests.append(_one_prompt(item))
        except _Problem as exc:
            raise _Problem(number, str(exc)) from None
    return _FORMAT[kind], requests, skipped


def _line_kind(item: object) -> str:
    if isinstance(item, str):
        return "prompt"
    if not isinstance(item, dict):
        raise _Problem(
            0, f'{_a(item)}: give {{"messages": [...]}}, {{"conversations": [...]}} or {{"prompt": "..."}}'
        )
    groups = {
        "messages": ("messages",),
        "conversations": ("conversations", "conversation"),
        "prompt": ("prompt", "text"),
    }
    found = [kind for kind, keys in groups.items() if any(k in item for k in keys)]
    if len(found) > 1:
        raise _Problem(0, f"both {_SHAPE[found[0]]} and {_SHAPE[found[1]]}: keep one")
    if not found:
        keys = ", ".join(_show(k) for k in list(item)[:5]) or "no keys"
        raise _Problem(0, f'an object with {keys}: give "messages", "conversations" or "prompt"')
    return found[0]


def _one_prompt(item: str | dict[str, Any]) -> Request:
    key = None if isinstance(item, str) else _one_of(item, ("prompt", "text"))
    text = item if isinstance(item, str) or key is None else item[key]
    if not isinstance(text, str):
        raise _Problem(0, f'"{key}" is {_a(text)}: give a string')
    if why := _lone_surrogate(text):
        raise _Problem(0, f"the prompt {why}" if key is None else f'"{key}" {why}')
    if not text.strip():
        raise _Problem(0, "an empty prompt: give its text, or remove the line")
    return Request.plain(text)


# --- OpenAI chat -------------------------------------------------------------------------


def _openai(item: dict[str, Any]) -> Request:
    """One chat request; a last assistant message is its answer, not sent."""
    extra = sorted(set(item) - OPENAI_KEYS)
    if extra:
        raise _Problem(
            0,
            f"{_show(extra[0])} is a request parameter bench does not send (bench_serving does): "
            "remove it; bench's own flags set temperature and the like",
        )
    messages = item["messages"]
    if not isinstance(messages, list) or not messages:
        raise _Problem(0, '"messages" must be a non-empty list of {"role": ..., "content": ...}')
    checked = [_message(m, i) for i, m in enumerate(messages)]
    answer = checked.pop()["content"] if checked[-1]["role"] == "assistant" else None
    if answer is not None and not answer.strip():
        raise _Problem(0, "the last message, the assistant's answer, is empty: give the answer or remove it")
    if not checked or checked[-1]["role"] not in ("user", "tool"):
        ends = checked[-1]["role"] if checked else "nothing but the answer"
        raise _Problem(0, f"the request ends with {ends}: the message before the answer must be user or tool")
    output_len = _max_tokens(item)
    if output_len is None and answer is not None:
        output_len = estimate_tokens(answer)
    prompt = "\n\n".join(m["content"] for m in checked)
    return Request(prompt=prompt, messages=tuple(checked), output_len=output_len)


def _message(message: object, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _Problem(0, f'{where} is {_a(message)}: give {{"role": "user", "content": "..."}}')
    extra = sorted(set(message) - MESSAGE_KEYS)
    if extra:
        raise _Problem(
            0, f"{where}: {_show(extra[0])} is not sent by bench: keep role, content, name, tool_call_id"
        )
    role = message.get("role")
    if role not in ROLES:
        raise _Problem(0, f"{where}: role {_show(role)}: give one of {', '.join(ROLES)} (lower case)")
    if "content" not in message:
        raise _Problem(0, f'{where} has no "content": give the message\'s text')
    out = {key: _string(message[key], f"{where}: {key}") for key in message if key != "content"}
    out["content"] = _content(message["content"], where)
    return out


def _content(content: object, where: str) -> str:
    """A string, or a list of text parts joined by a space, as SGLang 0.5.9 flattens them for
    a chat template that takes strings (jinja_template_utils.process_content_for_template_format).
    Image, audio and video parts are refused: bench sends text."""
    if isinstance(content, str):
        return _string(content, f"{where}: content")
    if not isinstance(content, list):
        raise _Problem(0, f"{where}: content is {_a(content)}: give a string")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = _show(part.get("type")) if isinstance(part, dict) else _a(part)
            raise _Problem(
                0,
                f'{where}: content[{i}] is {kind}: bench sends text; give {{"type": "text", "text": "..."}}',
            )
        texts.append(_string(part["text"], f"{where}: content[{i}].text"))
    return " ".join(texts)


def _max_tokens(item: dict[str, Any]) -> int | None:
    key = _one_of(item, ("max_tokens", "max_completion_tokens"))
    if key is None:
        return None
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Problem(0, f'"{key}" is {_show(value)}: give a whole number of tokens, at least 1')
    return value


# --- small helpers -----------------------------------------------------------------------


def _one_of(item: dict[str, Any], keys: tuple[str, str]) -> str | None:
    """Which of two spellings of one key `item` uses; both is refused."""
    found = [key for key in keys if key in item]
    if len(found) == 2:
        raise _Problem(0, f'both "{keys[0]}" and "{keys[1]}": keep one')
    return found[0] if found else None


def _json_why(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"


def _string(value: object, where: str) -> str:
    """`value`, a string a request sends."""
    if not isinstance(value, str):
        raise _Problem(0, f"{where} is {_a(value)}: give a string")
    if why := _lone_surrogate(value):
        raise _Problem(0, f"{where} {why}")
    return value


def _a(value: object) -> str:
    """What kind of JSON value `value` is, for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    kinds = {str: "a string", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


def _show(value: object, limit: int = 40) -> str:
    """A value from the file, quoted as JSON, cut short and escaped: a file's text reaches the
    terminal only through one_line (the rule of console.shown)."""
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + "..."
    return one_line(text)

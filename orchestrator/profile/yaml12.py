"""YAML as a profile means it: the 1.2 core schema, unique keys, bounded, and each number's text.

PyYAML resolves plain scalars by YAML 1.1: `1.10` is 1.1, `010` is 8, `0x10` 16, `12:30` 750 and
`yes` true. So an env value, an NCCL setting or a `service.extra` directive reached the server as
something other than the file says. This loader resolves them by YAML 1.2's core schema
(yaml.org/spec/1.2.2, 10.3), and keeps what was written:

- A number is an `int` or `float` that also carries its text (`Int`, `Float`). A string field gets
  that text (`str()` of it). So `env: {A: 1.10}` is "1.10", and `UMask: 0777` is "0777".
- A plain scalar that YAML 1.1 reads differently keeps that reading too (`yaml11`). So a number
  field can refuse a form with two readings, naming both (`two_readings`). `port: 075` is 75 here,
  and 61 to Ansible and PyYAML. `12:30` is text here, and 750 there.

Duplicate keys are refused, where PyYAML silently keeps the last. So is a file over `MAX_BYTES`, or
of over `max_nodes` nodes, before it is all parsed. PyYAML takes tens of seconds for 50 MB.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

#: A profile is a few KB; a chat template inline in extra_args a few more. Reading stops here.
MAX_BYTES = 1024 * 1024

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"

# The core schema's regular expressions (YAML 1.2.2, 10.3.2), whole-value matches.
_INT_RE = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT_RE = re.compile(
    r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
)
_BOOL_RE = re.compile(r"true|True|TRUE|false|False|FALSE")
_NULL_RE = re.compile(r"~|null|Null|NULL|")
#: A decimal integer written with a leading zero: octal to YAML 1.1 (and to C's strtol, base 0).
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")


class _Written:
    """A number that remembers its text: `str()` and `repr()` give the text, arithmetic the value."""

    text: str

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    @property
    def yaml11(self) -> Any:
        return yaml11_reading(self.text)


class Int(_Written, int):
    """An integer as written (`0x10`, `010`)."""

    def __new__(cls, value: int, text: str) -> Int:
        self = int.__new__(cls, value)
        self.text = text
        return self


class Float(_Written, float):
    """A float as written (`1.10`, `1e5`)."""

    def __new__(cls, value: float, text: str) -> Float:
        self = float.__new__(cls, value)
        self.text = text
        return self


class Plain(str):
    """Plain (unquoted) text that YAML 1.1 reads as something else (`12:30`, `yes`, `1_000`)."""

    yaml11: Any

    def __new__(cls, text: str, yaml11: Any) -> Plain:
        self = super().__new__(cls, text)
        self.yaml11 = yaml11
        return self


def yaml11_reading(text: str) -> Any:
    """What PyYAML (YAML 1.1, as Ansible reads its files) makes of `text` as a plain scalar."""
    resolvers = yaml.SafeLoader.yaml_implicit_resolvers
    for _tag, regexp in [*resolvers.get(text[:1], []), *resolvers.get(None, [])]:
        if regexp.match(text):
            break
    else:
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _value_of(reading: Any) -> str:
    return repr(reading) if isinstance(reading, str) else str(reading).lower()


def two_readings(value: Any) -> str | None:
    """A number field's value that YAML 1.1 reads otherwise, worded with both readings and the fix.

    A leading zero is refused even where YAML 1.1 gives text (`09`): it is octal to 1.1, to C's
    strtol and to systemd, so it is never clear which is meant. (`value == value` leaves NaN out.)
    """
    if isinstance(value, (Int, Float)):
        old = value.yaml11
        if isinstance(value, Int) and _LEADING_ZERO.fullmatch(value.text):
            octal = isinstance(old, int) and not isinstance(old, bool)
            if octal and old == int(value):  # `01`, `07`: one number, but a form that is octal elsewhere
                return f"{value.text} has a leading zero, which YAML 1.1 and C read as octal; write {old}"
            old_said = f"{old} (octal)" if octal else f"the text {old!r}"
            return (
                f"{value.text} has a leading zero: {int(value)} in YAML 1.2 (as read here), {old_said} in "
                f"YAML 1.1 (as Ansible and PyYAML read it); write {int(value)}"
                + (f", or {old} if the octal was meant" if octal else "")
            )
        if isinstance(old, (int, float)) and not isinstance(old, bool) and old != value and value == value:
            return (
                f"{value.text} has two readings: {_value_of(value + 0)} in YAML 1.2 (as read here) and "
                f"{_value_of(old)} in YAML 1.1; write {_value_of(value + 0)}"
            )
        return None
    old = value.yaml11 if isinstance(value, Plain) else None
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        base60 = " (base 60)" if ":" in value else ""
        return (
            f"{str(value)!r} is text in YAML 1.2 (as read here) but {_value_of(old)}{base60} in "
            f"YAML 1.1; write {_value_of(old)} if that is meant"
        )
    return None


class TooLarge(yaml.YAMLError):
    """The file has more nodes than the loader's bound (raised while composing, before the rest)."""


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema, refusing duplicate keys, counting nodes
    against `max_nodes` and noting whether the file uses aliases (for the caller's messages)."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    max_nodes = 10_000

    def __init__(self, stream: bytes) -> None:
        super().__init__(stream)
        self.aliased = False
        self.nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliased = True
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise TooLarge(f"has over {self.max_nodes} values")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """YAML says keys are unique; PyYAML keeps the last of two silently, so `server:` twice
        would drop the first. Keys merged in with `<<:` may be overridden: that is what merging is."""
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in first:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {first[key] + 1}); keep one",
                    key_node.start_mark,
                )
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def _scalar(self, node: yaml.ScalarNode, pattern: re.Pattern[str], what: str) -> str:
        text = self.construct_scalar(node)
        if not pattern.fullmatch(text):
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not a YAML 1.2 {what}", node.start_mark
            )
        return text

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Int:
        text = self._scalar(node, _INT_RE, "integer")
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        return Int(int(text[2:] if base != 10 else text, base), text)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> Float:
        text = self._scalar(node, _FLOAT_RE, "float")
        # Python's float() takes `inf` and `nan`, not YAML's `.inf` and `.nan`.
        return Float(float(text.lower().replace(".inf", "inf").replace(".nan", "nan")), text)

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        return self._scalar(node, _BOOL_RE, "boolean (true or false)").lower() == "true"

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        text = self.construct_scalar(node)
        if node.style is None and isinstance(text, str):
            old = yaml11_reading(text)
            if old != text or not isinstance(old, str):
                return Plain(text, old)
        return text


def _refused(loader: Loader, node: yaml.Node) -> Any:
    """YAML 1.1's further types: a set has no order (a list field would render in a different order
    from run to run, and so would its digest), and binary, timestamps and pairs have no meaning in a
    profile; none is in YAML 1.2's core schema."""
    kind = node.tag.rsplit(":", 1)[-1]
    raise yaml.constructor.ConstructorError(
        None, None, f"!!{kind} is not a YAML 1.2 core type: write a list, a mapping or text", node.start_mark
    )


for _kind in ("set", "omap", "pairs", "binary", "timestamp"):
    Loader.add_constructor(f"tag:yaml.org,2002:{_kind}", _refused)

for _tag, _regexp, _first in [
    (_BOOL, _BOOL_RE, "tTfF"),
    (_INT, _INT_RE, "-+0123456789"),
    (_FLOAT, _FLOAT_RE, "-+.0123456789"),
    (_NULL, _NULL_RE, ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:merge", re.compile(r"<<"), "<"),
]:
    Loader.add_implicit_resolver(_tag, re.compile(rf"^(?:{_regexp.pattern})$"), list(_first))
for _tag, _method in [
    (_INT, Loader.construct_yaml_int),
    (_FLOAT, Loader.construct_yaml_float),
    (_BOOL, Loader.construct_yaml_bool),
    (_STR, Loader.construct_yaml_str),
]:
    Loader.add_constructor(_tag, _method)


# What was read dumps as what it means in YAML 1.2 (`010` as 10), never as text a 1.1 reader
# would take otherwise; PyYAML's safe dumper refuses the subclasses without this.
yaml.SafeDumper.add_representer(Int, lambda dumper, v: dumper.represent_int(int(v)))
yaml.SafeDumper.add_representer(Float, lambda dumper, v: dumper.represent_float(float(v)))
yaml.SafeDumper.add_representer(Plain, lambda dumper, v: dumper.represent_str(str(v)))


def read_bytes(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, refusing one over `limit` before reading it (OSError as open() raises it)."""
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"is over {limit // 1024} KiB; no profile comes near that")
    return data


def reason(exc: yaml.YAMLError) -> str:
    """PyYAML's message in one line: its own spans several and quotes the source."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f" ({exc.context})" if exc.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}{context}"
    if isinstance(exc, yaml.reader.ReaderError):
        what = "not UTF-8" if isinstance(exc.character, bytes) else exc.reason
        return f"byte {exc.position}: {what}"
    return " ".join(str(exc).split())

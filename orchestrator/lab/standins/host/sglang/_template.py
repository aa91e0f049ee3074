"""Chat templates for /v1/chat/completions: the model folder's tokenizer_config.json `chat_template`.

The real server renders it with Jinja (transformers' apply_chat_template). A lab host has no
pip and Debian's minbase has no python3-jinja2, so this module uses jinja2 when it can be
imported and otherwise a small renderer of the subset chat templates use: text, `{{ expr }}`,
`{% for x in xs %}`, `{% if %}/{% elif %}/{% else %}`, `{% set x = expr %}`, whitespace control
(`{%-`, `-%}`), and in expressions string and integer literals, names, `x['k']`, `x[0]`, `x.k`,
`loop.index0/index/first/last`, `+`, `==`, `!=`, `not`, `and`, `or`, `( )` and the `trim` filter.
Anything else is a TemplateError, as an unknown tag is in Jinja.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: transformers' message when a tokenizer has no chat template (what SGLang passes on as a 400).
NO_TEMPLATE = (
    "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
    "argument was passed! For information about writing templates and setting the "
    "tokenizer.chat_template attribute, please see the documentation at "
    "https://huggingface.co/docs/transformers/main/en/chat_templating"
)


class TemplateError(ValueError):
    pass


def load(model_dir: Path) -> tuple[str | None, str]:
    """(chat_template, bos_token) from the folder's tokenizer_config.json; (None, "") without."""
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None, ""
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    bos = config.get("bos_token") or ""
    if isinstance(bos, dict):
        bos = bos.get("content", "")
    return (template if isinstance(template, str) else None), str(bos)


def render(
    template: str, messages: list[dict], *, bos_token: str = "", add_generation_prompt: bool = True
) -> str:
    context = {"messages": messages, "bos_token": bos_token, "add_generation_prompt": add_generation_prompt}
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # what transformers uses
    except ImportError:
        return render_subset(template, context)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(**context)


# --- the subset renderer ----------------------------------------------------------------------

_TAG = re.compile(r"(\{\{-?|\{%-?)(.*?)(-?\}\}|-?%\})", re.S)


def _lex(template: str) -> list[tuple[str, str]]:
    """[("text", s) | ("expr", e) | ("stmt", s)] with whitespace control applied."""
    out: list[tuple[str, str]] = []
    pos, strip_next = 0, False
    for m in _TAG.finditer(template):
        text = template[pos : m.start()]
        if strip_next:
            text = text.lstrip()
        if m.group(1).endswith("-"):
            text = text.rstrip()
        elif m.group(1) == "{%":  # lstrip_blocks, as transformers renders: a tag's indentation goes
            text = re.sub(r"(^|\n)[ \t]+$", r"\1", text)
        out.append(("text", text))
        out.append(("expr" if m.group(1).startswith("{{") else "stmt", m.group(2).strip()))
        strip_next = m.group(3).startswith("-")
        if m.group(3).endswith("%}") and not strip_next and template[m.end() : m.end() + 1] == "\n":
            pos = m.end() + 1  # trim_blocks: the newline after a block tag goes
        else:
            pos = m.end()
    tail = template[pos:]
    out.append(("text", tail.lstrip() if strip_next else tail))
    return [t for t in out if t != ("text", "")]


def _parse(tokens: list[tuple[str, str]], i: int, ends: tuple[str, ...]) -> tuple[list, int, str]:
    """Nodes up to a statement starting with one of `ends`; returns (nodes, next index, that stmt)."""
    nodes: list = []
    while i < len(tokens):
        kind, body = tokens[i]
        i += 1
        if kind != "stmt":
            nodes.append((kind, body))
            continue
        word = body.split(None, 1)[0] if body else ""
        if word in ends:
            return nodes, i, body
        if word == "for":
            m = re.fullmatch(r"for\s+(\w+)\s+in\s+(.+)", body, re.S)
            if not m:
                raise TemplateError(f"bad for: {body}")
            inner, i, _ = _parse(tokens, i, ("endfor",))
            nodes.append(("for", m.group(1), m.group(2), inner))
        elif word == "if":
            branches, cond = [], body[2:].strip()
            while True:
                inner, i, end = _parse(tokens, i, ("elif", "else", "endif"))
                branches.append((cond, inner))
                if end.startswith("endif"):
                    break
                cond = end[4:].strip() if end.startswith("elif") else "true"
            nodes.append(("if", branches))
        elif word == "set":
            m = re.fullmatch(r"set\s+(\w+)\s*=\s*(.+)", body, re.S)
            if not m:
                raise TemplateError(f"bad set: {body}")
            nodes.append(("set", m.group(1), m.group(2)))
        else:
            raise TemplateError(f"unknown tag: {word}")
    if ends:
        raise TemplateError(f"missing {ends[-1]}")
    return nodes, i, ""


_EXPR_TOKEN = re.compile(
    r"\s*(?:('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(\d+)|(\w+)|(==|!=|[-+\[\]().|~]))", re.S
)


class _Expr:
    """Recursive descent over one expression: or > and > not > compare > concat > filter > atom."""

    def __init__(self, text: str, scope: dict[str, Any]) -> None:
        self.tokens: list[tuple[str, Any]] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = _EXPR_TOKEN.match(text, pos)
            if not m:
                raise TemplateError(f"cannot read {text[pos:]!r}")
            pos = m.end()
            string, number, name, op = m.groups()
            if string is not None:
                self.tokens.append(("val", _unquote(string)))
            elif number is not None:
                self.tokens.append(("val", int(number)))
            elif name in ("true", "True", "false", "False", "none", "None"):
                self.tokens.append(("val", {"t": True, "T": True, "f": False, "F": False}.get(name[0])))
            elif name is not None:
                self.tokens.append(("name", name))
            else:
                self.tokens.append(("op", op))
        self.scope, self.i = scope, 0

    def value(self) -> Any:
        result = self._or()
        if self.i != len(self.tokens):
            raise TemplateError(f"unexpected {self.tokens[self.i][1]!r}")
        return result

    def _peek(self, *want: str) -> bool:
        return (
            self.i < len(self.tokens) and self.tokens[self.i][1] in want and self.tokens[self.i][0] != "val"
        )

    def _or(self) -> Any:
        left = self._and()
        while self._peek("or"):
            self.i += 1
            right = self._and()
            left = left or right
        return left

    def _and(self) -> Any:
        left = self._not()
        while self._peek("and"):
            self.i += 1
            right = self._not()
            left = left and right
        return left

    def _not(self) -> Any:
        if self._peek("not"):
            self.i += 1
            return not self._not()
        return self._compare()

    def _compare(self) -> Any:
        left = self._concat()
        if self._peek("==", "!="):
            op = self.tokens[self.i][1]
            self.i += 1
            right = self._concat()
            return (left == right) if op == "==" else (left != right)
        return left

    def _concat(self) -> Any:
        left = self._filtered()
        while self._peek("+", "~"):
            op = self.tokens[self.i][1]
            self.i += 1
            right = self._filtered()
            left = f"{left}{right}" if op == "~" else left + right
        return left

    def _filtered(self) -> Any:
        value = self._atom()
        while self._peek("|"):
            self.i += 1
            name = self._take("name")
            if name != "trim":
                raise TemplateError(f"unknown filter: {name}")
            value = str(value).strip()
        return value

    def _take(self, kind: str) -> Any:
        if self.i >= len(self.tokens) or self.tokens[self.i][0] != kind:
            raise TemplateError("unexpected end of expression")
        self.i += 1
        return self.tokens[self.i - 1][1]

    def _atom(self) -> Any:
        if self._peek("("):
            self.i += 1
            value = self._or()
            self._expect(")")
        elif self.i < len(self.tokens) and self.tokens[self.i][0] == "val":
            value = self._take("val")
        else:
            name = self._take("name")
            value = self.scope.get(name)
        while self._peek("[", "."):
            if self.tokens[self.i][1] == ".":
                self.i += 1
                value = _item(value, self._take("name"))
            else:
                self.i += 1
                key = self._or()
                self._expect("]")
                value = _item(value, key)
        return value

    def _expect(self, op: str) -> None:
        if not self._peek(op):
            raise TemplateError(f"expected {op}")
        self.i += 1


def _unquote(literal: str) -> str:
    """A Jinja string literal's value (it may span lines, as Llama 3's '...\\n\\n' does in JSON)."""
    escapes = {"n": "\n", "t": "\t", "r": "\r"}
    return re.sub(r"\\(.)", lambda m: escapes.get(m.group(1), m.group(1)), literal[1:-1], flags=re.S)


def _item(value: Any, key: Any) -> Any:
    try:
        return value[key]
    except (KeyError, IndexError, TypeError):
        return None


def _run(nodes: list, scope: dict[str, Any], out: list[str]) -> None:
    for node in nodes:
        kind = node[0]
        if kind == "text":
            out.append(node[1])
        elif kind == "expr":
            value = _Expr(node[1], scope).value()
            out.append("" if value is None else str(value))
        elif kind == "set":
            scope[node[1]] = _Expr(node[2], scope).value()
        elif kind == "if":
            for cond, body in node[1]:
                if _Expr(cond, scope).value():
                    _run(body, scope, out)
                    break
        elif kind == "for":
            items = list(_Expr(node[2], scope).value() or [])
            for index, item in enumerate(items):
                loop = {
                    "index0": index,
                    "index": index + 1,
                    "first": index == 0,
                    "last": index == len(items) - 1,
                }
                _run(node[3], {**scope, node[1]: item, "loop": loop}, out)


def render_subset(template: str, context: dict[str, Any]) -> str:
    nodes, _, _ = _parse(_lex(template), 0, ())
    out: list[str] = []
    _run(nodes, dict(context), out)
    return "".join(out)

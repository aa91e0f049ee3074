#!/usr/bin/env python3
"""Refresh the shipped types of SGLang's options: `python3 scripts/sglang_types.py 0.5.15 [0.5.20 ...]`.

For each version: `pip download --no-deps sglang==VERSION` (the wheel that scripts/sglang_help.py
installs to make the help text: 5 to 40 MB, none of its dependencies), then SGLang's own argument
declarations are read from it without importing anything, and
orchestrator/profile/sglang_help/launch_server-types-<VERSION>.json gets, for every option SGLang's
launch_server parser registers, the `type=` argparse converts its value with: "int", "float",
"str", the name of SGLang's own converter as its source spells it ("json.loads",
"json_list_type", "human_readable_int", ...), or null where SGLang gives none (a switch, or a
value argparse hands over as text). `--source DIR` reads a source tree instead, such as
`python/` of a checkout of the tag vVERSION.

Where the declarations are, and how `type=` follows from them:
- 0.5.9: `parser.add_argument(..., type=...)` calls in ServerArgs.add_cli_args (server_args.py).
- 0.5.15: fields of the ServerArgs dataclass annotated `A[T, "help"]` or `A[T, Arg(...)]`,
  turned into arguments by arg_groups/arg_utils.py:add_cli_args_from_dataclass, plus a few
  add_argument calls left in add_cli_args. That function's rules, as field_type below follows
  them: `Arg(action=...)` takes `action_kwargs["type"]` if any; Optional[X] is X; Literal[...]
  takes the type of its first value; List[X] (without type_parser) gives X per value; bool is
  a switch; otherwise type_parser, else int, float or str from the annotation (any other
  annotation, a Union or Dict or class, becomes str).
- 0.5.20 on: the same, with the fields declared on the namespace classes of
  arg_groups/fields/*.py that server_args.py lists in `_INPUT_NAMESPACES`.
- Every version: the options of smg-grpc-servicer's plugin where the shipped help lists them
  (PLUGIN_TYPES).

scripts/sglang_help.py builds SGLang's real parser from a full install and reports where its
types differ from these files (`--check` there), which is how the reading here was proven.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.profile import sglang_flags  # noqa: E402 (the checkout's, not an installed copy)

SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields"

#: What add_cli_args_from_dataclass's _infer_type_func maps to itself; all else becomes str.
_INFERRED = ("int", "float", "str")

#: Options that smg-grpc-servicer's SGLang plugin (the `sglang.srt.plugins` entry point
#: smg-servicer, loaded by launch_server before it parses) adds to SGLang's parser, and their
#: `type=`: read from smg_grpc_servicer 0.14.1's metrics_flag.py and servicer_impl_flag.py
#: (`--servicer-impl` has choices python, rust and no type). SGLang does not pin that package, so
#: a help text has them when the servicer pip installed then had them (0.5.15 and 0.5.20 do,
#: 0.5.23 does not): a table takes those its version's shipped help lists.
PLUGIN_TYPES: dict[str, str | None] = {
    "--servicer-impl": None,
    "--metrics-port": "int",
    "--metrics-host": None,
}


class Failed(Exception):
    pass


@dataclass(frozen=True)
class Source:
    """The declaration files of one SGLang version: relative path -> text."""

    files: dict[str, str]
    origin: str  # what they were read from, for the table's "from" line

    def tree(self, path: str) -> ast.Module:
        return ast.parse(self.files[path], filename=path)


def from_wheel(version: str, work: Path) -> Source:
    """The declaration files of the PyPI wheel of sglang `version`."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "-q", "--no-deps"]
    result = subprocess.run(
        [*pip, "-d", str(work), f"sglang=={version}"], capture_output=True, text=True, check=False
    )
    wheels = sorted(work.glob(f"sglang-{version}-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise Failed(f"pip download sglang=={version} gave {len(wheels)} wheels:\n  " + "\n  ".join(tail))
    wheel = wheels[0]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as archive:
        wanted = [n for n in archive.namelist() if n == SERVER_ARGS or _is_fields_file(n)]
        files = {n: archive.read(n).decode() for n in wanted}
    return Source(files, f"{wheel.name} (sha256 {digest})")


def from_tree(root: Path) -> Source:
    """The declaration files of a source tree holding sglang/srt/server_args.py."""
    paths = [root / SERVER_ARGS, *sorted((root / FIELDS_DIR).glob("*.py"))]
    files = {p.relative_to(root).as_posix(): p.read_text() for p in paths if p.is_file()}
    if SERVER_ARGS not in files:
        raise Failed(f"{root} has no {SERVER_ARGS}")
    return Source(files, str(root))


def _is_fields_file(name: str) -> bool:
    return name.startswith(f"{FIELDS_DIR}/") and name.endswith(".py") and name.count("/") == 4


# --- Reading the declarations ---------------------------------------------------------


def option_types(source: Source) -> dict[str, str | None]:
    """Every option SGLang's ServerArgs.add_cli_args registers -> its `type=` (None: none)."""
    module = source.tree(SERVER_ARGS)
    server_args = _class(module, "ServerArgs")
    if server_args is None:
        raise Failed(f"{SERVER_ARGS} defines no class ServerArgs")
    types: dict[str, str | None] = {}
    for cls in [server_args, *_namespaces(source, module)]:
        # A field annotated twice in one class body is one field, of the last annotation.
        fields = {
            s.target.id: s.annotation
            for s in cls.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
        for name, annotation in fields.items():
            declared = field_type(name, annotation)
            if declared is not None:
                _add(types, *declared)
    add_cli_args = _method(server_args, "add_cli_args")
    if add_cli_args is None:
        raise Failed("ServerArgs has no add_cli_args")
    for node in ast.walk(add_cli_args):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            _add(types, *argument_type(node))
    return types


def _add(types: dict[str, str | None], names: list[str], type_name: str | None) -> None:
    for name in names:
        if name in types:
            raise Failed(f"{name} is declared twice")
        types[name] = type_name


def _class(module: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _namespaces(source: Source, module: ast.Module) -> list[ast.ClassDef]:
    """The classes `_INPUT_NAMESPACES` lists (0.5.20 on), with the classes they derive from."""
    listed: list[str] = []
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in stmt.targets
        ):
            if not isinstance(stmt.value, ast.List) or not all(
                isinstance(e, ast.Name) for e in stmt.value.elts
            ):
                raise Failed("_INPUT_NAMESPACES is not a plain list of class names")
            listed = [e.id for e in stmt.value.elts]  # type: ignore[attr-defined]
    if not listed:
        return []
    classes: dict[str, ast.ClassDef] = {}
    for path in source.files:
        if path.startswith(FIELDS_DIR):
            for node in source.tree(path).body:
                if isinstance(node, ast.ClassDef):
                    classes[node.name] = node
    out: list[ast.ClassDef] = []
    for name in listed:
        if name not in classes:
            raise Failed(f"_INPUT_NAMESPACES names {name}, which no file of {FIELDS_DIR} defines")
        # msgspec.structs.fields includes the fields of a base Struct declared beside it.
        out.extend(classes[b.id] for b in classes[name].bases if isinstance(b, ast.Name) and b.id in classes)
        out.append(classes[name])
    return out


def field_type(field: str, annotation: ast.expr) -> tuple[list[str], str | None] | None:
    """(the option names, the type) of a field that add_cli_args_from_dataclass makes an
    argument of, or None for a field it skips (no Arg or help string, or `no_cli=True`)."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    arg = next((p for p in parts[1:] if _is_arg(p) or _is_text(p)), None)
    if arg is None:
        return None
    meta = _keywords(arg) if _is_arg(arg) else {}
    if _constant(meta.get("no_cli"), False):
        return None
    names = [_constant(meta.get("cli_name"), None) or "--" + field.replace("_", "-")]
    aliases = meta.get("aliases")
    if aliases is not None:
        if not isinstance(aliases, ast.List) or not all(isinstance(e, ast.Constant) for e in aliases.elts):
            raise Failed(f"{field}: aliases is not a list of strings")
        names += [e.value for e in aliases.elts]  # type: ignore[attr-defined]
    if "action" in meta:
        kwargs = meta.get("action_kwargs")
        given = _dict_item(kwargs, "type") if kwargs is not None else None
        return _negated(names, meta["action"]), ast.unparse(given) if given is not None else None
    parser = ast.unparse(meta["type_parser"]) if "type_parser" in meta else None
    inner = _unwrap_optional(parts[0])
    head = _subscript_head(inner)
    if head == "Literal":
        values = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]  # type: ignore[attr-defined]
        first = values[0]
        kind = type(first.value).__name__ if isinstance(first, ast.Constant) else "?"
        return names, parser or _infer(kind)
    if head in ("List", "list") and parser is None:
        elem = inner.slice  # type: ignore[attr-defined]
        return names, _infer(ast.unparse(elem))
    if ast.unparse(inner) == "bool":
        return names, None
    return names, parser or _infer(ast.unparse(inner))


def argument_type(call: ast.Call) -> tuple[list[str], str | None]:
    """(the option names, the type) of a `parser.add_argument(...)` call."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(names) != len(call.args) or not names:
        raise Failed(f"line {call.lineno}: add_argument with option names that are not plain strings")
    keywords = {k.arg: k.value for k in call.keywords}
    if None in keywords:
        raise Failed(f"line {call.lineno}: add_argument(**...) for {names[0]}")
    given = keywords.get("type")
    if "action" in keywords:
        names = _negated(names, keywords["action"])
    return names, ast.unparse(given) if given is not None else None


def _negated(names: list[str], action: ast.expr) -> list[str]:
    """The names of an option with its `--no-` forms, which BooleanOptionalAction adds."""
    if ast.unparse(action).rpartition(".")[2] != "BooleanOptionalAction":
        return names
    return names + ["--no-" + n[2:] for n in names if n.startswith("--")]


def _is_arg(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "Arg"


def _is_text(node: ast.expr) -> bool:
    """A help string: a literal, an f-string, or a sum of them (`"..." + f"..."`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_text(node.left)


def _keywords(call: ast.expr) -> dict[str, ast.expr]:
    assert isinstance(call, ast.Call)
    if call.args or any(k.arg is None for k in call.keywords):
        raise Failed(f"line {call.lineno}: Arg(...) with positional or ** arguments")
    return {k.arg: k.value for k in call.keywords if k.arg is not None}


def _constant(node: ast.expr | None, default):
    if node is None:
        return default
    if not isinstance(node, ast.Constant):
        raise Failed(f"line {node.lineno}: {ast.unparse(node)} is not a literal")
    return node.value


def _dict_item(node: ast.expr, key: str) -> ast.expr | None:
    if not isinstance(node, ast.Dict):
        raise Failed(f"line {node.lineno}: action_kwargs is not a literal dict")
    for k, v in zip(node.keys, node.values, strict=True):
        if isinstance(k, ast.Constant) and k.value == key:
            return v
    return None


def _subscript_head(node: ast.expr) -> str | None:
    return ast.unparse(node.value).removeprefix("typing.") if isinstance(node, ast.Subscript) else None


def _union_members(node: ast.expr) -> list[ast.expr]:
    """The members of a union, nested ones flattened as typing does: Optional[Union[a, b]]."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    head = _subscript_head(node)
    if head == "Optional":
        return [*_union_members(node.slice), ast.Constant(None)]  # type: ignore[attr-defined]
    if head == "Union":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]  # type: ignore[attr-defined]
        return [m for e in elts for m in _union_members(e)]
    return [node]


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """arg_utils._unwrap_optional: a union of one type and None is that type; others stay."""
    members = _union_members(node)
    if len(members) == 1:
        return members[0]
    real = [
        m
        for m in members
        if not (isinstance(m, ast.Constant) and m.value is None) and ast.unparse(m) != "None"
    ]
    return real[0] if len(real) == 1 else node


def _infer(name: str) -> str:
    """arg_utils._infer_type_func: int, float and str are themselves, anything else str."""
    return name if name in _INFERRED else "str"


# --- Writing ---------------------------------------------------------------------------


def types_path(version: str, out: Path) -> Path:
    return out / sglang_flags.types_path(version).name


def render(version: str, source: Source, types: dict[str, str | None]) -> str:
    doc = {
        "sglang": version,
        "from": source.origin,
        "made_by": "scripts/sglang_types.py",
        "types": dict(sorted(types.items())),
    }
    return json.dumps(doc, indent=1) + "\n"


def help_names(version: str) -> set[str]:
    """The options of the shipped help of `version` and those it hides (HIDDEN), less argparse's
    own --help: the names a table must have."""
    help_file = sglang_flags.help_path(version)
    if not help_file.is_file():
        raise Failed(f"no {help_file.name}: make it first (scripts/sglang_help.py {version})")
    table = sglang_flags.FlagTable(version, sglang_flags.parse_help(help_file.read_text()))
    return {n for o in table.all_options for n in o.names} - {"-h", "--help"}


def with_plugin(version: str, types: dict[str, str | None]) -> dict[str, str | None]:
    """`types` and the plugin options (PLUGIN_TYPES) that the shipped help of `version` lists."""
    listed = help_names(version)
    return {**types, **{n: t for n, t in PLUGIN_TYPES.items() if n in listed and n not in types}}


def verify(version: str, types: dict[str, str | None]) -> None:
    """The table names exactly the options of the shipped help (and HIDDEN), so a table read
    from the wrong release is never written."""
    listed = help_names(version)
    extra, missing = sorted(set(types) - listed), sorted(listed - set(types))
    if extra or missing:
        raise Failed(
            f"the declarations read do not match the shipped --help of {version}: "
            f"not in the help: {', '.join(extra) or 'none'}; not declared: {', '.join(missing) or 'none'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="SGLang releases, e.g. 0.5.15")
    parser.add_argument(
        "--source", type=Path, help="a source tree to read (one VERSION) instead of the wheel"
    )
    parser.add_argument("--out", type=Path, default=sglang_flags.HELP_DIR, help="where the tables go")
    parser.add_argument("--check", action="store_true", help="compare with the files there; write none")
    args = parser.parse_args()
    if args.source and len(args.versions) != 1:
        parser.error("--source reads one version")
    failed = 0
    for version in args.versions:
        try:
            with tempfile.TemporaryDirectory(prefix=f"sglang-types-{version}-") as work:
                source = from_tree(args.source) if args.source else from_wheel(version, Path(work))
                types = with_plugin(version, option_types(source))
            verify(version, types)
        except Failed as exc:
            print(f"error: SGLang {version}: {exc}", file=sys.stderr)
            failed += 1
            continue
        text = render(version, source, types)
        path = types_path(version, args.out)
        counts = ", ".join(f"{n} {k}" for k, n in _counts(types).items())
        if args.check:
            same = path.is_file() and json.loads(path.read_text())["types"] == json.loads(text)["types"]
            print(f"{path}: {'identical' if same else 'DIFFERS'} ({counts})")
            failed += not same
        else:
            path.write_text(text)
            print(f"wrote {path} ({counts})")
    return 1 if failed else 0


def _counts(types: dict[str, str | None]) -> dict[str, int]:
    kinds = [
        "int" if t == "int" else "float" if t == "float" else "no type" if t is None else "other"
        for t in types.values()
    ]
    return {k: kinds.count(k) for k in ("int", "float", "other", "no type")}


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Write the option declarations that follow from the modules' ARGUMENT_SPEC: `python3 scripts/role_specs.py`
(`--check`: only name the files that are not as it would write them, exit 1).

An option of a module is declared once: in the ARGUMENT_SPEC of the module that takes it
(plugins/modules/<module>.py), with its type, default, choices, no_log and a `description`
(a string, or a list of paragraphs). Options that several modules take are declared once in
plugins/module_utils/orchestrator_host/options.py (PATHS_SPEC, PREFLIGHT_OPTIONS) and used from there.
AnsibleModule ignores `description`; what validates on the host is the same dict as ever.

From those declarations this writes:
- the `options:` of each module's DOCUMENTATION, the rest of which is the module's own. A module
  that takes the shared `paths` gets
  `extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]` instead of a copy, and
  states only a description of its own, if it has one;
- plugins/doc_fragments/orchestrator_paths.py, the documentation of `paths`;
- each role's meta/argument_specs.yml: an entry point per tasks/<entry>.yml, whose options are
  those of the collection's module its task runs (orchestrator.sglang.<module>), each a role
  variable named `<role>_<option>` (RENAMED aside), I(option) in a description naming the variable.
  An entry's short_description and description are the file's own, kept as they are;
- each role's defaults/main.yml: the variables with a default, with the first sentence of their
  description above each.

ansible-doc reads them from the collection (orchestrator/hosts/ansible_config.py collections_dir):
`ANSIBLE_COLLECTIONS_PATH=DIR ansible-doc orchestrator.sglang.gpu_idle`, a role's
`ANSIBLE_COLLECTIONS_PATH=DIR ansible-doc -t role orchestrator.sglang.gpu_idle`.
tests/unit/test_role_specs.py fails when a file is not as this writes it.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.paths import (  # noqa: E402 (the checkout's)
    COLLECTION,
    MODULES_DIR,
    ROLES_DIR,
    host_imports,
)

host_imports()

from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import (  # noqa: E402
    options as host,
)

COMMAND = "python3 scripts/role_specs.py"
#: Role variables that are not `<role>_<option>`, by role and option.
RENAMED = {
    # not sglang_unit_unit_name
    "sglang_unit": {"unit_name": "sglang_unit_name"},
    # sglang_health_wait's options predate the role's names
    "sglang_health": {"unit": "sglang_health_unit_name"},
    # the option is the record's own key
    "sglang_record": {"unit": "sglang_record_unit_content"},
}
#: The doc fragment that documents PATHS_SPEC, for every module taking it as `paths`.
FRAGMENT = f"{COLLECTION}.orchestrator_paths"
FRAGMENT_FILE = MODULES_DIR.parent / "doc_fragments" / "orchestrator_paths.py"
WIDTH = 110
_MARKUP = re.compile(r"\b([CI])\(([^()]*)\)")


class Failed(Exception):
    """A declaration this cannot write out as it is."""


# --- reading the declarations --------------------------------------------------------------


def load(path: Path) -> types.ModuleType:
    """A module file, imported as Ansible would run it (its module_utils from the checkout)."""
    spec = importlib.util.spec_from_file_location(f"_role_specs_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry_points(role: Path) -> dict[str, str]:
    """{entry point: the collection's module its tasks/<entry>.yml runs}, main first."""
    ours = {f"{COLLECTION}.{p.stem}": p.stem for p in MODULES_DIR.glob("*.py")}
    found = {}
    for path in sorted((role / "tasks").glob("*.yml"), key=lambda p: (p.stem != "main", p.stem)):
        runs = {ours[key] for task in yaml.safe_load(path.read_text()) or [] for key in task if key in ours}
        if len(runs) > 1:
            raise Failed(
                f"{path.relative_to(ROOT)} runs {sorted(runs)}: one module of the role an entry point"
            )
        if runs:
            found[path.stem] = runs.pop()
    if "main" not in found:
        raise Failed(f"{role.relative_to(ROOT)}/tasks/main.yml runs no module of {COLLECTION}")
    return found


def role_var(role: str, option: str) -> str:
    """The role variable that sets a module option."""
    return RENAMED.get(role, {}).get(option, f"{role}_{option}")


def _check(where: str, spec: dict[str, dict[str, Any]]) -> None:
    """Each option described, and required or with a default (a role variable is never undefined)."""
    for name, opt in spec.items():
        if not opt.get("description"):
            raise Failed(f"{where}: option {name} has no description")
        if bool(opt.get("required")) == ("default" in opt):
            raise Failed(f"{where}: option {name} must be either required or have a default")
        if "options" in opt:
            _check(f"{where}: {name}", opt["options"])


# --- YAML as the house writes it: a flow mapping where one fits on the line ---------------------


def _reads_back(text: str, value: Any) -> bool:
    try:
        return yaml.safe_load(text) == value
    except yaml.YAMLError:
        return False


def scalar(value: Any, in_flow: bool = True) -> str:
    """One scalar, plain where YAML reads it back as the same value (in a flow mapping too, if `in_flow`)."""
    if isinstance(value, str):
        plain = value and _reads_back(f"k: {value}", {"k": value})
        if plain and (not in_flow or _reads_back(f"{{k: {value}}}", {"k": value})):
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    raise Failed(f"no scalar: {value!r}")


def flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def _prose(value: Any) -> bool:
    """A list of paragraphs (a description), written one item a line."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and " " in v for v in value)


def _wrapped(first: str, rest: str, text: str, expect: Any, dedent: int) -> list[str]:
    """`text` after `first`, continued on lines starting `rest`: plain, or else double-quoted."""
    for form in (scalar(text, in_flow=False), json.dumps(text, ensure_ascii=False)):
        lines = textwrap.wrap(
            form,
            WIDTH,
            initial_indent=first,
            subsequent_indent=rest,
            break_long_words=False,
            break_on_hyphens=False,
        )
        if _reads_back("\n".join(line[dedent:] for line in lines), expect):
            return lines
    raise Failed(f"cannot write as YAML: {text!r}")


def block(mapping: dict[str, Any], indent: int) -> list[str]:
    """A mapping's lines at `indent`: each entry on one line where it fits, else opened up."""
    pad = " " * indent
    lines = []
    for key, value in mapping.items():
        one = f"{pad}{key}: {flow(value)}"
        if isinstance(value, dict) and value and len(one) > WIDTH:
            lines += [f"{pad}{key}:", *block(value, indent + 2)]
        elif _prose(value) or (isinstance(value, list) and len(one) > WIDTH):
            lines.append(f"{pad}{key}:")
            for item in value:
                lines += _wrapped(f"{pad}  - ", f"{pad}    ", item, [item], indent + 2)
        elif isinstance(value, str):
            lines += _wrapped(f"{pad}{key}: ", f"{pad}  ", value, {key: value}, indent)
        else:
            lines.append(one)
    return lines


# --- what is written ------------------------------------------------------------------------


def doc_option(opt: dict[str, Any]) -> dict[str, Any]:
    """An ARGUMENT_SPEC entry as DOCUMENTATION states it."""
    out: dict[str, Any] = {"description": opt["description"], "type": opt.get("type", "str")}
    for key in ("elements", "required", "default", "choices"):
        if key in opt and (key != "required" or opt[key]):
            out[key] = opt[key]
    if "options" in opt:
        out["suboptions"] = {name: doc_option(sub) for name, sub in opt["options"].items()}
    return out


def _shared_paths(opt: dict[str, Any]) -> bool:
    """Whether an option is PATHS_SPEC (its description aside): the fragment documents it."""
    return {k: v for k, v in opt.items() if k != "description"} == {
        k: v for k, v in host.PATHS_SPEC.items() if k != "description"
    }


def doc_options(spec: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """DOCUMENTATION's options of a module, and whether it extends the paths fragment."""
    options, fragment = {}, False
    for name, opt in spec.items():
        if _shared_paths(opt):
            fragment = True
            if opt["description"] != host.PATHS_SPEC["description"]:
                options[name] = {"description": opt["description"]}
        else:
            options[name] = doc_option(opt)
    return options, fragment


def _named(text: Any, names: dict[str, str]) -> Any:
    """I(option...) in a description as I(role_variable...)."""
    if isinstance(text, list):
        return [_named(t, names) for t in text]
    return re.sub(r"\bI\((\w+)", lambda m: f"I({names.get(m.group(1), m.group(1))}", text)


def role_option(opt: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An ARGUMENT_SPEC entry as a role's argument_specs.yml states it."""
    out: dict[str, Any] = {"type": opt.get("type", "str")}
    for key in ("elements", "required", "default", "choices", "no_log"):
        if key in opt and (key not in ("required", "no_log") or opt[key]):
            out[key] = opt[key]
    out["description"] = _named(opt["description"], names)
    if "options" in opt:
        out["options"] = {name: role_option(sub, names) for name, sub in opt["options"].items()}
    return out


def role_options(role: str, spec: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    names = {option: role_var(role, option) for option in spec}
    return {names[option]: role_option(opt, names) for option, opt in spec.items()}


def _header(specs: dict[str, tuple[str, dict]], *more: str) -> list[str]:
    """The comment that says where a file comes from."""
    sources = [
        f"plugins/modules/{module}.py" + (f" ({entry})" if len(specs) > 1 else "")
        for entry, (module, _) in specs.items()
    ]
    text = f"Written by {COMMAND} from the ARGUMENT_SPEC of {' and '.join(sources)}: change an option there, "
    text += "then run it." + "".join(f" {m}" for m in more)
    return textwrap.wrap(text, WIDTH, initial_indent="# ", subsequent_indent="# ")


def argument_specs(role: Path, specs: dict[str, tuple[str, dict]]) -> str:
    """meta/argument_specs.yml: every entry point's options from its module; the rest kept."""
    path = role / "meta/argument_specs.yml"
    old = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {"argument_specs": {}}
    entries = {}
    for entry, (module, spec) in specs.items():
        kept = {k: v for k, v in old["argument_specs"].get(entry, {}).items() if k != "options"}
        kept.setdefault(
            "short_description",
            yaml.safe_load(load_doc(MODULES_DIR / f"{module}.py"))["short_description"],
        )
        entries[entry] = {**kept, "options": role_options(role.name, spec)}
    own = "An entry point's short_description and description are this file's own."
    text = "\n".join(["---", *_header(specs, own), *block({"argument_specs": entries}, 0)]) + "\n"
    if not _reads_back(text, {"argument_specs": entries}):
        raise Failed(f"{path.relative_to(ROOT)} would not read back as written")
    return text


def _first_sentence(text: Any, names: dict[str, str]) -> str:
    """A description's first sentence without markup, options named as the role's variables."""
    para = text if isinstance(text, str) else text[0]
    para = _MARKUP.sub(lambda m: m.group(2), _named(para, names))
    match = re.search(r"\.(\s|$)", para)
    return para[: match.start() + 1] if match else para


def defaults(role: Path, specs: dict[str, tuple[str, dict]]) -> str:
    """defaults/main.yml: each optional variable's default, under its description's first sentence."""
    values: dict[str, Any] = {}
    comments: dict[str, str] = {}
    required: list[str] = []
    for _, spec in specs.values():
        names = {option: role_var(role.name, option) for option in spec}
        for option, opt in spec.items():
            var = names[option]
            if (var in required) if "default" in opt else (var in values):
                raise Failed(
                    f"{role.name}: {var} is required in one entry point and has a default in another"
                )
            if "default" not in opt:
                required += [] if var in required else [var]
                continue
            if var in values and values[var] != opt["default"]:
                raise Failed(f"{role.name}: {var} has two defaults ({values[var]!r}, {opt['default']!r})")
            values[var] = opt["default"]
            comments.setdefault(var, _first_sentence(opt["description"], names))
    lines = ["---", *_header(specs)]
    if required:
        lines += textwrap.wrap(
            "Required, no default: " + ", ".join(required) + ".",
            WIDTH,
            initial_indent="# ",
            subsequent_indent="#   ",
        )
    for var, value in values.items():
        lines += ["", *textwrap.wrap(comments[var], WIDTH, initial_indent="# ", subsequent_indent="# ")]
        lines += block({var: value}, 0)
    text = "\n".join(lines) + "\n"
    if not _reads_back(text, values or None):
        raise Failed(f"{role.name}/defaults/main.yml would not read back as written")
    return text


def load_doc(path: Path) -> str:
    """The DOCUMENTATION string of a module file."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "DOCUMENTATION" for t in node.targets
        ):
            return node.value.value  # type: ignore[attr-defined]
    raise Failed(f"{path.relative_to(ROOT)} has no DOCUMENTATION")


def documentation(path: Path, spec: dict[str, dict[str, Any]]) -> str:
    """The module file with DOCUMENTATION's `options:` (and fragment line) written from `spec`, last."""
    source = path.read_text()
    opening = 'DOCUMENTATION = r"""'
    start = source.index(opening) + len(opening)
    end = source.index('"""', start)
    ours = f"extends_documentation_fragment: [{FRAGMENT}]"
    note = f"# Written by {COMMAND} from ARGUMENT_SPEC below:"
    lines = [line for line in source[start:end].split("\n") if line not in (ours, note)]
    if "options:" not in lines or lines[-1] != "":
        raise Failed(f"{path.relative_to(ROOT)}: DOCUMENTATION has no top-level `options:` line")
    if any(line.startswith("extends_documentation_fragment:") for line in lines):
        raise Failed(f"{path.relative_to(ROOT)}: extends_documentation_fragment is this script's ({ours})")
    first = lines.index("options:")
    last = next((i for i in range(first + 1, len(lines)) if re.match(r"[A-Za-z_]", lines[i])), len(lines) - 1)
    options, fragment = doc_options(spec)
    written = [note, *([ours] if fragment else [])]
    written += ["options:", *block(options, 2)] if options else ["options: {}"]
    # The options last: what follows them (attributes, notes) is the module's own, kept above.
    doc = "\n".join(lines[:first] + lines[last:-1] + written + [""])
    parsed = yaml.safe_load(doc)
    if parsed.get("options") != (options or {}) or '"""' in doc:
        raise Failed(f"{path.relative_to(ROOT)}: DOCUMENTATION would not read back as written")
    return source[:start] + doc + source[end:]


def fragment() -> str:
    """plugins/doc_fragments/orchestrator_paths.py: the documentation of PATHS_SPEC."""
    doc = "\n".join(["options:", *block({"paths": doc_option(host.PATHS_SPEC)}, 2)])
    return (
        '"""`paths`, as every module that takes orchestrator_host.options.PATHS_SPEC has it.\n\n'
        f"Written by {COMMAND} from plugins/module_utils/orchestrator_host/options.py: change\n"
        'PATHS_SPEC there, then run it."""\n\n\n'
        "class ModuleDocFragment:\n"
        f'    DOCUMENTATION = r"""\n{doc}\n"""\n'
    )


def expected() -> dict[Path, str]:
    """Every file this writes, as it writes it."""
    _check("orchestrator_host.options.PATHS_SPEC", {"paths": host.PATHS_SPEC})
    _check("orchestrator_host.options.PREFLIGHT_OPTIONS", host.PREFLIGHT_OPTIONS)
    out = {FRAGMENT_FILE: fragment()}
    argspecs = {}
    for path in sorted(MODULES_DIR.glob("*.py")):
        argspecs[path.stem] = load(path).ARGUMENT_SPEC
        _check(str(path.relative_to(ROOT)), argspecs[path.stem])
        out[path] = documentation(path, argspecs[path.stem])
    for role in sorted(p for p in ROLES_DIR.iterdir() if p.is_dir()):
        specs = {entry: (module, argspecs[module]) for entry, module in entry_points(role).items()}
        out[role / "meta/argument_specs.yml"] = argument_specs(role, specs)
        out[role / "defaults/main.yml"] = defaults(role, specs)
    return out


def stale(files: dict[Path, str]) -> list[Path]:
    """The files that are not as `files` (expected()) has them."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only name the stale files; exit 1 if any")
    args = parser.parse_args()
    try:
        files = expected()
    except Failed as exc:
        print(f"role_specs: {exc}", file=sys.stderr)
        return 2
    changed = stale(files)
    for path in changed:
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path])
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

"""No import cycles among the orchestrator's own modules.

A cycle works only as long as every module in it happens to be imported in the right
order (or hides the import inside a function), and it means neither module can be read
or tested without the other. Every import counts: at the top, inside a function, or
under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
#: Files copied onto the lab hosts and run there as their own packages, never imported as ours.
HOST_FILES = PACKAGE / "lab" / "standins" / "host"


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p, PACKAGE): p for p in sorted(PACKAGE.rglob("*.py")) if not p.is_relative_to(HOST_FILES)
    }


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The orchestrator modules `path` (module `name`) imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(path, name, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, by breadth-first search."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in component {component}")


def test_the_orchestrator_has_no_import_cycles() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_graph())]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_a_cycle_is_named_module_by_module() -> None:
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def test_relative_and_lazy_imports_are_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "orchestrator"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from orchestrator.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("from ..a import f\n")
    modules = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    got = {name: _imported(path, name, modules) for name, path in modules.items()}
    assert got["orchestrator.a"] == {"orchestrator.sub.b"}
    assert got["orchestrator.sub.b"] == {"orchestrator.a", "orchestrator.sub.c"}
    assert got["orchestrator.sub.c"] == {"orchestrator.a"}


def test_the_cli_starts_without_scipy() -> None:
    """scipy (stats.py: Welch's t-test, t intervals) is imported by the functions that compare, so
    `--help`, and the help of the commands that compare, start without it (about 0.3 s)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from orchestrator.cli.main import cli\n"
        "for args in (['--help'], ['results', '--help'], ['sweep', '--help'], ['bench', '--help']):\n"
        "    assert CliRunner().invoke(cli, args).exit_code == 0, args\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'numpy', 'matplotlib')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


#: The layers, bottom first (docs/architecture.md): a module imports its own layer and those below.
#: The root's modules are the foundation, beside each layer: errors, paths and the ledger, which
#: every layer uses. `api` is the public interface over the engine; `cli` is the top; the lab's
#: code serves the CLI and copies profile/sglang_flags.py onto its hosts.
LAYERS: dict[str, set[str]] = {
    "orchestrator": set(),
    # The foundation's ledger is a folder of its own (its SQL, schema and migrations).
    "orchestrator.ledger": {"orchestrator"},
    "orchestrator.profile": {"orchestrator"},
    "orchestrator.render": {"orchestrator", "orchestrator.profile"},
    "orchestrator.hosts": {"orchestrator", "orchestrator.profile", "orchestrator.render"},
    "orchestrator.tuning": {
        "orchestrator",
        "orchestrator.profile",
        "orchestrator.render",
        "orchestrator.hosts",
    },
    "orchestrator.lab": {"orchestrator", "orchestrator.profile"},
    "orchestrator.api": {
        "orchestrator",
        "orchestrator.profile",
        "orchestrator.render",
        "orchestrator.hosts",
        "orchestrator.tuning",
    },
    "orchestrator.cli": {
        "orchestrator",
        "orchestrator.profile",
        "orchestrator.render",
        "orchestrator.hosts",
        "orchestrator.tuning",
        "orchestrator.lab",
    },
    "orchestrator.__main__": {"orchestrator.cli"},
}


#: Every layer may import these: errors.py and paths.py (the root), and ledger/.
FOUNDATION = ("orchestrator", "orchestrator.ledger")


def _layer(module: str) -> str:
    """The layer a module belongs to: its subpackage, or the root for the foundation's modules."""
    parts = module.split(".")
    if len(parts) == 1 or module in ("orchestrator.errors", "orchestrator.paths"):
        return "orchestrator"
    name = ".".join(parts[:2])
    assert name in LAYERS, f"{module}: in no layer; add its package to LAYERS and docs/architecture.md"
    return name


def test_layers_import_only_downward() -> None:
    wrong = [
        f"{module} ({_layer(module)}) imports {dep} ({_layer(dep)})"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _layer(dep) != _layer(module)
        and _layer(dep) not in LAYERS[_layer(module)]
        and not (_layer(dep) in FOUNDATION and _layer(module) not in FOUNDATION)
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_package_says_what_it_may_import() -> None:
    """Each layer's __init__.py names what lives there and the layers it may import."""
    for name in LAYERS:
        path = PACKAGE.parent / (name.replace(".", "/") + "/__init__.py")
        if not path.is_file() or name == "orchestrator":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        where = path.relative_to(PACKAGE.parent)
        assert "May import:" in doc, f"{where}: say what it may import"
        said = doc[doc.index("May import:") :].split("\n\n")[0]
        named = set(re.findall(r"\b(\w+)/", said))
        allowed = {layer.split(".")[1] for layer in LAYERS[name] if layer != "orchestrator"}
        assert named == allowed, f"{where} says it may import {sorted(named)}; LAYERS says {sorted(allowed)}"
        assert "foundation" in said, f"{where}: every layer may import the foundation; say so"


def test_command_modules_import_no_other_command_module() -> None:
    """Each command module of cli/ loads alone when its command runs: what two share lives in
    cli/console.py, cli/view.py or cli/params.py (the option types)."""
    graph = _graph()
    commands = {
        m for m in graph if m.startswith("orchestrator.cli.") and m.endswith(("_command", "_commands"))
    }
    wrong = [f"{m} imports {dep}" for m in sorted(commands) for dep in sorted(graph[m] & commands)]
    assert not wrong, "\n".join(wrong)


def test_every_command_is_loaded_from_cli() -> None:
    """LazyGroup loads commands by name (importlib), which the graph above cannot see: each one's
    module is in cli/ and exists."""
    from orchestrator.cli.main import LazyGroup

    modules = _modules()
    for name, target in LazyGroup.LAZY.items():
        module = target.partition(":")[0]
        assert module.startswith("orchestrator.cli.") and module in modules, f"{name}: {target}"

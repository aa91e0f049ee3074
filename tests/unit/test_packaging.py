"""What a `pip install` gets (issue 15): the package carries the Ansible content and the examples,
finds them where it is installed, and declares what its commands import. The wheel itself is built,
installed and run in tests/lab/test_wheel.py."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator import paths
from orchestrator.hosts.verify import run as verify_run
from orchestrator.tuning import bench

CHECKOUT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
#: The stand-ins copied onto lab hosts: data of orchestrator.lab.standins, not packages of ours.
HOST_FILES = CHECKOUT / "orchestrator" / "lab" / "standins" / "host"
#: Top-level folders shipped inside the package, and what runs on hosts rather than here.
SHIPPED = ("playbooks", "roles", "plugins", "meta", "templates", "profiles")


def test_every_python_package_of_ours_is_in_the_wheel() -> None:
    found = {
        ".".join(p.parent.relative_to(CHECKOUT).parts)
        for p in (CHECKOUT / "orchestrator").rglob("__init__.py")
        if not p.is_relative_to(HOST_FILES)
    }
    assert found <= set(SETUPTOOLS["packages"]), "add the new package to [tool.setuptools] packages"


def test_the_top_level_folders_ship_inside_the_package() -> None:
    assert SETUPTOOLS["package-dir"] == {f"orchestrator.{name}": name for name in SHIPPED}
    assert {f"orchestrator.{name}" for name in SHIPPED} <= set(SETUPTOOLS["packages"])
    assert SETUPTOOLS["exclude-package-data"] == {"*": ["*.pyc"]}


def test_paths_in_a_checkout() -> None:
    assert paths.CHECKOUT == paths.ROOT == CHECKOUT
    for folder in (paths.PLAYBOOKS_DIR, paths.ROLES_DIR, paths.TEMPLATES_DIR, paths.EXAMPLES_DIR):
        assert folder.is_dir() and folder.parent == CHECKOUT
    assert (paths.MODULE_UTILS_DIR / "orchestrator_host" / "__init__.py").is_file()
    assert not any((CHECKOUT / "orchestrator" / name).exists() for name in SHIPPED), (
        "orchestrator/playbooks/ in a checkout would make paths.py take it for an installed wheel"
    )


def test_the_collections_plugins_ship_as_files() -> None:
    """plugins/ (modules, module_utils/orchestrator_host/, the strategy, the doc fragment) is the
    collection's, not a package of ours: its files ship as orchestrator.plugins' data, every one,
    folders included, and meta/runtime.yml with them."""
    plugins = paths.ROOT / "plugins"
    files = {p for p in plugins.rglob("*.py") if "__pycache__" not in p.parts}
    patterns = SETUPTOOLS["package-data"]["orchestrator.plugins"]
    shipped = {p for pattern in patterns for p in plugins.glob(pattern)}
    assert paths.MODULE_UTILS_DIR / "orchestrator_host" / "gpus.py" in files
    assert plugins / "strategy" / "orchestrator_linear.py" in files
    assert files <= shipped, sorted(map(str, files - shipped))
    assert not [name for name in SETUPTOOLS["packages"] if "module_utils" in name]
    assert SETUPTOOLS["package-data"]["orchestrator.meta"] == ["*.yml"]


def test_paths_in_an_installed_wheel(tmp_path: Path) -> None:
    """The wheel's layout: site-packages/orchestrator/{playbooks,roles,templates,profiles}."""
    package = tmp_path / "site-packages" / "orchestrator"
    for name in SHIPPED:
        (package / name).mkdir(parents=True)
    (package / "paths.py").write_text((CHECKOUT / "orchestrator" / "paths.py").read_text())
    spec = importlib.util.spec_from_file_location("installed_paths", package / "paths.py")
    assert spec and spec.loader
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    seen = {name: getattr(installed, name) for name in ("CHECKOUT", "ROOT", "PLAYBOOKS_DIR", "EXAMPLES_DIR")}
    assert seen == {
        "CHECKOUT": None,
        "ROOT": package,
        "PLAYBOOKS_DIR": package / "playbooks",
        "EXAMPLES_DIR": package / "profiles",
    }


def _third_party_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "orchestrator"}


def _canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): pydantic_core is pydantic-core."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {_canonical(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}


def test_runtime_dependencies_are_what_the_commands_import() -> None:
    """`verify` imports pytest and testinfra: a plain install must have them. matplotlib is the
    [plot] extra, imported by plot.py alone."""
    distributions = importlib.metadata.packages_distributions()
    imported: dict[str, set[str]] = {}
    for path in sorted((CHECKOUT / "orchestrator").rglob("*.py")):
        if path.is_relative_to(HOST_FILES):  # runs on the lab hosts
            continue
        for name in _third_party_imports(path):
            for dist in distributions.get(name, [name]):
                imported.setdefault(_canonical(dist), set()).add(path.name)
    declared = _requirement_names(PYPROJECT["project"]["dependencies"])
    plot = _requirement_names(PYPROJECT["project"]["optional-dependencies"]["plot"])
    assert imported.pop("matplotlib") == {"plot.py"} and plot == {"matplotlib"}
    assert set(imported) <= declared, sorted(set(imported) - declared)
    # verify runs pytest in-process, with testinfra as its plugin (the --hosts=ansible://... it passes)
    assert "pytest" in imported and "--hosts=" in (CHECKOUT / "orchestrator/hosts/verify/run.py").read_text()
    assert "pytest-testinfra" in declared


def test_plot_without_matplotlib_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.cli.main import cli

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what find_spec reports for a missing one
    result = CliRunner().invoke(cli, ["results", "--plot", str(tmp_path / "tok_s.png")])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --plot draws with matplotlib, which is not installed: pip install 'orchestrator[plot]' "
        "(under pipx: pipx inject orchestrator matplotlib)\n"
    )
    assert result.stdout == ""


def test_an_installed_wheel_records_its_version_not_a_foreign_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv inside the team's own repository must not record that repository's commit."""
    monkeypatch.setattr(bench, "CHECKOUT", None)
    assert bench.git_commit() == f"v{importlib.metadata.version('orchestrator')}"


def test_verify_finds_our_ansible_without_our_venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """pipx puts only `orchestrator` on PATH; testinfra starts `ansible-inventory` by name."""
    ours = sysconfig.get_path("scripts")
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", ours, "/bin"]))
    assert verify_run._path_first_ours().split(os.pathsep) == [ours, "/usr/bin", "/bin"]


def test_no_two_test_files_share_a_name() -> None:
    """The test folders are not packages, so pytest imports each test file by its bare name: two
    files named alike fail the whole collection ("import file mismatch"), as CI did once."""
    seen: dict[str, Path] = {}
    for path in sorted((CHECKOUT / "tests").rglob("*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path or path.name == "conftest.py", f"{other} and {path} share a name"

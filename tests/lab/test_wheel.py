"""The tool as a team installs it (issue 15): the wheel built from this checkout, installed into a
fresh venv with nothing else, and run from an empty directory outside the checkout through the venv's
`orchestrator` script alone, as pipx leaves it (the venv's bin/ on no PATH).

validate, render and a read-only preflight of this machine need no lab; deploy (no -i: the lab, as
the README's first command), verify and bench run on the lab's first host. Installing needs the
package index, as `pip install` does.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.lab import nspawn
from orchestrator.paths import CHECKOUT, EXAMPLES_DIR
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.wheel

#: The checkout's folders that ship inside the package, under orchestrator/.
SHIPPED = ("playbooks", "roles", "plugins", "meta", "templates", "profiles")
LOAD = ["--requests", "2", "--concurrency", "2", "--max-tokens", "96", "--warmup", "1"]


def _check(argv: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{argv}: rc {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _files() -> list[str]:
    """The checkout's files as a fresh clone has them, with new files not yet committed."""
    listed = _check(["git", "-C", CHECKOUT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
    return [name for name in listed.stdout.split("\0") if name and (CHECKOUT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build --wheel` of a copy of the checkout (the tree itself keeps no build/)."""
    assert CHECKOUT is not None, "run the tests from a checkout"
    source = tmp_path_factory.mktemp("source")
    for name in _files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((CHECKOUT / name).read_bytes())
    dist = tmp_path_factory.mktemp("dist")
    _check([sys.executable, "-m", "build", "--wheel", "--outdir", dist, source])
    (built,) = dist.glob("orchestrator-*.whl")
    return built


@pytest.fixture(scope="module")
def orchestrator_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    _check([sys.executable, "-m", "venv", venv])
    _check([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel])
    return venv / "bin" / "orchestrator"


@pytest.fixture
def run(orchestrator_bin: Path, tmp_path: Path):
    """The installed command, from an empty directory, with nothing of the checkout around it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "ORCHESTRATOR_PROFILES", "ANSIBLE_CONFIG", "ANSIBLE_INVENTORY")
    env = {k: v for k, v in os.environ.items() if k not in drop}

    def command(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(orchestrator_bin), *args],
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return command


def test_the_wheel_carries_the_ansible_content_and_the_examples(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    print(f"\n{wheel.name}: {len(names)} files")
    expected = {
        f"orchestrator/{name}" if name.split("/")[0] in SHIPPED else name
        for name in _files()
        if name.split("/")[0] in (*SHIPPED, "orchestrator")
    }
    assert expected <= set(names), sorted(expected - set(names))
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert {n.split("/")[0] for n in names} == {"orchestrator", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in (
        "plugins/modules/sglang_probe.py",
        "plugins/module_utils/orchestrator_host/__init__.py",
        "plugins/module_utils/orchestrator_host/preflight.py",
        "plugins/strategy/orchestrator_linear.py",
        "meta/runtime.yml",
    ):
        assert f"orchestrator/{module}" in names


def test_validate_and_render_from_an_empty_directory(run) -> None:
    done = run("validate")
    assert done.returncode == 0, done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines()] == [
        f"example:{name}" for name in profile_mod.examples()
    ]
    done = run("render", "-p", "example:cg_5tok")
    assert done.returncode == 0, done.stderr
    assert done.stdout == launch.build(profile_mod.load(str(EXAMPLES_DIR / "cg_5tok.yml"))).unit
    done = run("render", "-p", "cg_5tok")
    assert done.returncode == 2
    assert done.stderr.startswith("error: unknown profile 'cg_5tok' (the shipped example is example:cg_5tok)")
    done = run("results", "--plot", "tok_s.png")  # matplotlib is an extra the venv does not have
    assert (done.returncode, done.stdout) == (2, "")
    assert "pip install 'orchestrator[plot]'" in done.stderr and len(done.stderr.splitlines()) == 1


def test_preflight_runs_the_shipped_roles_and_modules(run, tmp_path: Path) -> None:
    """Read-only checks of this machine over a local connection: Ansible finds the strategy plugin,
    the role, its module and module_utils inside the installed package. This machine has no
    SGLang, model or GPU, so each check reports a problem (exit 1), none a missing file."""
    inventory = tmp_path / "here.yml"
    inventory.write_text(
        "all:\n  hosts:\n    here:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
    )
    done = run("preflight", "-p", "example:cg_5tok", "-i", str(inventory))
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("here: ") for line in lines), done.stdout
    assert any("nvidia-smi" in line for line in lines), done.stdout


@pytest.mark.lab
def test_deploy_verify_and_bench_on_the_lab_from_an_empty_directory(lab, run) -> None:
    defaults = inspect.signature(nspawn.up).parameters
    default_lab = tuple(defaults[name].default for name in ("hosts", "gpus", "sglang_version"))
    if (len(lab.hosts), lab.gpus, lab.sglang_version) != default_lab:
        pytest.skip("without -i, deploy uses the default lab, and the one up is not (ORCH_LAB_HOSTS?)")
    host = lab.hosts[0].name
    done = run("deploy", "-p", "example:cg_5tok", "--limit", host, "--force-restart", "--json")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (report,) = json.loads(done.stdout)["hosts"]
    assert report["ok"] and report["restarted"], report
    done = run("verify", "-p", "example:cg_5tok", "--limit", host, "--json")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    checks = json.loads(done.stdout)["checks"]
    assert checks and all(c["passed"] for c in checks), checks
    done = run("bench", "-p", "example:cg_5tok", "--limit", host, *LOAD, "--json")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    row = json.loads(done.stdout)
    assert (row["host"], row["profile"], row["errors"]) == (host, "cg_5tok", 0)
    assert row["tok_s"] > 0 and row["git_commit"].startswith("v")

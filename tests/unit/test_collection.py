"""The Ansible collection orchestrator.sglang (issue 27): the checkout's playbooks, roles and plugins
build into it with ansible-galaxy, it passes ansible-test sanity as built and installed, the CLI runs
the same files, and `orchestrator plan` writes the extra vars a team's own ansible-playbook passes
to it. tests/lab/test_team_playbooks.py runs a team's playbooks on it with plain ansible-playbook."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import StateError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts.ansible_config import collections_dir
from orchestrator.paths import COLLECTION, ROOT
from orchestrator.profile import model as profile_mod

#: What the collection is made of: every file under these, and the files named.
CONTENT = ("playbooks", "roles", "plugins", "meta", "tests/sanity")
NAMED = ("docs/collection.md", "tests/config.yml")
#: ansible-test's stand-in for get-pip.py (scripts/ansible_test_get_pip.py), see _offline_pip.
GET_PIP = ROOT / "scripts" / "ansible_test_get_pip.py"


def _ansible(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).with_name(argv[0])  # the ansible-core beside this Python
    done = subprocess.run(
        [str(tool) if tool.exists() else argv[0], *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball `ansible-galaxy collection build` makes of the checkout."""
    out = tmp_path_factory.mktemp("build")
    _ansible("ansible-galaxy", "collection", "build", "--output-path", str(out), cwd=ROOT)
    [tarball] = out.glob("orchestrator-sglang-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def installed(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball installed as a team installs it: DIR/ansible_collections/orchestrator/sglang."""
    top = tmp_path_factory.mktemp("collections")
    _ansible("ansible-galaxy", "collection", "install", str(built), "-p", str(top), cwd=top)
    return top / "ansible_collections" / "orchestrator" / "sglang"


def _shipped_files() -> set[str]:
    found = {
        str(p.relative_to(ROOT))
        for part in CONTENT
        for p in (ROOT / part).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    return found | set(NAMED)


def test_the_collection_builds_from_the_checkouts_content_and_nothing_else(built: Path) -> None:
    with tarfile.open(built) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert names - {"MANIFEST.json", "FILES.json"} == _shipped_files()
    info = manifest["collection_info"]
    assert f"{info['namespace']}.{info['name']}" == COLLECTION
    # one version for the package and the collection
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{info["version"]}"' in pyproject


def test_the_cli_runs_the_checkout_as_the_collection() -> None:
    """One copy: the collection path the CLI's plays get leads back to this checkout."""
    namespace, name = COLLECTION.split(".")
    assert (collections_dir() / "ansible_collections" / namespace / name).resolve() == ROOT


def test_an_unwritable_cache_is_an_error_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cache").write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(StateError, match="point XDG_CACHE_HOME at a writable directory"):
        collections_dir()


def test_every_role_and_module_is_called_by_its_fqcn() -> None:
    """A role of the collection finds the collection's modules by name only through the FQCN in a
    team's play; the playbooks name roles the same way."""
    modules = {p.stem for p in (ROOT / "plugins/modules").glob("*.py")}
    roles = {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()}
    short = re.compile(rf"^\s*(?:- )?(?:name: )?({'|'.join(sorted(modules | roles))}):?\s*$", re.M)
    for path in [*(ROOT / "roles").rglob("tasks/*.yml"), *(ROOT / "playbooks").rglob("*.yml")]:
        assert not short.findall(path.read_text()), path


def _offline_pip() -> None:
    """ansible-test bootstraps pip into each sanity venv with get-pip.py from
    ci-files.testing.ansible.com, which machines that reach only PyPI cannot fetch; its message says
    to save the script under ~/.ansible/test/cache. The one saved there does the same job with the
    pip Python bundles (ensurepip) and PyPI. The pip release is the one this ansible-test asks for."""
    import ansible_test

    source = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    [version] = re.findall(r"pip='([0-9.]+)'", source.read_text())
    cache = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    if not cache.exists() or cache.read_bytes() != GET_PIP.read_bytes():
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(GET_PIP, cache)


@pytest.mark.skipif(shutil.which("git") is None, reason="ansible-test needs git")
def test_ansible_test_sanity_passes_on_the_built_collection(installed: Path) -> None:
    """Every sanity test of this ansible-core (validate-modules, pylint, yamllint, ansible-doc,
    import, compile, ...), on the controller's Python; tests/sanity/ignore-*.txt names the two
    exceptions and why."""
    _offline_pip()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    done = _ansible("ansible-test", "sanity", "--python", python, "--color", "no", cwd=installed, env=env)
    ran = re.findall(r'^Running sanity test "([\w-]+)"', done.stdout, re.M)
    print(f"\nansible-test sanity: {len(ran)} tests passed")
    assert {"validate-modules", "pylint", "yamllint", "ansible-doc", "import", "runtime-metadata"} <= set(ran)


# --- orchestrator plan ---------------------------------------------------------------------------


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    return inv


def test_plan_prints_what_deploy_hands_its_play(inventory: Path) -> None:
    done = CliRunner().invoke(cli, ["plan", "-p", "example:cg_5tok", "-i", str(inventory)])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout)["orch"]
    prof = profile_mod.load("example:cg_5tok")
    _, orch = deploy_mod.planned(prof, inventory, deploy_mod.Options(lock_detached=True), "r1")
    expected = orch.extravars()["orch"]
    for plan in (printed, expected):  # each run its own lock id
        for host in plan["hosts"].values():
            host["lock"]["run_id"] = host["lock"]["holder"] = "-"
    assert printed == expected
    assert sorted(printed["hosts"]) == ["gpu1", "gpu2"] and printed["secret_file"] == ""
    lock = printed["hosts"]["gpu1"]["lock"]
    assert (lock["control"], lock["pid"], lock["live_pids"]) == ("", 0, [])  # no process named


def test_a_plans_lock_and_a_live_deploys_lock_exclude_each_other(tmp_path: Path) -> None:
    """The play of a plan runs after `plan` exited: its lock must not read as a dead deploy's to a
    deploy from this machine, nor take a live deploy's lock for a dead one's."""
    from orchestrator.hosts import playvars
    from orchestrator.paths import host_imports

    host_imports()
    from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import lock

    def held(spec: playvars.LockSpec) -> dict:
        return {**spec.model_dump(), "since": time.time(), "expires": time.time() + spec.ttl_s}

    planned = playvars.lock("plan1", "cg_5tok", 600, 0, detached=True)
    # a deploy started once `plan` had exited: the plan's process is not among its live PIDs
    later = playvars.lock("deploy1", "baseline", 600, 0).model_copy(update={"live_pids": [1]})
    path = str(tmp_path / "sglang.service.lock")
    assert lock.try_lock(path, held(planned)) is None  # the team's play holds the host
    holder = lock.try_lock(path, held(later))
    assert holder is not None and holder["holder"].endswith("(orchestrator plan, run plan1)")
    Path(path).unlink()
    # a deploy that started after the plan was printed: its PID is not in the plan's snapshot
    live = playvars.lock("deploy2", "baseline", 600, 0).model_copy(update={"pid": 2**22 + 7})
    assert lock.try_lock(path, held(live)) is None  # a live deploy holds the host
    assert lock.try_lock(path, held(planned)) is not None


def test_plan_takes_the_limit_and_deploys_flags(inventory: Path) -> None:
    argv = ["plan", "-p", "example:cg_5tok", "-i", str(inventory), "--limit", "gpu2", "--force-restart"]
    done = CliRunner().invoke(cli, [*argv, "--serial", "1", "--no-preflight"])
    assert done.exit_code == 0, done.output
    orch = json.loads(done.stdout)["orch"]
    assert list(orch["hosts"]) == ["gpu2"] and orch["serial"] == "1"
    assert orch["hosts"]["gpu2"]["force_restart"] is True and orch["hosts"]["gpu2"]["preflight"] is None


def test_a_profiles_secrets_go_to_a_file_of_their_own_never_into_the_plan(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_KEY", "sk-not-in-the-plan")
    keyed = tmp_path / "keyed.yml"
    keyed.write_text("extends: example:cg_5tok\napi_key: {env: SGLANG_KEY}\n")
    base = ["plan", "-p", str(keyed), "-i", str(inventory)]
    done = CliRunner().invoke(cli, base)
    assert done.exit_code == 2 and "pass --secret-file PATH" in done.stderr, done.output
    secret = tmp_path / "secret.json"
    done = CliRunner().invoke(cli, [*base, "--secret-file", str(secret)])
    assert done.exit_code == 0, done.output
    assert "sk-not-in-the-plan" not in done.stdout
    assert json.loads(done.stdout)["orch"]["secret_file"] == str(secret)
    assert json.loads(secret.read_text())["api_key"] == "sk-not-in-the-plan"
    assert secret.stat().st_mode & 0o777 == 0o600
    again = CliRunner().invoke(cli, [*base, "--secret-file", str(secret)])
    assert again.exit_code == 2 and "the file exists" in again.stderr
    plain = CliRunner().invoke(
        cli, ["plan", "-p", "example:cg_5tok", "-i", str(inventory), "--secret-file", str(secret)]
    )
    assert plain.exit_code == 2 and "has no secrets: drop --secret-file" in plain.stderr


def test_a_host_name_ansible_reads_as_a_pattern_is_refused_before_any_play(tmp_path: Path) -> None:
    """The play's host list is the plan's host names, each read by Ansible as a pattern: an IPv6
    address with a zone id would be split at its colons and the host silently left out."""
    inv = tmp_path / "hosts.yml"
    inv.write_text('all:\n  hosts:\n    gpu1: {}\n    "fe80::1%eth0": {}\n')
    done = CliRunner().invoke(cli, ["plan", "-p", "example:cg_5tok", "-i", str(inv)])
    assert done.exit_code == 2, done.output
    assert "'fe80::1%eth0' reads as an Ansible host pattern" in done.stderr
    assert "rename the host in the inventory" in done.stderr

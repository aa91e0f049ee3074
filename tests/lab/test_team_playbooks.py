"""A team's own playbooks on the built collection orchestrator.sglang, run with plain
`ansible-playbook` (issue 27): docs/playbooks.md's site.yml (its own play, then import_playbook of
orchestrator.sglang.deploy) and check.yml (the role orchestrator.sglang.sglang_preflight), each
taken from docs/playbooks.md, with the extra vars `orchestrator plan` printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from labutil import orchestrator, service, ssh, write_profile
from orchestrator.paths import ROOT

pytestmark = pytest.mark.lab

PAGE = (ROOT / "docs" / "playbooks.md").read_text()


def readme_playbook(name: str) -> str:
    """docs/playbooks.md's ```yaml block that starts with the line `# NAME`."""
    [found] = re.findall(rf"```yaml\n(# {re.escape(name)}\n.*?)```", PAGE, re.S)
    return found


def _ansible(*argv: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).with_name(argv[0])
    return subprocess.run(
        [str(tool) if tool.exists() else argv[0], *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _recap(out: str, host: str) -> dict[str, int]:
    [line] = [line for line in out.splitlines() if line.startswith(f"{host} ") and "ok=" in line]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_a_teams_playbooks_run_the_built_collection_with_plain_ansible_playbook(lab, tmp_path) -> None:
    host = lab.hosts[1]
    # a unit of this run's own (its name is in the unit), so the first play restarts whatever ran
    profile_name = f"team_{uuid.uuid4().hex[:8]}"
    team = write_profile(tmp_path, profile_name, "extends: baseline\nnccl:\n  NCCL_DEBUG: WARN\n")
    # built and installed as a team would (not the checkout the CLI links)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"), "ANSIBLE_NOCOLOR": "1"}
    done = _ansible(
        "ansible-galaxy", "collection", "build", "--output-path", str(tmp_path), cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    [tarball] = tmp_path.glob("orchestrator-sglang-*.tar.gz")
    done = _ansible(
        "ansible-galaxy", "collection", "install", str(tarball), "-p", "collections", cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    for name in ("site.yml", "check.yml"):
        (tmp_path / name).write_text(readme_playbook(name))

    planned = orchestrator("plan", "--profile", team, "-i", str(lab.inventory), "--limit", host.name)
    assert planned.returncode == 0, planned.stderr
    (tmp_path / "plan.json").write_text(planned.stdout)
    play = ["ansible-playbook", "-i", str(lab.inventory), "-e", "@plan.json"]  # the plan's hosts only
    before = service(host)["MainPID"]

    first = _ansible(*play, "site.yml", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-3000:]
    assert f"{host.name} gets {profile_name}" in first.stdout  # the team's own play ran first
    others = [h.name for h in lab.hosts if h is not host]
    assert not [h for h in others if re.search(rf"^{h}\s+:", first.stdout, re.M)]  # planned hosts only
    assert "TASK [orchestrator.sglang.sglang_restart : " in first.stdout  # from the installed copy
    assert _recap(first.stdout, host.name)["changed"] >= 1
    unit = ssh(host, "cat", "/etc/systemd/system/sglang.service")
    assert f"# profile: {profile_name}\n" in unit and "NCCL_DEBUG=WARN" in unit
    now = service(host)
    assert now["ActiveState"] == "active" and now["MainPID"] not in ("0", before)

    again = _ansible(*play, "site.yml", cwd=tmp_path, env=env)  # the same plan: nothing to do
    assert again.returncode == 0, again.stdout[-3000:]
    assert _recap(again.stdout, host.name)["changed"] == 0 and service(host)["MainPID"] == now["MainPID"]

    checked = _ansible(*play, "check.yml", cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "TASK [orchestrator.sglang.sglang_preflight : " in checked.stdout
    assert _recap(checked.stdout, host.name) | {"ok": 0} == {
        "ok": 0, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0, "ignored": 0,
    }  # fmt: skip
    # a plan the host cannot run fails the check, naming why: a model path the host lacks
    plan = json.loads(planned.stdout)
    plan["orch"]["hosts"][host.name]["preflight"]["model_path"] = "/data/models/not-there"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    failed = _ansible(*play, "check.yml", cwd=tmp_path, env=env)
    assert failed.returncode == 2 and "/data/models/not-there" in failed.stdout, failed.stdout[-3000:]

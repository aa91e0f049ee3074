"""systemd's own parser on the control machine: `systemd-analyze verify` reads the planned units.

It reads them before any host is touched. systemd_rules.py refuses, in pure Python, what it knows
systemd 252 would refuse or change. This module asks systemd itself, where it is installed here,
about the exact unit text a host will get.

Some lines systemd would drop or cannot read: "ignoring", "Failed to parse", "Invalid". The unit
still loads, verify exits 0, and the server would start without the setting. So each such line is a
problem. It is located at the profile field that wrote the line, else named by its directive.

What only holds on this machine is left out. That is verify's complaints about the unit as a whole,
such as the executable or the container engine missing here. They carry no line number. And verify
looks up no users. The hosts verify the unit again before their server stops (roles/sglang_preflight,
roles/sglang_unit). They read systemd's output the same way
(module_utils/orchestrator_host/systemd.py unit_complaints).

There is one `systemd-analyze verify` run per distinct unit, about 40 ms each. The ranks of a
multi-node server differ in argv, and replicas share one unit. Where systemd-analyze is not
installed (a laptop without systemd), the check is skipped, with a note.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import Problem, ProfileError
from orchestrator.paths import module_utils
from orchestrator.profile import systemd_rules
from orchestrator.profile.model import Profile
from orchestrator.render.launch import Plan

#: Seconds one verify may take; it takes well under one.
TIMEOUT_S = 30
#: The profile field that writes each directive the template renders from the profile.
FIELDS = {
    "User": "service.user",
    "WorkingDirectory": "service.working_directory",
    "CacheDirectory": "service.unit_name",
    "EnvironmentFile": "service.environment_files",
    "LoadCredential": "api_key",
    "ExecStart": "server",
    "Restart": "service.restart",
    "RestartSec": "service.restart_sec",
    "TimeoutStartSec": "service.start_timeout_s",
    "TimeoutStopSec": "service.stop_timeout_s",
    "StartLimitBurst": "service.start_limit_burst",
    "StartLimitIntervalSec": "service.start_limit_interval_s",
    "LimitMEMLOCK": "service.limits.memlock",
    "LimitNOFILE": "service.limits.nofile",
}


@dataclass(frozen=True)
class Verdict:
    """What systemd-analyze here made of a profile's units."""

    problems: list[Problem] = field(default_factory=list)
    #: Why nothing was checked ("" when it was).
    skipped: str = ""


def check(profile: Profile, plans: Iterable[Plan]) -> Verdict:
    """systemd-analyze verify over each distinct unit of `plans` (a profile's plan, or each host's)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return Verdict(skipped="systemd-analyze is not installed here: only the hosts verify the unit")
    units = {p.unit: p.unit_name for p in plans}
    problems: list[Problem] = []
    for unit, unit_name in units.items():
        try:
            lost = _verify(analyze, unit, unit_name)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Verdict(skipped=f"systemd-analyze verify did not run here ({exc}): only the hosts verify")
        problems += [Problem(profile.name, *_located(profile, unit, n, message)) for n, message in lost]
    return Verdict(list(dict.fromkeys(problems)))


def require(profile: Profile, plans: Iterable[Plan]) -> Verdict:
    """check(), raising its problems as a ProfileError (deploy, render: nothing goes on)."""
    verdict = check(profile, plans)
    if verdict.problems:
        raise ProfileError(verdict.problems)
    return verdict


def _verify(analyze: str, unit: str, unit_name: str) -> list[tuple[int, str]]:
    """(line, message) of what systemd would drop from `unit`, named `unit_name` as on a host."""
    # systemd reads SYSTEMD_UNIT_PATH and friends: the user's own must not change the verdict.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYSTEMD_")}
    with tempfile.TemporaryDirectory(prefix="orchestrator-verify-") as folder:
        path = Path(folder, unit_name)
        path.write_text(unit)
        path.chmod(0o644)
        result = subprocess.run(
            [analyze, "verify", "--man=no", str(path)],
            capture_output=True,
            text=True,
            errors="replace",
            cwd=folder,
            env=env,
            timeout=TIMEOUT_S,
            check=False,
        )
    return module_utils("orchestrator_host.systemd").unit_complaints(result.stdout + result.stderr, str(path))


def _located(profile: Profile, unit: str, number: int, message: str) -> tuple[str, str]:
    """(field, message) of systemd's complaint about physical line `number` of `unit`."""
    first, directive = next(
        (first, directive)
        for first, directive, _, _ in reversed(systemd_rules.unit_lines(unit))
        if first <= number
    )
    loc = FIELDS.get(directive, "")
    if directive in systemd_rules.EXTRA_DIRECTIVES and directive in profile.service.extra:
        loc = f"service.extra.{directive}"
    elif directive == "Environment":
        name = re.match(r'Environment="?([^=]*)=', unit.split("\n")[first - 1])
        if name:
            loc = f"nccl.{name[1]}" if name[1] in profile.nccl else f"env.{name[1]}"
    said = message if len(message) <= 200 else f"{message[:197]}..."
    return loc, f"systemd would not use this {directive}= (unit line {first}: {said}): give a value it takes"

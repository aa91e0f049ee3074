"""The public Python interface: what a team's scripts call, and what tune itself calls.

Load a profile, render it, deploy it, bench it, roll it back:

    from pathlib import Path
    from orchestrator import api

    hosts = Path("inventory/hosts.yml")
    prof = api.load("cg_5tok")
    print(api.build(prof).unit)  # the unit each host gets
    report = api.deploy(prof, hosts, api.Options(serial="1"))
    result = api.bench(api.find_target(hosts, None, prof), api.Settings(concurrency=4))

Each name is the engine's own object, re-exported here. The modules behind them may move, but these
names stay. Nothing here prints. Results come back typed, and failures are OrchestratorError.
"""

from __future__ import annotations

from orchestrator.errors import InputError, OrchestratorError, ProfileError
from orchestrator.hosts.deploy import Options, deploy
from orchestrator.hosts.host_report import DeployReport, HostReport
from orchestrator.hosts.preflight_play import PreflightResult, preflight
from orchestrator.hosts.rollback import rollback
from orchestrator.hosts.status_play import HostStatus, status
from orchestrator.hosts.stop_play import stop
from orchestrator.profile.model import Profile, load
from orchestrator.render.launch import Plan, build
from orchestrator.tuning.bench import BenchResult, Settings, Target, Traffic, find_target
from orchestrator.tuning.bench import run as bench
from orchestrator.tuning.sweep import sweep

__all__ = [
    "BenchResult",
    "DeployReport",
    "HostReport",
    "HostStatus",
    "InputError",
    "Options",
    "OrchestratorError",
    "Plan",
    "PreflightResult",
    "Profile",
    "ProfileError",
    "Settings",
    "Target",
    "Traffic",
    "bench",
    "build",
    "deploy",
    "find_target",
    "load",
    "preflight",
    "rollback",
    "status",
    "stop",
    "sweep",
]

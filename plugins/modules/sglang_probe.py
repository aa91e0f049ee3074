#!/usr/bin/python
"""Ansible module: what is deployed on this host, and whether the plan needs a restart.

When it does, the host's deploy lock is taken here and the read-only preflight checks run
under it, so a deploy that cannot succeed fails before anything is stopped, in one task.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_probe
short_description: Read the installed SGLang unit, its facts and service state; decide on a restart
description:
  - Reads the unit file, the facts stored with it, the service state and the last-good record,
    and asks the server's /health once when the service is active.
  - The digest is the same sha256 prefix the control machine computes over the unit text, so
    equal digests mean the unit on disk is the planned one.
  - Changes nothing on the host but the deploy lock. When a restart is needed and I(lock) is
    given, takes the lock (waiting up to its wait_s) and reads everything again, since another
    deploy may have changed the host meanwhile. With I(preflight), then runs the read-only
    preflight checks and fails, releasing the lock, when they find a problem.
  - A lock with C(keep) true (a tune campaign's, held between its trials) is taken even when no
    restart is needed, and the probe never releases it; a lock this run holds from before is
    taken over. A lock of this run id without C(keep) where no restart is needed is released.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: In check mode no lock is taken; the preflight checks (read-only) still run.
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name: {description: "The systemd unit to read (and to lock, with I(lock)).", type: str, required: true}
  desired_digest:
    description: Digest of the planned unit; empty to only report (no restart decision).
    type: str
    default: ""
  secret_path:
    description: Host path of the secret --config file to compare with I(secret_content); empty if none.
    type: str
    default: ""
  secret_content:
    description: The planned secret file's text; the file at I(secret_path) is compared with it here, on the
      host, so no digest of the key leaves the control machine. Never logged.
    type: str
    default: ""
  env_path:
    description: Host path of the unit's secret EnvironmentFile= to compare with I(env_content); empty if
      none.
    type: str
    default: ""
  env_content:
    description: The planned environment file's text, compared like I(secret_content). Never logged.
    type: str
    default: ""
  adaptive_path:
    description: Host path of the server's --speculative-adaptive-config file to compare with
      I(adaptive_content); empty if none.
    type: str
    default: ""
  adaptive_content:
    description: "The planned adaptive config's text: a file that differs (or is gone) is a restart."
    type: str
    default: ""
  force_restart: {description: Restart even when nothing changed., type: bool, default: false}
  takeover:
    description:
      - A hand-started server the restart takes over, {pid, start_ticks}; {} for none.
      - "While that process runs (its PID with that start time), a restart is needed, whatever the unit: the
        restart's takeover step stops it first."
    type: dict
    default: {}
  health_url:
    description: Health URL asked once when the service is active; empty uses the stored facts' one.
    type: str
    default: ""
  lock:
    description:
      - The deploy lock to take when a restart is needed; {} takes none.
      - "Keys: holder, run_id, ttl_s, wait_s (required); control, pid, live_pids, profile, keep. A lock from a
        PID of the same control machine that is not in live_pids is stale. keep: take it even when no restart
        is needed and never release it here."
    type: dict
    default: {}
  preflight:
    description:
      - The checks to run under the lock when a restart is needed; {} runs none.
      - Keys as the I(checks) option of the sglang_preflight module.
    type: dict
    default: {}
  read_ahead:
    description:
      - "Read these model directories into the page cache when a restart is needed and preflight passed,
        before anything stops: the start then reads its weights from memory. {} reads none."
      - "Keys: dirs (the model and drafter directories), timeout_s (stop reading then), reserve_mib (memory
        left to the host: it reads at most MemAvailable minus this). Never in check mode."
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Read what runs (status)
  orchestrator.sglang.sglang_probe:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
  register: __sglang_probe

- name: Decide on a restart, lock the host and check it first
  orchestrator.sglang.sglang_probe:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    desired_digest: 0123456789abcdef
    lock: {holder: me@laptop (pid 42), run_id: r1, ttl_s: 3600, wait_s: 60}
    preflight:
      python: /opt/sglang/bin/python
      sglang_version: 0.5.4
      model_path: /models/m
      gpus: [0, 1, 2, 3]
      port: 30000
  register: __sglang_probe
"""

RETURN = r"""
installed:
  description: Whether the unit file exists.
  type: bool
  returned: always
digest:
  description: Digest of the installed unit text; empty when not installed.
  type: str
  returned: always
profile:
  description: The profile named in the installed unit's C(# profile:) header.
  type: str
  returned: always
unit:
  description: The installed unit text (units hold no secrets).
  type: str
  returned: always
facts:
  description:
    - The facts sglang_unit stored with the installed unit (profile, port, bind, gpus, health_url, ...).
    - "{} when none were stored with this very unit text."
  type: dict
  returned: always
health_url:
  description: The URL asked for /health (I(health_url), else the stored facts' one); empty if none.
  type: str
  returned: always
health_status:
  description: The HTTP status /health answered; null when not asked or nothing answered.
  type: int
  returned: always
healthy:
  description: Whether /health answered 200 (asked only when the service is active).
  type: bool
  returned: always
state:
  description: "systemctl show: LoadState, ActiveState, SubState, MainPID, NRestarts, InvocationID, ..."
  type: dict
  returned: always
uptime_s:
  description: Seconds since the service became active; null when it is not.
  type: float
  returned: always
restart_needed:
  description: Whether stop, write and start must run.
  type: bool
  returned: always
reasons:
  description: Why a restart is needed.
  type: list
  elements: str
  returned: always
last_good:
  description: "The host's last healthy deploy: profile, digest, unit, time, facts; {} if none."
  type: dict
  returned: always
locked:
  description: Whether this run now holds the host's deploy lock.
  type: bool
  returned: always
read_ahead:
  description:
    - "With I(read_ahead), where a restart is needed: what was read into the page cache before the stop
      (files, read_bytes, resident_before, resident_after, total_bytes, seconds, stopped)."
  type: dict
  returned: when read ahead
preflight:
  description:
    - "The preflight result (problems, notes, sglang_version, gpus, help_checked, verified_digest,
      memory, model_files);
      {} when not run."
  type: dict
  returned: always
end_play:
  description:
    - "The play's decision: nothing to do here, the plan already runs healthy and is recorded as
      last good (deploy.yml ends the host's play)."
  type: bool
  returned: always
wait_health:
  description: "The play's decision: wait for /health (a restart ran, or the server is not healthy)."
  type: bool
  returned: always
record:
  description:
    - "The play's decision: record the deploy as last good after health (the plan is not yet
      recorded, or this run holds the lock and the record releases it); never in check mode."
  type: bool
  returned: always
release_run_id:
  description: The run id whose lock the record releases; empty when this run holds none or keeps it.
  type: str
  returned: always
release_on_failure:
  description: Whether a failed path must release this run's lock (it holds one and does not keep it).
  type: bool
  returned: always
journal:
  description: Whether the service has an invocation whose journal can be read (status.yml).
  type: bool
  returned: always
lock_holder:
  description: The lock's content (holder, run_id, profile, since, ...) another deploy held.
  type: dict
  returned: failure, when another deploy held the lock past wait_s
"""

import hmac
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import modelfiles
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.adopt import (
    start_ticks,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files import (
    read_bytes,
    read_json,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.health import (
    health_status,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.lock import (
    acquire,
    release_if_ours,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    LOCK_OPTIONS,
    PATHS_SPEC,
    PREFLIGHT_OPTIONS,
    module_spec,
    validate_suboptions,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.preflight import (
    preflight_checks,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd import (
    systemctl_show,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    facts_path,
    record_path,
    unit_digest,
    unit_path,
)

ARGUMENT_SPEC = {
    "unit_name": {
        "type": "str",
        "required": True,
        "description": "The systemd unit to read (and to lock, with I(lock)).",
    },
    "paths": PATHS_SPEC,
    "desired_digest": {
        "type": "str",
        "default": "",
        "description": "Digest of the planned unit; empty to only report (no restart decision).",
    },
    "secret_path": {
        "type": "str",
        "default": "",
        "no_log": False,
        "description": (
            "Host path of the secret --config file to compare with I(secret_content); empty if none."
        ),
    },
    "secret_content": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": (
            "The planned secret file's text; the file at I(secret_path) is compared with it here, on "
            "the host, so no digest of the key leaves the control machine. Never logged."
        ),
    },
    "env_path": {
        "type": "str",
        "default": "",
        "no_log": False,
        "description": (
            "Host path of the unit's secret EnvironmentFile= to compare with I(env_content); empty if none."
        ),
    },
    "env_content": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": "The planned environment file's text, compared like I(secret_content). Never logged.",
    },
    "adaptive_path": {
        "type": "str",
        "default": "",
        "description": (
            "Host path of the server's --speculative-adaptive-config file to compare with "
            "I(adaptive_content); empty if none."
        ),
    },
    "adaptive_content": {
        "type": "str",
        "default": "",
        "description": "The planned adaptive config's text: a file that differs (or is gone) is a restart.",
    },
    "force_restart": {"type": "bool", "default": False, "description": "Restart even when nothing changed."},
    "takeover": {
        "type": "dict",
        "default": {},
        "description": [
            "A hand-started server the restart takes over, {pid, start_ticks}; {} for none.",
            "While that process runs (its PID with that start time), a restart is needed, whatever "
            "the unit: the restart's takeover step stops it first.",
        ],
    },
    "health_url": {
        "type": "str",
        "default": "",
        "description": "Health URL asked once when the service is active; empty uses the stored facts' one.",
    },
    "lock": {
        "type": "dict",
        "default": {},
        "description": [
            "The deploy lock to take when a restart is needed; {} takes none.",
            "Keys: holder, run_id, ttl_s, wait_s (required); control, pid, live_pids, profile, keep. A "
            "lock from a PID of the same control machine that is not in live_pids is stale. keep: take "
            "it even when no restart is needed and never release it here.",
        ],
    },
    "preflight": {
        "type": "dict",
        "default": {},
        "description": [
            "The checks to run under the lock when a restart is needed; {} runs none.",
            "Keys as the I(checks) option of the sglang_preflight module.",
        ],
    },
    "read_ahead": {
        "type": "dict",
        "default": {},
        "description": [
            "Read these model directories into the page cache when a restart is needed and preflight "
            "passed, before anything stops: the start then reads its weights from memory. {} reads none.",
            "Keys: dirs (the model and drafter directories), timeout_s (stop reading then), reserve_mib "
            "(memory left to the host: it reads at most MemAvailable minus this). Never in check mode.",
        ],
    },
}
PROPS = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ActiveEnterTimestamp",
    "ActiveEnterTimestampMonotonic",
    "ExecMainStartTimestamp",
    "InvocationID",
)


def unit_profile(text: str) -> str:
    """The profile named in the unit's `# profile:` header line."""
    match = re.search(r"^# profile: (.+)$", text, re.M)
    return match.group(1).strip() if match else ""


def uptime_s(state: dict[str, str], now_monotonic: float) -> float | None:
    value = state.get("ActiveEnterTimestampMonotonic", "")
    if state.get("ActiveState") != "active" or not value.isdigit() or value == "0":
        return None
    return round(now_monotonic - int(value) / 1e6, 1)


def secret_differs(path: str, content: str) -> bool:
    """Whether the secret --config on the host differs from the planned one. Compared here, on
    the host, in constant time: no digest of the key ever leaves the control machine."""
    if not path:
        return False
    data = read_bytes(path)
    return data is None or not hmac.compare_digest(data, content.encode())


def secrets_changed(p: dict) -> list[str]:
    """Which of the unit's files differ from the plan (compared on the host): its secrets, and the
    adaptive config (the unit shows that one's text, so only a file edited or lost differs)."""
    changed = []
    if secret_differs(p["secret_path"], p["secret_content"]):
        changed.append("secret config")
    if secret_differs(p["env_path"], p["env_content"]):
        changed.append("secret environment")
    if secret_differs(p["adaptive_path"], p["adaptive_content"]):
        changed.append("adaptive config")
    return changed


def restart_reasons(p: dict, digest: str, secret_changed: list[str], state: dict[str, str]) -> list[str]:
    """Why the planned unit needs a restart; none without a desired digest (only a report)."""
    if not p["desired_digest"]:
        return []
    reasons = []
    if not digest:
        reasons.append("unit not installed")
    elif digest != p["desired_digest"]:
        reasons.append(f"unit differs ({digest} -> {p['desired_digest']})")
    reasons += [f"{what} differs" for what in secret_changed]
    if state.get("ActiveState") != "active":
        reasons.append(f"service is {state.get('ActiveState')}")
    if p["force_restart"]:
        reasons.append("--force-restart")
    takeover = p["takeover"] or {}
    pid = int(takeover.get("pid") or 0)
    if pid and start_ticks(pid) == int(takeover.get("start_ticks") or 0):
        reasons.append(f"PID {pid}, started by hand, is taken over")
    return reasons


def stored_facts(paths: dict, unit: str, digest: str) -> dict:
    """The facts sglang_unit stored with the unit, if they were stored with this very text."""
    stored = read_json(facts_path(paths, unit))
    if not digest or stored.get("digest") != digest:
        return {}
    return {k: v for k, v in stored.items() if k != "digest"}


def probe(module: AnsibleModule) -> dict:
    """What is installed and running, and why (if at all) the plan needs a restart."""
    p = module.params
    raw = read_bytes(unit_path(p["paths"], p["unit_name"]))
    digest = unit_digest(raw) if raw is not None else ""
    text = raw.decode(errors="replace") if raw is not None else ""
    state = systemctl_show(module, p["unit_name"], PROPS)
    facts = stored_facts(p["paths"], p["unit_name"], digest)
    url = p["health_url"] or facts.get("health_url", "")
    status = health_status(url, timeout=2) if url and state.get("ActiveState") == "active" else None
    reasons = restart_reasons(p, digest, secrets_changed(p), state)
    return {
        "installed": raw is not None,
        "digest": digest,
        "profile": unit_profile(text),
        "unit": text,
        "facts": facts,
        "health_url": url,
        "health_status": status,
        "healthy": status == 200,
        "state": state,
        "uptime_s": uptime_s(state, time.clock_gettime(time.CLOCK_MONOTONIC)),
        "restart_needed": bool(reasons),
        "reasons": reasons,
        "last_good": read_json(record_path(p["paths"], p["unit_name"])),
    }


def decide(result: dict, desired_digest: str, check_mode: bool, lock: dict) -> dict:
    """What the play does next on this host, decided here so the playbooks only route it: end,
    wait for health, record (and release the lock with it), release on a failed path."""
    recorded = (result["last_good"] or {}).get("digest", "") == desired_digest
    held = result["locked"] and not lock.get("keep")
    return {
        "end_play": not result["restart_needed"] and result["healthy"] and recorded,
        "wait_health": result["restart_needed"] or not result["healthy"],
        "record": not check_mode and (result["locked"] or not recorded),
        "release_run_id": lock["run_id"] if held else "",
        "release_on_failure": held,
        "journal": bool(result["state"].get("InvocationID")),
    }


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    unit, paths = p["unit_name"], p["paths"]
    lock = validate_suboptions(module, "lock", LOCK_OPTIONS, p["lock"]) if p["lock"] else {}
    checks = (
        validate_suboptions(module, "preflight", PREFLIGHT_OPTIONS, p["preflight"]) if p["preflight"] else {}
    )
    lock = {} if module.check_mode else lock
    # A kept lock (a tune campaign's, held between its trials) is taken even where nothing
    # changes, and no path of this run lets it go: the host stays the campaign's.
    keep = bool(lock.get("keep"))
    result = {**probe(module), "locked": False, "preflight": {}}
    if lock and (result["restart_needed"] or keep):
        acquire(module, paths, unit, lock)
        # Another deploy may have changed the host while we waited.
        result = {**probe(module), "locked": True, "preflight": {}}
        if not result["restart_needed"] and not keep:
            release_if_ours(paths, unit, lock["run_id"])
            result["locked"] = False
    elif lock:
        # A lock of this run may be left: its play was stopped (Ctrl-C) before it changed the
        # host, and this is the rollback that puts it back (or a campaign's last deploy, which
        # ends the campaign's lock).
        release_if_ours(paths, unit, lock["run_id"])
    if result["restart_needed"] and checks:
        result["preflight"] = preflight_checks(module, unit, paths, checks)
        if result["preflight"]["problems"]:
            if result["locked"] and not keep:
                release_if_ours(paths, unit, lock["run_id"])
                result["locked"] = False
            result |= decide(result, p["desired_digest"], module.check_mode, lock)
            module.fail_json(
                msg="preflight: " + "; ".join(result["preflight"]["problems"]), changed=False, **result
            )
    if result["restart_needed"] and p["read_ahead"] and not module.check_mode:
        result["read_ahead"] = read_ahead(p["read_ahead"])
    result |= decide(result, p["desired_digest"], module.check_mode, lock)
    module.exit_json(changed=False, **result)


def read_ahead(spec: dict) -> dict:
    """The model's files not yet in the page cache, read into it before the stop, when the host
    has the memory for all of them (MemAvailable less the larger of `reserve_mib` and a tenth of
    MemTotal): modelfiles.read_ahead's report. A model larger than that is not read at all
    (`stopped: memory`): a part would be evicted again by the rest as the server loads it. Nor
    where the kernel does not say what is cached (`stopped: unknown`): each deploy would read it all."""
    files = modelfiles.weight_files([d for d in spec.get("dirs") or [] if d])
    available = modelfiles.available_bytes()
    reserve = max(int(spec.get("reserve_mib") or 0) * 2**20, modelfiles.available_bytes("MemTotal") // 10)
    budget = available - reserve if available >= 0 else 0
    total = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    if total - max(0, modelfiles.available_bytes("Cached")) > budget:
        resident = -1  # more than the page cache holds now could be missing: no need to ask which
        stopped = "memory"
    else:  # mincore over every page: 5 s for Kimi-K2.5's 555 GiB, so only for a model that may fit
        resident, total = modelfiles.resident(files)
        stopped = "unknown" if resident < 0 else "memory" if total - resident > budget else ""
    if stopped:
        return {
            "files": len(files),
            "read_bytes": 0,
            "resident_before": resident,
            "resident_after": resident,
            "total_bytes": total,
            "available_bytes": available,
            "seconds": 0.0,
            "stopped": stopped,
        }
    report = modelfiles.read_ahead(files, budget, float(spec.get("timeout_s") or 0))
    return {**report, "available_bytes": available}


if __name__ == "__main__":
    main()

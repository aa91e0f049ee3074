#!/usr/bin/python
"""Ansible module: wait for SGLang's /health to answer 200 while watching its unit.

Polling alone would wait out the whole health timeout (up to 30 minutes) for a server
that died in its first second; watching ActiveState, MainPID and NRestarts between polls
fails the deploy as soon as the process is gone, with the journal's last lines.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_health_wait
short_description: Wait for an HTTP health endpoint while the systemd unit behind it stays alive
description:
  - Polls I(url) from the host until it answers 200; between polls reads the unit's state and
    fails at once when the server exited or restarted, with the journal of this start.
  - Changes nothing.
attributes:
  check_mode: {support: none}
  diff_mode: {support: none}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  url: {description: Health URL polled from the host itself., type: str, required: true}
  unit: {description: The systemd unit running the server., type: str, required: true}
  timeout_s: {description: Give up after this many seconds., type: float, default: 1800.0}
  interval_s: {description: Seconds between polls (at most 1)., type: float, default: 0.25}
  journal_lines: {description: Journal lines returned on failure., type: int, default: 40}
"""

EXAMPLES = r"""
- name: Wait for /health
  sglang_health_wait:
    url: http://127.0.0.1:30000/health
    unit: sglang.service
    timeout_s: 1800
"""

RETURN = r"""
elapsed_s:
  description: Seconds until healthy (or until the failure).
  type: float
  returned: always
status:
  description: The last HTTP status; null when nothing answered.
  type: int
  returned: always
unit_state:
  description: ActiveState, SubState, MainPID, NRestarts, ExecMainStatus, ... of the unit.
  type: dict
  returned: always
reason:
  description: How the wait ended.
  type: str
  returned: always
  sample: healthy
journal:
  description: The last journal lines of this start of the unit.
  type: list
  elements: str
  returned: failure
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.orchestrator_host.health import health_status
from ansible.module_utils.orchestrator_host.systemd import systemctl_show

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True, "description": "Health URL polled from the host itself."},
    "unit": {"type": "str", "required": True, "description": "The systemd unit running the server."},
    "timeout_s": {"type": "float", "default": 1800.0, "description": "Give up after this many seconds."},
    "interval_s": {"type": "float", "default": 0.25, "description": "Seconds between polls (at most 1)."},
    "journal_lines": {"type": "int", "default": 40, "description": "Journal lines returned on failure."},
}
PROPS = (
    "ActiveState",
    "SubState",
    "MainPID",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "Result",
    "InvocationID",
    "ExecMainExitTimestamp",
)


def unit_state(module: AnsibleModule, unit: str) -> dict[str, str]:
    # Microseconds in UTC: a multi-node deploy compares these across hosts to find who died first.
    return systemctl_show(module, unit, PROPS, "--timestamp=us+utc")


def journal(module: AnsibleModule, unit: str, lines: int, invocation: str) -> list[str]:
    """The last lines of this start of the unit only, not of earlier runs."""
    journalctl = module.get_bin_path("journalctl", required=True)
    match = f"_SYSTEMD_INVOCATION_ID={invocation}" if invocation else f"--unit={unit}"
    _, out, _ = module.run_command([journalctl, match, "-n", str(lines), "--no-pager", "-o", "cat"])
    return out.splitlines()[-lines:]


def wait(module: AnsibleModule, url: str, unit: str, timeout_s: float, interval: float) -> dict:
    """Poll until healthy, exited, restarted or timed out: {elapsed_s, status, unit_state, reason}."""
    start = time.monotonic()
    first = unit_state(module, unit)
    status, reason = None, "timeout"
    while True:
        state = unit_state(module, unit)
        if state.get("ActiveState") in ("failed", "inactive") or state.get("MainPID") == "0":
            reason = "exited"
            break
        if state.get("NRestarts") != first.get("NRestarts") or state.get("MainPID") != first.get("MainPID"):
            reason = "restarted"
            break
        status = health_status(url, timeout=interval + 1.0)
        if status == 200:
            reason = "healthy"
            break
        if time.monotonic() - start >= timeout_s:
            break
        time.sleep(max(0.0, interval - 0.05))
    elapsed = round(time.monotonic() - start, 2)
    # The journal of the start that failed: after a restart (Restart=on-failure) the unit already
    # runs a new invocation, whose lines say nothing of why the first one died.
    invocation = (first if reason == "restarted" else state).get("InvocationID", "")
    return {
        "elapsed_s": elapsed,
        "status": status,
        "unit_state": state,
        "reason": reason,
        "invocation": invocation,
    }


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    p = module.params
    result = wait(module, p["url"], p["unit"], p["timeout_s"], min(p["interval_s"], 1.0))
    if result["reason"] == "healthy":
        result.pop("invocation")
        module.exit_json(changed=False, **result)
    state, status = result["unit_state"], result["status"]
    result["journal"] = journal(module, p["unit"], p["journal_lines"], result.pop("invocation"))
    what = {
        "exited": f"the server exited ({state.get('Result')}, status {state.get('ExecMainStatus')})",
        "restarted": "the server restarted (MainPID or NRestarts changed)",
        "timeout": f"no 200 from {p['url']} within {p['timeout_s']:.0f} s (last status {status})",
    }[result["reason"]]
    module.fail_json(msg=f"{what} after {result['elapsed_s']:.1f} s", changed=False, **result)


if __name__ == "__main__":
    main()

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
options:
  url: {description: Health URL polled from the host itself., type: str, required: true}
  unit: {description: The systemd unit running the server., type: str, required: true}
  timeout_s: {description: Give up after this many seconds., type: float, required: true}
  interval_s: {description: Seconds between polls (at most 1)., type: float, default: 0.25}
  journal_lines: {description: Journal lines returned on failure., type: int, default: 40}
"""

RETURN = r"""
elapsed_s: {description: seconds until healthy (or until failure), type: float}
status: {description: last HTTP status, or null when the port refused, type: int}
unit_state: {description: ActiveState, SubState, MainPID, NRestarts, ExecMainStatus of the unit, type: dict}
journal: {description: the unit's last journal lines (on failure), type: list}
reason: {description: "healthy, exited, restarted or timeout", type: str}
"""

import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

PROPS = (
    "ActiveState,SubState,MainPID,NRestarts,ExecMainStatus,ExecMainCode,Result,InvocationID,"
    "ExecMainExitTimestamp"
)


def unit_state(module: AnsibleModule, unit: str) -> dict[str, str]:
    # Microseconds in UTC: a multi-node deploy compares these across hosts to find who died first.
    rc, out, err = module.run_command(
        ["systemctl", "show", unit, f"--property={PROPS}", "--timestamp=us+utc"]
    )
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(module: AnsibleModule, unit: str, lines: int, invocation: str) -> list[str]:
    """The last lines of this start of the unit only, not of earlier runs."""
    match = f"_SYSTEMD_INVOCATION_ID={invocation}" if invocation else f"--unit={unit}"
    _, out, _ = module.run_command(["journalctl", match, "-n", str(lines), "--no-pager", "-o", "cat"])
    return out.splitlines()[-lines:]


def poll(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "timeout_s": {"type": "float", "required": True},
            "interval_s": {"type": "float", "default": 0.25},
            "journal_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=False,
    )
    p = module.params
    interval = min(p["interval_s"], 1.0)
    start = time.monotonic()
    first = unit_state(module, p["unit"])
    status, reason = None, "timeout"
    while True:
        state = unit_state(module, p["unit"])
        if state.get("ActiveState") in ("failed", "inactive") or state.get("MainPID") == "0":
            reason = "exited"
            break
        if state.get("NRestarts") != first.get("NRestarts") or state.get("MainPID") != first.get("MainPID"):
            reason = "restarted"
            break
        status = poll(p["url"], timeout=min(interval, 1.0) + 1.0)
        if status == 200:
            reason = "healthy"
            break
        if time.monotonic() - start >= p["timeout_s"]:
            break
        time.sleep(max(0.0, interval - 0.05))
    result = {
        "changed": False,
        "elapsed_s": round(time.monotonic() - start, 2),
        "status": status,
        "unit_state": state,
        "reason": reason,
    }
    if reason == "healthy":
        module.exit_json(**result)
    result["journal"] = journal(module, p["unit"], p["journal_lines"], state.get("InvocationID", ""))
    what = {
        "exited": f"the server exited ({state.get('Result')}, status {state.get('ExecMainStatus')})",
        "restarted": "the server restarted (MainPID or NRestarts changed)",
        "timeout": f"no 200 from {p['url']} within {p['timeout_s']:.0f} s (last status {status})",
    }[reason]
    module.fail_json(msg=f"{what} after {result['elapsed_s']:.1f} s", **result)


if __name__ == "__main__":
    main()

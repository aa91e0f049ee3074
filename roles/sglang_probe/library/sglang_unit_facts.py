#!/usr/bin/python
"""Ansible module: what is deployed on this host, and whether the plan needs a restart."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_unit_facts
short_description: Read the installed SGLang unit and its service state; decide on a restart
description:
  - Read-only. The digest is the same sha256 prefix the control machine computes over
    the unit text, so equal digests mean the unit on disk is the planned one.
options:
  unit_name: {description: The systemd unit., type: str, required: true}
  unit_dir: {description: Where the unit file lives., type: str, default: /etc/systemd/system}
  desired_digest: {description: Digest of the planned unit; empty to only report., type: str, default: ""}
  secret_path: {description: Host path of the secret --config file, if any., type: str, default: ""}
  desired_secret_sha1: {description: sha1 of the planned secret file content., type: str, default: ""}
  force_restart: {description: Restart even when nothing changed., type: bool, default: false}
  health_url: {description: Health URL asked once if the unit is active; empty skips., type: str, default: ""}
  state_dir: {description: Root-only state dir (last-good records)., type: str, default: /etc/orchestrator}
  lock:
    description:
      - When a restart is needed, take the host's deploy lock first (holder, profile, run_id,
        ttl_s, wait_s), waiting up to wait_s, then re-read the state; released by sglang_lock.
    type: dict
"""

RETURN = r"""
installed: {description: whether the unit file exists, type: bool}
digest: {description: digest of the installed unit text, type: str}
profile: {description: profile named in the installed unit's header, type: str}
unit: {description: the installed unit text (units hold no secrets), type: str}
health_url: {description: "/health of the installed unit's server, from this host", type: str}
state: {description: "systemctl show: LoadState, ActiveState, SubState, MainPID, NRestarts, ...", type: dict}
uptime_s: {description: seconds since the service became active, or null, type: float}
restart_needed: {description: whether stop, idle check, write and start must run, type: bool}
reasons: {description: why a restart is needed, type: list}
last_good: {description: "the host's last healthy deploy: profile, digest, unit, time", type: dict}
locked: {description: whether this run now holds the host's deploy lock, type: bool}
healthy: {description: whether health_url answered 200 (asked only when the service is active), type: bool}
"""

import contextlib
import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

#: Deploy locks live on tmpfs: a reboot ends every deploy, and so its lock.
LOCK_DIR = "/run/orchestrator"
PROPS = ",".join(
    (
        "LoadState",
        "ActiveState",
        "SubState",
        "MainPID",
        "NRestarts",
        "ActiveEnterTimestamp",
        "ExecMainStartTimestamp",
        "InvocationID",
    )
)


def read_unit(path: str) -> tuple[str, str, str]:
    """(digest, profile, text) of the unit file, or empty strings when absent."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return "", "", ""
    match = re.search(rb"^# profile: (.+)$", raw, re.M)
    profile = match.group(1).decode() if match else ""
    return hashlib.sha256(raw).hexdigest()[:16], profile, raw.decode(errors="replace")


def health_url(text: str) -> str:
    """/health of the installed unit's server, as reached from this host. A multi-node rank
    other than 0 serves no HTTP: its server's /health is rank 0's (--dist-init-addr's host)."""
    port = re.search(r"--port[= ]+(\d+)", text)
    host = re.search(r"--host[= ]+([^\s\\]+)", text)
    rank = re.search(r"--node-rank[= ]+(\d+)", text)
    rank0 = re.search(r"--dist-init-addr[= ]+\"?(\[[^\]]+\]|[^\s\\:\"]+):\d+", text)
    if not port:
        return ""
    addr = host.group(1).strip('"') if host else "127.0.0.1"
    addr = "127.0.0.1" if addr in ("0.0.0.0", "::") else addr
    if rank and int(rank.group(1)) > 0 and rank0:
        addr = rank0.group(1).strip("[]")
    return f"http://{f'[{addr}]' if ':' in addr else addr}:{port.group(1)}/health"


def uptime(module: AnsibleModule, unit: str) -> float | None:
    rc, out, _ = module.run_command(["systemctl", "show", unit, "--property=ActiveEnterTimestampMonotonic"])
    value = out.strip().partition("=")[2]
    if rc != 0 or not value.isdigit() or value == "0":
        return None
    return round(time.clock_gettime(time.CLOCK_MONOTONIC) - int(value) / 1e6, 1)


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def secret_sha1(path: str) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as fh:
        return hashlib.sha1(fh.read()).hexdigest()  # change detection, not security


def read_last_good(state_dir: str, unit: str) -> dict:
    """The record a healthy deploy left on this host (sglang_record), or {}."""
    try:
        with open(os.path.join(state_dir, "last-good", f"{unit}.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def lock_path(unit: str) -> str:
    return os.path.join(LOCK_DIR, f"{unit}.lock")


def _dead_here(current: dict, mine: dict) -> bool:
    """A lock taken from our own control machine by a process that no longer runs there is stale:
    its deploy died (killed, crashed) before releasing it. `live_pids` lists the control
    machine's running processes."""
    same_control = current.get("control") and current.get("control") == mine.get("control")
    return bool(same_control) and current.get("pid") not in mine.get("live_pids", [])


def try_lock(path: str, holder: dict, record: dict | None = None) -> dict | None:
    """Take the lock atomically; return the current holder when someone else has it."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                with open(path) as fh:
                    current = json.load(fh)
            except (OSError, ValueError):
                current = {}
            ours = current.get("run_id") == holder.get("run_id")  # a rollback after our own Ctrl-C
            if current.get("expires", 0) > time.time() and not _dead_here(current, holder) and not ours:
                return current
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # expired: its deploy died without releasing it
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(record or holder, fh)
        return None
    return {"holder": "unknown (lock file keeps reappearing)"}


def acquire(module: AnsibleModule, unit: str) -> None:
    """Wait up to lock_wait_s for the host's deploy lock, or fail naming who holds it."""
    p = module.params
    mine = {**p["lock"], "since": time.time(), "expires": time.time() + p["lock"]["ttl_s"]}
    mine_record = {k: v for k, v in mine.items() if k != "live_pids"}
    deadline = time.monotonic() + p["lock"]["wait_s"]
    while True:
        holder = try_lock(lock_path(unit), mine, mine_record)
        if holder is None:
            return
        if time.monotonic() >= deadline:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
            module.fail_json(
                msg=f"another deploy holds this host: {holder.get('holder', '?')} since {since}, "
                f"deploying {holder.get('profile', '?')} (waited {p['lock']['wait_s']:.0f} s)",
                lock_holder=holder,
            )
        time.sleep(0.25)


def evaluate(module: AnsibleModule) -> dict:
    """What is installed and running, and why (if at all) the plan needs a restart."""
    p = module.params
    digest, profile, text = read_unit(os.path.join(p["unit_dir"], p["unit_name"]))
    rc, out, err = module.run_command(["systemctl", "show", p["unit_name"], f"--property={PROPS}"])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {p['unit_name']} failed: {err.strip()}")
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    active = state.get("ActiveState") == "active"
    reasons = []
    if p["desired_digest"]:
        if not digest:
            reasons.append("unit not installed")
        elif digest != p["desired_digest"]:
            reasons.append(f"unit differs ({digest} -> {p['desired_digest']})")
        if secret_sha1(p["secret_path"]) != p["desired_secret_sha1"]:
            reasons.append("secret config differs")
        if not active:
            reasons.append(f"service is {state.get('ActiveState')}")
        if p["force_restart"]:
            reasons.append("--force-restart")
    return {
        "installed": bool(digest),
        "digest": digest,
        "profile": profile,
        "unit": text,
        "health_url": health_url(text),
        "state": state,
        "uptime_s": uptime(module, p["unit_name"]) if active else None,
        "restart_needed": bool(reasons),
        "reasons": reasons,
        "healthy": active and bool(p["health_url"]) and answers_200(p["health_url"]),
        "last_good": read_last_good(p["state_dir"], p["unit_name"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit_name": {"type": "str", "required": True},
            "unit_dir": {"type": "str", "default": "/etc/systemd/system"},
            "state_dir": {"type": "str", "default": "/etc/orchestrator"},
            "desired_digest": {"type": "str", "default": ""},
            "secret_path": {"type": "str", "default": ""},
            "desired_secret_sha1": {"type": "str", "default": "", "no_log": False},
            "force_restart": {"type": "bool", "default": False},
            "health_url": {"type": "str", "default": ""},
            "lock": {"type": "dict", "default": None},
        },
        supports_check_mode=True,
    )
    facts = evaluate(module)
    locked = False
    if facts["restart_needed"] and module.params["lock"] and not module.check_mode:
        acquire(module, module.params["unit_name"])
        locked = True
        facts = evaluate(module)  # another deploy may have changed the host while we waited
        if not facts["restart_needed"]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(module.params["unit_name"]))
            locked = False
    elif module.params["lock"] and not module.check_mode:
        release_if_ours(module.params["unit_name"], module.params["lock"]["run_id"])
    module.exit_json(changed=False, locked=locked, **facts)


def release_if_ours(unit: str, run_id: str) -> None:
    """Nothing to change here, but a lock of this run may be left: its play was stopped by Ctrl-C
    before it changed the host, and this is the rollback that puts it back."""
    try:
        with open(lock_path(unit)) as fh:
            current = json.load(fh)
    except (OSError, ValueError):
        return
    if current.get("run_id") == run_id:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path(unit))


if __name__ == "__main__":
    main()

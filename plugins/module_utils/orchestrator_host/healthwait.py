"""The wait for a started server's /health, following its start-up in the journal
(sglang_health_wait, and the restart transaction sglang_restart).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from .health import health_status
from .startup import LABELS, Startup
from .systemd import systemctl_show

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.health
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.startup
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd  # noqa: F401

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True, "description": "Health URL polled from the host itself."},
    "unit": {"type": "str", "required": True, "description": "The systemd unit running the server."},
    "timeout_s": {
        "type": "float",
        "default": 1800.0,
        "description": "Give up this many seconds after the server process started.",
    },
    "interval_s": {"type": "float", "default": 0.25, "description": "Seconds between polls (at most 1)."},
    "journal_lines": {"type": "int", "default": 40, "description": "Journal lines returned on failure."},
    "stall_s": {
        "type": "dict",
        "default": {},
        "description": "Seconds without a new log line after which a start-up phase is stalled, by phase "
        "(launch, init, weights, kv_cache, jit, graphs, draft, draft_graphs, warmup; `*` for any other); "
        "empty: no stall limit.",
    },
    "usual_s": {
        "type": "dict",
        "default": {},
        "description": "Each phase's usual seconds on this host (from the ledger), for `eta_s`.",
    },
    "invocation_id": {
        "type": "str",
        "default": "",
        "description": "The InvocationID the start gave the unit: another one means systemd restarted it "
        "since (between two reports too); empty: compared within this call only.",
    },
    "report_s": {
        "type": "float",
        "default": 0.0,
        "description": "Return after this many seconds with `done: false` and where the start stands, for "
        "the task to be retried (a live view); 0: return only when healthy or failed.",
    },
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
    "ExecMainStartTimestampMonotonic",
    "ControlGroup",
)
#: Phases whose progress bar reaches the journal only when it ends (journald splits at \n, tqdm
#: redraws with \r): bytes the unit's processes read from storage count as progress there.
READING = ("weights", "draft")
#: How often the journal is read during the wait (it costs a journalctl run).
JOURNAL_EVERY_S = 1.0


def unit_state(module: Any, unit: str) -> dict[str, str]:
    # Microseconds in UTC: a multi-node deploy compares these across hosts to find who died first.
    return systemctl_show(module, unit, PROPS, "--timestamp=us+utc")


def journal(module: Any, unit: str, lines: int, invocation: str) -> list[str]:
    """The last lines of this start of the unit only, not of earlier runs."""
    journalctl = module.get_bin_path("journalctl", required=True)
    match = f"_SYSTEMD_INVOCATION_ID={invocation}" if invocation else f"--unit={unit}"
    _rc, out, _err = module.run_command([journalctl, match, "-n", str(lines), "--no-pager", "-o", "cat"])
    return out.splitlines()[-lines:]


def message_of(entry: dict) -> str:
    """MESSAGE as text: journald gives a byte array for a line with control characters (a bar's `\r`)."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        return bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
    return message if isinstance(message, str) else ""


class Reader:
    """This start's journal, read on from where the last read stopped, into a Startup."""

    def __init__(self, module: Any, invocation: str, origin_us: int):
        self.module, self.invocation, self.origin_us = module, invocation, origin_us
        self.cursor = ""
        self.startup = Startup()
        self.last_read = 0.0
        self.bytes_read = 0

    def read(self) -> None:
        if not self.invocation:
            return
        self.last_read = time.monotonic()
        journalctl = self.module.get_bin_path("journalctl", required=True)
        argv = [journalctl, f"_SYSTEMD_INVOCATION_ID={self.invocation}", "--no-pager", "-o", "json"]
        argv += ["--output-fields=MESSAGE"]
        if self.cursor:
            argv += [f"--after-cursor={self.cursor}"]
        rc, out, _err = self.module.run_command(argv)
        if rc != 0:
            return
        for line in out.splitlines():
            try:
                entry = json.loads(line)
                at = (int(entry["__MONOTONIC_TIMESTAMP"]) - self.origin_us) / 1e6
            except (ValueError, KeyError, TypeError):
                continue
            self.cursor = str(entry.get("__CURSOR") or self.cursor)
            self.startup.feed(at, message_of(entry))


def read_bytes(cgroup: str) -> int:
    """Bytes the unit's processes have read from storage (/proc/PID/io read_bytes, summed over the
    unit's cgroup, cgroup v2 or v1's systemd hierarchy); 0 where none can be read."""
    total = 0
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd"):
        try:
            with open(f"{root}{cgroup}/cgroup.procs") as fh:
                pids = fh.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/io") as fh:
                    total += next((int(x.split()[1]) for x in fh if x.startswith("read_bytes:")), 0)
            except (OSError, ValueError, IndexError):
                continue
        return total
    return 0


def _origin_us(state: dict[str, str]) -> int:
    """The server process's start on the monotonic clock (µs), now where systemd has none."""
    try:
        started = int(state.get("ExecMainStartTimestampMonotonic") or 0)
    except ValueError:
        started = 0
    return started or int(time.monotonic() * 1e6)


def wait(module: Any, p: dict) -> dict:
    """Poll until healthy, exited, restarted, stalled, timed out or (report_s) time to report."""
    called = time.monotonic()
    first = unit_state(module, p["unit"])
    origin_us = _origin_us(first)
    reader = Reader(module, first.get("InvocationID", ""), origin_us)
    interval = min(p["interval_s"], 1.0)
    status, reason, stalled_at = None, "timeout", None
    state = first

    def now() -> float:
        return time.monotonic() - origin_us / 1e6

    while True:
        state = unit_state(module, p["unit"])
        if state.get("ActiveState") in ("failed", "inactive") or state.get("MainPID") == "0":
            reason = "exited"
            break
        moved = state.get("MainPID") != first.get("MainPID") or state.get("NRestarts") != first.get(
            "NRestarts"
        )
        if moved or (p["invocation_id"] and state.get("InvocationID") != p["invocation_id"]):
            reason = "restarted"
            break
        status = health_status(p["url"], timeout=interval + 1.0)
        if status == 200:
            reason = "healthy"
            break
        if time.monotonic() - reader.last_read >= JOURNAL_EVERY_S:
            reader.read()
            if reader.startup.phase in READING and state.get("ControlGroup"):
                read = read_bytes(state["ControlGroup"])
                if read > reader.bytes_read:
                    reader.bytes_read = read
                    reader.startup.touch(now())
            stalled_at = reader.startup.stalled(now(), p["stall_s"] or {})
            if stalled_at is not None:
                reason = "stalled"
                break
        if now() >= p["timeout_s"]:
            break
        if p["report_s"] and time.monotonic() - called >= p["report_s"]:
            reason = "starting"
            break
        time.sleep(max(0.0, interval - 0.05))
    reader.read()
    at = round(now(), 2)
    if reason == "healthy":
        reader.startup.enter_ready(at)
    report = reader.startup.report(at)
    report["eta_s"] = reader.startup.eta(at, p["usual_s"] or {})
    # The journal of the start that failed: after a restart (Restart=on-failure) the unit already
    # runs a new invocation, whose lines say nothing of why the first one died.
    invocation = (first if reason == "restarted" else state).get("InvocationID", "")
    if reason == "restarted" and p["invocation_id"]:
        invocation = p["invocation_id"]
    result = {
        "elapsed_s": at,
        "status": status,
        "unit_state": state,
        "reason": reason,
        "invocation": invocation,
        "done": reason != "starting",
        **report,
    }
    if stalled_at is not None:
        result["stalled"] = {"phase": report["phase"], "limit_s": stalled_at, "quiet_s": report["quiet_s"]}
    return result


def run(module: Any, p: dict) -> dict:
    """sglang_health_wait's work on the host: its result, or fail_json (which ends the module)."""
    result = wait(module, p)
    if result["reason"] in ("healthy", "starting"):
        result.pop("invocation")
        return {"changed": False, **result}
    state, status = result["unit_state"], result["status"]
    result["journal"] = journal(module, p["unit"], p["journal_lines"], result.pop("invocation"))
    phase = LABELS.get(str(result["phase"]), str(result["phase"]))
    stalled = result.get("stalled") or {}
    what = {
        "exited": f"the server exited ({state.get('Result')}, status {state.get('ExecMainStatus')})",
        "restarted": "the server restarted (MainPID or NRestarts changed)",
        "timeout": f"no 200 from {p['url']} within {p['timeout_s']:.0f} s (last status {status}), in {phase}",
        "stalled": f"start-up stalled in {phase}: no new log line for {stalled.get('quiet_s', 0):.0f} s "
        f"(its limit {stalled.get('limit_s', 0):.0f} s)",
    }[result["reason"]]
    module.fail_json(msg=f"{what} after {result['elapsed_s']:.1f} s", changed=False, **result)
    raise AssertionError("fail_json returned")  # it ends the module

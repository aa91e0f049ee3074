#!/usr/bin/python
"""Ansible module: a restart as one transaction on the host: a hand-started server taken over (where
the plan adopts one), stop (and the GPUs released), write the unit, start, the first stretch of
the health wait, and the record.

Each module run costs a round trip and Ansible's own work on both ends (0.5-0.8 s on the lab, more
than most of these steps take); five of them made a restart 1.7x the plain playbook a team would
write. The steps are the very functions of sglang_adopt (its takeover), sglang_stop, sglang_unit,
sglang_start, sglang_health_wait and sglang_record (module_utils/orchestrator_host), in that order,
each result returned under its own module's name, so the controller reads them as it reads those
modules' (orchestrator/hosts/runner.py splits them into one event a step).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_restart
short_description: Stop, write the unit, start, wait for health and record, in one run on the host
description:
  - Runs the steps of M(orchestrator.sglang.sglang_adopt) (its takeover of a hand-started server),
    M(orchestrator.sglang.sglang_stop), M(orchestrator.sglang.sglang_unit),
    M(orchestrator.sglang.sglang_start), M(orchestrator.sglang.sglang_health_wait) and
    M(orchestrator.sglang.sglang_record) in that order, with each one's own options, and stops at the
    first that fails. Nothing after a failed step runs; the failed step is named in C(failed_step) and in
    C(steps).
  - The takeover saves the hand-started server's command and stops its process tree, so that the
    unit can take its port and GPUs; a server already gone is nothing to stop.
  - A step starts only while the control machine still reads the module's output. After a Ctrl-C
    there (or a lost connection), the step in flight ends and no later one starts, as when each
    step was a task of its own.
  - The health wait runs for at most its I(report_s). A server healthy by then is recorded (when
    I(record) is given) and the result has C(done=true); one still starting returns C(done=false)
    with the wait's report as its step's result, and the play goes on waiting with
    M(orchestrator.sglang.sglang_health_wait) and records with M(orchestrator.sglang.sglang_record).
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: In check mode the takeover, the stop and the unit report what they would do; nothing is
      stopped, started, waited for or recorded.
  diff_mode:
    support: full
    description: Whether the module returns a diff.
    details: The unit's diff, as M(orchestrator.sglang.sglang_unit) returns it.
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  takeover:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions:
      pid: {description: The hand-started server's PID., type: int, required: true}
      start_ticks:
        description: "Its start time, field 22 of /proc/PID/stat: a PID that started at another time is
          another process, never stopped."
        type: int
        required: true
      unit_name:
        description: The unit that takes over; its stem names the saved command.
        type: str
        required: true
      paths:
        description: Where orchestrator keeps things on the host; the command is saved under
          C(state_dir)/adopted.
        type: dict
        required: true
        suboptions:
          unit_dir: {description: Where unit files live., type: str, required: true}
          state_dir:
            description: Root-only state directory (the units' facts, last-good records, images' cache).
            type: str
            required: true
          lock_dir: {description: Where deploy locks live (tmpfs)., type: str, required: true}
      gone_timeout_s:
        description: Seconds to wait after SIGTERM for the process tree to exit; then SIGKILL.
        type: float
        default: 30.0
  stop:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions:
      unit_name: {description: The systemd unit to stop., type: str, required: true}
      paths:
        description: Where orchestrator keeps things on the host. The unit's stored facts give its GPUs when
          I(gpus) is empty; the other units' facts name their processes, never killed.
        type: dict
        required: true
        suboptions:
          unit_dir: {description: Where unit files live., type: str, required: true}
          state_dir:
            description: Root-only state directory (the units' facts, last-good records, images' cache).
            type: str
            required: true
          lock_dir: {description: Where deploy locks live (tmpfs)., type: str, required: true}
      gone_timeout_s:
        description: Seconds to wait for the unit's cgroup to empty after the stop.
        type: float
        default: 30.0
      gpus:
        description: GPU indices to wait for; empty means the GPUs in the unit's stored facts, and every GPU
          on the host only for a unit stored without them.
        type: list
        elements: int
        default: []
      gpu_release_timeout_s:
        description: Seconds to wait for the GPUs' memory to be released.
        type: float
        default: 30.0
      kill_gpu_holders:
        description: Kill the processes nvidia-smi still lists on the GPUs after the stop (as gpu_idle does),
          except those of another orchestrator unit of this host.
        type: bool
        default: false
      max_used_mib:
        description: A GPU counts as released at or below this many MiB used.
        type: int
        default: 0
      nvidia_smi: {description: The nvidia-smi executable., type: str, default: nvidia-smi}
      disable:
        description: Also disable the unit, so that a reboot does not start it again and its port counts as
          free for another unit (C(orchestrator stop)); a restart within a deploy leaves it enabled.
        type: bool
        default: false
  unit:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions:
      unit_name:
        description: The systemd unit name (its file name in I(paths.unit_dir)).
        type: str
        required: true
      paths:
        description: Where orchestrator keeps things on the host (orchestrator/hosts/playvars.py HostPaths).
        type: dict
        required: true
        suboptions:
          unit_dir: {description: Where unit files live., type: str, required: true}
          state_dir:
            description: Root-only state directory (the units' facts, last-good records, images' cache).
            type: str
            required: true
          lock_dir: {description: Where deploy locks live (tmpfs)., type: str, required: true}
      content: {description: The unit text the plan rendered., type: str, required: true}
      facts:
        description: The facts of this unit (profile, port, bind, gpus, health_url, rank, nnodes).
        type: dict
        required: true
      secret_path:
        description: Host path of the secret --config file, written with I(secret_content) (0600, root); empty
          if none.
        type: str
        default: ""
      secret_content: {description: The secret config's text. Never logged., type: str, default: ""}
      env_path:
        description: Host path of the unit's EnvironmentFile= (secret variables), written with I(env_content)
          (0600, owned by I(env_owner)); empty if none.
        type: str
        default: ""
      env_content: {description: The environment file's text. Never logged., type: str, default: ""}
      env_owner: {description: Owner of I(env_path) (the service user)., type: str, default: root}
      adaptive_path:
        description: Host path of the server's C(--speculative-adaptive-config) JSON, written with
          I(adaptive_content) (0600, root; systemd hands it to the server as a credential); empty if none.
        type: str
        default: ""
      adaptive_content:
        description: The adaptive config's text (the unit's comment shows it too).
        type: str
        default: ""
      verified_digest:
        description: Digest of a unit text this run's preflight already had systemd-analyze verify accept;
          when it is I(content)'s, the check is not run twice.
        type: str
        default: ""
  start:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions: {unit_name: {description: The systemd unit to start., type: str, required: true}}
  health:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions:
      url: {description: Health URL polled from the host itself., type: str, required: true}
      unit: {description: The systemd unit running the server., type: str, required: true}
      timeout_s:
        description: Give up this many seconds after the server process started.
        type: float
        default: 1800.0
      interval_s: {description: Seconds between polls (at most 1)., type: float, default: 0.25}
      journal_lines: {description: Journal lines returned on failure., type: int, default: 40}
      stall_s:
        description: "Seconds without a new log line after which a start-up phase is stalled, by phase
          (launch, init, weights, kv_cache, jit, graphs, draft, draft_graphs, warmup; `*` for any other);
          empty: no stall limit."
        type: dict
        default: {}
      usual_s:
        description: Each phase's usual seconds on this host (from the ledger), for `eta_s`.
        type: dict
        default: {}
      invocation_id:
        description: "The InvocationID the start gave the unit: another one means systemd restarted it since
          (between two reports too); empty: compared within this call only."
        type: str
        default: ""
      report_s:
        description: "Return after this many seconds with `done: false` and where the start stands, for the
          task to be retried (a live view); 0: return only when healthy or failed."
        type: float
        default: 0.0
  record:
    description: "The options of the step's own module, as it takes them; none: this step is not run."
    type: dict
    default: null
    suboptions:
      unit_name: {description: The systemd unit whose healthy deploy is recorded., type: str, required: true}
      paths:
        description: Where orchestrator keeps things on the host (orchestrator/hosts/playvars.py HostPaths).
        type: dict
        required: true
        suboptions:
          unit_dir: {description: Where unit files live., type: str, required: true}
          state_dir:
            description: Root-only state directory (the units' facts, last-good records, images' cache).
            type: str
            required: true
          lock_dir: {description: Where deploy locks live (tmpfs)., type: str, required: true}
      profile: {description: The profile the unit was rendered from., type: str, required: true}
      digest: {description: Digest of the unit text., type: str, required: true}
      unit: {description: The unit text., type: str, required: true}
      facts: {description: The facts of the unit (as sglang_unit stored them)., type: dict, required: true}
      release_run_id:
        description: Release the deploy lock if this run id holds it; empty releases nothing.
        type: str
        default: ""
"""

EXAMPLES = r"""
- name: Restart with the planned unit, taking over the server started by hand
  orchestrator.sglang.sglang_restart:
    takeover:
      pid: 4242
      start_ticks: 81234567
      unit_name: sglang.service
      paths: {unit_dir: /etc/systemd/system, state_dir: /var/lib/orchestrator, lock_dir: /run/orchestrator}
    stop:
      unit_name: sglang.service
      paths: {unit_dir: /etc/systemd/system, state_dir: /var/lib/orchestrator, lock_dir: /run/orchestrator}
    unit:
      unit_name: sglang.service
      paths: {unit_dir: /etc/systemd/system, state_dir: /var/lib/orchestrator, lock_dir: /run/orchestrator}
      content: "[Unit]\nDescription=SGLang\n"
      facts: {profile: cg_5tok, port: 30000}
    start: {unit_name: sglang.service}
    health: {url: "http://127.0.0.1:30000/health", unit: sglang.service, report_s: 5}
    record:
      unit_name: sglang.service
      paths: {unit_dir: /etc/systemd/system, state_dir: /var/lib/orchestrator, lock_dir: /run/orchestrator}
      profile: cg_5tok
      digest: 0123456789abcdef
      unit: "[Unit]\nDescription=SGLang\n"
      facts: {profile: cg_5tok, port: 30000}
  register: __sglang_restart
"""

RETURN = r"""
steps:
  description: Each step that ran, in order, as {action, failed, took_s, result}; I(result) is what
    that step's own module returns (its failure result for the failed step), I(took_s) the seconds
    it took.
  type: list
  elements: dict
  returned: always
failed_step:
  description: The module whose step failed (C(sglang_adopt), C(sglang_stop), ...); empty when none failed.
  type: str
  returned: always
done:
  description: Whether the server is healthy (and recorded, where asked); false while it still starts,
    and in check mode.
  type: bool
  returned: always
recorded:
  description: Whether the record step ran.
  type: bool
  returned: always
released:
  description: Whether the record step released the deploy lock.
  type: bool
  returned: always
invocation_id:
  description: The unit's InvocationID once started; empty in check mode.
  type: str
  returned: always
"""

import os
import time
import traceback
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import (
    adopt,
    healthwait,
    record,
    start,
    stop,
    unitfile,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec

#: (option, the module whose step it is, its options, the step's function), in the order they run.
STEPS = (
    ("takeover", "sglang_adopt", adopt.TakeoverStep),
    ("stop", "sglang_stop", stop),
    ("unit", "sglang_unit", unitfile),
    ("start", "sglang_start", start),
    ("health", "sglang_health_wait", healthwait),
    ("record", "sglang_record", record),
)
#: The steps check mode runs (the rest are skipped there, as their roles' tasks are).
CHECKED = ("takeover", "stop", "unit")


def _spec(option: str, step: Any) -> dict[str, Any]:
    """The option holding one step's options: a dict validated by that step's own spec (its no_log
    options masked as Ansible masks any), or none: the step is not run here."""
    return {
        "type": "dict",
        "default": None,
        "options": step.ARGUMENT_SPEC,
        "description": "The options of the step's own module, as it takes them; none: this step is not run.",
    }


ARGUMENT_SPEC = {option: _spec(option, step) for option, _name, step in STEPS}


def _failing(module: AnsibleModule, action: str, done: list[dict[str, Any]], outcome: dict[str, Any]) -> Any:
    """The fail_json a step runs with (set on the module itself, so that AnsibleModule's own failures,
    a chown or a missing binary, end the same way): it ends the transaction naming the step, with
    every step before it."""
    began, fail = time.monotonic(), module.fail_json

    def fail_json(msg: str, **result: Any) -> None:
        fail_json.ended = True  # type: ignore[attr-defined]  # whatever it raises, it is the end
        if isinstance(result.get("exception"), BaseException):  # 2.19's own failures pass the object
            result["exception"] = "".join(traceback.format_exception(result["exception"]))
        took_s = round(time.monotonic() - began, 3)
        failed = {"action": action, "failed": True, "took_s": took_s, "result": {"msg": msg, **result}}
        changed = any(s["result"].get("changed") for s in done) or bool(result.get("changed"))
        fail(
            msg=msg,
            changed=changed,
            steps=[*done, failed],
            failed_step=action,
            done=False,
            recorded=False,
            released=False,
            invocation_id=outcome["invocation_id"],
        )

    return fail_json


def watched() -> bool:
    """Whether the control machine still reads this module's output. A blank line goes to stdout
    (Ansible drops the lines before a module's JSON); once ssh closed the session (Ctrl-C on the
    control machine, a lost connection), sshd has closed the pipe and the write fails with EPIPE
    (measured on the lab: within 0.4 s of the ssh client's end)."""
    try:
        os.write(1, b"\n")
    except BrokenPipeError:
        return False
    return True


def transact(module: AnsibleModule) -> dict[str, Any]:
    done: list[dict[str, Any]] = []
    outcome = {"done": False, "recorded": False, "released": False, "invocation_id": ""}
    for option, action, step in STEPS:
        p = module.params[option]
        if p is None or (module.check_mode and option not in CHECKED):
            continue
        if not watched():
            # As with a task a step each: the one in flight ends, no later one starts. Nobody
            # reads a result now; the controller rolls back from what it last heard.
            raise SystemExit(1)
        if option == "health":  # the wait watches the invocation this start began
            p = {**p, "invocation_id": p["invocation_id"] or outcome["invocation_id"]}
        began = time.monotonic()
        own, failing = module.fail_json, _failing(module, action, done, outcome)
        module.fail_json = failing
        try:
            result = step.run(module, p)
        except Exception as exc:  # a bug of the step: named with it, the steps before it kept
            if getattr(failing, "ended", False):
                raise  # the step's own fail_json, ending (a test's stand-in for sys.exit raises)
            failing(msg=f"{action} failed: {type(exc).__name__}: {exc}", exception=traceback.format_exc())
            raise
        finally:
            module.fail_json = own
        done.append(
            {
                "action": action,
                "failed": False,
                "took_s": round(time.monotonic() - began, 3),
                "result": result,
            }
        )
        if option == "start":
            outcome["invocation_id"] = result["invocation_id"]
        if option == "health" and not result["done"]:
            break  # still starting: the play waits on, and records, with their own tasks
        if option == "health":
            outcome["done"] = True
        if option == "record":
            outcome["recorded"], outcome["released"] = True, result["released"]
    changed = any(s["result"].get("changed") for s in done)
    return {"changed": changed, "steps": done, "failed_step": "", **outcome}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    module.exit_json(**transact(module))


if __name__ == "__main__":
    main()

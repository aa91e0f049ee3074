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
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: none, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  url: {description: Health URL polled from the host itself., type: str, required: true}
  unit: {description: The systemd unit running the server., type: str, required: true}
  timeout_s:
    description: Give up this many seconds after the server process started.
    type: float
    default: 1800.0
  interval_s: {description: Seconds between polls (at most 1)., type: float, default: 0.25}
  journal_lines: {description: Journal lines returned on failure., type: int, default: 40}
  stall_s:
    description: "Seconds without a new log line after which a start-up phase is stalled, by phase (launch,
      init, weights, kv_cache, jit, graphs, draft, draft_graphs, warmup; `*` for any other); empty: no stall
      limit."
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
    description: "Return after this many seconds with `done: false` and where the start stands, for the task
      to be retried (a live view); 0: return only when healthy or failed."
    type: float
    default: 0.0
"""

EXAMPLES = r"""
- name: Wait for /health
  orchestrator.sglang.sglang_health_wait:
    url: http://127.0.0.1:30000/health
    unit: sglang.service
    timeout_s: 1800
"""

RETURN = r"""
elapsed_s:
  description: Seconds from the server process's start until healthy (or the failure, or the report).
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
  description: How the wait ended (healthy, exited, restarted, stalled, timeout; starting with done false).
  type: str
  returned: always
  sample: healthy
journal:
  description: The last journal lines of this start of the unit.
  type: list
  elements: str
  returned: failure
done:
  description: False when it returned at report_s while the server was still starting (retry it).
  type: bool
  returned: always
phase:
  description: The start-up phase the server's log reached (launch, init, weights, kv_cache, jit, graphs,
    draft, draft_graphs, warmup, ready).
  type: str
  returned: always
progress:
  description: The phase's progress bar as last drawn, {done, total, detail}; null without one.
  type: dict
  returned: always
phase_s:
  description: Seconds in the current phase.
  type: float
  returned: always
quiet_s:
  description: Seconds since the server's last log line.
  type: float
  returned: always
phases:
  description: "[{phase, s}]: each phase's seconds so far, in the order they came."
  type: list
  elements: dict
  returned: always
eta_s:
  description: Seconds left by the phases' usual lengths (usual_s); null without one for this phase.
  type: float
  returned: always
lines:
  description: Log lines of this start read.
  type: int
  returned: always
memory_lines:
  description: The server's own lines on its memory (weights loaded, KV cache allocated, graphs
    captured), in their order, at most 16.
  type: list
  elements: str
  returned: always
stalled:
  description: "{phase, limit_s, quiet_s}: the phase that went past its stall limit."
  type: dict
  returned: failure (when reason is stalled)
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.healthwait import (
    ARGUMENT_SPEC,
    run,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=False)
    module.exit_json(**run(module, module.params))


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Ansible module: a server's place in the rotation of SGLang's gateway (smg).

Runs on the control machine (the role delegates it to localhost): the gateway's admin API may be
reachable only from there. The client is module_utils/orchestrator_gateway.py, which
orchestrator/hosts/rotation.py shares.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gateway
short_description: Take a worker out of the SGLang gateway's rotation, or put it back
description:
  - "I(state=absent): DELETE /workers/{id}; returns once the gateway no longer lists it. A worker
    that is not listed is left as it is (a rollback after a failed start finds it so)."
  - "I(state=present): POST /workers unless listed, then waits until the gateway lists it healthy."
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: full, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  url: {description: The gateway's base URL., type: str, required: true}
  worker_url: {description: The URL the gateway knows the server by., type: str, required: true}
  state:
    description: "absent: out of rotation; present: back in rotation and healthy."
    type: str
    required: true
    choices: [absent, present]
  api_key:
    description: The gateway's admin API key (smg --control-plane-api-keys, --api-key); empty when it has
      none.
    type: str
    default: ""
  worker_api_key:
    description: The server's own API key, given to the gateway with the worker.
    type: str
    default: ""
  timeout_s:
    description: Seconds the gateway may take to drop the worker or list it healthy.
    type: float
    default: 120.0
  role:
    description: "The worker's role in a PD fleet (smg --pd-disaggregation): it is added with it, and taken
      out only while another worker of its role (and, for a decode, a prefill) stays in rotation."
    type: str
    default: ""
    choices: ["", prefill, decode]
  bootstrap_port:
    description: "A prefill worker's bootstrap port, given to the gateway with the worker (0: none)."
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Take the worker out of rotation
  orchestrator.sglang.sglang_gateway:
    url: http://127.0.0.1:39000
    worker_url: http://10.0.0.5:30000
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
state:
  description: The state asked for.
  type: str
  returned: always
before:
  description: "The worker as the gateway listed it before: listed, is_healthy, load, and status
    where the gateway has one (1.x)."
  type: dict
  returned: always
after:
  description: The worker as the gateway lists it after.
  type: dict
  returned: always
drain:
  description:
    - "The play's decision: wait for the requests in flight before the stop. Only where this call
      took the worker out of rotation (a rollback finds it already out, its server dead)."
  type: bool
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_gateway import (
    GatewayError,
    add,
    find,
    healthy,
    out,
    pd_guard,
    remove,
    seen,
    workers,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True, "description": "The gateway's base URL."},
    "worker_url": {
        "type": "str",
        "required": True,
        "description": "The URL the gateway knows the server by.",
    },
    "state": {
        "type": "str",
        "required": True,
        "choices": ["absent", "present"],
        "description": "absent: out of rotation; present: back in rotation and healthy.",
    },
    "api_key": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": (
            "The gateway's admin API key (smg --control-plane-api-keys, --api-key); empty when it has none."
        ),
    },
    "worker_api_key": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": "The server's own API key, given to the gateway with the worker.",
    },
    "timeout_s": {
        "type": "float",
        "default": 120.0,
        "description": "Seconds the gateway may take to drop the worker or list it healthy.",
    },
    "role": {
        "type": "str",
        "default": "",
        "choices": ["", "prefill", "decode"],
        "description": (
            "The worker's role in a PD fleet (smg --pd-disaggregation): it is added with it, and taken out "
            "only while another worker of its role (and, for a decode, a prefill) stays in rotation."
        ),
    },
    "bootstrap_port": {
        "type": "int",
        "default": 0,
        "description": "A prefill worker's bootstrap port, given to the gateway with the worker (0: none).",
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    gateway, worker, key = p["url"].rstrip("/"), p["worker_url"], p["api_key"]
    try:
        listed = workers(gateway, key)
        before = find(listed, worker)
        if p["state"] == "absent":
            changed = not out(before)  # 1.x: a draining worker is out already
            problem = pd_guard(listed, worker, p["role"]) if changed else None
            if problem:
                module.fail_json(
                    msg=f"gateway {gateway}: {problem}", state="absent", changed=False, drain=False
                )
            if changed and not module.check_mode:
                remove(gateway, worker, key, p["timeout_s"])
            after = None if changed else before
        else:
            changed = not healthy(before)
            after = before
            if changed and not module.check_mode:
                after = add(
                    gateway,
                    worker,
                    key,
                    p["worker_api_key"],
                    p["timeout_s"],
                    role=p["role"],
                    bootstrap_port=p["bootstrap_port"] or None,
                )
    except GatewayError as exc:
        module.fail_json(msg=f"gateway {gateway}: {exc}", state=p["state"], changed=False, drain=False)
    drain = p["state"] == "absent" and changed
    module.exit_json(changed=changed, state=p["state"], before=seen(before), after=seen(after), drain=drain)


if __name__ == "__main__":
    main()

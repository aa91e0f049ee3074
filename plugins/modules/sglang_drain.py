#!/usr/bin/python
"""Ansible module: wait until a server out of rotation has finished its requests, or prove a
restarted one generates before it takes traffic again. Runs on the host, against the server's
own port."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_drain
short_description: Wait until a server has no request in flight, or prove it generates
description:
  - "I(mode=drain): polls SGLang's GET /get_load until no request runs or waits (twice in a row),
    or I(timeout_s); never fails on the timeout: it returns the requests still in flight. A server
    that does not answer has none."
  - "I(mode=prove): GET /health_generate (SGLang runs one short generation for it) must answer 200
    within I(timeout_s)."
  - Changes nothing.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: none, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  url: {description: "The server's base URL, from the host itself.", type: str, required: true}
  mode:
    description: "drain: wait for requests in flight; prove: /health_generate answers 200."
    type: str
    required: true
    choices: [drain, prove]
  api_key:
    description: The server's API key (SGLang's /get_load wants it); empty when it has none.
    type: str
    default: ""
  timeout_s:
    description: "drain: seconds to wait for the requests in flight (then it returns those left); prove:
      seconds /health_generate may take to answer 200."
    type: float
    default: 60.0
"""

EXAMPLES = r"""
- name: Wait for the requests in flight
  orchestrator.sglang.sglang_drain:
    url: http://127.0.0.1:30000
    mode: drain
    timeout_s: 60
"""

RETURN = r"""
mode:
  description: The mode asked for.
  type: str
  returned: always
in_flight:
  description: "drain: requests still running or queued when the wait ended; prove: 0."
  type: int
  returned: always
waited_s:
  description: Seconds waited.
  type: float
  returned: always
timed_out:
  description: "drain: the timeout ended the wait; prove: no 200 came within it."
  type: bool
  returned: always
status:
  description: "prove: the last HTTP status of /health_generate (null: nothing answered); drain: null."
  type: int
  returned: always
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_gateway import (
    GatewayError,
    drain,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.health import (
    health_status,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True, "description": "The server's base URL, from the host itself."},
    "mode": {
        "type": "str",
        "required": True,
        "choices": ["drain", "prove"],
        "description": "drain: wait for requests in flight; prove: /health_generate answers 200.",
    },
    "api_key": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": "The server's API key (SGLang's /get_load wants it); empty when it has none.",
    },
    "timeout_s": {
        "type": "float",
        "default": 60.0,
        "description": (
            "drain: seconds to wait for the requests in flight (then it returns those left); prove: "
            "seconds /health_generate may take to answer 200."
        ),
    },
}


def prove(url: str, timeout_s: float) -> dict:
    start, status = time.monotonic(), None
    while True:
        status = health_status(url.rstrip("/") + "/health_generate", timeout=max(timeout_s, 1.0))
        waited = round(time.monotonic() - start, 2)
        if status == 200 or waited >= timeout_s:
            return {"status": status, "waited_s": waited, "in_flight": 0, "timed_out": status != 200}
        time.sleep(0.5)


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=False)
    p = module.params
    if p["mode"] == "prove":
        result = prove(p["url"], p["timeout_s"])
        if result["status"] != 200:
            module.fail_json(
                msg=f"GET {p['url']}/health_generate answered {result['status']} "
                f"within {p['timeout_s']:.0f} s: the server is healthy but cannot generate; "
                "it was not put back in rotation",
                mode="prove",
                changed=False,
                **result,
            )
        module.exit_json(changed=False, mode="prove", **result)
    try:
        result = drain(p["url"], p["api_key"], p["timeout_s"])
    except GatewayError as exc:
        module.fail_json(msg=f"drain: {exc}", mode="drain", changed=False)
    module.exit_json(changed=False, mode="drain", status=None, **result)


if __name__ == "__main__":
    main()

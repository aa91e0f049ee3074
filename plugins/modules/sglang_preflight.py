#!/usr/bin/python
"""Ansible module: everything that can be known on the host before the stop, checked before it.

Read-only. Stopping a serving model to start one that cannot run costs minutes of downtime
while weights reload, so every problem found here fails the deploy while the old server
still runs. All problems are returned at once, one line each. sglang_probe runs the same
checks (module_utils/orchestrator_host/preflight.py preflight_checks) under the deploy lock.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_preflight
short_description: Check SGLang (host or image), model, drafter, GPUs, port and disk before a restart
description:
  - "Read-only; fails with C(preflight: <problem>; <problem>...) naming every problem found."
  - "A unit that is not orchestrator's to replace is a problem: systemd loads it from another file
    (such as /lib/systemd/system/ssh.service), its file in I(paths.unit_dir) has neither
    orchestrator's header line nor stored facts, or it is masked."
  - "With a container I(engine), the containers it makes to ask the image and the engine (C(run --rm),
    C(create) then C(rm)) are never left behind, and the C(create) is never started."
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: full, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name: {description: Our unit; it may hold the port and the GPUs., type: str, required: true}
  checks:
    description: What the plan needs on the host.
    type: dict
    required: true
    suboptions:
      python: {description: The python executable of the unit., type: str, required: true}
      sglang_version: {description: SGLang version the plan was rendered for., type: str, required: true}
      flags:
        description: Every flag the plan renders; each must be in C(--help).
        type: list
        elements: str
        default: []
      model_path: {description: Target model directory., type: str, required: true}
      draft_model_path: {description: Draft model directory; empty if none., type: str, default: ""}
      algorithm: {description: Speculative algorithm; empty if none., type: str, default: ""}
      gpus:
        description: nvidia-smi indices of the GPUs the server uses on this host, the only ones looked at.
          Each must exist; a process on one of them outside I(unit_name) is a problem, named as another
          orchestrator unit (never killed) where it runs in one.
        type: list
        elements: int
        required: true
      port: {description: HTTP port of the server., type: int, required: true}
      skip_flags_if_digest:
        description: Skip the C(--help) check when the installed unit has this digest (its flags already run).
        type: str
        default: ""
      log_dir: {description: Where the journal writes., type: str, default: /var/log}
      min_free_mib: {description: Free space the logs need., type: int, default: 1024}
      cache_dir:
        description: "The unit's JIT and compile cache directory (systemd makes it at start, owned by the
          service user); empty: none."
        type: str
        default: ""
      cache_min_free_mib: {description: Free space the compile caches need., type: int, default: 4096}
      nvidia_smi: {description: The nvidia-smi executable., type: str, default: nvidia-smi}
      allow_gpu_holders:
        description: Processes outside I(unit_name) on the GPUs are no problem (the deploy kills them); those
          of another orchestrator unit still are (never killed).
        type: bool
        default: false
      unit_content:
        description: The planned unit text, checked with C(systemd-analyze verify) before anything stops
          (unless that very text is installed); a non-zero exit, or a line of the unit systemd says it ignores
          or cannot parse, is a problem; empty skips the check.
        type: str
        default: ""
      user:
        description: The user the server runs as (service.user); it must exist on the host.
        type: str
        default: root
      engine:
        description:
          - The container engine of a container runtime (runtime.kind); empty for SGLang on the host's
            I(python).
          - "With an engine, it must be installed and answer C(ENGINE version); the image must be here (or be
            pulled at start, as I(pull) allows: preflight never pulls); I(sglang_version) and I(flags) are
            checked against the image's own SGLang and C(--help), run once per image in a throw-away container
            (C(run --rm --pull=never) with I(run_options)) and cached by image ID under C(state_dir)/images;
            I(python) is the image's."
          - Model and drafter are mounted at the same paths, so their checks read the host's files.
        type: str
        default: ""
        choices: ["", docker, podman]
      image: {description: The image reference (runtime.image) with an I(engine)., type: str, default: ""}
      pull:
        description: When the engine pulls the image (runtime.pull); C(never) makes a missing image a problem.
        type: str
        default: missing
        choices: [never, missing, always]
      mounts:
        description: The host paths runtime.mounts gives the container; each must exist.
        type: list
        elements: str
        default: []
      run_options:
        description: The unit's engine options a throw-away container of the image also needs on this host
          (network, cgroups, ulimits), one word each.
        type: list
        elements: str
        default: []
      run_words:
        description:
          - "The unit's C(ENGINE run) command after the verb, one word each, as systemd runs it; empty skips
            this check. The engine's own C(create) (never started, removed at once) judges every option before
            the stop: a refusal is a problem, with the engine's message and the options it names. It gets a
            name and label of its own, no C(-d), C(--replace) or pull; podman creates it over an empty root
            file system, docker from the image."
          - "Each C(--device) host path and each I(mounts) source under /dev is resolved on this host: one
            that leads to an NVIDIA device node (a link, a directory holding one) is a problem; GPUs reach the
            container from the unit's own GPU words only. With docker, whose daemon opens devices only at
            start, a C(--device) this host lacks is one too."
          - "docker's C(create) takes GPU requests it cannot serve at start: C(--gpus) needs NVIDIA's runtime
            hook (C(nvidia-container-runtime-hook)) on this host, and CDI devices
            (C(--device=nvidia.com/gpu=N)) need the daemon's CDI on and each device in a spec of its CDI spec
            directories; either missing is a problem."
        type: list
        elements: str
        default: []
      memory:
        description: "The server's settings the GPU memory fit needs (TP, PP, mem_fraction_static, context
          length, KV cache dtype, CUDA graphs, speculative decoding): the weights' size is read from the
          safetensors headers of the model and drafter, and a start that cannot fit is a problem; empty skips
          the fit."
        type: dict
        default: {}
      calibration:
        description: "What the server logged about its memory on its last start of the same model files, TP
          and GPU (weights, KV tokens, graphs): the fit uses it instead of its own estimate."
        type: dict
        default: {}
      file_lists:
        description: "Return every file of the model and drafter (name, size, sampled digest): the control
          machine compares them across hosts."
        type: bool
        default: false
      takeover_pid:
        description: "A hand-started server this deploy takes over (sglang_restart's takeover step stops it
          first): the port and GPUs it or a process below it holds are no problem, and a note names them; 0:
          none. A PID that no longer runs changes nothing."
        type: int
        default: 0
      takeover_start_ticks:
        description: "I(takeover_pid)'s start time, field 22 of /proc/PID/stat: a PID that started at another
          time is another process, whose port and GPUs are problems as any; 0: not known, the PID alone says."
        type: int
        default: 0
      pd:
        description: "The server's role in a prefill/decode fleet (the profile's disaggregation); empty: none.
          Each is checked before the stop: the bootstrap port free (a listener of I(unit_name) aside); the
          transfer backend's engine importable by I(python) (in a container runtime, a note instead); each IB
          device in /sys/class/infiniband."
        type: dict
        default: {}
        suboptions:
          transfer_backend:
            description: "SGLang's C(--disaggregation-transfer-backend); empty: not a PD server."
            type: str
            default: ""
            choices: ["", mooncake, mooncake_tcp, nixl, mori, ascend, fake]
          bootstrap_port:
            description: "The prefill server's bootstrap port; 0: none (a decode server opens none)."
            type: int
            default: 0
          ib_devices:
            description: Every IB device C(--disaggregation-ib-device) names (its comma list, or each GPU's in
              its JSON mapping); each must be on the host where the backend reads them.
            type: list
            elements: str
            default: []
      secret_files:
        description: The files the unit's write step makes (its C(--config) and adaptive config mounts'
          sources, its C(--env-file)), given to that C(create) as empty files in their place.
        type: list
        elements: str
        default: []
"""

EXAMPLES = r"""
- name: Check everything that would fail after the stop
  orchestrator.sglang.sglang_preflight:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    checks:
      python: /opt/sglang/.venv/bin/python
      sglang_version: 0.5.4
      flags: [--model-path, --port]
      model_path: /models/Llama-3.1-8B-Instruct
      gpus: [4, 5, 6, 7]
      port: 30000

- name: The same in SGLang's own image, with podman
  orchestrator.sglang.sglang_preflight:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    checks:
      python: python3
      sglang_version: 0.5.9
      flags: [--model-path, --port]
      model_path: /models/Llama-3.1-8B-Instruct
      gpus: [0, 1]
      port: 30000
      engine: podman
      image: docker.io/lmsysorg/sglang:v0.5.9
      pull: missing
"""

RETURN = r"""
problems:
  description: One line per problem.
  type: list
  elements: str
  returned: always
notes:
  description: What could not be checked yet without being a problem (an image the engine will pull).
  type: list
  elements: str
  returned: always
sglang_version:
  description: The SGLang version installed on the host (or in the image); empty when not known.
  type: str
  returned: always
gpus:
  description: How many GPUs nvidia-smi reports.
  type: int
  returned: always
help_checked:
  description: Whether the C(--help) flag check ran.
  type: bool
  returned: always
verified_digest:
  description: Digest of the planned unit systemd-analyze verify accepted; empty when not checked.
  type: str
  returned: always
memory:
  description:
    - The GPU memory fit of the planned start, per GPU of the smallest GPU in the set, from the
      safetensors headers of the model and drafter (weights, static pool, KV cache tokens, graphs,
      problems and fixes); empty when it did not run (no memory settings, or unsized weights).
  type: dict
  returned: always
model_files:
  description:
    - The model's and drafter's fingerprints, under C(model) and C(draft) (path, digest, shards, tensor bytes,
      config digest); with I(checks.file_lists) each file's name, size and sampled digest too.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    PATHS_SPEC,
    PREFLIGHT_OPTIONS,
    module_spec,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.preflight import (
    preflight_checks,
)

ARGUMENT_SPEC = {
    "unit_name": {
        "type": "str",
        "required": True,
        "description": "Our unit; it may hold the port and the GPUs.",
    },
    "paths": PATHS_SPEC,
    "checks": {
        "type": "dict",
        "required": True,
        "options": PREFLIGHT_OPTIONS,
        "description": "What the plan needs on the host.",
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    result = preflight_checks(module, p["unit_name"], p["paths"], p["checks"])
    if result["problems"]:
        module.fail_json(msg="preflight: " + "; ".join(result["problems"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()

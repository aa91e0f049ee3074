"""The option specs several modules share (ansible-core's argument_spec form): the host paths, the
deploy lock and the preflight checks, each the mirror of a record the control machine sends
(orchestrator/hosts/playvars.py HostPaths, LockSpec, PreflightChecks).
"""

from __future__ import annotations

import copy
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

# Each option's one declaration, with its description (documentation only: module_spec leaves it
# out of what AnsibleModule gets): scripts/role_specs.py writes the modules' documentation and the
# roles' specs from it.


def module_spec(spec: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A module's ARGUMENT_SPEC as AnsibleModule takes it: each option, and each of its suboptions,
    without its `description`, a key AnsibleModule has no use for (and ansible-test's
    validate-modules refuses in an argument_spec)."""
    out = {}
    for name, option in spec.items():
        # A copy: AnsibleModule fills a dict option's suboption defaults into its default in place,
        # and the spec's own `{}` would then carry them into role_specs.py's reading.
        kept = {key: copy.deepcopy(value) for key, value in option.items() if key != "description"}
        if isinstance(kept.get("options"), dict):
            kept["options"] = module_spec(kept["options"])
        out[name] = kept
    return out


PATHS_OPTIONS: dict[str, dict[str, Any]] = {
    "unit_dir": {"type": "str", "required": True, "description": "Where unit files live."},
    "state_dir": {
        "type": "str",
        "required": True,
        "description": "Root-only state directory (the units' facts, last-good records, images' cache).",
    },
    "lock_dir": {"type": "str", "required": True, "description": "Where deploy locks live (tmpfs)."},
}

PATHS_SPEC: dict[str, Any] = {
    "type": "dict",
    "required": True,
    "options": PATHS_OPTIONS,
    "description": "Where orchestrator keeps things on the host (orchestrator/hosts/playvars.py HostPaths).",
}

#: The deploy lock a run takes (orchestrator/hosts/playvars.py LockSpec).
LOCK_OPTIONS: dict[str, dict[str, Any]] = {
    "holder": {"type": "str", "required": True},
    "run_id": {"type": "str", "required": True},
    "ttl_s": {"type": "float", "required": True},
    "wait_s": {"type": "float", "required": True},
    "control": {"type": "str", "default": ""},
    "pid": {"type": "int", "default": 0},
    "live_pids": {"type": "list", "elements": "int", "default": []},
    "profile": {"type": "str", "default": ""},
    "keep": {"type": "bool", "default": False},
}

#: The read-only checks before a restart (orchestrator/hosts/playvars.py PreflightChecks): the
#: `checks` option of sglang_preflight and the `preflight` option of sglang_probe.
PREFLIGHT_OPTIONS: dict[str, dict[str, Any]] = {
    "python": {"type": "str", "required": True, "description": "The python executable of the unit."},
    "sglang_version": {
        "type": "str",
        "required": True,
        "description": "SGLang version the plan was rendered for.",
    },
    "flags": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "Every flag the plan renders; each must be in C(--help).",
    },
    "model_path": {"type": "str", "required": True, "description": "Target model directory."},
    "draft_model_path": {
        "type": "str",
        "default": "",
        "description": "Draft model directory; empty if none.",
    },
    "algorithm": {"type": "str", "default": "", "description": "Speculative algorithm; empty if none."},
    "gpus": {
        "type": "list",
        "elements": "int",
        "required": True,
        "description": (
            "nvidia-smi indices of the GPUs the server uses on this host, the only ones looked at. "
            "Each must exist; a process on one of them outside I(unit_name) is a problem, named as "
            "another orchestrator unit (never killed) where it runs in one."
        ),
    },
    "port": {"type": "int", "required": True, "description": "HTTP port of the server."},
    "skip_flags_if_digest": {
        "type": "str",
        "default": "",
        "description": (
            "Skip the C(--help) check when the installed unit has this digest (its flags already run)."
        ),
    },
    "log_dir": {"type": "str", "default": "/var/log", "description": "Where the journal writes."},
    "min_free_mib": {"type": "int", "default": 1024, "description": "Free space the logs need."},
    "cache_dir": {
        "type": "str",
        "default": "",
        "description": "The unit's JIT and compile cache directory (systemd makes it at start, owned by "
        "the service user); empty: none.",
    },
    "cache_min_free_mib": {
        "type": "int",
        "default": 4096,
        "description": "Free space the compile caches need.",
    },
    "nvidia_smi": {"type": "str", "default": "nvidia-smi", "description": "The nvidia-smi executable."},
    "allow_gpu_holders": {
        "type": "bool",
        "default": False,
        "description": (
            "Processes outside I(unit_name) on the GPUs are no problem (the deploy kills them); those "
            "of another orchestrator unit still are (never killed)."
        ),
    },
    "unit_content": {
        "type": "str",
        "default": "",
        "description": (
            "The planned unit text, checked with C(systemd-analyze verify) before anything stops "
            "(unless that very text is installed); a non-zero exit, or a line of the unit systemd says "
            "it ignores or cannot parse, is a problem; empty skips the check."
        ),
    },
    "user": {
        "type": "str",
        "default": "root",
        "description": "The user the server runs as (service.user); it must exist on the host.",
    },
    "engine": {
        "type": "str",
        "default": "",
        "choices": ["", "docker", "podman"],
        "description": [
            "The container engine of a container runtime (runtime.kind); empty for SGLang on the "
            "host's I(python).",
            "With an engine, it must be installed and answer C(ENGINE version); the image must be here "
            "(or be pulled at start, as I(pull) allows: preflight never pulls); I(sglang_version) and "
            "I(flags) are checked against the image's own SGLang and C(--help), run once per image in "
            "a throw-away container (C(run --rm --pull=never) with I(run_options)) and cached by image "
            "ID under C(state_dir)/images; I(python) is the image's.",
            "Model and drafter are mounted at the same paths, so their checks read the host's files.",
        ],
    },
    "image": {
        "type": "str",
        "default": "",
        "description": "The image reference (runtime.image) with an I(engine).",
    },
    "pull": {
        "type": "str",
        "default": "missing",
        "choices": ["never", "missing", "always"],
        "description": (
            "When the engine pulls the image (runtime.pull); C(never) makes a missing image a problem."
        ),
    },
    "mounts": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": "The host paths runtime.mounts gives the container; each must exist.",
    },
    "run_options": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": (
            "The unit's engine options a throw-away container of the image also needs on this host "
            "(network, cgroups, ulimits), one word each."
        ),
    },
    "run_words": {
        "type": "list",
        "elements": "str",
        "default": [],
        "description": [
            "The unit's C(ENGINE run) command after the verb, one word each, as systemd runs it; empty "
            "skips this check. The engine's own C(create) (never started, removed at once) judges "
            "every option before the stop: a refusal is a problem, with the engine's message and the "
            "options it names. It gets a name and label of its own, no C(-d), C(--replace) or pull; "
            "podman creates it over an empty root file system, docker from the image.",
            "Each C(--device) host path and each I(mounts) source under /dev is resolved on this host: "
            "one that leads to an NVIDIA device node (a link, a directory holding one) is a problem; "
            "GPUs reach the container from the unit's own GPU words only. With docker, whose daemon "
            "opens devices only at start, a C(--device) this host lacks is one too.",
            "docker's C(create) takes GPU requests it cannot serve at start: C(--gpus) needs NVIDIA's "
            "runtime hook (C(nvidia-container-runtime-hook)) on this host, and CDI "
            "devices (C(--device=nvidia.com/gpu=N)) need the daemon's CDI on and each device in a spec of "
            "its CDI spec directories; either missing is a problem.",
        ],
    },
    "memory": {
        "type": "dict",
        "default": {},
        "description": (
            "The server's settings the GPU memory fit needs (TP, PP, mem_fraction_static, context length, "
            "KV cache dtype, CUDA graphs, speculative decoding): the weights' size is read from the "
            "safetensors headers of the model and drafter, and a start that cannot fit is a problem; "
            "empty skips the fit."
        ),
    },
    "calibration": {
        "type": "dict",
        "default": {},
        "description": (
            "What the server logged about its memory on its last start of the same model files, TP and "
            "GPU (weights, KV tokens, graphs): the fit uses it instead of its own estimate."
        ),
    },
    "file_lists": {
        "type": "bool",
        "default": False,
        "description": (
            "Return every file of the model and drafter (name, size, sampled digest): the control machine "
            "compares them across hosts."
        ),
    },
    "takeover_pid": {
        "type": "int",
        "default": 0,
        "description": (
            "A hand-started server this deploy takes over (sglang_restart's takeover step stops it "
            "first): the port and GPUs it or a process below it holds are no problem, and a note "
            "names them; 0: none. A PID that no longer runs changes nothing."
        ),
    },
    "takeover_start_ticks": {
        "type": "int",
        "default": 0,
        "description": (
            "I(takeover_pid)'s start time, field 22 of /proc/PID/stat: a PID that started at another "
            "time is another process, whose port and GPUs are problems as any; 0: not known, the PID "
            "alone says."
        ),
    },
    "pd": {
        "type": "dict",
        "default": {},
        "description": (
            "The server's role in a prefill/decode fleet (the profile's disaggregation); empty: none. Each "
            "is checked before the stop: the bootstrap port free (a listener of I(unit_name) aside); the "
            "transfer backend's engine importable by I(python) (in a container runtime, a note instead); "
            "each IB device in /sys/class/infiniband."
        ),
        "options": {
            "transfer_backend": {
                "type": "str",
                "default": "",
                "choices": ["", "mooncake", "mooncake_tcp", "nixl", "mori", "ascend", "fake"],
                "description": "SGLang's C(--disaggregation-transfer-backend); empty: not a PD server.",
            },
            "bootstrap_port": {
                "type": "int",
                "default": 0,
                "description": "The prefill server's bootstrap port; 0: none (a decode server opens none).",
            },
            "ib_devices": {
                "type": "list",
                "elements": "str",
                "default": [],
                "description": (
                    "Every IB device C(--disaggregation-ib-device) names (its comma list, or each GPU's in "
                    "its JSON mapping); each must be on the host where the backend reads them."
                ),
            },
        },
    },
    "secret_files": {
        "type": "list",
        "elements": "str",
        "default": [],
        "no_log": False,  # paths, not secrets: the preflight report names them
        "description": (
            "The files the unit's write step makes (its C(--config) and adaptive config mounts' sources, "
            "its C(--env-file)), given to that C(create) as empty files in their place."
        ),
    },
}


def validate_suboptions(module: Any, name: str, spec: dict[str, dict[str, Any]], value: dict) -> dict:
    """`value` checked against `spec`, defaults filled in. For a dict option where {} means
    "none": Ansible would reject {} against required suboptions, so they are checked here."""
    result = ArgumentSpecValidator(module_spec(spec)).validate(value)  # a copy: it fills defaults in
    if result.error_messages:
        module.fail_json(msg=f"{name}: {'; '.join(result.error_messages)}")
    return result.validated_parameters

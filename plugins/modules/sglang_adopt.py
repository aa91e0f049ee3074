#!/usr/bin/python
"""Ansible module: the SGLang servers a team started by hand (nohup, tmux, screen, another unit, a
container), as `orchestrator adopt` reads them; the takeover of one; its command started again.

The takeover is also the first step of sglang_restart, whose result it returns under this
module's name. The work is module_utils/orchestrator_host/adopt.py's.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_adopt
short_description: Find the SGLang servers started by hand; take one over; start its command again
description:
  - "C(find): each SGLang server of the host (C(python -m sglang.launch_server) after the interpreter's
    options, or C(sglang serve)), read from /proc: argv, environment, working directory, user, start
    time, launcher, the TCP ports it and its children listen on, and the GPUs nvidia-smi lists them on.
    A process below another SGLang server (a scheduler) is part of it. A server in a docker or podman
    container is read from C(ENGINE inspect). Nothing is written on the host."
  - "SGLang's version is read by the server's python (the very file it runs) run as the server's user
    and groups, with C(-I), in C(/), with PATH=/usr/bin:/bin and no other variable: never the server's
    environment, directory or root, which a local user could have set to run code of theirs."
  - "Secrets never leave the host: the value of C(--api-key), C(--admin-api-key) and
    C(--ssl-keyfile-password) (also as C(--flag=VALUE) and the prefixes argparse takes), and of a
    variable whose name holds TOKEN, KEY, SECRET or PASSWORD in any case (the control machine's rule),
    reads C(<secret>); its sha256 is in C(secrets). A PID that is no SGLang server is named by its
    program alone, never its arguments."
  - "C(takeover): the server I(pid), if it still runs with I(start_ticks), has its command saved in
    C(state_dir)/adopted/<unit stem>.json (root, 0600: argv and environment as bytes, working
    directory, user, groups, umask, ignored signals, log files), then its process tree is stopped:
    SIGTERM, I(gone_timeout_s), SIGKILL. A parent C(sh -c) with no other child goes with it; an
    interactive shell never does. A PID gone, or now another process's, is nothing to stop."
  - "C(relaunch): the command saved for I(unit_name) started again as it ran: the same argv and
    environment, working directory, user and groups, stdin /dev/null, output appended to its log
    files, in a session of its own; then I(health_url) is waited for. A log that is still the very
    file the server wrote (device and inode, no link) is opened before root is dropped, so a root
    shell's redirect (root's 0644) is no obstacle; another path is opened as the server's user."
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: C(find) runs as ever; C(takeover) says what it would stop and saves nothing; C(relaunch)
      starts nothing.
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  action:
    description: C(find) the servers; C(takeover) one (I(pid), I(start_ticks), I(unit_name)); C(relaunch) the
      command saved for I(unit_name).
    type: str
    default: find
    choices: [find, takeover, relaunch]
  port: {description: "find: only the server listening on this port; 0: any.", type: int, default: 0}
  pid:
    description: "find: only this process; 0: any. takeover: the server to stop. relaunch: the server the
      deploy took over: the saved command must be its, and is not started while it still runs."
    type: int
    default: 0
  start_ticks:
    description: "takeover, relaunch: the server's start time, field 22 of /proc/PID/stat; another is another
      process, never stopped."
    type: int
    default: 0
  paths:
    description: Where orchestrator keeps things on the host; a server in one of its units is C(ours), and the
      takeover saves the command under C(state_dir)/adopted.
  unit_name:
    description: "takeover, relaunch: the unit taking over; its stem names the saved command."
    type: str
    default: ""
  gone_timeout_s:
    description: "takeover: seconds to wait after SIGTERM for the process tree to exit; then SIGKILL."
    type: float
    default: 30.0
  nvidia_smi: {description: The nvidia-smi executable., type: str, default: nvidia-smi}
  engines:
    description: The container engines asked about a server in a container; another is not asked.
    type: list
    elements: str
    default: [docker, podman]
  engine_timeout_s:
    description: Seconds a container engine may take to answer; then the server is read from /proc.
    type: float
    default: 10.0
  health_url:
    description: "relaunch: the URL that answers 200 once the server serves; empty: not waited for."
    type: str
    default: ""
  health_timeout_s: {description: "relaunch: seconds to wait for I(health_url).", type: float, default: 600.0}
"""

EXAMPLES = r"""
- name: Find the SGLang server on port 30000
  orchestrator.sglang.sglang_adopt:
    port: 30000
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
  register: __sglang_adopt

- name: Start the hand command again after the unit failed
  orchestrator.sglang.sglang_adopt:
    action: relaunch
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    health_url: http://127.0.0.1:30000/health
"""

RETURN = r"""
action:
  description: The action that ran (find, takeover, relaunch).
  type: str
  returned: always
servers:
  description:
    - "find: each server found, {pid, ppid, uid, user, started (epoch s), start_ticks, argv, env, secrets,
      cwd, exe, home, shell, python, entry (module, serve), ports, gpus, launcher {kind, detail}, unit,
      ours, log, log_err, container, cpus_allowed, mems_allowed}."
    - "argv and env with secrets as C(<secret>); secrets: {flag or variable: sha256 of its value};
      home, shell: its user's passwd entry (systemd's User= sets them);
      python: argv[0] made absolute (the process's own PATH, else exe); launcher kind: nohup, tmux,
      screen, unit, container, shell or init; unit: its systemd unit, empty for a login session's;
      ours: a unit orchestrator deployed; log, log_err: the files its stdout and stderr write, empty
      when none; container: {} or {engine, id, name, image}; cpus_allowed, mems_allowed: its
      Cpus_allowed_list and Mems_allowed_list (/proc/PID/status) where they leave out an online CPU or
      NUMA node (taskset, numactl, a cpuset), empty where they hold every one."
  type: list
  elements: dict
  returned: with action find
systemd_path:
  description: "find: the service manager's PATH, which a unit gets (systemctl show-environment); empty when
    unknown."
  type: str
  returned: with action find
units:
  description: "find: the units orchestrator deployed on the host (C(state_dir)/units) that run or are
    enabled (one C(orchestrator stop) stopped and disabled is not listed)."
  type: list
  elements: str
  returned: with action find
sglang_version:
  description: "find: SGLang's version as the first server's python imports it; empty when it could not be
    read (a problem says why)."
  type: str
  returned: with action find
problems:
  description: "find: what could not be read, one line each (a PID that is not SGLang, one that exited, argv
    that is not UTF-8, a value left out, an engine that did not answer)."
  type: list
  elements: str
  returned: with action find
taken:
  description: "takeover: whether the server still ran and was stopped (in check mode: would be)."
  type: bool
  returned: with action takeover
why:
  description: "takeover: why nothing was stopped; empty when taken."
  type: str
  returned: with action takeover
pid:
  description: "takeover: the server's PID. relaunch: the new process's PID; 0 in check mode."
  type: int
  returned: with action takeover or relaunch
killed:
  description: "takeover: the PIDs stopped (in check mode: to stop): the server, its children, a parent
    C(sh -c)."
  type: list
  elements: int
  returned: with action takeover
log:
  description: "takeover, relaunch: the file the server's stdout writes; empty when none."
  type: str
  returned: with action takeover or relaunch
record_path:
  description: "takeover: where its command is saved; empty when nothing was taken."
  type: str
  returned: with action takeover
launcher:
  description: "takeover: how it was started, {kind, detail}; {} when nothing was taken."
  type: dict
  returned: with action takeover
took_s:
  description: "takeover, relaunch: seconds the action took."
  type: float
  returned: with action takeover or relaunch
healthy:
  description: "relaunch: whether I(health_url) answered 200 (without one: whether the process runs)."
  type: bool
  returned: with action relaunch
start_ticks:
  description: "relaunch: the new process's start time (field 22 of /proc/PID/stat): with I(pid), it names
    the process."
  type: int
  returned: with action relaunch
argv:
  description: "relaunch: the argv started, secrets as C(<secret>)."
  type: list
  elements: str
  returned: with action relaunch
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import adopt
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    PATHS_SPEC,
    module_spec,
)

ARGUMENT_SPEC = {
    "action": {
        "type": "str",
        "default": "find",
        "choices": ["find", "takeover", "relaunch"],
        "description": (
            "C(find) the servers; C(takeover) one (I(pid), I(start_ticks), I(unit_name)); C(relaunch) "
            "the command saved for I(unit_name)."
        ),
    },
    "port": {
        "type": "int",
        "default": 0,
        "description": "find: only the server listening on this port; 0: any.",
    },
    "pid": {
        "type": "int",
        "default": 0,
        "description": (
            "find: only this process; 0: any. takeover: the server to stop. relaunch: the server the "
            "deploy took over: the saved command must be its, and is not started while it still runs."
        ),
    },
    "start_ticks": {
        "type": "int",
        "default": 0,
        "description": (
            "takeover, relaunch: the server's start time, field 22 of /proc/PID/stat; another is "
            "another process, never stopped."
        ),
    },
    "paths": {
        **PATHS_SPEC,
        "description": (
            "Where orchestrator keeps things on the host; a server in one of its units is C(ours), and "
            "the takeover saves the command under C(state_dir)/adopted."
        ),
    },
    "unit_name": {
        "type": "str",
        "default": "",
        "description": "takeover, relaunch: the unit taking over; its stem names the saved command.",
    },
    "gone_timeout_s": {
        "type": "float",
        "default": 30.0,
        "description": "takeover: seconds to wait after SIGTERM for the process tree to exit; then SIGKILL.",
    },
    **adopt.ENGINE_OPTIONS,
    "health_url": {
        "type": "str",
        "default": "",
        "description": "relaunch: the URL that answers 200 once the server serves; empty: not waited for.",
    },
    "health_timeout_s": {
        "type": "float",
        "default": 600.0,
        "description": "relaunch: seconds to wait for I(health_url).",
    },
}

#: The options each action needs beyond its defaults.
NEEDS = {"takeover": ("pid", "start_ticks", "unit_name"), "relaunch": ("unit_name",)}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    missing = [name for name in NEEDS.get(p["action"], ()) if not p[name]]
    if missing:
        module.fail_json(msg=f"action {p['action']} needs {', '.join(missing)}", action=p["action"])
    run = {"find": adopt.find, "takeover": adopt.takeover, "relaunch": adopt.relaunch}[p["action"]]
    module.exit_json(**run(module, p))


if __name__ == "__main__":
    main()

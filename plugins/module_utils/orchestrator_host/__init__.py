"""What orchestrator's modules know about a host, one submodule a concern. plugins/modules import
the submodules they use, and Ansible ships with a module only those and what they import:

- options: the option specs several modules share (host paths, the deploy lock, preflight checks)
- files: reading and writing a host's files (atomic writes, check mode aware ensure_*)
- units: orchestrator's units on a host: their paths, which are deployed, whose a unit is, digests
- systemd: `systemctl show` parsing, `systemd-analyze verify` and the unit lines it would drop
- procs: the unit a process runs in (its cgroup, named as systemd names it), argv[0]
- containers: a container's unit by its label, `ps` of docker and podman
- gpus: nvidia-smi's CSV, who holds a GPU, the wait for a GPU set to be released
- lock: the host's deploy lock
- health: a server's HTTP health
- preflight: the read-only checks before a restart (on the host's Python, or in a container image)
- a restart's steps, each the work of one module (its run()), which sglang_restart also runs in one
  transaction: stop (sglang_stop), unitfile (sglang_unit), start (sglang_start), healthwait
  (sglang_health_wait), record (sglang_record)

Pure functions (text in, values out) are kept apart from the ones that read the host, so that
tests/unit/modules can prove them on captured output. Paths are never defaults here: the control
machine passes them (`paths` = {unit_dir, state_dir, lock_dir}, orchestrator/hosts/playvars.py
HostPaths). The submodules import each other relatively, so that the control machine loads the
ones it reads (systemd, procs, containers) under a name of its own (orchestrator/paths.py
module_utils). This file imports nothing: shipping it ships no submodule.
"""

"""A container's unit, told by its label (orchestrator.unit): `ps` of docker and podman, and the
processes of a labelled container, which may run outside its unit's cgroup (docker's always do).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection
from typing import Any

#: The label a container unit puts on its container, naming the unit
#: (orchestrator/render/container_unit.py LABEL).
CONTAINER_LABEL = "orchestrator.unit"

#: The engines a unit may run SGLang with (orchestrator/render/container_unit.py ENGINES).
ENGINES = ("docker", "podman")

#: `ps --format` per engine: podman writes one JSON array, docker one JSON object a line.
PS_FORMAT = {"docker": "{{json .}}", "podman": "json"}


def parse_ps(text: str) -> list[tuple[str, str]]:
    """(container ID, its orchestrator.unit label) of each container `ps` listed: podman's
    `--format json` (an array; Labels a map) or docker's `--format '{{json .}}'` (an object a
    line; Labels one `k=v,k=v` string, which a unit name, holding no ',', survives)."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    found = []
    for row in rows or []:
        labels = row.get("Labels") or {}
        if isinstance(labels, str):
            labels = dict(item.partition("=")[::2] for item in labels.split(","))
        cid, unit = row.get("Id") or row.get("ID") or "", labels.get(CONTAINER_LABEL, "")
        if cid and unit:
            found.append((cid, unit))
    return found


def proc_parents() -> dict[int, int]:
    """{PID: parent PID} of every process, from /proc/PID/stat (the command name, in
    parentheses, may hold spaces and parentheses: the fields follow the last ')')."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 1:
            parents[int(pid)] = int(fields[1])
    return parents


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def labelled_containers(module: Any) -> list[tuple[str, str, int]]:
    """(engine, unit label, main PID) of each running container labelled orchestrator.unit, of
    every engine installed here. An engine that is not installed is not asked; one that does not
    answer (docker without its daemon runs no container) or a container gone meanwhile is
    skipped: no host fails for lacking engines."""
    found = []
    for engine in ENGINES:
        exe = module.get_bin_path(engine)
        if not exe:
            continue
        argv = [exe, "ps", "--filter", f"label={CONTAINER_LABEL}", "--format", PS_FORMAT[engine]]
        rc, out, _err = module.run_command(argv)
        try:
            listed = parse_ps(out) if rc == 0 else []
        except ValueError:
            listed = []
        for cid, unit in listed:
            rc, out, _err = module.run_command([exe, "inspect", "--format", "{{.State.Pid}}", cid])
            pid = out.strip()
            if rc == 0 and pid.isdigit() and int(pid) > 0:
                found.append((engine, unit, int(pid)))
    return found


def container_units(
    module: Any, units: Collection[str], parents: Callable[[], dict[int, int]] | None = None
) -> dict[int, str]:
    """{PID: unit} of every process of a container labelled with one of `units`: its main PID
    (the engine's inspect) and all its descendants. A docker container runs under the daemon,
    outside its unit's cgroup, and so may a podman one (--cgroups=split puts it in a
    sub-cgroup, which cgroup_unit finds anyway); the label is what ties it to its unit. A
    container labelled with a unit this host does not know is nobody's, as in cgroups."""
    ours = [(unit, pid) for _cid, unit, pid in labelled_containers(module) if unit in units]
    if not ours:
        return {}
    tree = (parents or proc_parents)()
    return {p: unit for unit, pid in ours for p in descendants(pid, tree)}


def unit_containers(module: Any, unit: str) -> list[int]:
    """Main PIDs of the running containers labelled with `unit` (labelled_containers): a docker
    container runs under the daemon, so an empty cgroup does not mean it is gone."""
    return [pid for _cid, label, pid in labelled_containers(module) if label == unit]

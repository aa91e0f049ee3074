"""`verify`'s GPU check (orchestrator/hosts/verify/test_deployment.py) on a host running two servers:
only the plan's GPU set is looked at, and a process of another orchestrator unit on it is named."""

from __future__ import annotations

import json
import types

import pytest

from orchestrator.hosts.verify import test_deployment as checks

UUID = "GPU-8b9e1fa8-32f8-da01-8524-833ee60332e{}"


class Host:
    """Answers the commands the check runs, as testinfra's host does (check_output, run). No
    container engine is installed (`docker ps` exits 127, as the shell says) unless `containers`
    lists docker's: (ID, unit label, main PID); `parents` is the host's {PID: parent PID}."""

    def __init__(
        self,
        apps: list[tuple[int, int, str]],
        containers: list[tuple[str, str, int]] | None = None,
        parents: dict[int, int] | None = None,
    ) -> None:
        self.apps = apps  # (pid, GPU index, unit)
        self.containers, self.parents = containers, parents or {}
        self.commands: list[str] = []

    def check_output(self, command: str) -> str:
        if command.startswith("nvidia-smi --query-gpu=index,uuid"):
            return "\n".join(f"{i}, {UUID.format(i)}" for i in range(8))
        assert command.startswith("nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid")
        return "".join(f"{pid}, /usr/bin/python3, 70000, {UUID.format(gpu)}\n" for pid, gpu, _ in self.apps)

    def run(self, command: str) -> types.SimpleNamespace:
        self.commands.append(command)
        if command == "ls -1 /etc/orchestrator/units":
            return _done("sglang-a.service.json\nsglang-b.service.json\n")
        if command.startswith(("docker ", "podman ")):
            return self._engine(command)
        if command.startswith("python3 -c "):
            return _done("".join(f"{pid} {parent}\n" for pid, parent in self.parents.items()))
        pid = int(command.removeprefix("cat /proc/").removesuffix("/cgroup"))
        unit = next(u for p, _, u in self.apps if p == pid)
        return _done(f"0::/system.slice/{unit}\n")

    def _engine(self, command: str) -> types.SimpleNamespace:
        if self.containers is None or command.startswith("podman "):
            return _done("", rc=127)
        if command == "docker ps --filter label=orchestrator.unit --format '{{json .}}'":
            rows = [{"ID": cid, "Labels": f"orchestrator.unit={unit}"} for cid, unit, _ in self.containers]
            return _done("".join(json.dumps(r) + "\n" for r in rows))
        cid = command.removeprefix("docker inspect --format '{{.State.Pid}}' ")
        return _done(f"{next(pid for c, _, pid in self.containers if c == cid)}\n")


def _done(stdout: str, rc: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(stdout=stdout, stderr="", rc=rc)


PLAN = {"unit_name": "sglang-b.service", "gpus": [4, 5, 6, 7], "state_dir": "/etc/orchestrator"}
NEIGHBOUR = [(100 + i, i, "sglang-a.service") for i in range(4)]
OURS = [(200 + i, i, "sglang-b.service") for i in range(4, 8)]


def test_a_neighbour_on_other_gpus_passes():
    checks.test_only_the_server_holds_the_gpus(Host([*NEIGHBOUR, *OURS, (77, 2, "session-4.scope")]), PLAN)


def test_another_unit_on_our_gpus_fails_naming_it():
    with pytest.raises(AssertionError) as failed:
        checks.test_only_the_server_holds_the_gpus(Host([*OURS, (103, 5, "sglang-a.service")]), PLAN)
    assert str(failed.value).startswith(
        "GPUs [4, 5, 6, 7] held outside sglang-b.service: GPU 5: PID 103 /usr/bin/python3 70000 MiB "
        "of sglang-a.service, another orchestrator unit on this host"
    )


def test_a_foreign_process_on_our_gpus_fails():
    with pytest.raises(AssertionError) as failed:
        checks.test_only_the_server_holds_the_gpus(Host([*OURS, (77, 7, "session-4.scope")]), PLAN)
    assert "GPU 7: PID 77 /usr/bin/python3 70000 MiB\n" in str(failed.value) + "\n"


# --- containers: docker's run under the daemon, in no unit's cgroup ---------------------------------

#: Docker's containers: the neighbour's main process 500 (its server 501, a child) and ours 600.
CONTAINERS = [("a1b2", "sglang-a.service", 500), ("c3d4", "sglang-b.service", 600)]
PARENTS = {1: 0, 400: 1, 500: 400, 501: 500, 600: 400, 601: 600, 77: 1}


def test_our_container_on_our_gpus_passes_and_a_neighbours_is_named():
    ours = [(601, 4, "docker-c3d4.scope")]
    checks.test_only_the_server_holds_the_gpus(Host(ours, CONTAINERS, PARENTS), PLAN)
    with pytest.raises(AssertionError) as failed:
        checks.test_only_the_server_holds_the_gpus(
            Host([*ours, (501, 5, "docker-a1b2.scope")], CONTAINERS, PARENTS), PLAN
        )
    assert str(failed.value).startswith(
        "GPUs [4, 5, 6, 7] held outside sglang-b.service: GPU 5: PID 501 /usr/bin/python3 70000 MiB "
        "of sglang-a.service, another orchestrator unit on this host"
    )


def test_a_foreign_process_beside_containers_is_foreign():
    with pytest.raises(AssertionError) as failed:
        checks.test_only_the_server_holds_the_gpus(
            Host([(77, 6, "session-4.scope")], CONTAINERS, PARENTS), PLAN
        )
    assert str(failed.value).startswith(
        "GPUs [4, 5, 6, 7] held outside sglang-b.service: GPU 6: PID 77 /usr/bin/python3 70000 MiB\n"
    )


def test_no_engine_is_asked_when_every_process_is_in_a_units_cgroup():
    host = Host(OURS, CONTAINERS, PARENTS)
    checks.test_only_the_server_holds_the_gpus(host, PLAN)
    assert not any(c.startswith(("docker", "podman")) for c in host.commands)

"""`verify`'s GPU check (orchestrator/verify/test_deployment.py) on a host running two servers:
only the plan's GPU set is looked at, and a process of another orchestrator unit on it is named."""

from __future__ import annotations

import types

import pytest

from orchestrator.verify import test_deployment as checks

UUID = "GPU-8b9e1fa8-32f8-da01-8524-833ee60332e{}"


class Host:
    """Answers the commands the check runs, as testinfra's host does (check_output, run)."""

    def __init__(self, apps: list[tuple[int, int, str]]) -> None:
        self.apps = apps  # (pid, GPU index, unit)

    def check_output(self, command: str) -> str:
        if command.startswith("nvidia-smi --query-gpu=index,uuid"):
            return "\n".join(f"{i}, {UUID.format(i)}" for i in range(8))
        assert command.startswith("nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid")
        return "".join(f"{pid}, /usr/bin/python3, 70000, {UUID.format(gpu)}\n" for pid, gpu, _ in self.apps)

    def run(self, command: str) -> types.SimpleNamespace:
        if command == "ls -1 /etc/orchestrator/units":
            return types.SimpleNamespace(stdout="sglang-a.service.json\nsglang-b.service.json\n")
        pid = int(command.removeprefix("cat /proc/").removesuffix("/cgroup"))
        unit = next(u for p, _, u in self.apps if p == pid)
        return types.SimpleNamespace(stdout=f"0::/system.slice/{unit}\n")


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

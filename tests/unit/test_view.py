"""How status shows GPU holders: one entry per process, its GPUs as ranges."""

from __future__ import annotations

from orchestrator.view import gpu_ranges, holders_line


def test_gpu_ranges_joins_runs():
    assert gpu_ranges([3, 0, 1, 2, 5, 7, 6]) == "0-3,5-7"
    assert gpu_ranges([4]) == "4"


def test_holders_line_gives_each_process_once_with_its_gpus_and_total_memory():
    python = "/usr/bin/python3"
    server = [{"gpu": g, "pid": 1072, "process_name": python, "used_mib": 126518} for g in range(8)]
    stray = {"gpu": 3, "pid": 77, "process_name": python, "used_mib": 4000}
    assert holders_line([*server, stray]) == (
        "1072 /usr/bin/python3 on GPU 0-7, 1012144 MiB; 77 /usr/bin/python3 on GPU 3, 4000 MiB"
    )
    assert holders_line([]) == ""

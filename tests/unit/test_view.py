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


def test_check_table_says_which_hosts_would_fail_restart_or_stay():
    from rich.console import Console

    from orchestrator.deploy import DeployReport, HostReport
    from orchestrator.view import deploy_table

    def host(name: str, ok: bool, reasons: list[str]) -> HostReport:
        return HostReport(
            name, ok, False, False, None, "d", "d", "preflight" if not ok else "probe", reasons=reasons
        )

    report = DeployReport(
        "eagle",
        "d",
        True,
        [host("lab1", False, ["unit differs"]), host("lab2", True, ["unit differs"]), host("lab3", True, [])],
        "",
    )
    console = Console(record=True, width=200, color_system=None)
    console.print(deploy_table(report))
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in console.export_text().splitlines()
        if line.startswith("│ lab")
    }
    assert rows == {"lab1": "would fail", "lab2": "would restart", "lab3": "no change"}

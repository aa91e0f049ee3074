"""How status shows GPU holders: one entry per process, its GPUs as ranges."""

from __future__ import annotations

from orchestrator.cli.view import gpu_ranges, holders_line


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


def test_holders_line_shows_unknown_memory_as_a_question_mark():
    """nvidia-smi prints `[N/A]` for a process's memory on some drivers; status must still show it."""
    python = "/usr/bin/python3"
    server = [{"gpu": g, "pid": 1072, "process_name": python, "used_mib": 1000} for g in range(4)]
    server[2] = {**server[2], "used_mib": None}
    stray = {"gpu": 5, "pid": 77, "process_name": python, "used_mib": None}
    assert holders_line([*server, stray]) == (
        "1072 /usr/bin/python3 on GPU 0-3, 3000 MiB + ? MiB on GPU 2; 77 /usr/bin/python3 on GPU 5, ? MiB"
    )


def test_check_table_says_which_hosts_would_fail_restart_or_stay():
    from rich.console import Console

    from orchestrator.cli.view import deploy_table
    from orchestrator.hosts.host_report import DeployReport, HostReport

    def host(name: str, ok: bool, reasons: list[str]) -> HostReport:
        step = "preflight" if not ok else "probe"
        return HostReport(host=name, ok=ok, step=step, digest="d", previous_digest="d", reasons=reasons)

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


def test_check_of_a_multinode_server_compares_each_rank_with_its_own_unit(tmp_path, monkeypatch):
    """Each rank's installed unit against its own plan: no false `--nnodes: 2 -> (removed)`."""
    from rich.console import Console

    from orchestrator.cli.view import check_details
    from orchestrator.hosts.host_report import DeployReport, HostReport
    from orchestrator.hosts.playvars import placements
    from orchestrator.profile import model as profile_mod

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    where = placements(profile_mod.load("cg_5tok_2node"), inv, None)
    hosts = [
        HostReport(host=h, ok=True, step="probe", previous_unit=p.plan.unit, planned_unit=p.plan.unit)
        for h, p in where.items()
    ]
    console = Console(record=True, width=200, color_system=None)
    console.print(check_details(DeployReport("cg_5tok_2node", "", True, hosts, "")))
    text = console.export_text()
    assert "gpu1" in text and "gpu2" in text
    assert "--nnodes" not in text and "--node-rank" not in text

"""plugins/module_utils/orchestrator_host/: the parsers and rules every module relies on,
proved on real captured output where there is some."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers import (
    descendants,
    parse_ps,
    proc_parents,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files import (
    read_json,
    write_atomic,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.gpus import (
    busy_gpus,
    describe,
    foreign_gpus,
    gpu_ranges,
    idle_message,
    kill,
    missing_gpus,
    parse_apps,
    parse_gpus,
    with_units,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.health import (
    health_status,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.lock import (
    acquire,
    release_if_ours,
    try_lock,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.preflight import (
    disk_problem,
    drafter_problems,
    gpu_set_problems,
    help_flags,
    hidden_size,
    label_version,
    listeners,
    parse_image_inspect,
    port_problems,
    read_config,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs import (
    cgroup_procs,
    cgroup_unit,
    proc_cgroup,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd import (
    parse_systemctl_show,
    unit_complaints,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    deployed_units,
    facts_path,
    installed_units,
    lock_path,
    record_path,
    unit_digest,
    unit_path,
)
from hostfakes import CAPTURES, DATA, capture

from orchestrator.render.launch import Plan

H200 = "GPU-1c99f63f-3983-6cc7-7349-904bbbeb995b"
CAPTURED_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.used",
    "memory.total",
    "utilization.gpu",
)


# --- systemd -----------------------------------------------------------------------------------


def test_systemctl_show_values_keep_their_equals_signs_and_multiline_braces():
    text = (
        "ActiveState=active\nMainPID=4242\nEnvironment=A=1 B=2\n"
        "ExecStart={ path=/usr/bin/python ; argv[]=/usr/bin/python -m x\n  --port 1 ; }\nInvocationID=\n"
    )
    shown = parse_systemctl_show(text)
    assert shown["ActiveState"] == "active"
    assert shown["Environment"] == "A=1 B=2"
    assert shown["ExecStart"].startswith("{ path=/usr/bin/python") and shown["ExecStart"].endswith("; }")
    assert shown["InvocationID"] == ""


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_unit_complaints_are_the_lines_of_the_unit_that_systemd_drops(tmp_path: Path):
    """Read from the real systemd-analyze verify, which exits 0 here: the unit's lines it ignores
    count; a warning that keeps the setting, and what it says of another unit, do not."""
    unit = tmp_path / "sglang.service"
    unit.write_text(
        "[Unit]\nWants=other.service\n[Service]\nUser=nobody\nExecStart=/bin/true\n"
        'Nice=019\nCPUAffinity=5-2\nExecStartPost=/bin/echo \\\n  "a\\q"\n'
    )
    (tmp_path / "other.service").write_text("[Service]\nExecStart=/bin/true\nNice=50\n")
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Special user nobody" in output and "other.service:3: " in output
    assert unit_complaints(output, str(unit)) == [
        (6, "Failed to parse nice priority '019', ignoring: Invalid argument"),
        (7, "Range '5-2' is invalid, 5 > 2, ignoring."),
        (9, 'Ignoring unknown escape sequences: "a\\q"'),
    ]


@pytest.mark.parametrize(
    ("cgroup", "inside"),
    [
        ("0::/system.slice/sglang.service\n", True),
        ("0::/system.slice/sglang.service/payload\n", True),
        ("12:pids:/system.slice/sglang.service\n1:name=systemd:/system.slice/sglang.service\n", True),
        ("0::/system.slice/sglang.service-b\n", False),
        ("0::/system.slice/xsglang.service\n", False),
        ("0::/user.slice/user-0.slice/session-3.scope\n", False),
        ("", False),
    ],
)
def test_a_process_is_in_the_unit_only_when_a_cgroup_path_component_is_its_name(cgroup, inside):
    assert cgroup_unit(cgroup, {"sglang.service"}) == ("sglang.service" if inside else "")


def test_a_process_that_is_gone_is_in_no_unit():
    assert proc_cgroup(2**22 + 7) == "" and proc_cgroup(None) == ""
    assert with_units([app(0, 2**22 + 7)], {"sglang.service"})[0]["unit"] == ""


def test_the_unit_of_a_process_is_the_path_component_naming_one_of_them():
    units = {"sglang-a.service", "sglang-b.service"}
    assert cgroup_unit("0::/system.slice/sglang-b.service\n", units) == "sglang-b.service"
    assert cgroup_unit("0::/system.slice/sglang-a.service/payload\n", units) == "sglang-a.service"
    assert cgroup_unit("0::/system.slice/sglang-a.service-old\n", units) == ""
    assert cgroup_unit("0::/user.slice/user-0.slice/session-3.scope\n", units) == ""
    assert cgroup_unit("", units) == ""


def test_a_delegated_units_processes_are_in_its_sub_cgroups(tmp_path: Path):
    """podman's --cgroups=split with Delegate=yes: conmon and the container in two sub-cgroups,
    none in the unit's own (cgroup v2's no-internal-processes rule)."""
    unit = tmp_path / "system.slice/sglang.service"
    for sub, procs in (("", ""), ("supervisor", "4242\n"), ("libpod-payload-0123", "4250\n4251\n")):
        (unit / sub).mkdir(parents=True, exist_ok=True)
        (unit / sub / "cgroup.procs").write_text(procs)
    assert sorted(cgroup_procs("/system.slice/sglang.service", str(tmp_path))) == ["4242", "4250", "4251"]
    assert cgroup_procs("/system.slice/gone.service", str(tmp_path)) == cgroup_procs("") == []


#: /proc/PID/cgroup texts (cgroup v2, as systemd lays units out) of a host running two servers.
CGROUPS = {
    100: "0::/system.slice/sglang-a.service\n",
    200: "0::/system.slice/sglang-b.service\n",
    300: "0::/user.slice/user-1000.slice/session-4.scope\n",
    400: "0::/system.slice/jupyter.service\n",
}


def test_each_gpu_process_is_tagged_with_the_orchestrator_unit_it_runs_in():
    apps = [app(0, 100), app(4, 200), app(5, 300), app(6, 400), app(7, None, name="[No data]")]
    tagged = with_units(apps, {"sglang-a.service", "sglang-b.service"}, CGROUPS.get)
    assert [a["unit"] for a in tagged] == ["sglang-a.service", "sglang-b.service", "", "", ""]
    assert [a["pid"] for a in tagged] == [100, 200, 300, 400, None]  # nothing else changes


# --- containers --------------------------------------------------------------------------------


def test_podman_and_docker_ps_give_each_container_with_its_unit_label():
    """podman's `ps --format json` (an array, Labels a map) and docker's `--format '{{json .}}'`
    (an object a line, Labels one string, as docker-ps(1) prints it)."""
    podman = json.dumps(
        [
            {"Id": "0123abcd", "Names": ["sglang-a"], "Labels": {"orchestrator.unit": "sglang-a.service"}},
            {"Id": "4567ef01", "Names": ["other"], "Labels": None},
        ]
    )
    assert parse_ps(podman) == [("0123abcd", "sglang-a.service")]
    docker = (
        '{"ID":"89ab","Labels":"org.opencontainers.image.version=22.04,orchestrator.unit=sglang-b.service",'
        '"Names":"sglang-b","State":"running"}\n'
        '{"ID":"cdef","Labels":"","Names":"x","State":"running"}\n'
    )
    assert parse_ps(docker) == [("89ab", "sglang-b.service")]
    assert parse_ps("") == parse_ps("[]\n") == []


def test_a_containers_processes_are_its_main_pid_and_every_descendant():
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert descendants(10, parents) == {10, 11, 12, 13}
    assert descendants(99, parents) == {99}  # gone meanwhile: only itself


def test_proc_parents_reads_the_real_process_table(tmp_path: Path):
    """A command name with spaces and a ')' does not shift the fields."""
    odd = tmp_path / "a) 1 (b"
    shutil.copy("/bin/sleep", odd)
    proc = subprocess.Popen([str(odd), "30"])
    try:
        time.sleep(0.05)
        parents = proc_parents()
        assert parents[proc.pid] == os.getpid() and parents[os.getpid()] == os.getppid()
    finally:
        proc.kill()
        proc.wait()


def test_the_captured_podman_image_and_a_docker_one_give_id_digest_and_labels():
    image = parse_image_inspect(capture("podman-image-inspect.json"))
    assert image == {
        "id": "1ac87e3132daf12f7f0bd0eeb60d931a3d00b7785cc4ab4201ad834af54a9cfb",
        "digests": ["sha256:684a024643f75c3464de281ba9311d99e10a0af7fd07069382d075306a72f5df"],
        "labels": {"sglang.version": "0.5.9"},
    }
    docker = [{"Id": "sha256:" + "ab" * 32, "RepoDigests": [], "Config": {"Labels": None}}]
    assert parse_image_inspect(json.dumps(docker)) == {"id": "ab" * 32, "digests": [], "labels": {}}
    assert parse_image_inspect("[]") == parse_image_inspect("Error: no such image") == {}


@pytest.mark.parametrize(
    ("labels", "version"),
    [
        ({"sglang.version": "0.5.9", "org.opencontainers.image.version": "22.04"}, "0.5.9"),
        ({"org.opencontainers.image.version": "22.04", "org.opencontainers.image.ref.name": "ubuntu"}, ""),
        ({"org.opencontainers.image.title": "SGLang", "org.opencontainers.image.version": "0.5.9"}, "0.5.9"),
        ({}, ""),
    ],
)
def test_an_images_sglang_version_label_and_ubuntus_inherited_one(labels, version):
    assert label_version(labels) == version


# --- nvidia-smi --------------------------------------------------------------------------------


def test_real_gpu_capture_parses_by_field_name():
    [gpu] = parse_gpus(capture("busy-query-gpu.csv"), CAPTURED_GPU_FIELDS)
    assert gpu == {
        "index": 0,
        "uuid": H200,
        "name": "NVIDIA H200",
        "memory_used_mib": 7821,
        "memory_total_mib": 143771,
    }
    [idle] = parse_gpus(capture("idle-query-gpu.csv"), CAPTURED_GPU_FIELDS)
    assert idle["memory_used_mib"] == 0


def test_header_format_with_units_parses_too():
    [gpu] = parse_gpus(capture("idle-query-gpu-header.csv"), CAPTURED_GPU_FIELDS)
    assert (gpu["index"], gpu["memory_used_mib"], gpu["memory_total_mib"]) == (0, 0, 143771)


def test_real_compute_apps_capture_parses_with_the_gpu_index():
    apps = parse_apps(capture("busy-compute-apps.csv"), {H200: 0})
    assert apps == [
        {"gpu": 0, "pid": 424, "process_name": "python3", "used_mib": 3380},
        {"gpu": 0, "pid": 450, "process_name": "python3", "used_mib": 4426},
    ]
    assert parse_apps(capture("idle-compute-apps.csv"), {H200: 0}) == []


def test_a_killed_process_lingers_as_no_data_and_parses_without_a_crash():
    [gpu] = parse_gpus(capture("killed-query-gpu.csv"))
    [app] = parse_apps(capture("killed-compute-apps.csv"), {gpu["uuid"]: 0})
    assert app == {"gpu": 0, "pid": 443, "process_name": "[No data]", "used_mib": 4614}
    assert gpu["memory_used_mib"] == 4623


@pytest.mark.parametrize("value", ["[N/A]", "[No data]", "[Not Supported]", "[Insufficient Permissions]"])
def test_unreadable_figures_become_none(value):
    [gpu] = parse_gpus(f"0, {H200}, NVIDIA H200, {value}, {value}\n")
    assert gpu["memory_used_mib"] is None and gpu["memory_total_mib"] is None
    [app] = parse_apps(f"424, python3, {value}, {H200}\n", {H200: 0})
    assert app["used_mib"] is None


def test_a_process_name_with_commas_and_an_unknown_gpu():
    [app] = parse_apps("7, /opt/a,b/python, 12, GPU-elsewhere\n", {H200: 0})
    assert app == {"gpu": None, "pid": 7, "process_name": "/opt/a,b/python", "used_mib": 12}


def test_error_text_is_no_gpu():
    assert parse_gpus((CAPTURES / "badfield.txt").read_text()) == []
    assert parse_gpus((CAPTURES / "badid.txt").read_text()) == []


# --- GPU decisions -----------------------------------------------------------------------------


def gpu(index: int, used: int | None) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H200", "memory_used_mib": used}


def app(gpu_index: int, pid: int, mib: int | None = 100, name: str = "python3") -> dict:
    return {"gpu": gpu_index, "pid": pid, "process_name": name, "used_mib": mib}


def test_busy_means_memory_above_the_limit_on_a_checked_gpu():
    gpus = [gpu(0, 0), gpu(1, 4623), gpu(2, 10)]
    apps = [app(1, 516, 4614)]
    assert [b["index"] for b in busy_gpus(gpus, apps, [], 0)] == [1, 2]
    assert [b["index"] for b in busy_gpus(gpus, apps, [], 10)] == [1]
    assert [b["index"] for b in busy_gpus(gpus, apps, [0, 2], 10)] == []
    assert busy_gpus(gpus, apps, [1], 0)[0]["holders"] == apps


def test_memory_in_use_with_no_process_listed_is_still_busy():
    [busy] = busy_gpus([gpu(0, 4623)], [], [], 0)
    assert busy["holders"] == []
    assert describe([busy]) == "GPU 0 has 4623 MiB used by no process listed (another PID namespace?)"


def test_unknown_memory_is_judged_by_the_process_list():
    assert busy_gpus([gpu(0, None)], [], [], 0) == []
    assert [b["index"] for b in busy_gpus([gpu(0, None)], [app(0, 5)], [], 0)] == [0]


def test_foreign_gpus_name_only_processes_outside_the_unit():
    gpus = [gpu(0, 9000), gpu(1, 9000), gpu(2, 0)]
    ours = {"unit": "sglang.service"}
    apps = [{**app(0, 10), **ours}, {**app(1, 10), **ours}, {**app(1, 77, name="other"), "unit": ""}]
    [busy] = foreign_gpus(gpus, apps, [], "sglang.service")
    assert busy["index"] == 1 and [h["pid"] for h in busy["holders"]] == [77]
    assert foreign_gpus(gpus, apps, [0], "sglang.service") == []


def test_describe_names_each_holder():
    busy = [{"index": 0, "memory_used_mib": 4623, "holders": [app(0, 516, 4614), app(0, 517, None)]}]
    assert describe(busy) == "GPU 0 has 4623 MiB used by PID 516 python3 4614 MiB, PID 517 python3 ? MiB"
    assert describe(busy, foreign_only=True).startswith("GPU 0 is used by PID 516")


def test_kill_touches_only_a_pid_whose_argv0_is_the_listed_name():
    names = {5: "python3", 6: "bash"}
    assert kill([app(0, 6)], name_of=names.get) == []  # PID 6 is someone else now
    assert kill([app(0, 7, name="[No data]")], name_of=names.get) == []  # already dying
    assert kill([app(0, None)], name_of=names.get) == []


def test_kill_never_touches_a_process_of_an_orchestrator_unit():
    """A neighbouring server's process on one of our GPUs is named, never killed."""
    names = {5: "python3"}
    assert kill([{**app(0, 5), "unit": "sglang-a.service"}], name_of=names.get) == []


def test_the_gpus_a_host_lacks_are_named_with_what_it_has():
    four = [gpu(i, 0) for i in range(4)]
    assert missing_gpus([0, 7], four) == (
        "the server uses GPU 0,7 (2: TP x DP, on server.gpus); GPU 7 is not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)"
    )
    assert missing_gpus([4, 5, 6, 7], four) == (
        "the server uses GPU 4-7 (4: TP x DP, on server.gpus); GPUs 4-7 are not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)"
    )
    assert missing_gpus([3], [gpu(0, 0)]) == (
        "the server uses GPU 3 (1: TP x DP, on server.gpus); GPU 3 is not on this host: "
        "nvidia-smi reports 1 GPU (0)"
    )
    assert missing_gpus([0, 3], four) == "" and missing_gpus([], four) == ""
    assert gpu_ranges([7, 0, 1, 2, 5]) == "0-2,5,7"


def test_idle_message_names_a_neighbour_it_would_not_kill():
    holder = {**app(4, 100, 4000), "unit": "sglang-a.service"}
    report = {
        "busy": [{"index": 4, "memory_used_mib": 4100, "holders": [holder]}],
        "waited_s": 30.0,
        "killed": [],
    }
    assert idle_message(report, 30) == (
        "GPUs not idle after waiting 30.0 s: GPU 4 has 4100 MiB used by PID 100 python3 4000 MiB of "
        "sglang-a.service (sglang-a.service: another orchestrator unit on this host, never killed)"
    )


def test_idle_message_says_how_long_it_waited():
    report = {"busy": [{"index": 0, "memory_used_mib": 5, "holders": []}], "waited_s": 30.04, "killed": []}
    assert idle_message(report, 30).startswith("GPUs not idle after waiting 30.0 s: GPU 0 has 5 MiB")
    assert idle_message(report, 0).startswith("GPUs not idle: GPU 0")
    assert idle_message(report, 0, "sglang.service").startswith("GPUs held outside sglang.service: GPU 0 is")


# --- preflight rules ---------------------------------------------------------------------------

TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": 4096}


def test_an_eagle3_drafter_under_eagle_would_silently_run_at_accept_length_one():
    [problem] = drafter_problems("EAGLE", TARGET, EAGLE3, "/m/d")
    assert "EAGLE-3 model" in problem and "accept length 1.0" in problem
    assert drafter_problems("EAGLE3", TARGET, EAGLE3, "/m/d") == []


def test_eagle3_needs_an_eagle3_drafter_of_the_target_size():
    [problem] = drafter_problems("EAGLE3", TARGET, {"architectures": ["LlamaForCausalLMEagle"]}, "/m/d")
    assert "is not an EAGLE-3 model" in problem
    [size] = drafter_problems("EAGLE3", TARGET, {**EAGLE3, "target_hidden_size": 5120}, "/m/d")
    assert "expects target hidden size 5120, the target model has 4096" in size


def test_hidden_size_of_a_multimodal_wrapper_is_its_text_configs():
    assert hidden_size({"text_config": {"hidden_size": 7168}}) == 7168
    assert hidden_size({"hidden_size": 4096, "text_config": {"hidden_size": 1}}) == 4096
    assert hidden_size({}) is None


def test_read_config_says_what_is_wrong(tmp_path: Path):
    assert read_config(str(tmp_path / "nope"))[1].endswith("does not exist")
    assert read_config(str(tmp_path))[1].endswith("holds no config.json")
    (tmp_path / "config.json").write_text("{")
    assert "is unreadable" in read_config(str(tmp_path))[1]
    (tmp_path / "config.json").write_text(json.dumps(TARGET))
    assert read_config(str(tmp_path)) == (TARGET, "")


#: /proc/net/tcp: a listener on 30000 (0x7530) on any address, one on 3306 on loopback, and an
#: established connection from port 30000.
PROC_NET_TCP = (DATA / "proc-net-tcp.txt").read_text()


def test_listeners_are_the_listening_sockets_of_the_port():
    assert listeners(PROC_NET_TCP, 30000) == {"31337"}  # 0x7530; the established row is no listener
    assert listeners(PROC_NET_TCP, 3306) == {"4242"}
    assert listeners(PROC_NET_TCP, 8080) == set()
    assert listeners("", 30000) == set()


def test_help_flags_are_the_long_options_of_the_real_help_text():
    from orchestrator.paths import ROOT

    text = (ROOT / "orchestrator/profile/sglang_help/launch_server-help-0.5.9.txt").read_text()
    flags = help_flags(text)
    assert {"--model-path", "--port", "--speculative-algorithm"} <= flags
    assert not any(f.startswith("---") for f in flags)


def test_disk_problem_names_free_space(tmp_path: Path):
    assert disk_problem(str(tmp_path), 0) == ""
    assert "MiB free, the logs need" in disk_problem(str(tmp_path), 2**40)
    assert disk_problem(str(tmp_path / "missing"), 1).startswith("log dir ")


# --- several servers on one host -------------------------------------------------------------

#: Two orchestrator units of one 8-GPU host, as their stored facts (units/<unit>.json) say.
UNITS = {
    "sglang-a.service": {"profile": "cg_5tok", "port": 30000, "gpus": [0, 1, 2, 3]},
    "sglang-b.service": {"profile": "cg_2step", "port": 30001, "gpus": [4, 5, 6, 7]},
}
EIGHT = [gpu(i, 70000 if i < 4 else 0) for i in range(8)]
B_GPUS = [4, 5, 6, 7]


def held(gpu_index: int, pid: int, unit: str, mib: int = 70000) -> dict:
    return {**app(gpu_index, pid, mib), "unit": unit}


def test_a_neighbour_on_other_gpus_is_no_problem():
    apps = [held(i, 100 + i, "sglang-a.service") for i in range(4)]
    assert gpu_set_problems(EIGHT, apps, B_GPUS, "sglang-b.service", UNITS, False) == []


def test_a_neighbour_on_our_gpus_is_named_with_its_profile_even_where_holders_may_be_killed():
    apps = [held(4, 123, "sglang-a.service")]
    neighbour = (
        "GPU 4 is used by PID 123 python3 of sglang-a.service (profile cg_5tok), another orchestrator "
        "unit on this host: give this profile other server.gpus or stop sglang-a.service"
    )
    for kill_foreign in (False, True):
        assert gpu_set_problems(EIGHT, apps, B_GPUS, "sglang-b.service", UNITS, kill_foreign) == [neighbour]
    apps = [held(g, 120 + g, "sglang-a.service") for g in (4, 5, 6)]  # one line per unit
    [line] = gpu_set_problems(EIGHT, apps, B_GPUS, "sglang-b.service", UNITS, False)
    assert line.startswith("GPUs 4-6 are used by PID 124 python3, PID 125 python3, PID 126 python3 of ")
    unknown = gpu_set_problems(EIGHT, [held(4, 9, "sglang-x.service")], B_GPUS, "sglang-b.service", {}, False)
    assert "of sglang-x.service (profile unknown)" in unknown[0]


def test_a_foreign_process_counts_only_on_our_gpus_and_our_own_never():
    apps = [held(2, 77, ""), held(5, 78, "", 4000), held(6, 200, "sglang-b.service")]
    assert gpu_set_problems(EIGHT, apps, B_GPUS, "sglang-b.service", UNITS, False) == [
        "GPU 5 is used by PID 78 python3 4000 MiB, outside sglang-b.service (--kill-gpu-holders kills it)"
    ]
    assert gpu_set_problems(EIGHT, apps, B_GPUS, "sglang-b.service", UNITS, True) == []


def test_gpus_of_the_set_the_host_lacks_are_a_problem():
    assert gpu_set_problems(EIGHT[:4], [], B_GPUS, "sglang-b.service", UNITS, False) == [
        "the server uses GPU 4-7 (4: TP x DP, on server.gpus); GPUs 4-7 are not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)"
    ]


def test_another_installed_unit_with_our_port_is_named_with_its_profile():
    units = {**UNITS, "sglang-c.service": {"profile": "old", "port": 30001}}
    installed = ["sglang-a.service", "sglang-b.service"]  # sglang-c.service's unit file was removed
    assert port_problems(30001, "sglang-new.service", [], units, installed) == [
        "port 30001 is the port of sglang-b.service (profile cg_2step) on this host: "
        "give this profile another server.port"
    ]
    assert port_problems(30001, "sglang-b.service", [], units, installed) == []  # our own port


def test_a_listener_on_our_port_is_named_by_its_unit():
    a = [(555, "/usr/bin/python3", "sglang-a.service"), (556, "/usr/bin/python3", "sglang-a.service")]
    assert port_problems(30002, "sglang-b.service", a, UNITS, list(UNITS)) == [
        "port 30002 is taken by PID 555 /usr/bin/python3, PID 556 /usr/bin/python3 of sglang-a.service "
        "(profile cg_5tok), another orchestrator unit on this host: give this profile another server.port"
    ]
    [once] = port_problems(30000, "sglang-b.service", a, UNITS, list(UNITS))  # named for its port only
    assert once.startswith("port 30000 is the port of sglang-a.service (profile cg_5tok) on this host")
    assert port_problems(30002, "sglang-b.service", [(9, "nginx", "")], UNITS, list(UNITS)) == [
        "port 30002 is taken by PID 9 nginx (not sglang-b.service)"
    ]
    ours = [(200, "python3", "sglang-b.service")]
    assert port_problems(30001, "sglang-b.service", ours, UNITS, list(UNITS)) == []


def test_the_units_orchestrator_deployed_are_those_with_stored_facts(tmp_path: Path):
    paths = {"unit_dir": str(tmp_path / "u"), "state_dir": str(tmp_path / "s"), "lock_dir": "/l"}
    assert deployed_units(paths) == {} and installed_units(paths) == {}
    stored = tmp_path / "s" / "units"
    stored.mkdir(parents=True)
    (tmp_path / "u").mkdir()
    for name, facts in UNITS.items():
        (stored / f"{name}.json").write_text(json.dumps({**facts, "digest": "0123456789abcdef"}))
    (stored / ".sglang-c.service.json.k2j4x1").write_text("{")  # write_atomic's temporary file
    (tmp_path / "u" / "sglang-b.service").write_text("[Unit]\n")
    assert list(deployed_units(paths)) == ["sglang-a.service", "sglang-b.service"]
    assert deployed_units(paths)["sglang-a.service"]["profile"] == "cg_5tok"
    assert list(installed_units(paths)) == ["sglang-b.service"]


# --- digest, paths, files ----------------------------------------------------------------------


def test_unit_digest_is_the_control_machines():
    text = "[Unit]\nDescription=SGLang ü\n[Service]\nExecStart=/bin/true\n"
    plan = Plan(profile="p", unit_name="sglang.service", argv=[], environment={}, unit=text, port=30000)
    assert unit_digest(text.encode()) == plan.digest
    assert len(plan.digest) == 16


def test_host_paths():
    paths = {"unit_dir": "/u", "state_dir": "/s", "lock_dir": "/l"}
    assert unit_path(paths, "a.service") == "/u/a.service"
    assert facts_path(paths, "a.service") == "/s/units/a.service.json"
    assert record_path(paths, "a.service") == "/s/last-good/a.service.json"
    assert lock_path(paths, "a.service") == "/l/a.service.lock"


def test_read_json_is_empty_for_anything_but_an_object(tmp_path: Path):
    f = tmp_path / "x.json"
    assert read_json(str(f)) == {}
    for text, want in (("{", {}), ("[1]", {}), ('{"a": 1}', {"a": 1})):
        f.write_text(text)
        assert read_json(str(f)) == want


def test_write_atomic_sets_the_mode_and_leaves_no_temporary_file(tmp_path: Path):
    target = tmp_path / "secret.yaml"
    write_atomic(str(target), b"api-key: x\n", 0o600)
    assert target.read_bytes() == b"api-key: x\n"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.yaml"]


# --- the deploy lock ---------------------------------------------------------------------------


class Failed(Exception):
    pass


class StubModule:
    def fail_json(self, msg: str, **kw: object) -> None:
        raise Failed(msg, kw)


def lock(run_id: str, pid: int = 10, live: tuple[int, ...] = (10, 20), wait_s: float = 0.0) -> dict:
    return {
        "holder": f"me@vm (pid {pid})",
        "run_id": run_id,
        "ttl_s": 600.0,
        "wait_s": wait_s,
        "control": "vm",
        "pid": pid,
        "live_pids": list(live),
        "profile": "llama",
    }


@pytest.fixture
def lock_paths(tmp_path: Path) -> dict[str, str]:
    return {"unit_dir": str(tmp_path), "state_dir": str(tmp_path), "lock_dir": str(tmp_path / "run")}


def test_acquire_writes_the_holder_without_the_control_machines_pid_list(lock_paths):
    acquire(StubModule(), lock_paths, "sglang.service", lock("a"))
    held = json.loads(Path(lock_path(lock_paths, "sglang.service")).read_text())
    assert held["run_id"] == "a" and held["profile"] == "llama" and "live_pids" not in held
    assert held["expires"] - held["since"] == 600.0


def test_another_live_deploy_makes_acquire_wait_then_fail_naming_it(lock_paths):
    acquire(StubModule(), lock_paths, "sglang.service", lock("a", pid=10))
    start = time.monotonic()
    with pytest.raises(Failed) as failed:
        acquire(StubModule(), lock_paths, "sglang.service", lock("b", pid=20, wait_s=0.5))
    assert time.monotonic() - start >= 0.5
    msg, extra = failed.value.args
    assert msg.startswith("another deploy holds this host: me@vm (pid 10) since ")
    assert "deploying llama (waited 0 s)" in msg and extra["lock_holder"]["run_id"] == "a"


def test_a_dead_pids_lock_from_the_same_control_machine_is_taken_over(lock_paths):
    path = lock_path(lock_paths, "sglang.service")
    acquire(StubModule(), lock_paths, "sglang.service", lock("a", pid=10))
    assert try_lock(path, {**lock("b", pid=20, live=(20,)), "expires": time.time() + 60}) is None
    assert read_json(path)["run_id"] == "b"


def test_an_expired_lock_is_taken_over(lock_paths):
    path = Path(lock_path(lock_paths, "sglang.service"))
    path.parent.mkdir()
    path.write_text(json.dumps({"run_id": "old", "control": "elsewhere", "expires": time.time() - 1}))
    assert try_lock(str(path), {**lock("b"), "expires": time.time() + 60}) is None


def test_release_only_removes_the_runs_own_lock(lock_paths):
    acquire(StubModule(), lock_paths, "sglang.service", lock("a"))
    assert release_if_ours(lock_paths, "sglang.service", "b") is False
    assert release_if_ours(lock_paths, "sglang.service", "") is False
    assert release_if_ours(lock_paths, "sglang.service", "a") is True
    assert release_if_ours(lock_paths, "sglang.service", "a") is False


# --- HTTP --------------------------------------------------------------------------------------


def test_health_status_is_the_http_status_or_none_when_refused(server: str):
    assert health_status(f"{server}/health", 2) == 200
    assert health_status(f"{server}/loading", 2) == 503
    assert health_status("http://127.0.0.1:9/health", 2) is None
    assert health_status("", 2) is None


def test_a_kept_lock_is_taken_over_by_its_own_id_with_a_new_expiry_and_waits_for_no_other(lock_paths):
    """A campaign's next deploy takes over its own kept lock (from now, for its ttl); the lock
    file says it is kept."""
    path = lock_path(lock_paths, "sglang.service")
    acquire(StubModule(), lock_paths, "sglang.service", {**lock("camp"), "keep": True})
    first = read_json(path)
    assert first["keep"] is True
    time.sleep(0.01)
    acquire(StubModule(), lock_paths, "sglang.service", {**lock("camp"), "ttl_s": 60.0})
    second = read_json(path)
    assert second["since"] > first["since"] and second["expires"] == second["since"] + 60.0
    with pytest.raises(Failed):
        acquire(StubModule(), lock_paths, "sglang.service", lock("b", pid=20))

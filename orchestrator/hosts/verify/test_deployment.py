"""What a healthy deployment looks like on a host, checked with testinfra.

`orchestrator verify` runs it. It passes each host's plan as JSON in $ORCH_VERIFY_PLANS. It passes
the hosts through testinfra's Ansible backend (`--hosts=ansible://...`).
"""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING

import pytest

from orchestrator.paths import module_utils
from orchestrator.render.launch import credentials_dir

if TYPE_CHECKING:
    from testinfra.host import Host


@pytest.fixture
def plan(host: Host) -> dict:
    """This host's plan (a multi-node rank has its own). Read per test, not at import: one
    process may verify several plans in a row."""
    raw = os.environ.get("ORCH_VERIFY_PLANS")
    if not raw:
        pytest.skip("run through `orchestrator verify`")
    return json.loads(raw)[host.backend.host]


def _main_pid(host: Host, plan: dict) -> int:
    out = host.check_output(f"systemctl show {plan['unit_name']} --property=MainPID --value")
    return int(out.strip() or 0)


def test_unit_file_equals_the_plan(host: Host, plan: dict) -> None:
    unit = host.file(f"/etc/systemd/system/{plan['unit_name']}")
    assert unit.exists, "unit file missing"
    if unit.content_string != plan["unit"]:
        import difflib

        drift = difflib.unified_diff(
            plan["unit"].splitlines(), unit.content_string.splitlines(), "plan", "host", lineterm="", n=0
        )
        pytest.fail("unit drifted from the plan:\n" + "\n".join(list(drift)[2:12]))


def test_service_enabled_and_active(host: Host, plan: dict) -> None:
    service = host.service(plan["unit_name"])
    assert service.is_enabled, "not enabled"
    assert service.is_running, "not active"


def test_port_listens_and_health_is_200(host: Host, plan: dict) -> None:
    if plan["serves_http"]:
        assert host.socket(f"tcp://{plan['bind']}:{plan['port']}").is_listening, (
            f"port {plan['port']} not listening"
        )
    # A multi-node rank other than 0 serves no HTTP: its server's health is rank 0's.
    probe = (
        "import sys, urllib.request;"
        f"sys.stdout.write(str(urllib.request.urlopen({plan['health_url']!r}, timeout=5).status))"
    )
    result = host.run(f"python3 -c {json.dumps(probe)}")
    assert result.stdout.strip() == "200", f"/health: {result.stdout.strip() or result.stderr.strip()[-200:]}"


def _server_process(host: Host, plan: dict) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, what systemd expanded ${CREDENTIALS_DIRECTORY} to) of the server: its
    MainPID's on the host; in a container, the container's own (inspect's Config.Cmd and
    Config.Env: the MainPID there is conmon or the docker client), whose --config file is
    mounted where the unit's credentials directory is."""
    if plan.get("engine"):
        config = _container(host, plan)["Config"]
        environ = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        return list(config.get("Cmd") or []), environ, credentials_dir(plan["unit_name"])
    pid = _main_pid(host, plan)
    assert pid, "no MainPID"
    argv = host.file(f"/proc/{pid}/cmdline").content.split(b"\0")[:-1]
    environ = dict(
        e.decode().split("=", 1) for e in host.file(f"/proc/{pid}/environ").content.split(b"\0") if b"=" in e
    )
    return (
        [a.decode() for a in argv],
        environ,
        environ.get("CREDENTIALS_DIRECTORY", "${CREDENTIALS_DIRECTORY}"),
    )


def _container(host: Host, plan: dict) -> dict:
    """`ENGINE container inspect NAME` (both engines print a JSON array) of the plan's container."""
    out = host.run(f"{plan['engine']} container inspect {plan['container']}")
    assert out.rc == 0, f"no container {plan['container']}: {(out.stderr or out.stdout).strip()[-200:]}"
    return json.loads(out.stdout)[0]


def test_server_argv_and_environment_match_the_plan(host: Host, plan: dict) -> None:
    running, environ, credentials = _server_process(host, plan)
    # systemd expands the credential words of the API key and the adaptive config (and no other:
    # the same text from a profile reaches the server as written) to the unit's own credentials
    # directory.
    planned = list(plan["argv"])
    for key in ("credential_at", "adaptive_at"):
        if plan.get(key) is not None:
            at = plan[key]
            planned[at] = planned[at].replace("${CREDENTIALS_DIRECTORY}", credentials, 1)
    if running != planned:
        from orchestrator.render.launch import flags_of

        have, want = flags_of(running), flags_of(planned)
        diffs = [f"{k}: {have.get(k, '(unset)')} (plan: {want.get(k, '(unset)')})" for k in {*have, *want}]
        diffs = sorted(
            d for d in diffs if d.split(":")[0] and have.get(d.split(":")[0]) != want.get(d.split(":")[0])
        )
        if running[:3] != planned[:3]:
            diffs.insert(0, f"command {running[:3]} (plan: {planned[:3]})")
        pytest.fail("server argv differs from the plan: " + "; ".join(diffs))
    missing = {k: v for k, v in plan["environment"].items() if environ.get(k) != v}
    assert not missing, f"environment lacks {missing}"


def test_adaptive_config_equals_the_plan(host: Host, plan: dict) -> None:
    """The --speculative-adaptive-config file the server read at start is the plan's. Without
    one: skipped, so `verify` does not list it."""
    if not plan.get("adaptive_config"):
        pytest.skip("the plan has no adaptive config")  # not listed by `verify`
    config = host.file(plan["adaptive_path"])
    assert config.exists, f"{plan['adaptive_path']} missing"
    assert config.content_string == plan["adaptive_config"], f"{plan['adaptive_path']} differs from the plan"


def test_container_runs_the_planned_image(host: Host, plan: dict) -> None:
    """The container the unit started runs the image the plan names, by image ID: a tag moved by
    a later pull, or a container left from another deploy, shows here. Host runtime: skipped,
    so `verify` does not list it."""
    if not plan.get("engine"):
        pytest.skip("the host runtime runs no container")  # not listed by `verify`
    running = _container(host, plan)
    assert running["State"].get("Running"), (
        f"container {plan['container']} is {running['State'].get('Status')}"
    )
    label = (running["Config"].get("Labels") or {}).get(LABEL)
    assert label == plan["unit_name"], f"container {plan['container']} is labelled {LABEL}={label}"
    planned = host.run(f"{plan['engine']} image inspect {plan['image']}")
    assert planned.rc == 0, f"the plan's image {plan['image']} is not on this host"
    want = json.loads(planned.stdout)[0]["Id"].removeprefix("sha256:")
    have = running["Image"].removeprefix("sha256:")
    moved = (
        ""
        if "@" in plan["image"]
        else " (a moved tag leaves the unit unchanged; pin runtime.image by digest)"
    )
    assert have == want, (
        f"container {plan['container']} runs image {have[:12]}, the plan's {plan['image']} is {want[:12]}: "
        f"deploy --force-restart to run it{moved}"
    )


#: The host modules' own parsers (plugins/module_utils/orchestrator_host/): `ps` of both
#: engines, a process tree, /proc/PID/cgroup, read here from what testinfra runs on the host.
CONTAINERS = module_utils("orchestrator_host.containers")
PROCS = module_utils("orchestrator_host.procs")
LABEL = CONTAINERS.CONTAINER_LABEL
#: {PID: parent PID} of every process of the host, one `PID PPID` line each.
_PARENTS = (
    "import os\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try: print(p, open(f'/proc/{p}/stat').read().rpartition(')')[2].split()[1])\n"
    "    except OSError: pass\n"
)


def _container_units(host: Host, units: set[str]) -> dict[int, str]:
    """{PID: unit} of every process of a container labelled with one of `units`: its main PID and
    all below it. An engine that is not installed (or does not answer) has no containers."""
    roots = []
    for engine, fmt in CONTAINERS.PS_FORMAT.items():
        listed = host.run(f"{engine} ps --filter label={LABEL} --format '{fmt}'")
        if listed.rc != 0:
            continue
        for cid, unit in CONTAINERS.parse_ps(listed.stdout):
            pid = host.run(f"{engine} inspect --format '{{{{.State.Pid}}}}' {cid}").stdout.strip()
            if unit in units and pid.isdigit() and int(pid):
                roots.append((unit, int(pid)))
    if not roots:
        return {}
    lines = host.run(f"python3 -c {shlex.quote(_PARENTS)}").stdout.splitlines()
    parents = {int(pid): int(ppid) for pid, ppid in (line.split() for line in lines)}
    return {pid: unit for unit, root in roots for pid in CONTAINERS.descendants(root, parents)}


def test_only_the_server_holds_the_gpus(host: Host, plan: dict) -> None:
    """Only the plan's GPU set is looked at: another orchestrator unit of this host may use the
    other GPUs. On ours, a process of another unit is named as such: by its cgroup, or by the
    label of the container it runs in."""
    index_of = {}
    for line in host.check_output("nvidia-smi --query-gpu=index,uuid --format=csv,noheader").splitlines():
        index, _, uuid = line.partition(",")
        index_of[uuid.strip()] = int(index)
    listed = host.run(f"ls -1 {plan['state_dir']}/units").stdout.split()
    units = {n.removesuffix(".json") for n in listed if n.endswith(".json")} | {plan["unit_name"]}
    out = host.check_output(
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits"
    )
    held, containers = [], None
    for line in filter(None, out.splitlines()):
        cells = [c.strip() for c in line.split(",")]  # a process name may hold commas
        pid, name, mib, gpu = cells[0], ",".join(cells[1:-2]), cells[-2], index_of.get(cells[-1])
        if gpu not in plan["gpus"]:
            continue
        owner = PROCS.cgroup_unit(host.run(f"cat /proc/{pid}/cgroup").stdout, units)
        if not owner and pid.isdigit():  # a container outside its unit's cgroup (docker's always are)
            containers = _container_units(host, units) if containers is None else containers
            owner = containers.get(int(pid), "")
        if owner != plan["unit_name"]:
            of = f" of {owner}, another orchestrator unit on this host" if owner else ""
            held.append(f"GPU {gpu}: PID {pid} {name} {mib} MiB{of}")
    assert not held, f"GPUs {plan['gpus']} held outside {plan['unit_name']}: {'; '.join(held)}"


def _http_status(host: Host, url: str) -> str:
    """The HTTP status of GET `url` asked from the host itself, with the server's own Python."""
    code = (
        "import sys, urllib.request as u\n"
        "try:\n    print(u.urlopen(sys.argv[1], timeout=5).status)\n"
        "except Exception as e:\n    print(getattr(e, 'code', None) or type(e).__name__ + ': ' + str(e))"
    )
    return host.run(f"python3 -c {shlex.quote(code)} {shlex.quote(url)}").stdout.strip()


def test_prefill_bootstrap_server_answers(host: Host, plan: dict) -> None:
    """A prefill server's bootstrap server: where its decode peers find its KV cache."""
    pd = plan.get("pd") or {}
    if pd.get("role") != "prefill":
        pytest.skip("not a prefill server")
    bind = plan["bind"] if plan["bind"] not in ("0.0.0.0", "::", "") else "127.0.0.1"
    status = _http_status(host, f"http://{bind}:{pd['bootstrap_port']}/health")
    assert status == "200", f"bootstrap server on port {pd['bootstrap_port']}: {status}"


def test_decode_reaches_its_prefill_peers(host: Host, plan: dict) -> None:
    """Each prefill server's bootstrap, from the decode host, as SGLang's heartbeat asks it."""
    pd = plan.get("pd") or {}
    if pd.get("role") != "decode":
        pytest.skip("not a decode server")
    assert pd["peers"], "the inventory's prefill group is empty: a decode server needs a prefill peer"
    unreached = {
        peer: s for peer in pd["peers"] if (s := _http_status(host, f"http://{peer}/health")) != "200"
    }
    assert not unreached, "prefill bootstrap not reached: " + ", ".join(
        f"{p} ({s})" for p, s in unreached.items()
    )

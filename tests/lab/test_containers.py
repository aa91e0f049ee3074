"""#17, #27: SGLang in a podman or docker container on lab hosts built with `lab up --podman` or
`lab up --docker`; every test runs for each engine.

podman: the hosts carry Debian bookworm's podman 4.3.1, the CDI spec /etc/cdi/nvidia.yaml of their
stand-in GPUs and the image localhost/sglang-standin:VERSION, made from the lab's own root with
`podman import` (no registry). A profile with runtime.kind podman deploys through the same play as
the host runtime: stop, GPU check, unit, start (Type=notify, conmon is MainPID), health, record.
With runtime.cgroups disabled (cgroup v1 is read-only inside systemd-nspawn), conmon and the
container's processes stay in the unit's cgroup: systemd stops them, and the host's nvidia-smi
names their PIDs, which /proc/PID/cgroup puts in the unit.

docker: Debian trixie hosts (docker 26.1, the first Debian docker with CDI) running dockerd with
no bridge and CDI on, the same spec and an image made the same way (`docker import`, saved and
loaded on every host: one image ID). The unit runs `docker run` in the foreground (its MainPID is
the client); the container's processes run under the daemon, in a docker-ID.scope of their own,
and are the unit's by the container's label. GPUs come as CDI devices (runtime.gpu_devices: cdi):
the lab has no NVIDIA Container Toolkit, so a profile with docker's --gpus is stopped by preflight.

The lab hosts inherit the control machine's hard limits and cannot raise them (no
CAP_SYS_RESOURCE), and crun refuses a --ulimit above them where systemd quietly lowers
LimitNOFILE=: so the profiles here ask for what the host has (`lab_limits`).

The module may rebuild the session's lab with podman, then with docker (and back), so it runs
last (lab_podman); the docker lab has DOCKER_HOSTS hosts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_real_hosts import gpu_memory, gpu_pids, healthy, server, units_of

import labutil
from labutil import cmdline, ssh
from orchestrator.errors import OrchestratorError
from orchestrator.lab import nspawn
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = [pytest.mark.lab, pytest.mark.lab_destructive, pytest.mark.lab_podman]

REPO = Path(__file__).resolve().parents[2]
MODEL = "/data/models/Llama-3.3-70B-Instruct"
#: The two servers side by side: one on the host's Python, one in a container.
HOST_SIDE = {"unit": "sglang-a.service", "gpus": "0-3", "port": 30000}
CONTAINER_SIDE = {"unit": "sglang-b.service", "gpus": "4-7", "port": 30001}
ENGINES = ("podman", "docker")
#: A docker lab is built for this module alone: two hosts are all its tests use.
DOCKER_HOSTS = 2


@pytest.fixture(scope="module", params=ENGINES)
def engine_lab(request: pytest.FixtureRequest):
    """A lab built with --podman (or --docker): the running one if it is, else the lab rebuilt with
    that engine (and rebuilt as it was afterwards, unless the session started it: it would take it
    down next)."""
    engine = request.param
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    try:
        if engine == "docker":
            labutil.docker_base().result()  # built beside the earlier tests, or now
        else:
            nspawn.ensure_base(podman=True)
    except OrchestratorError as err:
        pytest.skip(f"{engine} is not installable in a lab host here: {str(err)[:400]}")
    seen = nspawn.status()
    shape = {"hosts": len(seen.hosts), "gpus": seen.gpus, "sglang_version": seen.sglang_version}
    if seen.healthy and getattr(seen, engine):
        yield nspawn.up(**shape, **{engine: True})
        return
    if seen.exists:
        nspawn.down()
    wanted = int(os.environ.get("ORCH_LAB_HOSTS", nspawn.DEFAULT_HOSTS))
    yield nspawn.up(hosts=DOCKER_HOSTS if engine == "docker" else wanted, **{engine: True})
    nspawn.down()
    if seen.healthy and not labutil.SESSION["owns_lab"]:
        nspawn.up(**shape, podman=seen.podman, docker=seen.docker)


def engine(lab) -> str:
    return "docker" if lab.docker else "podman"


def owners(host, pids: set[int]) -> set[str]:
    """The units these processes belong to: the unit whose cgroup holds them (podman's here), or
    the one labelled on the docker container whose scope holds them (docker's, under the daemon)."""
    cgroups = ssh(host, " ".join(f"cat /proc/{p}/cgroup;" for p in sorted(pids)))
    found = units_of(host, pids)
    for ctr in set(re.findall(r"/docker-([0-9a-f]{64})\.scope$", cgroups, re.MULTILINE)):
        label = ssh(
            host, "docker", "inspect", "--format", '{{index .Config.Labels "orchestrator.unit"}}', ctr
        )
        found.add(label.strip())
    return found


def run(lab, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestrator", args[0], "-i", str(lab.inventory), *args[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def deploy(lab, host, ref: str, *extra: str) -> tuple[int, dict]:
    done = run(lab, "deploy", "--limit", host.name, "-p", ref, "--json", *extra)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\n{done.stdout}\n{done.stderr}") from None


def verify(lab, host, ref: str) -> dict[str, str]:
    """`verify --json` of one host: {check: its failure message, '' when it passed}."""
    done = run(lab, "verify", "--limit", host.name, "-p", ref, "--json")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    checks = {c["check"]: c["message"] for c in json.loads(done.stdout)["checks"]}
    assert (done.returncode == 0) == (not any(checks.values())), done.stdout
    return checks


def lab_limits(host) -> tuple[dict, list[str]]:
    """service.limits and a --ulimit nproc the host can give (its hard limits), or nothing to add
    where they are unlimited."""
    said = ssh(host, "ulimit -Hn; ulimit -Hl; ulimit -Hu").split()
    hard = dict(zip(("nofile", "memlock", "nproc"), said, strict=True))
    limits = {}
    if hard["nofile"] != "unlimited":
        limits["nofile"] = hard["nofile"]
    if hard["memlock"] != "unlimited":
        limits["memlock"] = f"{hard['memlock']}K"
    options = [] if hard["nproc"] == "unlimited" else [f"--ulimit=nproc={hard['nproc']}:{hard['nproc']}"]
    return limits, options


def container_doc(lab, host, **more) -> dict:
    """A profile of the lab's engine on the lab's image (podman's pinned by its digest; docker's a
    tag, a local image having no registry digest), with what the lab host needs: podman without
    cgroups, docker's GPUs as CDI devices."""
    limits, options = lab_limits(host)
    runtime = {"kind": engine(lab), "image": lab.image, "pull": "never", "options": options}
    runtime.update({"gpu_devices": "cdi"} if lab.docker else {"cgroups": "disabled"})
    doc = {"extends": "cg_5tok", "runtime": runtime, "service": {"limits": limits}}
    for key, value in more.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return doc


def stopped_by_preflight(rc: int, report: dict) -> dict:
    """The one host of a deploy that failed at preflight (so nothing was stopped), as reported."""
    assert rc == 1, report
    (h,) = report["hosts"]
    assert h["step"] == "preflight", h
    return h


def write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def unit_state(host, unit: str = "sglang.service") -> dict[str, str]:
    return server(host, unit)


@pytest.fixture(scope="module")
def pod(engine_lab, tmp_path_factory) -> str:
    host = engine_lab.hosts[0]
    return write(tmp_path_factory.mktemp("pod"), "pod", container_doc(engine_lab, host))


def test_hosts_carry_the_engine_the_cdi_spec_and_the_image(engine_lab):
    host = engine_lab.hosts[0]
    spec = json.loads(ssh(host, "grep -v '^#' /etc/cdi/nvidia.yaml"))
    assert [d["name"] for d in spec["devices"]] == [str(i) for i in range(engine_lab.gpus)]
    ref = f"localhost/sglang-standin:{engine_lab.sglang_version}"
    if engine_lab.docker:
        assert ssh(host, "docker version --format={{.Server.Version}}").startswith("26.1.")
        assert engine_lab.image == ref
        ids = {
            ssh(h, "docker", "image", "inspect", "--format={{.Id}}", ref).strip() for h in engine_lab.hosts
        }
        assert len(ids) == 1, ids
        info = json.loads(ssh(host, "docker info --format '{{json .}}'"))
        assert (info["Driver"], info["CgroupVersion"]) == ("overlay2", "2")
        assert "/etc/cdi" in info["CDISpecDirs"]
        return
    assert ssh(host, "podman --version").strip() == "podman version 4.3.1"
    ref_, digest = engine_lab.image.split("@")
    assert ref_ == ref
    for h in engine_lab.hosts:
        assert ssh(h, "podman", "image", "inspect", "--format={{.Digest}}", ref).strip() == digest
    assert 'cgroups = "disabled"' in ssh(host, "cat /etc/containers/containers.conf")
    assert ssh(host, "podman info --format={{.Store.GraphDriverName}}").strip() == "overlay"


def test_an_engine_lab_serves_a_plain_request_too(engine_lab):
    """`lab up` (and a deploy without -i) on a --podman (--docker) lab reuses it; the other way
    round is refused (asked of a plain lab, in tests/unit: no second lab here)."""
    shape = {
        "hosts": len(engine_lab.hosts),
        "gpus": engine_lab.gpus,
        "sglang_version": engine_lab.sglang_version,
    }
    assert nspawn.up(**shape, **{engine(engine_lab): True}).reused
    plain = nspawn.up(**shape)
    assert plain.reused and (plain.podman, plain.docker) == (engine_lab.podman, engine_lab.docker)
    assert getattr(nspawn.status(), engine(engine_lab))


def test_deploy_noop_and_restart(engine_lab, pod):
    host = engine_lab.hosts[0]
    rc, report = deploy(engine_lab, host, pod)
    assert rc == 0, report
    (h,) = report["hosts"]
    assert h["ok"] and h["healthy_after_s"] is not None, h
    before = unit_state(host)
    assert before["ActiveState"] == "active"
    # systemd supervises conmon (podman), or the docker client in the foreground
    main = {"podman": "/usr/bin/conmon", "docker": "/usr/bin/docker"}[engine(engine_lab)]
    assert cmdline(host, before["MainPID"])[0] == main
    # The server's GPU processes, as the host's nvidia-smi names them, run the plan's argv and
    # sit in the unit's own cgroup (podman, runtime.cgroups disabled) or in the container's scope
    # under the daemon (docker).
    on_gpu = gpu_pids(host)
    assert sorted(on_gpu) == list(range(engine_lab.gpus)), on_gpu
    pids = set().union(*on_gpu.values())
    if engine_lab.docker:
        ctr = ssh(host, "docker inspect --format={{.Id}} sglang").strip()
        assert units_of(host, pids) == set(), pids
        assert (
            f"0::/system.slice/docker-{ctr}.scope" in ssh(host, f"cat /proc/{min(pids)}/cgroup").splitlines()
        )
    else:
        assert units_of(host, pids) == {"sglang.service"}, pids
    assert owners(host, pids) == {"sglang.service"}, pids
    assert cmdline(host, str(min(pids))) == launch.build(profile_mod.load(pod)).argv
    journal = ssh(host, "journalctl -u sglang.service -n 200 --no-pager")
    assert "The server is fired up and ready to roll!" in journal  # passthrough: its output is the unit's

    rc, again = deploy(engine_lab, host, pod)
    assert rc == 0, again
    (h,) = again["hosts"]
    assert h["ok"] and not h["changed"] and not h["restarted"], h
    assert unit_state(host) == before

    rc, forced = deploy(engine_lab, host, pod, "--force-restart")
    assert rc == 0, forced
    assert forced["hosts"][0]["restarted"]
    after = unit_state(host)
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    assert ssh(host, f"{engine(engine_lab)} ps --format '{{{{.Names}}}}'").split() == [
        "sglang"
    ]  # the old one is gone


def test_a_foreign_process_on_the_containers_gpu_fails_preflight_naming_it(engine_lab, pod):
    """GPU ownership is by cgroup (podman's container is in the unit's) or by the container's label
    (docker's runs under the daemon): the server in the container is ours (its restart is
    allowed), a gpu-hold outside it is foreign."""
    host = engine_lab.hosts[0]
    rc, report = deploy(engine_lab, host, pod)
    assert rc == 0, report
    before = unit_state(host)
    ssh(host, "systemd-run --unit=foreign-gpu-hold /usr/local/bin/gpu-hold --gpu 3 --mib 4000")
    try:
        pid = ssh(host, "sleep 0.5; systemctl show foreign-gpu-hold -p MainPID --value").strip()
        rc, report = deploy(engine_lab, host, pod, "--force-restart")
    finally:
        ssh(host, "systemctl stop foreign-gpu-hold.service")
    h = stopped_by_preflight(rc, report)
    assert f"GPU 3 is used by PID {pid} /usr/bin/python3 4000 MiB, outside sglang.service" in h["message"], h
    assert unit_state(host) == before  # nothing was stopped


def test_a_bad_flag_fails_inside_the_container_and_rolls_back(engine_lab, pod, tmp_path):
    """A profile for SGLang 0.5.23 on the lab's image (0.5.9): an 0.5.23-only flag is what the
    image's SGLang refuses. Preflight reads the image's SGLang, not the host's, and stops the deploy
    with nothing stopped; past it (--no-preflight), the server in the container fails and the host
    is rolled back."""
    host = engine_lab.hosts[0]
    rc, good = deploy(engine_lab, host, pod)
    assert rc == 0, good
    before = unit_state(host)
    doc = container_doc(engine_lab, host, server={"sglang_version": "0.5.23"})
    doc["server"]["extra_args"] = ["--debug-cuda-graph"]
    bad = write(tmp_path, "pod_0523", doc)
    rc, report = deploy(engine_lab, host, bad)
    h = stopped_by_preflight(rc, report)
    assert (
        f"image {engine_lab.image} has SGLang 0.5.9, the profile renders flags for 0.5.23: "
        'set server.sglang_version: "0.5.9" or use an image with 0.5.23'
    ) in h["message"], h
    assert "flag --debug-cuda-graph is not in the `sglang.launch_server --help` of image" in h["message"], h
    assert unit_state(host) == before  # nothing was stopped

    rc, report = deploy(engine_lab, host, bad, "--no-preflight")
    assert rc == 1, report
    (h,) = report["hosts"]
    assert not h["ok"] and h["step"] == "health", h
    assert h["diagnosis"].startswith("unknown or wrong flag"), h
    journal = "\n".join(h["journal"])  # the container's own stderr, through --log-driver=passthrough
    assert "launch_server: error: unrecognized arguments: --debug-cuda-graph" in journal, journal
    assert h["rolled_back_to"] == f"pod ({launch.build(profile_mod.load(pod)).digest})", h
    assert unit_state(host)["ActiveState"] == "active" and healthy(host, 30000)
    assert "# profile: pod\n" in ssh(host, "cat /etc/systemd/system/sglang.service")


def test_preflight_and_verify_look_inside_the_image_and_the_container(engine_lab, pod):
    """preflight answers from the image's own SGLang (cached by image ID: the second run starts no
    container); verify passes on the deployed container and names it once its tag has moved."""
    host = engine_lab.hosts[0]
    ssh(host, "rm -rf /etc/orchestrator/images")
    for _ in range(2):
        done = run(engine_lab, "preflight", "--limit", host.name, "-p", pod, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        (result,) = json.loads(done.stdout)
        assert (result["ok"], result["sglang_version"], result["problems"]) == (True, "0.5.9", [])
    done = run(engine_lab, "preflight", "--limit", host.name, "-p", pod)
    assert f"{host.name}: ok (SGLang 0.5.9 in image {engine_lab.image}, 8 GPUs, " in done.stdout, done.stdout
    cli = engine(engine_lab)
    image_id = ssh(host, cli, "image", "inspect", "--format={{.Id}}", engine_lab.image).strip()
    image_id = image_id.removeprefix("sha256:")
    cached = json.loads(ssh(host, f"cat /etc/orchestrator/images/{image_id}.json"))
    assert cached["sglang_version"] == "0.5.9" and "--speculative-algorithm" in cached["flags"]

    moving = f"localhost/sglang-standin:moving-{os.getpid()}"
    ssh(host, cli, "tag", image_id, moving)
    try:
        doc = container_doc(engine_lab, host)
        doc["runtime"]["image"] = moving  # a tag alone: the unit does not change when it moves
        ref = write(Path(pod).parent, "moving", doc)
        rc, report = deploy(engine_lab, host, ref)
        assert rc == 0, report
        checks = verify(engine_lab, host, ref)
        assert not any(checks.values()) and "container runs the planned image" in checks, checks
        quiet = ["-q"] if cli == "podman" else []  # docker prints the ID alone anyway
        moved = ssh(host, cli, "commit", "--pause=false", *quiet, "sglang", moving).strip()
        moved = moved.removeprefix("sha256:")
        checks = verify(engine_lab, host, ref)
        assert [name for name, message in checks.items() if message] == ["container runs the planned image"]
        assert checks["container runs the planned image"].startswith(
            f"container sglang runs image {image_id[:12]}, the plan's {moving} is {moved[:12]}: "
            "deploy --force-restart to run it"
        ), checks
        rc, report = deploy(engine_lab, host, ref)
        assert rc == 0 and not report["hosts"][0]["restarted"], report  # the unit is the same
        rc, report = deploy(engine_lab, host, ref, "--force-restart")
        assert rc == 0, report
        assert not any(verify(engine_lab, host, ref).values())
    finally:
        deploy(engine_lab, host, pod)
        ssh(host, f"{cli} rmi -f {moving} || true")


def test_a_container_that_dies_fails_the_unit_or_is_restarted(engine_lab, pod, tmp_path):
    """systemd supervises the container itself: a container killed under it fails the unit (exit
    137, GPUs released); with service.restart on-failure systemd starts a new one."""
    host = engine_lab.hosts[0]
    rc, report = deploy(engine_lab, host, pod)
    assert rc == 0, report
    cli = engine(engine_lab)
    ssh(host, f"{cli} kill --signal KILL sglang")
    deadline = time.monotonic() + 30  # ExecStopPost= (podman rm) runs before the unit is failed
    while True:
        shown = ssh(host, "systemctl show sglang.service -p ActiveState -p Result -p ExecMainStatus")
        state = dict(line.split("=", 1) for line in shown.splitlines())
        if state["ActiveState"] not in ("active", "deactivating") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (state["ActiveState"], state["Result"], state["ExecMainStatus"]) == ("failed", "exit-code", "137")
    assert gpu_pids(host) == {} and ssh(host, f"{cli} ps -aq").strip() == ""

    doc = container_doc(engine_lab, host, service={"restart": "on-failure", "restart_sec": 1})
    rc, report = deploy(engine_lab, host, write(tmp_path, "pod_restart", doc))
    assert rc == 0, report
    first = server(host, "sglang.service")["MainPID"]
    ssh(host, f"{cli} kill --signal KILL sglang")
    deadline = time.monotonic() + 60
    while not (healthy(host, 30000) and server(host, "sglang.service")["MainPID"] not in ("0", first)):
        assert time.monotonic() < deadline, server(host, "sglang.service")
        time.sleep(1)
    assert ssh(host, "systemctl show sglang.service -p NRestarts --value").strip() == "1"
    assert ssh(host, f"{cli} ps --format '{{{{.Names}}}}'").split() == ["sglang"]
    rc, report = deploy(engine_lab, host, pod)
    assert rc == 0, report


@pytest.fixture(scope="module")
def side_by_side(engine_lab, tmp_path_factory):
    """One host runs a host-runtime server on GPUs 0-3 and a container on 4-7."""
    host = engine_lab.hosts[1 % len(engine_lab.hosts)]
    tmp = tmp_path_factory.mktemp("pair")
    run(engine_lab, "stop", "--limit", host.name)
    llama = {"model_path": MODEL, "served_model_name": "llama-3.3-70b", "tp_size": 4}

    def server_of(side: dict) -> dict:
        return {**llama, "gpus": side["gpus"], "port": side["port"]}

    left = {
        "extends": "baseline",
        "server": server_of(HOST_SIDE),
        "service": {"unit_name": HOST_SIDE["unit"]},
    }
    right = container_doc(
        engine_lab, host, server=server_of(CONTAINER_SIDE), service={"unit_name": CONTAINER_SIDE["unit"]}
    )
    right["extends"] = "baseline"
    refs = {"host": write(tmp, "left", left), "container": write(tmp, "right", right)}
    for ref in refs.values():
        rc, report = deploy(engine_lab, host, ref)
        assert rc == 0, report
    yield host, refs
    for side in (HOST_SIDE, CONTAINER_SIDE):
        run(engine_lab, "stop", "--limit", host.name, "--unit", side["unit"])
    ssh(
        host,
        "rm -f /etc/systemd/system/sglang-[abc].service /etc/orchestrator/units/sglang-[abc].service.json "
        "/etc/orchestrator/last-good/sglang-[abc].service.json /etc/orchestrator/sglang-[abc].* "
        "&& systemctl daemon-reload",
    )


def test_a_host_server_and_a_container_side_by_side(engine_lab, side_by_side):
    host, refs = side_by_side
    assert healthy(host, HOST_SIDE["port"]) and healthy(host, CONTAINER_SIDE["port"])
    on_gpu = gpu_pids(host)
    assert sorted(on_gpu) == list(range(8)), on_gpu
    assert all(owners(host, on_gpu[g]) == {HOST_SIDE["unit"]} for g in range(4)), on_gpu
    assert all(owners(host, on_gpu[g]) == {CONTAINER_SIDE["unit"]} for g in range(4, 8)), on_gpu
    # Restarting the container leaves the host server alone, and the other way round.
    for moved, still in ((CONTAINER_SIDE, HOST_SIDE), (HOST_SIDE, CONTAINER_SIDE)):
        kept, memory = server(host, still["unit"]), gpu_memory(host)
        ref = refs["container" if moved is CONTAINER_SIDE else "host"]
        rc, report = deploy(engine_lab, host, ref, "--force-restart")
        assert rc == 0 and report["hosts"][0]["restarted"], report
        assert server(host, still["unit"]) == kept
        first, last = (int(x) for x in still["gpus"].split("-"))
        assert all(gpu_memory(host)[g] == memory[g] for g in range(first, last + 1))
    # A host server wanting GPUs 2-5 finds both neighbours, the container named by its unit.
    middle = {
        "extends": "baseline",
        "server": {"model_path": MODEL, "tp_size": 4, "gpus": "2-5", "port": 30002},
    }
    middle["service"] = {"unit_name": "sglang-c.service"}
    before = (server(host, HOST_SIDE["unit"]), server(host, CONTAINER_SIDE["unit"]))
    rc, report = deploy(engine_lab, host, write(Path(refs["host"]).parent, "middle", middle))
    assert rc == 1, report
    text = json.dumps(report)
    assert "sglang-a.service (profile left)" in text and "sglang-b.service (profile right)" in text, text
    assert (server(host, HOST_SIDE["unit"]), server(host, CONTAINER_SIDE["unit"])) == before
    # Stopping the container frees its GPUs (and only those).
    done = run(engine_lab, "stop", "--limit", host.name, "--unit", CONTAINER_SIDE["unit"])
    assert done.returncode == 0, done.stdout + done.stderr
    memory = gpu_memory(host)
    assert all(memory[g] == 0 for g in range(4, 8)) and all(memory[g] > 0 for g in range(4)), memory


# The two docker-only tests stay last in this file: pytest orders an indirect ["docker"] by where
# it is defined, so placed here they run between podman's tests and docker's, on the docker lab.
@pytest.mark.parametrize("engine_lab", ["docker"], indirect=True)
def test_deploy_speed_container_against_host(engine_lab, pod, capsys):
    """The benchmark's container run on a docker lab host, once (docs/speed.md's numbers are the
    script's medians of 5, the host runtime's cg_5tok beside it on the same host). Only the container
    run here: the host runtime's is the script's plain path, and CI's time is better spent elsewhere.
    For docker alone: podman's `--podman` is the same script with another lab."""
    host_index = 3 if len(engine_lab.hosts) >= 4 else 1  # not side_by_side's host
    bench = [
        sys.executable,
        str(REPO / "benchmarks/deploy_speed.py"),
        f"--{engine(engine_lab)}",
        "--repeat",
        "1",
    ]
    bench += ["--host", str(host_index)]
    out = []
    for ref in (pod,):
        env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's orchestrator, not an installed one
        argv = [*bench, "--profile", ref]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        out.append(done.stdout)
    with capsys.disabled():
        print("\n" + "\n".join(out))


@pytest.mark.parametrize("engine_lab", ["docker"], indirect=True)
def test_docker_gpus_docker_cannot_give_are_stopped_by_preflight(engine_lab, pod, tmp_path):
    """What `docker create` takes and only its start refuses, after the stop, preflight names with
    nothing stopped: docker's --gpus (runtime.gpu_devices' default) on a host without the NVIDIA
    Container Toolkit, and a CDI device the host's spec does not define."""
    host = engine_lab.hosts[0]
    rc, report = deploy(engine_lab, host, pod)
    assert rc == 0, report
    before = unit_state(host)
    doc = container_doc(engine_lab, host)
    del doc["runtime"]["gpu_devices"]
    rc, report = deploy(engine_lab, host, write(tmp_path, "gpus", doc))
    h = stopped_by_preflight(rc, report)
    assert "docker's --gpus needs the NVIDIA Container Toolkit on this host" in h["message"], h
    assert unit_state(host) == before  # nothing was stopped

    spec = json.loads(ssh(host, "grep -v '^#' /etc/cdi/nvidia.yaml"))
    spec["devices"] = [d for d in spec["devices"] if d["name"] != "7"]
    ssh(host, "mv /etc/cdi/nvidia.yaml /etc/cdi/nvidia.yaml.orig")
    try:
        ssh(host, f"cat > /etc/cdi/nvidia.yaml <<'EOF'\n{json.dumps(spec)}\nEOF")
        rc, report = deploy(engine_lab, host, pod, "--force-restart")
    finally:
        ssh(host, "mv /etc/cdi/nvidia.yaml.orig /etc/cdi/nvidia.yaml")
    h = stopped_by_preflight(rc, report)
    assert "CDI device nvidia.com/gpu=7 not defined by any spec in /etc/cdi, /var/run/cdi" in h["message"], h
    assert unit_state(host) == before

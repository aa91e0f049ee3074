"""The engines themselves read every free-form container field: what is accepted is what runs.

Generated values for runtime.image, runtime.shm_size, runtime.mounts (source, target,
read_only) and runtime.options (--ulimit, --device, --cap-add, --pids-limit, --security-opt,
--init): each profile is refused with located one-line problems, or the real engines take the
rendered `run` as the profile means it:

- podman (a storage root of its own, test_container_cli.Podman) creates the container over an
  empty root file system, and `podman container inspect` shows each value as written: mounts
  (the source as the engines clean it), shm size, ulimits, devices (the host path as podman
  resolves it), capabilities, pids limit, init; `podman create --pull=never IMAGE` parses the
  image reference ("image not known", never "invalid reference format");
- docker's client, against test_container_cli's recording socket, sends the same values in its
  create request, the image reference as written.

As in test_systemd_oracle.py, refused values are dropped one by one, so the rest of each example
still meets the engines. Nothing is started. Not generated: what depends on the host, which the
engine's own create in preflight judges there (tests/unit/modules/test_engine_cli.py):
--security-opt's apparmor profiles and seccomp files, --device paths this machine lacks, and a
bare --init (podman needs catatonit: "container-init binary not found on the host" here).
ENGINE_ORACLE_EXAMPLES sets how many profiles are generated (15: about 16 s here, podman's create
and inspect being most of it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from test_container_cli import DOCKERS, Podman, _docker_env, _Recorder, podman, recorder  # noqa: F401 (fixtures)

from orchestrator.errors import ProfileError
from orchestrator.profile import container_rules
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

UNIT = "sglang-o.service"
NAME = "sglang-o"
IMAGE = "docker.io/lmsysorg/sglang:v0.5.9"

# --- generated values -------------------------------------------------------------------------

registries = st.sampled_from(
    [
        "docker.io",
        "localhost",
        "localhost:5000",
        "reg.example.com:443",
        "[::1]:5000",
        "Reg.IO",
        "a_b.io",
        "-x.io",
    ]
)
components = st.sampled_from(["lmsysorg", "sglang", "a__b", "a--b", "a..b", "A", "a.b", "_a", "é", "x"])
tag_chars = st.sampled_from([*"azAZ09_.-", "\u0669", "ü", "\n"])
tags = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,6}", fullmatch=True),
    st.lists(tag_chars, min_size=1, max_size=8).map("".join),
    st.just("v" * 129),
)
DIGEST = "sha256:" + "0123456789abcdef" * 4
digests = st.sampled_from([DIGEST, "sha256:" + "0" * 63, "sha256:" + "A" * 64])


def _reference(registry: str, path: list[str], tag: str | None, digest: str | None) -> str:
    return f"{registry}/{'/'.join(path)}{':' + tag if tag else ''}{'@' + digest if digest else ''}"


#: Half of them from parts each of which the engines take, so that references are read back too.
images = st.one_of(
    st.builds(
        _reference,
        st.sampled_from(["docker.io", "localhost:5000", "reg.example.com"]),
        st.lists(st.sampled_from(["lmsysorg", "sglang", "a__b", "a--b", "a.b"]), min_size=1, max_size=2),
        st.from_regex(r"[a-z0-9][a-z0-9._-]{0,6}", fullmatch=True),
        st.none() | st.just(DIGEST),
    ),
    st.builds(
        _reference,
        registries,
        st.lists(components, min_size=1, max_size=2),
        st.none() | tags,
        st.none() | digests,
    ),
)
shm_sizes = st.one_of(
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.integers(0, 10**14),
        st.sampled_from(["", "b", "k", "m", "g", "G", "kb"]),
    ),
    st.sampled_from(["8589934591g", "8589934592g", "1.5g", " 1g", "1g\n", "\u0661g"]),
)
#: Path parts that the path rules are about, under a folder of the test for sources (which must
#: exist for podman) and as they are for targets.
path_parts = st.sampled_from(
    ["data", "m", ".", "..", "", "dev", "nvidia0", "char", "a:b", "x,y", "é", "a b", "mnt"]
)
rel_paths = st.lists(path_parts, min_size=1, max_size=4).map("/".join)
mounts = st.fixed_dictionaries(
    {"source": rel_paths, "target": rel_paths.map(lambda p: "/" + p)}, optional={"read_only": st.booleans()}
)
numbers = st.sampled_from(
    ["0", "1", "-1", "-2", "+5", "007", "65536", str(2**63 - 1), str(2**63), "9" * 19, "5\n"]
)
ulimits = st.builds(
    lambda name, soft, hard: f"--ulimit={name}={soft}{':' + hard if hard else ''}",
    st.sampled_from(["core", "stack", "nproc", "rtprio", "memlock", "bogus", "CORE"]),
    numbers,
    st.none() | numbers,
)
#: Host devices of every machine (and forms of them), and GPU paths, which no rule may let by.
HOSTS = ["/dev/null", "/dev/zero", "/dev/full", "/dev/./null", "/dev//zero", "/dev/null/", "/dev/../dev/null"]
hosts = st.sampled_from(
    [*HOSTS, "/dev/nvidia0", "/dev/nvidiactl", "/dev/char", "/dev/dri/card0", "/dev/.", "/dev"]
)
devices = st.builds(
    lambda host, inside, mode: ":".join(p for p in ("--device=" + host, inside, mode) if p is not None),
    hosts,
    st.none() | st.sampled_from(["/dev/x", "/dev/x/../y", "/dev/nvidiactl", "/", "x", "/dev/a b", "/dev/y/"]),
    st.none() | st.sampled_from(["r", "rw", "wr", "rwm", "mmm", "rr", "x", ""]),
)
other_options = st.sampled_from(
    [
        "--cap-add=IPC_LOCK",
        "--cap-add CAP_SYS_NICE",
        "--cap-add=ipc_lock",
        "--cap-add=NOPE",
        "--cap-add=SYS_PTRACE",
        "--pids-limit=-1",
        "--pids-limit=4096",
        "--pids-limit=0",
        "--pids-limit=01",
        "--pids-limit=9999999999",
        "--security-opt=no-new-privileges",
        "--security-opt=no-new-privileges:true",
        "--security-opt=label=disable",
        "--security-opt=seccomp=unconfined",
        "--init=true",
        "--privileged",
    ]
)
options = st.one_of(ulimits, devices, other_options)
fields = st.fixed_dictionaries(
    {},
    optional={
        "image": images,
        "shm_size": shm_sizes,
        "mounts": st.lists(mounts, max_size=3),
        "options": st.lists(options, max_size=4),
    },
)

#: The values issue 21 named and those this oracle found (an IPv6 registry, which podman 4.3.1's
#: reference grammar lacks; a pids limit past podman's int32 and the kernel's PID_MAX_LIMIT),
#: each an explicit example: the oracle bites when a rule goes.
EXAMPLES = [
    {"image": "docker.io/lmsysorg/sglang:v0.5.\u0669"},
    {"options": ["--ulimit=core=9999999999999999999"]},
    {"options": ["--device=/dev/null:mmm"]},
    {"options": ["--device=/dev/../dev/nvidia0"]},
    {"mounts": [{"source": "m", "target": "/data/m/."}, {"source": "n", "target": "/data/m"}]},
    {"shm_size": "8589934592g"},
    {"options": ["--device=/dev/null/"]},
    {"image": "[::1]:5000/lmsysorg@" + DIGEST},
    {"options": ["--pids-limit=9999999999"]},
]

#: Where a refusal of each generated field may be located.
FIELD_LOCS = re.compile(
    r"runtime\.(image|shm_size|mounts\.(\d+)(\.(source|target|read_only))?|options\.(\d+))"
)


def _doc(values: dict[str, Any], root: Path) -> dict[str, Any]:
    """cg_5tok in a podman container of the generated values, its model and drafter moved under
    `root` (podman mounts them), each mount source under `root` too."""
    runtime: dict[str, Any] = {"kind": "podman", "image": values.get("image", IMAGE), "pull": "never"}
    if "shm_size" in values:
        runtime.update(ipc_host=False, shm_size=values["shm_size"])
    runtime["mounts"] = [{**m, "source": f"{root}/src/{m['source']}"} for m in values.get("mounts", [])]
    runtime["options"] = values.get("options", [])
    return {
        "extends": "cg_5tok",
        "server": {"model_path": f"{root}/model"},
        "speculative": {"draft_model_path": f"{root}/drafter"},
        # no compile cache: systemd makes /var/cache/orchestrator/... at start, not this test
        "service": {"unit_name": UNIT, "compile_cache": False},
        "runtime": runtime,
    }


def _without(values: dict[str, Any], problems: list[Any]) -> dict[str, Any]:
    """The generated values less those the problems are located at."""
    out = {k: (list(v) if isinstance(v, list) else v) for k, v in values.items()}
    drop: dict[str, set[int]] = {"mounts": set(), "options": set()}
    for problem in problems:
        match = FIELD_LOCS.fullmatch(problem.loc)
        assert match, (problem.loc, problem.message)
        if match.group(2) is not None:
            drop["mounts"].add(int(match.group(2)))
        elif match.group(5) is not None:
            drop["options"].add(int(match.group(5)))
        else:
            out.pop(match.group(1))
    for key, indexes in drop.items():
        if key in out:
            out[key] = [v for i, v in enumerate(out[key]) if i not in indexes]
    return out


def _accepted(values: dict[str, Any], root: Path) -> tuple[profile_mod.Profile, dict[str, Any]]:
    while True:
        path = root / "p.yml"
        path.write_text(yaml.safe_dump(_doc(values, root)))
        try:
            return profile_mod.load(str(path)), values
        except ProfileError as exc:
            for problem in exc.problems:
                assert problem.message and "\n" not in str(problem), problem
                event(f"refused: {problem.loc.split('.')[1]}")
            values = _without(values, exc.problems)


def _ulimit_expected(prof: profile_mod.Profile) -> dict[str, tuple[int, int]]:
    found = {}
    for option in prof.runtime.options:
        if option.startswith("--ulimit="):
            name, _, limits = option.removeprefix("--ulimit=").partition("=")
            soft, _, hard = limits.partition(":")
            found[name] = (int(soft), int(hard or soft))
    return found


def _devices_expected(prof: profile_mod.Profile) -> list[tuple[str, str, str]]:
    """(host path, path in the container, mode) of each --device, as the profile means it."""
    found = []
    for option in prof.runtime.options:
        if option.startswith("--device="):
            parts = option.removeprefix("--device=").split(":")
            mode = parts.pop() if parts[-1][:1] != "/" else "rwm"
            found.append((parts[0], parts[-1], mode))
    return found


def _podman_reads(engine: Podman, prof: profile_mod.Profile, p: launch.Plan, root: Path) -> None:
    words = [w for w in p.exec_argv if w != "-d"]
    at = words.index(str(prof.runtime.image))
    name = f"--name={root.name}"  # one each, all removed with the storage root's fixture
    created = engine("create", *words[2:at], name, "--rootfs", str(root / "rootfs"), *words[at + 1 :])
    assert created.returncode == 0, (words, created.stderr)
    shown = json.loads(engine("container", "inspect", root.name).stdout)[0]
    host = shown["HostConfig"]
    rt = prof.runtime
    if rt.shm_size:
        assert host["ShmSize"] == container_rules.size_bytes(rt.shm_size)
    mounted = {(m["Source"], m["Destination"], m["RW"]) for m in shown["Mounts"]}
    for m in rt.mounts:
        assert (container_rules.clean_path(m.source), m.target, not m.read_only) in mounted, mounted
    limits = {u["Name"].removeprefix("RLIMIT_").lower(): (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    for name, expected in _ulimit_expected(prof).items():
        assert limits[name] == expected, (name, limits)
    given = {(d["PathOnHost"], d["PathInContainer"]) for d in host["Devices"]}
    for source, inside, _ in _devices_expected(prof):
        assert (os.path.realpath(source), inside) in given, given
    caps = {o.partition("=")[2].removeprefix("CAP_") for o in rt.options if o.startswith("--cap-add=")}
    assert {f"CAP_{c}" for c in caps} <= set(host["CapAdd"])
    for option in rt.options:
        if option.startswith("--pids-limit="):
            assert host["PidsLimit"] == int(option.partition("=")[2]) or option == "--pids-limit=-1"
    if str(rt.image) != IMAGE:  # the reference parses
        image = engine("create", "--pull=never", str(rt.image))
        assert image.returncode == 125 and image.stderr.strip().endswith("image not known"), image.stderr


def _docker_sends(client: str, seen: _Recorder, socket: Path, prof: profile_mod.Profile, root: Path) -> None:
    """The same profile with runtime.kind docker: its `docker run`, as the client sends it."""
    doc = yaml.safe_load((root / "p.yml").read_text())
    doc["runtime"]["kind"] = "docker"
    (root / "docker.yml").write_text(yaml.safe_dump(doc))
    prof = profile_mod.load(str(root / "docker.yml"))
    p = launch.build(prof)
    seen.requests.clear()
    result = subprocess.run(
        [client, *p.exec_argv[1:]],
        capture_output=True,
        text=True,
        env=_docker_env(socket.parent, socket),
        timeout=60,
    )
    assert "recorded by the test" in result.stderr, result.stderr
    [body] = [b for method, _, b in seen.requests if method == "POST"]
    host, rt = body["HostConfig"], prof.runtime
    assert body["Image"] == str(rt.image)
    if rt.shm_size:
        assert host["ShmSize"] == container_rules.size_bytes(rt.shm_size)
    for m in rt.mounts:
        assert f"{m.source}:{m.target}{':ro' if m.read_only else ''}" in host["Binds"]
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"] or []}
    for name, expected in _ulimit_expected(prof).items():
        assert limits[name] == expected
    sent = {(d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in host["Devices"] or []}
    assert sent == set(_devices_expected(prof)), sent
    caps = {o.partition("=")[2].removeprefix("CAP_") for o in rt.options if o.startswith("--cap-add=")}
    assert {c.removeprefix("CAP_") for c in host["CapAdd"] or []} == caps


def _issue_examples(test: Any) -> Any:
    for values in EXAMPLES:
        test = example(values=values)(test)
    return test


@_issue_examples
@given(values=fields)
@settings(
    max_examples=int(os.environ.get("ENGINE_ORACLE_EXAMPLES", "15")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_the_engines_read_what_the_profile_says(
    values: dict[str, Any],
    podman: Podman,  # noqa: F811
    recorder: tuple[_Recorder, Path],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """podman once, then each docker client here (Debian's 20.10, a newer one on PATH)."""
    if not DOCKERS:
        pytest.skip("no docker CLI here: apt-get install docker.io (scripts/setup.sh --test does)")
    root = tmp_path_factory.mktemp("oracle")
    for name in ("model", "drafter", "rootfs"):
        (root / name).mkdir()
    prof, values = _accepted(values, root)
    for m in prof.runtime.mounts:
        Path(container_rules.clean_path(m.source)).mkdir(parents=True, exist_ok=True)
    event(f"read back: {sorted(values)}")
    p = launch.build(prof)
    _podman_reads(podman, prof, p, root)
    for client in DOCKERS:
        _docker_sends(client, recorder[0], recorder[1], prof, root)

"""Lab hosts: Debian containers with real systemd and sshd, on a private bridge, for real deploys.

Each host `labK` is a `systemd-nspawn -b` container in its own network namespace `orchlabK`. A veth
pair joins it to the bridge `orchlab0` (10.213.0.1/24, hosts at .11, .12, ...). The hosts have no
default route, so the lab never talks to anything but itself and the control machine.

`bastion(JUMP)` makes one host the jump host. The others then refuse SSH from the control machine,
as GPU hosts behind a bastion do. A routing rule in their own namespaces does that. It lasts until
`lift_bastion()`, the next `up`, or `down`.

There is no machined, because the control machine has no systemd as PID 1 and no D-Bus. So nspawn
runs with `--register=no --keep-unit`, detached. The lab keeps its own record (`lab.json`) of every
process, mount, namespace and link it makes. Each is written as soon as it exists. So `down`, or the
next `up` after a crash, removes exactly those and nothing else.

Layout under `state_dir()`:

    lab/lab.json            the record (see `_Record`)
    lab/id_ed25519[.pub]    the lab's SSH key pair, root's only (kept across `down`)
    lab/user_key[.pub]      the key of the login users deploy, deploy-pw, nosudo (kept across `down`)
    lab/become_password     deploy-pw's (and nosudo's) password, random per lab, 0600
    lab/known_hosts         host keys of the current hosts
    lab/inventory.yml       Ansible inventory, group `lab`, as root
    lab/inventory-sudo.yml  the same hosts as `deploy`, becoming root with sudo
    lab/hosts/labK/         root (overlay mount point), upper, work, console.log; with --podman
                            containers/ (its /var/lib/containers), with --docker docker/ (/var/lib/docker)
    lab-cache/<key>/        the debootstrapped base root, the overlay's lower dir (kept across `down`)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import yaml

from orchestrator.errors import InputError, OrchestratorError
from orchestrator.paths import state_dir

Progress = Callable[[str], None] | None
#: Called first by `down`: what serves in front of the hosts (the lab gateway) stops before they go.
#: Such modules add themselves here when imported, so this one imports none of them.
ON_DOWN: list[Callable[[], object]] = []

SUITE = "bookworm"
#: What the deploy needs on a host, and no more: systemd to run units, sshd and python3 for Ansible,
#: sudo/curl/ping for the roles' probes and for debugging by hand.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "procps",
    "sudo",
    "curl",
    "iputils-ping",
)
#: What `up --podman` adds: Debian's podman (4.3.1), its OCI runtime, a network stack (containers-common
#: needs one, though the units use the host network) and catatonit for `--init`.
PODMAN_PACKAGES = ("podman", "crun", "netavark", "catatonit")
#: Podman inside a systemd-nspawn host: cgroup v1 is mounted read-only there, so the containers
#: get no cgroup of their own (they stay in the unit's, which is what systemd supervises and what
#: GPU ownership reads); no journald socket for podman's events, so a file; no session keyring
#: (nspawn's seccomp filter). Storage: overlayfs cannot stack on the host's overlay root, so the
#: host gets /var/lib/containers bound from a plain directory of the control machine
#: (`lab/hosts/labK/containers`), where podman's overlay driver works; `vfs`, which works on any
#: root, copies the whole image at every container start (5.9 s against 0.2 s, measured here).
STORAGE_CONF = """\
# Written by the orchestrator lab: /var/lib/containers is a plain directory bound in by nspawn.
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
"""
CONTAINERS_CONF = """\
# Written by the orchestrator lab: cgroup v1 is read-only inside systemd-nspawn, and its seccomp
# filter refuses keyctl(2) (crun: "create keyring ...: Operation not permitted").
[containers]
cgroups = "disabled"
keyring = false
{ulimits}
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
"""


def containers_conf() -> str:
    """containers.conf for a host of this lab. A host inherits the control machine's hard limits and
    has no CAP_SYS_RESOURCE to raise them, while podman raises RLIMIT_NPROC for root's containers to
    the kernel's maximum (crun: "setrlimit `RLIMIT_NPROC`: Operation not permitted"): so containers
    get the hard limit there is. A profile's service.limits must fit too (`ulimit -H -n -l` there)."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if hard == resource.RLIM_INFINITY:
        return CONTAINERS_CONF.format(ulimits="")
    return CONTAINERS_CONF.format(ulimits=f'default_ulimits = ["nproc={hard}:{hard}"]\n')


#: What `up --docker` builds on: Debian trixie, whose docker.io is 26.1 (bookworm's 20.10 has no
#: CDI, which docker 25 brought) and whose CLI is a package of its own.
DOCKER_SUITE = "trixie"
DOCKER_PACKAGES = ("docker.io", "docker-cli")
#: dockerd in a lab host: the units run with --network=host, so no bridge, NAT or forwarding (the
#: host may not write /proc/sys, and has no iptables of its own to give); CDI on (docker 26 has it
#: behind this feature flag; 28.2 on by default) for `--device nvidia.com/gpu=N`. Its storage,
#: /var/lib/docker, is a plain directory of the control machine (overlay2 cannot stack on the
#: host's overlay root), as /var/lib/containers is for podman.
DAEMON_JSON = {
    "bridge": "none",
    "iptables": False,
    "ip6tables": False,
    "ip-forward": False,
    "ip-masq": False,
    "features": {"cdi": True},
}
#: What a docker host gets from systemd-nspawn beyond a plain host. runc sets up the container's
#: network namespace handling and sysctls (CAP_NET_ADMIN: without it, "failed to create default
#: sandbox: operation not permitted"), joins a session keyring (nspawn's filter refuses keyctl) and
#: installs a BPF device filter in the container's cgroup (cgroup v2: the bpf syscall). The host
#: boots on the unified cgroup hierarchy in a cgroup of its own (`_docker_cgroup`), where runc can
#: make the container's cgroups: on cgroup v1 nspawn mounts the controllers read-only.
DOCKER_NSPAWN = ("--capability=CAP_NET_ADMIN", "--system-call-filter=@keyring bpf")
#: The folder under the control machine's cgroup2 mount that holds a docker host's cgroup.
CGROUP_PARENT = "orchlab"
MIRROR = os.environ.get("ORCHESTRATOR_LAB_MIRROR", "http://deb.debian.org/debian")
BRIDGE = "orchlab0"
SUBNET = "10.213.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
MAX_HOSTS = 50
#: Hosts in a lab brought up without --hosts: enough for a 2-node server beside other replicas, and
#: for a rolling deploy over 4 replicas.
DEFAULT_HOSTS = 4
BOOT_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
#: A clean PATH for commands run in a host; the control machine's PATH (pyenv shims...) means nothing there.
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SSHD_CONF = """\
# Written by the orchestrator lab: root logs in with the lab key only.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
HostKey /etc/ssh/ssh_host_ed25519_key
UseDNS no
"""
#: Bumped whenever what `up` builds into a host changes: a running lab of another format is rebuilt
#: rather than reused (2: the login users and the sglang service user; 3: a 70B model for TP 4;
#: 4: the stand-in knows every shipped --help).
FORMAT = 4
#: Logins as real fleets have them, each with the user key (never root's): `deploy` sudoes without a
#: password, `deploy-pw` with the lab's become password, `nosudo` may not sudo (its password is the same,
#: so sudo gets as far as saying so). `sglang` is a system user for servers run as a non-root service.user.
SUDO_USER, PASSWORD_SUDO_USER, NO_SUDO_USER, SERVICE_USER = "deploy", "deploy-pw", "nosudo", "sglang"
LOGIN_USERS = (SUDO_USER, PASSWORD_SUDO_USER, NO_SUDO_USER)
SUDOERS = f"""\
# Written by the orchestrator lab.
{SUDO_USER} ALL=(ALL) NOPASSWD:ALL
{PASSWORD_SUDO_USER} ALL=(ALL) ALL
"""


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class LabHost:
    """One running host, as `up` left it."""

    name: str
    address: str
    pid: int
    """The systemd-nspawn process."""
    rootfs: Path
    console_log: Path
    systemd_state: str
    """`running`, or `degraded` with `failed_units` naming why."""
    failed_units: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabState:
    """A lab that is up: where its inventories, keys and become password are, and its hosts."""

    inventory: Path
    """Every host as root with `private_key`."""
    private_key: Path
    known_hosts: Path
    hosts: tuple[LabHost, ...]
    gpus: int
    sglang_version: str
    reused: bool
    """True when `up` found this lab already running and changed nothing."""
    sudo_inventory: Path
    """The same hosts as `deploy` with `user_key`, `ansible_become: true` (sudo without a password)."""
    user_key: Path
    """The key of the login users (LOGIN_USERS); root does not accept it."""
    become_password_file: Path
    """`deploy-pw`'s sudo password (0600), new with every lab built."""
    bastion: str | None = None
    """The jump host, while the other hosts refuse SSH from the control machine (see `bastion`)."""
    image: str | None = None
    """`up --podman`: the SGLang stand-in's image on every host, REF@sha256:DIGEST; None without podman."""
    podman: bool = False
    """Built with `up --podman`."""
    docker: bool = False
    """Built with `up --docker` (Debian trixie hosts): `image` is then a tag (REF; a local image has
    no registry digest), every host holding the same image ID."""


@dataclass(frozen=True)
class LabHostStatus:
    """What `status` saw of one recorded host."""

    name: str
    address: str
    pid: int | None
    alive: bool
    systemd_state: str
    """`systemctl is-system-running`, or `-` when the container is not running."""
    ssh: bool


@dataclass(frozen=True)
class LabStatus:
    """The recorded lab, host by host; `hosts` is empty when there is no lab."""

    exists: bool
    complete: bool
    """False while `up` is under way, or when it crashed half-way."""
    inventory: Path | None
    hosts: tuple[LabHostStatus, ...]
    gpus: int | None = None
    sglang_version: str | None = None
    sudo_inventory: Path | None = None
    bastion: str | None = None
    """The jump host, while the others refuse SSH from the control machine (they are not `healthy` then)."""
    podman: bool = False
    """Built with `up --podman`."""
    docker: bool = False
    """Built with `up --docker`."""

    @property
    def healthy(self) -> bool:
        """Every host alive, booted and answering SSH."""
        return (
            self.complete
            and bool(self.hosts)
            and all(h.alive and h.ssh and h.systemd_state in ("running", "degraded") for h in self.hosts)
        )


# ---------------------------------------------------------------- paths and the record


def lab_dir() -> Path:
    """Everything one lab owns lives here; the base root cache sits beside it so `down` keeps it."""
    return state_dir() / "lab"


def cache_dir() -> Path:
    return state_dir() / "lab-cache"


def _host_dir(name: str) -> Path:
    return lab_dir() / "hosts" / name


class _Record:
    """`lab.json`: every thing `up` made, saved the moment it exists so a crash can be cleaned up.

    Shape: {"format", "hosts_wanted", "gpus", "sglang_version", "podman", "docker", "image",
    "complete", "bridge", "run_netns_mount", "bastion", "hosts": {name: {"address", "dir", "netns",
    "veth", "mount", "copied", "cgroup", "pid", "pid_start", "leader", "leader_start", "console"}}};
    each host key appears only once that thing exists.
    """

    def __init__(self, data: dict):
        self.data = data
        self.data.setdefault("hosts", {})

    @staticmethod
    def path() -> Path:
        return lab_dir() / "lab.json"

    @classmethod
    def load(cls) -> _Record | None:
        try:
            return cls(json.loads(cls.path().read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise OrchestratorError(f"cannot read the lab record {cls.path()}: {err}") from err

    def save(self) -> None:
        """Write atomically, so a crash never leaves a half-written record behind."""
        tmp = self.path().with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.path())

    def host(self, name: str) -> dict:
        return self.data["hosts"].setdefault(name, {})

    def note(self, name: str, **things: object) -> None:
        self.host(name).update(things)
        self.save()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One `up`/`down` at a time: two would race over the same bridge and namespaces."""
    lab_dir().mkdir(parents=True, exist_ok=True)
    with open(lab_dir() / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise OrchestratorError(f"another lab up/down is running (lock {lock.name})") from err
        yield


# ---------------------------------------------------------------- small helpers


def _say(progress: Progress, line: str) -> None:
    if progress is not None:
        progress(line)


def _run(argv: list[str], *, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Run a control-machine command; a failure becomes an error that shows what it said."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        raise OrchestratorError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from err
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise OrchestratorError(f"`{' '.join(argv)}` failed ({done.returncode}): {said}")
    return done.stdout


def _tail(path: Path | str | None, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return "(no console log)"
    # The console is a terminal: drop colour codes and carriage returns so the tail reads as plain text.
    plain = [ANSI_ESCAPE.sub("", line).rstrip("\r") for line in text.splitlines()]
    return "\n".join([line for line in plain if line.strip()][-lines:])


def _proc_start(pid: int) -> int | None:
    """The process's start time in ticks: with the pid it names one process, even after pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child (tests run up and down in one process)
        return None
    return int(fields[19])


def _alive(pid: int | None, start: int | None) -> TypeGuard[int]:
    """True if `pid` names the process that started at `start` (and so is a pid, not None)."""
    return pid is not None and start is not None and _proc_start(pid) == start


def _mounts() -> set[str]:
    """Mount points now, with /proc/mounts' octal escapes (spaces...) decoded."""
    points = set()
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1]
        points.add(point.encode().decode("unicode_escape"))
    return points


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _check_root() -> None:
    if os.geteuid() != 0:
        raise OrchestratorError("the lab needs root (network namespaces, mounts, systemd-nspawn)")


def _check_tools() -> None:
    _check_root()
    missing = {pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None}
    if missing:
        raise OrchestratorError(
            f"the lab needs these Debian packages: apt-get install {' '.join(sorted(missing))}"
        )


# ---------------------------------------------------------------- base root and key


def _packages(podman: bool, docker: bool = False) -> tuple[str, ...]:
    if docker:
        return (*PACKAGES, *DOCKER_PACKAGES)
    return (*PACKAGES, *PODMAN_PACKAGES) if podman else PACKAGES


def _suite(docker: bool) -> str:
    return DOCKER_SUITE if docker else SUITE


def _base_key(podman: bool = False, docker: bool = False) -> str:
    """The default base keeps its old key, so a cache built before `--podman` existed stays valid."""
    suite = _suite(docker)
    parts = (suite, MIRROR, *_packages(podman, docker), SSHD_CONF)
    digest = hashlib.sha256(" ".join(parts).encode()).hexdigest()
    return f"{suite}-{'podman-' if podman else ''}{'docker-' if docker else ''}{digest[:10]}"


def ensure_base(progress: Progress = None, podman: bool = False, docker: bool = False) -> Path:
    """The debootstrapped base root, built once (about a minute) and then shared by every host; a
    second one with podman for `up --podman`, a third (Debian trixie) with docker for `up --docker`.

    Built under a temporary name and renamed when done, so a half-built root is never used.
    """
    suite = _suite(docker)
    base = cache_dir() / _base_key(podman, docker)
    if base.is_dir():
        return base
    cache_dir().mkdir(parents=True, exist_ok=True)
    # One build of a base at a time (a test session builds the docker one in a thread beside a
    # `lab up`'s): the second waits, then finds it built.
    with open(cache_dir() / f".{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not base.is_dir():
            _debootstrap(base, suite, podman, docker, progress, lock.fileno())
    return base


def _debootstrap(
    base: Path, suite: str, podman: bool, docker: bool, progress: Progress, lock_fd: int
) -> None:
    tmp = base.with_name(base.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    what = " with podman" if podman else " with docker" if docker else ""
    _say(progress, f"building the {suite} base root{what} with debootstrap (a minute or two, once)")
    log = cache_dir() / f"debootstrap-{base.name}.log"
    include = ",".join(_packages(podman, docker))
    argv = ["debootstrap", "--variant=minbase", f"--include={include}", suite, str(tmp), MIRROR]
    # debootstrap holds the base's lock too: should this process die, a later build still waits.
    with open(log, "w") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=1800, pass_fds=(lock_fd,))
    if done.returncode != 0:
        raise OrchestratorError(f"debootstrap failed ({done.returncode}); end of {log}:\n{_tail(log)}")
    _generalise_base(tmp)
    tmp.rename(base)


def _generalise_base(root: Path) -> None:
    """Drop what must differ per host (host keys, machine id) and add what all hosts share."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    (root / "etc/ssh/sshd_config.d/orchestrator-lab.conf").write_text(SSHD_CONF)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


def private_key() -> Path:
    """The lab's SSH key, made once and kept across `down` so ssh configs that name it stay valid."""
    return _key("id_ed25519", "orchestrator-lab")


def user_key() -> Path:
    """The login users' SSH key: a second key, so a login as `deploy` cannot be root in disguise."""
    return _key("user_key", "orchestrator-lab-users")


def _key(name: str, comment: str) -> Path:
    key = lab_dir() / name
    if not key.exists():
        lab_dir().mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    return key


def become_password_file() -> Path:
    return lab_dir() / "become_password"


def _new_become_password() -> str:
    """A fresh password for this lab, in a file only this user reads from its first byte."""
    password = secrets.token_urlsafe(18)
    path = become_password_file()
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    return password


# ---------------------------------------------------------------- one host's root


def _address(index: int) -> str:
    return f"{SUBNET}.{10 + index}"


def _make_root(record: _Record, name: str, base: Path) -> Path:
    """An overlay over the cached base (instant, tiny); a full copy where overlayfs is refused."""
    hdir = _host_dir(name)
    root, upper, work = hdir / "root", hdir / "upper", hdir / "work"
    if hdir.exists():  # not in the record, so not provably ours to delete: ask rather than guess
        raise OrchestratorError(f"{hdir} exists but is not in the lab record; unmount and remove it by hand")
    for part in (root, upper, work):
        part.mkdir(parents=True)
    options = f"lowerdir={base},upperdir={upper},workdir={work}"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(root)], capture_output=True, text=True
    )
    if mounted.returncode == 0:
        record.note(name, mount=str(root))
    else:
        # cp -a keeps owners, modes, device nodes and hard links; reflink makes it cheap where supported.
        _run(["cp", "-a", "--reflink=auto", f"{base}/.", str(root)], timeout=600)
        record.note(name, copied=True)
    return root


def _personalise(root: Path, name: str, peers: dict[str, str], key: Path, password: str) -> None:
    """What makes a copy of the base one host: its name, machine id, host key, the lab key, its users."""
    (root / "etc/hostname").write_text(name + "\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    hosts = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{BRIDGE_ADDRESS}\tcontrol",
    ]
    hosts += [f"{addr}\t{peer}" for peer, addr in peers.items()]
    (root / "etc/hosts").write_text("\n".join(hosts) + "\n")
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    for old in (root / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(host_key)])
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    auth = ssh_dir / "authorized_keys"
    auth.write_text(key.with_suffix(".pub").read_text())
    auth.chmod(0o600)
    _add_users(root, password)


def _add_users(root: Path, password: str) -> None:
    """The login users (with the user key), their sudoers rules, and the sglang system user.

    Made with the root's own useradd, chpasswd and visudo under chroot, so the files are exactly
    what Debian writes; the password goes to chpasswd on stdin, never on a command line.
    """
    sudoers = root / "etc/sudoers.d/orchestrator-lab"
    sudoers.write_text(SUDOERS)
    sudoers.chmod(0o440)
    script = "set -e\n"
    script += "".join(f"useradd --create-home --shell /bin/bash {user}\n" for user in LOGIN_USERS)
    script += f"useradd --system --home-dir /var/lib/{SERVICE_USER} --create-home "
    script += f"--shell /usr/sbin/nologin {SERVICE_USER}\n"
    script += "chpasswd\n"  # reads `user:password` lines from this script's stdin
    script += "visudo --check --quiet --file=/etc/sudoers.d/orchestrator-lab\n"
    lines = "".join(f"{user}:{password}\n" for user in (PASSWORD_SUDO_USER, NO_SUDO_USER))
    done = subprocess.run(
        ["chroot", str(root), "/bin/sh", "-c", script],
        input=lines, capture_output=True, text=True, timeout=60, env=HOST_ENV,
    )  # fmt: skip
    if done.returncode != 0:
        raise OrchestratorError(f"adding the lab users in {root} failed: {done.stderr.strip()}")
    public = user_key().with_suffix(".pub").read_text()
    for user in LOGIN_USERS:
        uid, gid = _ids(root, user)
        ssh_dir = root / "home" / user / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text(public)
        (ssh_dir / "authorized_keys").chmod(0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, uid, gid)


def _ids(root: Path, user: str) -> tuple[int, int]:
    """A user's uid and gid in the host's own /etc/passwd (the container shares our uid space)."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise OrchestratorError(f"user {user} is not in {root}/etc/passwd")


def _install_standins(root: Path, gpus: int, sglang_version: str) -> bool:
    """Hand the root to the stand-in installer (SGLang, nvidia-smi, models), if it exists yet."""
    if importlib.util.find_spec("orchestrator.lab.standins") is None:
        return False
    install = getattr(importlib.import_module("orchestrator.lab.standins"), "install", None)
    if install is None:  # the package is being written; a lab without stand-ins still serves ssh tests
        return False
    install(root, gpus=gpus, sglang_version=sglang_version)
    return True


# ---------------------------------------------------------------- podman: CDI and the image

#: The stand-in's image: `IMAGE:<sglang version>`, made on the hosts, never pulled.
IMAGE = "localhost/sglang-standin"
#: What the image leaves out of the lab's root: what a host has and a container gets from the
#: host (the GPU config and devices through CDI, models through the profile's mounts), keys and
#: logins, the engine itself, and what only makes it bigger.
IMAGE_EXCLUDES = (
    "./proc/*", "./sys/*", "./dev/*", "./run/*", "./tmp/*", "./var/tmp/*", "./var/lib/containers",
    "./var/cache/apt/*", "./var/lib/apt/lists/*", "./var/log/*", "./usr/share/doc", "./usr/share/man",
    "./usr/share/locale", "./data", "./home", "./root/.ssh", "./etc/ssh/ssh_host_*",
    "./etc/nvidia-standin.json", "./etc/nvidia-standin", "./etc/cdi", "./etc/sudoers.d/*",
    "./usr/bin/podman", "./usr/libexec/podman", "./etc/docker", "./var/lib/docker",
    "./var/lib/containerd", "./usr/sbin/dockerd", "./usr/sbin/docker-*", "./usr/bin/docker",
    "./usr/bin/docker-*", "./usr/bin/containerd*", "./usr/sbin/runc", "./usr/bin/runc",
)  # fmt: skip
#: Inside a host: the root's tarball for `podman import`, then the image as an OCI archive.
_IMAGE_TAR, _IMAGE_OCI = "var/tmp/sglang-standin.tar", "var/tmp/sglang-standin.oci.tar"


def _install_podman(root: Path, gpus: int) -> None:
    """What a podman host has beyond the base: podman's configuration for this lab, the CDI spec."""
    (root / "etc/containers/storage.conf").write_text(STORAGE_CONF)
    (root / "etc/containers/containers.conf").write_text(containers_conf())
    # Debian enables podman-auto-update.timer, which runs at the first boot and fails (no registry):
    # the host would boot `degraded`. The lab pulls nothing.
    for unit in ("podman-auto-update.timer", "podman-auto-update.service"):
        mask = root / "etc/systemd/system" / unit
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    importlib.import_module("orchestrator.lab.standins").install_cdi(root, gpus)


def _image_tarball(root: Path) -> None:
    """The first host's root, stand-ins installed, before it boots: the image's only layer."""
    excludes = [f"--exclude={pattern}" for pattern in IMAGE_EXCLUDES]
    _run(
        ["tar", "--numeric-owner", "-C", str(root), *excludes, "-cf", str(root / _IMAGE_TAR), "."],
        timeout=300,
    )


def _install_docker(root: Path, gpus: int) -> None:
    """What a docker host has beyond the base: dockerd's configuration for this lab, the CDI spec."""
    (root / "etc/docker").mkdir(exist_ok=True)
    (root / "etc/docker/daemon.json").write_text(json.dumps(DAEMON_JSON, indent=2) + "\n")
    importlib.import_module("orchestrator.lab.standins").install_cdi(root, gpus)


def _engine(record: _Record, name: str, engine: str, *argv: str, timeout: float = 300) -> str:
    done = _exec_in(record.host(name)["leader"], [engine, *argv], timeout=timeout)
    if done.returncode != 0:
        raise OrchestratorError(
            f"{name}: `{engine} {' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}"
        )
    return done.stdout.strip()


@dataclass(frozen=True)
class _ImageWords:
    """How one engine makes the stand-in's image and tells it is the same on every host."""

    import_options: tuple[str, ...]
    save_options: tuple[str, ...]
    #: podman: the first host drops the imported image and loads the archive like the others, so
    #: all hold the archive's digest; docker's image ID is the same either way.
    reload_first: bool
    #: The `image inspect` format of what must be one value on every host, and its name.
    same: str
    same_name: str
    archive: str


_IMAGE_WORDS = {
    "podman": _ImageWords(
        ("--quiet",),
        ("--quiet", "--format=oci-archive"),
        True,
        "{{.Digest}}",
        "digests",
        "sglang-standin.oci.tar",
    ),
    "docker": _ImageWords((), (), False, "{{.Id}}", "IDs", "sglang-standin.docker.tar"),
}


def _build_image(record: _Record, sglang_version: str, progress: Progress, engine: str = "podman") -> str:
    """`ENGINE import` the tarball on the first host (no registry), save it as an archive and load
    that on every host, so all hold the same image; returns REF@DIGEST (podman) or REF (docker: an
    image that never was in a registry has no digest to pin it by; all hosts hold one image ID)."""
    started = time.monotonic()
    words = _IMAGE_WORDS[engine]
    names = list(record.data["hosts"])
    first = Path(record.host(names[0])["dir"]) / "root"
    ref = f"{IMAGE}:{sglang_version}"
    changes = [
        f"--change=LABEL org.opencontainers.image.version={sglang_version}",
        "--change=LABEL org.opencontainers.image.title=sglang-standin",
    ]
    _engine(record, names[0], engine, "import", *words.import_options, *changes, f"/{_IMAGE_TAR}", ref)
    _engine(record, names[0], engine, "save", *words.save_options, f"--output=/{_IMAGE_OCI}", ref)
    if words.reload_first:
        _engine(record, names[0], engine, "rmi", ref)
    (first / _IMAGE_TAR).unlink()
    archive = lab_dir() / words.archive
    shutil.move(first / _IMAGE_OCI, archive)

    def load(name: str) -> str:
        if words.reload_first or name != names[0]:
            copy = Path(record.host(name)["dir"]) / "root" / _IMAGE_OCI
            shutil.copyfile(archive, copy)
            _engine(record, name, engine, "load", "--quiet", f"--input=/{_IMAGE_OCI}")
            copy.unlink()
        return _engine(record, name, engine, "image", "inspect", f"--format={words.same}", ref)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:  # 6.6 s each, measured
            seen = set(pool.map(load, names))
    finally:
        archive.unlink()
    if len(seen) != 1:
        raise OrchestratorError(
            f"the hosts loaded {ref} with different {words.same_name}: {', '.join(sorted(seen))}"
        )
    same = seen.pop()
    took = time.monotonic() - started
    if engine == "docker":
        _say(progress, f"image {ref} ({same[:19]}) on {len(names)} hosts in {took:.1f} s")
        return ref
    _say(progress, f"image {ref} on {len(names)} hosts in {took:.1f} s")
    return f"{ref}@{same}"


# ---------------------------------------------------------------- network


def _ensure_bridge(record: _Record) -> None:
    """The one bridge all hosts hang off; refuse one we did not make rather than reuse a stranger's."""
    if record.data.get("bridge"):
        return
    if BRIDGE in _links():
        raise OrchestratorError(
            f"network link {BRIDGE} exists but this lab ({lab_dir()}) did not make it; "
            "is a lab from another state directory up? Run `lab down` there, or `ip link del " + BRIDGE + "`"
        )
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    record.data["bridge"] = BRIDGE
    record.save()
    _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])


def _make_network(record: _Record, name: str, address: str) -> str:
    """A namespace with eth0 at `address`, its other end on the bridge; no default route, on purpose."""
    netns, veth = f"orch{name}", f"ve-orch{name}"
    if _netns_exists(netns) or veth in _links():
        raise OrchestratorError(f"netns {netns} or link {veth} exists but this lab did not make it")
    if "/run/netns" not in _mounts() and "run_netns_mount" not in record.data:
        record.data["run_netns_mount"] = True  # `ip netns add` is about to mount /run/netns on itself
        record.save()
    _run(["ip", "netns", "add", netns])
    record.note(name, netns=netns)
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    record.note(name, veth=veth)
    _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    inside = ["ip", "netns", "exec", netns, "ip"]
    _run([*inside, "addr", "add", f"{address}/24", "dev", "eth0"])
    _run([*inside, "link", "set", "eth0", "up"])
    _run([*inside, "link", "set", "lo", "up"])
    return netns


# ---------------------------------------------------------------- boot and wait


def _boot(record: _Record, name: str, root: Path, netns: str) -> None:
    """Start nspawn detached, its console going to a log: the log is what errors show when boot fails."""
    console = _host_dir(name) / "console.log"
    argv = ["systemd-nspawn", "--register=no", "--keep-unit", "--console=read-only", "--quiet"]
    argv += ["-D", str(root), "-b", "-M", name, f"--network-namespace-path=/run/netns/{netns}"]
    env = None
    if record.data.get("podman"):  # see STORAGE_CONF; inside the host's own dir, so `down` removes it
        storage = _host_dir(name) / "containers"
        storage.mkdir(exist_ok=True)
        argv.append(f"--bind={storage}:/var/lib/containers")
    if record.data.get("docker"):  # see DAEMON_JSON and DOCKER_NSPAWN
        storage = _host_dir(name) / "docker"
        storage.mkdir(exist_ok=True)
        argv += [*DOCKER_NSPAWN, f"--bind={storage}:/var/lib/docker"]
        cgroup = _docker_cgroup(record, name)
        # nspawn stays in the cgroup it starts in (--keep-unit): the shell moves itself there first.
        argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]
        env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    with open(console, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    record.note(name, pid=proc.pid, pid_start=_proc_start(proc.pid), console=str(console))


def _cgroup2_mount() -> Path:
    """Where the control machine mounts the unified cgroup hierarchy (cgroup2): /sys/fs/cgroup on a
    unified machine, /sys/fs/cgroup/unified on a hybrid one."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1].encode().decode("unicode_escape"))
    raise OrchestratorError(
        "`lab up --docker` needs the unified cgroup hierarchy (cgroup2), and /proc/mounts has none: "
        "mount it (mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 none /sys/fs/cgroup/unified)"
    )


def _docker_cgroup(record: _Record, name: str) -> str:
    """A cgroup of the host's own on the unified hierarchy (recorded before it exists, so `down`
    removes it), for systemd in the host to delegate, and runc to make the containers' in."""
    path = _cgroup2_mount() / CGROUP_PARENT / name
    record.note(name, cgroup=str(path))
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _remove_cgroup(name: str, path: str | None) -> list[str]:
    """The host's cgroup tree, deepest first (a cgroup goes once it holds no process): only the
    one this lab names, as _remove_dir."""
    if not path or not Path(path).is_dir():
        return []
    if Path(path) != _cgroup2_mount() / CGROUP_PARENT / name:
        return [f"{name}: recorded cgroup {path} is not this lab's {CGROUP_PARENT}/{name}; left alone"]
    deadline = time.monotonic() + 2  # a cgroup emptied a moment ago may still be busy
    while True:
        for top, _dirs, _files in os.walk(path, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(top)
        if not Path(path).exists() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        Path(path).parent.rmdir()  # the shared parent, once the last host's is gone
    if not Path(path).exists():
        return []
    return [
        f"{name}: cgroup {path} still holds processes (its cgroup.procs lists them): kill them, then "
        "`lab down` again"
    ]


def _leader(pid: int) -> int | None:
    """The container's PID 1: nspawn's only child once the container runs."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _exec_in(leader: int, argv: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `argv` inside the container without SSH (nsenter): for probes before SSH works."""
    cmd = ["nsenter", "-t", str(leader), "-a", "-r", "-w", "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=HOST_ENV)


def _system_state(leader: int) -> str:
    try:
        done = _exec_in(leader, ["systemctl", "is-system-running"], timeout=10)
    except subprocess.TimeoutExpired:
        return "unknown"
    return done.stdout.strip() or "offline"


def _systemd(leader: int) -> tuple[str, tuple[str, ...]]:
    """The container's system state, and the failed units that make it `degraded`."""
    state = _system_state(leader)
    if state != "degraded":
        return state, ()
    failed = _exec_in(leader, ["systemctl", "--failed", "--plain", "--no-legend"]).stdout
    return state, tuple(line.split()[0] for line in failed.splitlines() if line.strip())


def _boot_failure(name: str, entry: dict, why: str) -> OrchestratorError:
    console = entry.get("console")
    return OrchestratorError(
        f"{name}: {why}; the next `lab up` cleans up first, or run `lab down`.\n"
        f"end of {console}:\n{_tail(console)}"
    )


def _wait_booted(record: _Record, name: str, deadline: float) -> tuple[str, tuple[str, ...]]:
    """Wait for systemd in the container to finish booting; `degraded` is accepted with its failed units."""
    entry = record.host(name)
    state = "offline"
    while time.monotonic() < deadline:
        if not _alive(entry["pid"], entry["pid_start"]):
            raise _boot_failure(name, entry, "systemd-nspawn exited during boot")
        leader = _leader(entry["pid"])
        if leader is not None:
            if "leader" not in entry:
                record.note(name, leader=leader, leader_start=_proc_start(leader))
            state, failed = _systemd(leader)
            if state in ("running", "degraded"):
                return state, failed
            if state in ("maintenance", "stopping"):
                raise _boot_failure(name, entry, f"systemd is {state}")
        time.sleep(0.3)
    raise _boot_failure(name, entry, f"not booted after {BOOT_TIMEOUT_S:.0f} s (systemd: {state})")


def ssh_argv(
    address: str, *command: str, connect_timeout: int = 3, user: str = "root", key: Path | None = None
) -> list[str]:
    """`ssh` to a lab host, checking its host key against the lab's file: as root with the lab key, or
    as `user` with the user key (`key` picks another, to show it is refused)."""
    key = key or (private_key() if user == "root" else user_key())
    options = [
        "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={lab_dir() / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
        "-o", f"ConnectTimeout={connect_timeout}",
    ]  # fmt: skip
    return ["ssh", *options, f"{user}@{address}", *command]


def _ssh_ok(address: str, timeout: float = 10) -> bool:
    try:
        done = subprocess.run(ssh_argv(address, "true"), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _wait_ssh(record: _Record, name: str, deadline: float) -> None:
    entry = record.host(name)
    while time.monotonic() < deadline:
        if _ssh_ok(entry["address"]):
            return
        time.sleep(0.3)
    raise _boot_failure(name, entry, f"booted, but ssh root@{entry['address']} does not answer")


# ---------------------------------------------------------------- inventory


def _write_known_hosts(record: _Record) -> Path:
    lines = []
    for name, entry in record.data["hosts"].items():
        pub = (Path(entry["dir"]) / "root/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"{name},{entry['address']} {pub[0]} {pub[1]}")
    path = lab_dir() / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_inventory(record: _Record, sudo: bool = False) -> Path:
    """A plain Ansible YAML inventory, group `lab`: as root, or (`sudo`) as `deploy` becoming root.

    Every connection variable is set per host rather than on the group, so a reader that loads the
    YAML without Ansible's variable merging still finds all of a host's settings in one place.
    """
    common_args = f"-o UserKnownHostsFile={lab_dir() / 'known_hosts'} -o StrictHostKeyChecking=yes"
    login = {"ansible_user": SUDO_USER, "ansible_become": True} if sudo else {"ansible_user": "root"}
    hosts = {
        name: {
            "ansible_host": entry["address"],
            **login,
            "ansible_ssh_private_key_file": str(user_key() if sudo else private_key()),
            "ansible_ssh_common_args": common_args + " -o IdentitiesOnly=yes",
            "ansible_python_interpreter": "/usr/bin/python3",
            "lab_gpus": record.data["gpus"],
            "lab_sglang_version": record.data["sglang_version"],
            **({"lab_image": record.data["image"]} if record.data.get("image") else {}),
        }
        for name, entry in record.data["hosts"].items()
    }
    path = lab_dir() / ("inventory-sudo.yml" if sudo else "inventory.yml")
    header = "# Written by `orchestrator lab up`; rewritten on every up, removed by `lab down`.\n"
    path.write_text(
        header + yaml.safe_dump({"all": {"children": {"lab": {"hosts": hosts}}}}, sort_keys=False, width=1000)
    )
    return path


def _state(record: _Record, booted: dict[str, tuple[str, tuple[str, ...]]], reused: bool) -> LabState:
    hosts = tuple(
        LabHost(
            name=name,
            address=entry["address"],
            pid=entry["pid"],
            rootfs=Path(entry["dir"]) / "root",
            console_log=Path(entry["console"]),
            systemd_state=booted.get(name, ("running", ()))[0],
            failed_units=booted.get(name, ("running", ()))[1],
        )
        for name, entry in record.data["hosts"].items()
    )
    return LabState(
        inventory=lab_dir() / "inventory.yml",
        private_key=private_key(),
        known_hosts=lab_dir() / "known_hosts",
        hosts=hosts,
        gpus=record.data["gpus"],
        sglang_version=record.data["sglang_version"],
        reused=reused,
        sudo_inventory=lab_dir() / "inventory-sudo.yml",
        user_key=user_key(),
        become_password_file=become_password_file(),
        bastion=record.data.get("bastion"),
        image=record.data.get("image"),
        podman=bool(record.data.get("podman")),
        docker=bool(record.data.get("docker")),
    )


# ---------------------------------------------------------------- bastion

#: The routing-policy rule that makes a host refuse SSH from the control machine, in the host's own
#: network namespace: sshd's answers to the bridge address have no route (`prohibit`), so a connection
#: from the control machine to port 22 never completes (it times out, as behind a dropping firewall),
#: while connections from the jump host (another address on the bridge) and to every other port (the
#: server's, ping) still get through. Only iproute2, which the lab needs anyway.
BASTION_PREF = "100"
BASTION_RULE = ("pref", BASTION_PREF, "to", BRIDGE_ADDRESS, "ipproto", "tcp", "sport", "22", "prohibit")


def bastion(jump: str) -> tuple[str, ...]:
    """Make lab host `jump` the jump host: from now on every other host refuses SSH from the control
    machine and accepts it from `jump` (ssh -J root@JUMP, or ProxyJump in ssh_args). Returns the hosts
    that refuse. `lift_bastion()`, the next `up` and `down` undo it."""
    _check_root()
    with _locked():
        record = _Record.load()
        if record is None or not record.data.get("complete"):
            raise InputError("no lab is up: run `lab up` first")
        hosts = record.data["hosts"]
        if jump not in hosts:
            raise InputError(f"no lab host {jump!r}; the lab has {', '.join(hosts)}")
        _lift(record)
        record.data["bastion"] = jump  # recorded first: a crash half-way is still undone
        record.save()
        behind = tuple(name for name in hosts if name != jump)
        for name in behind:
            _run(["ip", "-n", hosts[name]["netns"], "rule", "add", *BASTION_RULE])
        return behind


def lift_bastion() -> bool:
    """Every lab host answers SSH from the control machine again; True if a bastion was set."""
    _check_root()
    with _locked():
        record = _Record.load()
        return record is not None and _lift(record)


def _lift(record: _Record) -> bool:
    if not record.data.get("bastion"):
        return False
    for entry in record.data["hosts"].values():
        netns = entry.get("netns")
        if not netns or not _netns_exists(netns):
            continue
        while _run(["ip", "-n", netns, "rule", "show", "pref", BASTION_PREF]).strip():
            _run(["ip", "-n", netns, "rule", "del", "pref", BASTION_PREF])
    record.data["bastion"] = None
    record.save()
    return True


# ---------------------------------------------------------------- public: up, status, down


def up(
    hosts: int = DEFAULT_HOSTS,
    gpus: int = 8,
    sglang_version: str = "0.5.9",
    progress: Progress = None,
    podman: bool = False,
    docker: bool = False,
) -> LabState:
    """Bring up `hosts` lab hosts, or return the running lab unchanged if it already matches.

    `podman`: the hosts also carry Debian's podman, a CDI spec for the stand-in GPUs and the image
    `IMAGE:VERSION` of the SGLang stand-in, made from the lab's own root (see `_build_image`).
    `docker`: the same with Debian trixie's docker (DAEMON_JSON, DOCKER_NSPAWN) in place of podman,
    on trixie hosts.

    A record left by a crash (dead processes, half-made hosts) is cleaned up first, then the lab is
    built afresh: state that survived a crash is not trusted.
    """
    if not 1 <= hosts <= MAX_HOSTS:
        raise InputError(f"--hosts must be between 1 and {MAX_HOSTS}, not {hosts}")
    if not 1 <= gpus <= 64:
        raise InputError(f"--gpus must be between 1 and 64, not {gpus}")
    if not sglang_version.strip():
        raise InputError("--sglang-version must not be empty")
    if podman and docker:
        raise InputError(
            "--podman and --docker are two labs (bookworm's podman, trixie's docker): choose one"
        )
    _check_tools()
    if docker:
        _cgroup2_mount()  # before anything is built
    with _locked():
        record = _Record.load()
        if record is not None:
            live = _reuse(record, hosts, gpus, sglang_version, podman, docker)
            if live is not None:
                _say(progress, f"lab already up with {hosts} hosts; nothing to do")
                return live
            if record.data.get("complete") and record.data.get("format") != FORMAT:
                _say(progress, "the running lab was built by an older orchestrator: rebuilding it")
            else:
                _say(progress, "cleaning up what the last, unfinished lab left behind")
            _teardown(record, progress)
        return _build(hosts, gpus, sglang_version, progress, podman, docker)


def _reuse(
    record: _Record, hosts: int, gpus: int, sglang_version: str, podman: bool, docker: bool = False
) -> LabState | None:
    """The running lab if it is whole; an InputError if it is whole but not what was asked for."""
    entries = record.data["hosts"]
    if record.data.get("format") != FORMAT:  # built without what this version's tests stand on
        return None
    whole = record.data.get("complete") and all(
        _alive(e.get("pid"), e.get("pid_start")) and _leader(e["pid"]) for e in entries.values()
    )
    if not whole:
        return None
    # A --podman (or --docker) lab is a plain lab and more: it serves a plain request (a deploy
    # without -i, a test), while a plain lab asked for an engine is refused.
    built_with = "--podman" if record.data.get("podman") else "--docker" if record.data.get("docker") else ""
    wanted = "--podman" if podman else "--docker" if docker else built_with
    asked = (hosts, gpus, sglang_version, wanted)
    has = (len(entries), record.data["gpus"], record.data["sglang_version"], built_with)

    def said(values: tuple) -> str:
        return f"hosts={values[0]} gpus={values[1]} sglang-version={values[2]}" + f" {values[3]}".rstrip()

    if asked != has:
        raise InputError(f"a lab is up with {said(has)}; run `lab down` first to get {said(asked)}")
    _lift(record)  # `up` promises hosts the control machine reaches (a test that set a bastion crashed)
    booted = {name: _systemd(_leader(e["pid"]) or 0) for name, e in entries.items()}
    return _state(record, booted, reused=True)


def _build(
    hosts: int, gpus: int, sglang_version: str, progress: Progress, podman: bool, docker: bool = False
) -> LabState:
    started = time.monotonic()
    base = ensure_base(progress, podman=podman, docker=docker)
    key = private_key()
    user_key()
    password = _new_become_password()
    record = _Record(
        {
            "format": FORMAT,
            "hosts_wanted": hosts,
            "gpus": gpus,
            "sglang_version": sglang_version,
            "podman": podman,
            "docker": docker,
            "complete": False,
        }
    )
    record.save()
    names = [f"lab{i}" for i in range(1, hosts + 1)]
    peers = {name: _address(i) for i, name in enumerate(names, start=1)}
    _ensure_bridge(record)
    standins = False
    for name in names:
        record.note(name, address=peers[name], dir=str(_host_dir(name)))
        root = _make_root(record, name, base)
        _personalise(root, name, peers, key, password)
        standins = _install_standins(root, gpus, sglang_version)
        if podman:
            _install_podman(root, gpus)
        if docker:
            _install_docker(root, gpus)
        if (podman or docker) and name == names[0]:
            _image_tarball(root)
        netns = _make_network(record, name, peers[name])
        _boot(record, name, root, netns)
        _say(progress, f"{name}: booting at {peers[name]}")
    if not standins:
        _say(
            progress, "orchestrator.lab.standins is not there yet: hosts have no SGLang/nvidia-smi stand-ins"
        )
    _write_known_hosts(record)
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    booted = {}
    for name in names:
        booted[name] = _wait_booted(record, name, deadline)
        _wait_ssh(record, name, deadline)
        failed = f" (failed units: {', '.join(booted[name][1])})" if booted[name][1] else ""
        _say(progress, f"{name}: {booted[name][0]}{failed}, ssh answers")
    if podman:
        record.data["image"] = _build_image(record, sglang_version, progress)
        record.save()
    if docker:
        record.data["image"] = _build_image(record, sglang_version, progress, "docker")
        record.save()
    _write_inventory(record)
    _write_inventory(record, sudo=True)
    record.data["complete"] = True
    record.save()
    _say(progress, f"lab up: {hosts} hosts in {time.monotonic() - started:.1f} s")
    return _state(record, booted, reused=False)


def status() -> LabStatus:
    """What is running of the recorded lab; probes each host (systemd state, an SSH login)."""
    record = _Record.load()
    if record is None:
        return LabStatus(exists=False, complete=False, inventory=None, hosts=())
    seen = []
    for name, entry in record.data["hosts"].items():
        pid = entry.get("pid")
        alive = _alive(pid, entry.get("pid_start"))
        leader = _leader(pid) if alive and pid else None
        state = _system_state(leader) if leader else "-"
        ssh = alive and _ssh_ok(entry["address"], timeout=5)
        seen.append(LabHostStatus(name, entry["address"], pid, alive, state, ssh))
    inventory, sudo_inventory = lab_dir() / "inventory.yml", lab_dir() / "inventory-sudo.yml"
    return LabStatus(
        exists=True,
        complete=bool(record.data.get("complete")),
        inventory=inventory if inventory.exists() else None,
        hosts=tuple(seen),
        gpus=record.data.get("gpus"),
        sglang_version=record.data.get("sglang_version"),
        sudo_inventory=sudo_inventory if sudo_inventory.exists() else None,
        bastion=record.data.get("bastion"),
        podman=bool(record.data.get("podman")),
        docker=bool(record.data.get("docker")),
    )


def down(progress: Progress = None) -> bool:
    """Remove exactly what `up` recorded; True if there was a lab to remove.

    The base root cache and the lab key stay, so the next `up` is quick and old ssh configs still work.
    """
    _check_root()
    for stop in ON_DOWN:
        stop()
    with _locked():
        record = _Record.load()
        if record is None:
            _say(progress, "no lab recorded; nothing to do")
            return False
        _teardown(record, progress)
        return True


def _teardown(record: _Record, progress: Progress) -> None:
    """Undo the record host by host, newest first, saving after each so an interrupted `down` resumes."""
    problems: list[str] = []
    for name in reversed(list(record.data["hosts"])):
        host_problems = _remove_host(name, record.host(name))
        if host_problems:
            problems += host_problems
            continue
        del record.data["hosts"][name]
        record.save()
        _say(progress, f"{name}: removed")
    if not problems:
        problems += _remove_shared(record)
    if problems:
        record.save()
        raise OrchestratorError("lab down left things behind:\n" + "\n".join(problems))
    made = ("inventory.yml", "inventory-sudo.yml", "known_hosts", become_password_file().name)
    for path in [*(lab_dir() / name for name in made), _Record.path()]:
        path.unlink(missing_ok=True)
    _say(progress, "lab down: nothing left running")


def _remove_host(name: str, entry: dict) -> list[str]:
    _stop(name, entry)
    problems = []
    if _alive(entry.get("pid"), entry.get("pid_start")) or _alive(
        entry.get("leader"), entry.get("leader_start")
    ):
        problems.append(f"{name}: container processes survive SIGKILL (pid {entry.get('pid')})")
        return problems
    mount = entry.get("mount")
    if mount and mount in _mounts() and subprocess.run(["umount", mount], capture_output=True).returncode:
        subprocess.run(["umount", "--lazy", mount], capture_output=True)
    if entry.get("veth") in _links():
        subprocess.run(["ip", "link", "del", entry["veth"]], capture_output=True)
    if entry.get("netns") and _netns_exists(entry["netns"]):
        subprocess.run(["ip", "netns", "del", entry["netns"]], capture_output=True)
    problems += _remove_dir(name, entry.get("dir"))
    problems += _remove_cgroup(name, entry.get("cgroup"))
    if entry.get("veth") in _links() or (entry.get("netns") and _netns_exists(entry["netns"])):
        problems.append(f"{name}: could not delete {entry.get('veth')} / netns {entry.get('netns')}")
    return problems


def _remove_dir(name: str, path: str | None) -> list[str]:
    """Delete the host's own directory: only the one this lab names, and never across a mount."""
    if not path or not Path(path).exists():
        return []
    if Path(path) != _host_dir(name):
        return [f"{name}: recorded dir {path} is not {_host_dir(name)}; left alone"]
    busy = [point for point in _mounts() if point == path or point.startswith(path + "/")]
    if busy:
        return [f"{name}: still mounted under {path}: {', '.join(sorted(busy))}"]
    shutil.rmtree(path)
    return []


def _stop(name: str, entry: dict) -> None:
    """SIGTERM makes nspawn power the container off cleanly; SIGKILL if that takes too long.

    Killing nspawn alone would orphan the container, so its PID 1 is killed too when it outlives nspawn.
    """
    pid, start = entry.get("pid"), entry.get("pid_start")
    if _alive(pid, start) and "leader" not in entry and (leader := _leader(pid)):
        entry["leader"], entry["leader_start"] = leader, _proc_start(leader)
    for target, target_start in ((pid, start), (entry.get("leader"), entry.get("leader_start"))):
        if not _alive(target, target_start):
            continue
        if target == pid:
            os.kill(target, signal.SIGTERM)
            if _wait_gone(target, target_start, STOP_TIMEOUT_S):
                continue
        os.kill(target, signal.SIGKILL)
        _wait_gone(target, target_start, 5)


def _wait_gone(pid: int, start: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid, start):
            return True
        time.sleep(0.1)
    return not _alive(pid, start)


def _remove_shared(record: _Record) -> list[str]:
    """The bridge, and /run/netns's self-mount if our first `ip netns add` made it and it is now empty."""
    bridge = record.data.get("bridge")
    if bridge and bridge in _links():
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        if bridge in _links():
            return [f"could not delete bridge {bridge}"]
    record.data["bridge"] = None
    if record.data.get("run_netns_mount") and "/run/netns" in _mounts() and not os.listdir("/run/netns"):
        subprocess.run(["umount", "/run/netns"], capture_output=True)
    with contextlib.suppress(OSError):
        (lab_dir() / "hosts").rmdir()
    return []

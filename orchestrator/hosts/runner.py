"""ansible-runner in one place: the playbook call, its settings, and events turned into typed results.

Engine layer: never prints. Callers get `TaskEvent`s while the play runs (for a live
view) and a `PlayResult` at the end.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from orchestrator.errors import OrchestratorError
from orchestrator.hosts import ansible_config, diagnose, vault
from orchestrator.hosts import inventory as inventory_mod
from orchestrator.hosts.playvars import PlayVars
from orchestrator.paths import COLLECTION, PLAYBOOKS_DIR, state_dir

#: Runs kept under the state directory's runs/; older ones are removed.
KEEP_RUNS = 20
#: ansible-playbook's prompt for --ask-become-pass (AGNOSTIC_BECOME_PROMPT, which _run sets), which
#: ansible-runner answers through the pty it runs the play on.
BECOME_PROMPT = r"^BECOME password:\s*$"
#: The become password the command line asked for once (-K), for every play of that command.
_become_password = ""


def use_become_password(password: str) -> None:
    """Every later play of this process answers Ansible's become prompt with `password` ("": none)."""
    global _become_password
    _become_password = password


@dataclass
class TaskEvent:
    """One host starting or finishing one task."""

    host: str
    kind: str  # start, progress (a report of a task still running), ok, changed, failed, skipped, unreachable
    role: str
    #: The module or action plugin the task ran (`sglang_probe` for orchestrator.sglang.sglang_probe,
    #: `ansible.builtin.command`):
    #: what results are read by, never the task's display name.
    action: str
    result: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)


@dataclass
class HostRun:
    """Everything one host did in one play."""

    host: str
    events: list[TaskEvent] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    @property
    def failed(self) -> TaskEvent | None:
        return next((e for e in self.events if e.kind in ("failed", "unreachable")), None)

    @property
    def changed(self) -> bool:
        return any(e.kind == "changed" for e in self.events)

    def result_of(self, action: str) -> dict[str, Any] | None:
        """The module result of the last finished task that ran `action` (skipped ones excluded)."""
        for e in reversed(self.events):
            if e.kind not in ("start", "progress", "skipped") and e.action == action:
                return e.result
        return None


class PlayCanceled(OrchestratorError):
    """ansible-runner stopped the play on Ctrl-C, SIGTERM or SIGHUP; `logs --follow` ends quietly.

    `partial` holds what each host did before the stop, for a deploy to put its hosts back.
    """

    def __init__(self, message: str, partial: PlayResult | None = None):
        super().__init__(message)
        self.partial = partial


_canceled = 0  # the newest cancel_plays(); a play in a thread started before it stops


def cancel_plays() -> None:
    """Cancel the plays that other threads run now (a tune campaign's hosts), as Ctrl-C cancels
    the main thread's. Called by the main thread when it sees the Ctrl-C. A play started after
    this call (a rollback) runs."""
    global _canceled
    _canceled += 1  # only the main thread writes it


@contextmanager
def _interrupts() -> Iterator[Callable[[], bool]]:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal or ssh session went away) as a flag, the old
    handlers back afterwards. A deploy that sees it rolls back what it changed.

    ansible-runner's own handlers are never restored, so they would swallow every later Ctrl-C
    (say, between two plays of `logs --follow`), and one that lands after its last look at the
    flag is lost. With ours, a signal at any moment of the play is seen, and cancels it.
    """
    caught = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        # only the main thread gets signals and may set handlers: it cancels through cancel_plays
        began = _canceled
        yield lambda: _canceled != began
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    # An ignored signal stays ignored: under nohup a hangup must not stop the deploy.
    saved = {sig: signal.getsignal(sig) for sig in signals if signal.getsignal(sig) != signal.SIG_IGN}
    for sig in saved:
        signal.signal(sig, lambda *_: caught.set())
    try:
        yield caught.is_set
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@dataclass
class PlayResult:
    rc: int
    status: str
    hosts: dict[str, HostRun]
    artifacts: Path


#: Hosts a play works on at once where neither ansible.cfg nor deploy --forks says.
DEFAULT_FORKS = 20


def _settings(forks: int) -> dict[str, str]:
    """The user's Ansible configuration (ansible.cfg, ANSIBLE_*) kept whole, with orchestrator's collection
    added to its collection paths, and Ansible's own means for speed where the user left the default:
    pipelining, SSH multiplexing, forks, and a strategy (linear, frozen out of GC before workers fork:
    plugins/strategy/). See ansible_config."""
    return ansible_config.play_environment(ansible_config.read(), forks)


def _play_directory() -> str | None:
    """The user's directory, for the play to start in: relative paths in their configuration (an
    `ssh_args = -F ssh_config`, a key file named in the inventory) mean there what they mean to their
    own ansible-playbook. None (ansible-runner's private directory) when it is gone."""
    try:
        return os.getcwd()
    except OSError:
        return None


def ansible_command(name: str) -> str:
    """`ansible-playbook` (or `ansible`) of the ansible-core this Python imports, from this
    Python's scripts directory, rather than whichever PATH finds first: that may be another
    installation of another version, or a version manager's shim that costs 0.2 s a run."""
    ours = Path(sysconfig.get_path("scripts"), name)
    return str(ours) if os.access(ours, os.X_OK) else name


def _path_first_ours(path: str) -> str:
    """PATH with this Python's scripts directory first, so ansible-runner starts ansible_command()'s
    ansible-playbook (it looks the bare name up in the PATH it is given)."""
    ours = sysconfig.get_path("scripts")
    return os.pathsep.join([ours, *(p for p in path.split(os.pathsep) if p and p != ours)])


def _event_kind(event: dict[str, Any]) -> str | None:
    name = event.get("event", "")
    data = event.get("event_data", {})
    if name == "runner_on_start":
        return "start"
    if name == "runner_retry":  # a module that reports while it waits (the health wait's report_s)
        return "progress"
    if name == "runner_on_ok":
        return "changed" if data.get("res", {}).get("changed") else "ok"
    return {
        "runner_on_failed": "failed",
        "runner_on_skipped": "skipped",
        "runner_on_unreachable": "unreachable",
    }.get(name)


def _new_run_dir(playbook: str) -> Path:
    """One private data dir per run, so concurrent runs never share or rotate each other's files."""
    runs = state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(playbook).stem}-{uuid.uuid4().hex[:8]}"
    path = runs / stem
    path.mkdir(mode=0o700)
    return path


def _prune_runs(runs: Path) -> None:
    """Keep the newest KEEP_RUNS runs; older ones go once nobody can still be writing them. Plays
    end at once in several threads (a tune campaign's hosts): a run another one removed is gone."""
    times = {}
    for path in runs.iterdir():
        try:
            times[path] = path.stat().st_mtime
        except FileNotFoundError:
            continue
    old = sorted(times, key=lambda p: times[p], reverse=True)[KEEP_RUNS:]
    for path in old:
        if time.time() - times[path] > 600:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _secret_file(secret: str) -> Iterator[str]:
    """The secret in a 0600 file of a private directory on tmpfs where there is one (so it never
    reaches a disk), for the play's lookup; removed when the play ends. "" when no secret."""
    if not secret:
        yield ""
        return
    tmpfs = next(
        (d for d in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm") if d and os.access(d, os.W_OK)), None
    )
    folder = tempfile.mkdtemp(prefix="orchestrator-secret-", dir=tmpfs)  # mode 0700
    try:
        path = Path(folder, "secret")
        write_private(path, secret)
        yield str(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _without_env(names: Iterable[str]) -> Iterator[None]:
    """os.environ without `names` for the play: ansible-runner copies os.environ itself."""
    saved = {n: os.environ.pop(n) for n in list(names) if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _vars_file(private: Path, orch: PlayVars) -> Path:
    """The play's one extra var in a file of the run's private (0700) directory, read with
    `-e @FILE`: on the command line it would be visible to every local user, and one argument
    over 128 KiB (a unit per host, for a hundred hosts) fails to start at all (E2BIG)."""
    path = private / "orch.json"
    write_private(path, json.dumps(orch.extravars()))
    return path


def write_private(path: Path, text: str) -> None:
    """A new file readable by this user only from its first byte (no chmod after the write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def run_playbook(
    playbook: str,
    inventory: Path,
    orch: PlayVars,
    *,
    limit: str | None = None,
    check: bool = False,
    forks: int | None = None,
    secret: str = "",
    hide_env: Iterable[str] = (),
    on_event: Callable[[TaskEvent], None] | None = None,
    become_password: str = "",
) -> PlayResult:
    """Run playbooks/<playbook> against `inventory`.

    `become_password` (default: the one `use_become_password` set) answers sudo where the inventory
    asks Ansible to become root. It reaches ansible-playbook only through ansible-runner's answer to
    its prompt on the play's pty: never argv, the environment, a file or the artifacts; so do the vault
    passwords the command line asked for (vault.play_options).

    `secret` reaches the play as `orch.secret_file` (see `_secret_file`); the environment
    variables in `hide_env` (where a secret came from) are kept out of Ansible's environment,
    which ansible-runner writes whole into the run's artifacts.
    """
    inventory_mod.check(inventory)
    with _secret_file(secret) as path, _without_env(hide_env):
        orch = orch.model_copy(update={"secret_file": path})
        password = become_password or _become_password
        return _run(playbook, inventory, orch, limit, check, forks, on_event, become_password=password)


def _explain_become(hosts: dict[str, HostRun], inventory: Path, password_given: bool) -> None:
    """A host that failed at becoming root gets diagnose.become's line (which login, what to do) as its
    failure's `msg`, Ansible's own kept as `ansible_msg`: every command shows `msg`."""
    users: dict[str, str] | None = None
    for run in hosts.values():
        failed = run.failed
        if failed is None or diagnose.become(failed.result, "", password_given) is None:
            continue
        users = _login_users(inventory) if users is None else users
        line = diagnose.become(failed.result, users.get(run.host, ""), password_given)
        failed.result.update(ansible_msg=failed.result.get("msg", ""), msg=line)


def _login_users(inventory: Path) -> dict[str, str]:
    """The user Ansible logs in as on each host, as far as the inventory says (for a diagnosis only:
    reading it with Ansible costs a few tenths of a second, so only a failure pays for it)."""
    users = {}
    for host, found in inventory_mod.host_variables(inventory).items():
        user = vault.plain(found.get("ansible_user"), "ansible_user")
        users[host] = str(user or vault.plain(found.get("ansible_ssh_user"), "ansible_ssh_user") or "")
    return users


def own_name(name: str) -> str:
    """A role or module of orchestrator's collection by its own name (`orchestrator.sglang.sglang_probe`
    is `sglang_probe`, as module_results.py names it); any other name as Ansible gave it."""
    return name.removeprefix(f"{COLLECTION}.")


def _collect(
    hosts: dict[str, HostRun], on_event: Callable[[TaskEvent], None] | None, event: dict[str, Any]
) -> bool:
    """ansible-runner's event handler: each host's task results, typed, in order."""
    kind = _event_kind(event)
    data = event.get("event_data", {})
    host = data.get("host")
    if kind is None or host is None:
        return True
    run = hosts.setdefault(host, HostRun(host))
    task = TaskEvent(
        host,
        kind,
        own_name(data.get("role", "")),
        own_name(data.get("task_action", "")),
        data.get("res", {}) or {},
    )
    for each in split_steps(task):
        run.events.append(each)
        if each.kind == "unreachable" or (each.kind == "failed" and not data.get("ignore_errors")):
            run.finished = each.at
        if on_event:
            on_event(each)
    return True


#: The module that runs a restart as one transaction on the host (roles/sglang_restart), and the
#: modules whose steps it runs, in their order: its result holds one result of each it ran
#: (sglang_adopt's is its takeover of a hand-started server).
RESTART = "sglang_restart"
RESTART_STEPS = (
    "sglang_adopt",
    "sglang_stop",
    "sglang_unit",
    "sglang_start",
    "sglang_health_wait",
    "sglang_record",
)


def split_steps(task: TaskEvent) -> list[TaskEvent]:
    """A restart transaction's event as the events of its steps, each under its own module's name,
    as if each had been a task of its own: every reader of results (facts, the live view, the
    report, rollback) reads a step as it reads that module's task. Its start, and an end that
    says nothing of its steps (unreachable, or it died), stay the restart's own: a host that
    failed there may have been stopped (readback.HostFacts.stopped). Any other event is itself."""
    if task.action != RESTART or task.kind == "skipped":
        return [task]
    steps = task.result.get("steps")
    if task.kind in ("start", "unreachable") or not isinstance(steps, list) or not steps:
        return [task]  # the restart as a whole: which of its steps ran is not known
    events: list[TaskEvent] = []
    # Each step's start and end on this clock, from its took_s: the transaction ended at task.at.
    took = [
        s["took_s"] if isinstance(s, dict) and isinstance(s.get("took_s"), int | float) else 0.0
        for s in steps
    ]
    ends = [task.at - sum(took[i + 1 :]) for i in range(len(steps))]
    for step, end, step_s in zip(steps, ends, took, strict=True):
        action = step.get("action") if isinstance(step, dict) else None
        result = step.get("result") if isinstance(step, dict) else None
        if action not in RESTART_STEPS or not isinstance(result, dict):
            msg = f"{RESTART} returned a step orchestrator does not know: {str(step)[:200]}"
            return [*events, TaskEvent(task.host, "failed", task.role, RESTART, {"msg": msg}, task.at)]
        if step.get("failed"):
            kind = "failed"
        elif action == "sglang_health_wait" and result.get("done") is False:
            kind = "progress"  # still starting: the play's own health wait goes on
        else:
            kind = "changed" if result.get("changed") else "ok"
        events += [
            TaskEvent(task.host, "start", task.role, action, {}, end - step_s),
            TaskEvent(task.host, kind, task.role, action, result, end),
        ]
    return events


def _run(
    playbook: str,
    inventory: Path,
    orch: PlayVars,
    limit: str | None,
    check: bool,
    forks: int | None,
    on_event: Callable[[TaskEvent], None] | None,
    become_password: str = "",
) -> PlayResult:
    """`forks`: None keeps ansible.cfg's forks (orchestrator's DEFAULT_FORKS where it has none); a
    number (deploy --forks) goes to ansible-playbook's own --forks, which wins over both."""
    hosts: dict[str, HostRun] = {}
    handle = functools.partial(_collect, hosts, on_event)
    private = _new_run_dir(playbook)
    vault_args, passwords = vault.play_options()  # the typed vault passwords answer their prompts
    cmdline = " ".join(
        [
            f"--extra-vars @{shlex.quote(str(_vars_file(private, orch)))}",
            "--check --diff" if check else "",
            f"--limit {shlex.quote(limit)}" if limit else "",
            "--ask-become-pass" if become_password else "",
            f"--forks {int(forks)}" if forks else "",
            *(shlex.quote(arg) for arg in vault_args),
        ]
    ).strip()
    if become_password:
        passwords[BECOME_PROMPT] = become_password
    env_for_run = {**os.environ, **_settings(forks or DEFAULT_FORKS)}
    env_for_run["PATH"] = _path_first_ours(env_for_run.get("PATH", os.defpath))
    env_for_run["ANSIBLE_AGNOSTIC_BECOME_PROMPT"] = "True"  # the prompt BECOME_PROMPT expects
    with _interrupts() as interrupted:
        result = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=_play_directory(),
            playbook=str(PLAYBOOKS_DIR / playbook),
            inventory=str(inventory.resolve()),
            cmdline=cmdline or None,
            envvars=env_for_run,
            quiet=True,
            event_handler=handle,
            suppress_env_files=True,  # also keeps `passwords` out of the private dir's env/
            passwords=passwords or None,
            cancel_callback=interrupted,
        )
    status = "canceled" if interrupted() else result.status
    now = time.monotonic()
    for run in hosts.values():
        run.finished = run.finished or now
    _explain_become(hosts, inventory, bool(become_password))
    played = PlayResult(result.rc, status, hosts, Path(result.config.artifact_dir))
    if status == "canceled":
        raise PlayCanceled(f"ansible-playbook canceled (rc {result.rc}) by Ctrl-C, SIGTERM or SIGHUP", played)
    if status not in ("successful", "failed"):
        tail = (result.stdout.read()[-2000:] if result.stdout else "").strip()
        raise OrchestratorError(f"ansible-playbook {status} (rc {result.rc}): {tail}")
    _prune_runs(private.parent)
    return played

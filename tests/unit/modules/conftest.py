"""Fixtures for the module tests (helpers in hostfakes.py)."""

from __future__ import annotations

import http.server
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ansible.module_utils import basic
from hostfakes import Exit, FakeHost, exit_json, fail_json, module_args

from orchestrator.hosts import module_results


@pytest.fixture
def run_module(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[bool, dict]]:
    """run_module(module, args, check_mode=False, diff=False) -> (failed, result).

    Each result is also read as orchestrator reads it (module_results.parse), so the models there are
    checked against what the real modules return, on success and on failure, not only against
    their RETURN blocks."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def run(module: types.ModuleType, args: dict, check_mode: bool = False, diff: bool = False):
        args = {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}
        with module_args(args), pytest.raises(Exit) as done:
            module.main()
        failed, result = done.value.failed, done.value.result
        module_results.parse(module.__name__, result, failed)
        return failed, result

    return run


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    fake = FakeHost()
    monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda module, argv, **kw: fake.run_command(argv))
    monkeypatch.setattr(
        basic.AnsibleModule,
        "get_bin_path",
        lambda module, arg, required=False, opt_dirs=None: fake.get_bin_path(arg),
    )
    return fake


@pytest.fixture
def cgroups(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """{PID: unit}: these processes run in that systemd unit, as /proc/PID/cgroup would say
    (cgroup v2 under system.slice); every other PID reads its real cgroup. Replaced in each
    submodule that imports proc_cgroup by name (gpus, preflight), as well as in procs."""
    from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import (
        gpus,
        preflight,
        procs,
    )

    units: dict[int, str] = {}
    real = procs.proc_cgroup
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith(procs.__package__ + ".")]
    readers = [m for m in loaded if getattr(m, "proc_cgroup", None) is real]
    assert set(readers) == {procs, gpus, preflight}, "a new reader of proc_cgroup: add it above"
    for module in readers:
        monkeypatch.setattr(
            module,
            "proc_cgroup",
            lambda pid: f"0::/system.slice/{units[pid]}\n" if pid in units else real(pid),
        )
    return units


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    made = {key: tmp_path / key for key in ("unit_dir", "state_dir", "lock_dir")}
    made["unit_dir"].mkdir()
    return {key: str(value) for key, value in made.items()}


@pytest.fixture
def server() -> Iterator[str]:
    """A local HTTP server: /health answers 200, any other path 503 (a server still loading)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()

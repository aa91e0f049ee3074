"""The ansible-playbook a run starts is the one of the ansible-core orchestrator imports."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

import pytest

from orchestrator import runner


def test_ansible_playbook_comes_from_this_pythons_scripts() -> None:
    ours = sysconfig.get_path("scripts")
    if not os.access(Path(ours, "ansible-playbook"), os.X_OK):
        pytest.skip(f"ansible-core's scripts are not in {ours} (a --user install?)")
    elsewhere = os.pathsep.join(["/usr/local/bin", "/usr/bin", ours, "/bin"])
    path = runner._path_first_ours(elsewhere)
    assert path.split(os.pathsep)[0] == ours and path.split(os.pathsep).count(ours) == 1
    found = shutil.which("ansible-playbook", path=path)
    assert found == runner.ansible_command("ansible-playbook") == str(Path(ours, "ansible-playbook"))


def test_a_play_is_canceled_by_int_term_or_hup_but_an_ignored_hangup_stays_ignored() -> None:
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with runner._interrupts() as interrupted:
                assert not interrupted()
                signal.raise_signal(sig)
                assert interrupted()
            assert signal.getsignal(sig) == before[sig]  # handlers put back
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        with runner._interrupts() as interrupted:
            signal.raise_signal(signal.SIGHUP)
            assert not interrupted()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)

"""What systemd's own programs say: `systemctl show` parsed as ansible-core's systemd_service
module parses it, and `systemd-analyze verify` with the lines of a unit it would drop
(unit_complaints, which the control machine reads too: orchestrator/render/systemd_check.py).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any


def parse_systemctl_show(text: str) -> dict[str, str]:
    """`systemctl show` output as {property: value}. A value opening with `{` may go on over
    several lines (ExecStart=...), as ansible-core's systemd_service module handles it."""
    parsed: dict[str, str] = {}
    key = ""
    multival: list[str] = []
    for line in text.splitlines():
        if multival:
            multival.append(line)
            if line.rstrip().endswith("}"):
                parsed[key] = "\n".join(multival).strip()
                multival = []
            continue
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        if value.lstrip().startswith("{") and not value.rstrip().endswith("}"):
            multival = [value]
        else:
            parsed[key] = value.strip()
    return parsed


def systemctl_show(module: Any, unit: str, props: Iterable[str], *extra_args: str) -> dict[str, str]:
    state, problem = try_systemctl_show(module, unit, props, *extra_args)
    if problem:
        module.fail_json(msg=problem)
    return state


def try_systemctl_show(
    module: Any, unit: str, props: Iterable[str], *extra_args: str
) -> tuple[dict[str, str], str]:
    """`systemctl show`'s properties of `unit`, or ({}, why not) in one line (no systemd running:
    "System has not been booted with systemd ...")."""
    systemctl = module.get_bin_path("systemctl", required=True)
    argv = [systemctl, "show", unit, f"--property={','.join(props)}", *extra_args]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        return {}, f"systemctl show {unit} failed: {' '.join((err or out).split())}"
    return parse_systemctl_show(out), ""


#: What systemd says of a unit line whose setting it drops, cannot read or reads otherwise, while
#: it loads the unit all the same: `systemd-analyze verify` exits 0 and the unit starts without
#: the setting ("Range '5-2' is invalid, 5 > 2, ignoring.", "Failed to parse sec value, ignoring:
#: 1e-05", "Invalid memory limit '101%', ignoring", "Cannot add CPU 8192 to set", "Ignoring unknown
#: escape sequences"). A warning that keeps the setting ("Special user nobody configured, this is
#: not safe!") is not one.
LOST_SETTING = re.compile(r"ignoring|failed to|invalid|cannot|can't|too long|out of range|bad ", re.I)


def unit_complaints(output: str, path: str) -> list[tuple[int, str]]:
    """(line, message) of each line of systemd's `output` (systemd-analyze verify, systemd --test)
    that says a setting of the unit file at `path` was lost; complaints about other files (the
    units it depends on) and about the unit as a whole (an executable missing here) are left out.
    systemd numbers a continued line by its last physical line."""
    located = re.compile(rf"^{re.escape(path)}:(\d+): (.*)$", re.M)
    return [(int(m[1]), m[2]) for m in located.finditer(output) if LOST_SETTING.search(m[2])]


def verify_unit(module: Any, unit_name: str, data: bytes, folder: str | None = None) -> tuple[str, str]:
    """(path, complaint) of `systemd-analyze verify` on the unit text, written as a 0644 file
    named like the unit (systemd-analyze needs the suffix) in `folder`, else in a private
    temporary directory. The complaint is "" when systemd accepts it and uses every setting
    (a non-zero exit, or a line it ignores: unit_complaints); the file is left for the caller
    (to rename into place), removed with its private directory otherwise."""
    private = folder is None
    folder = folder or tempfile.mkdtemp(prefix="orchestrator-verify-")
    stem, suffix = os.path.splitext(unit_name)
    fd, path = tempfile.mkstemp(prefix=f".{stem}-" if not private else "", suffix=suffix, dir=folder)
    if private:
        os.close(fd)
        path = os.path.join(folder, unit_name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o644)
        fh.write(data)
    analyze = module.get_bin_path("systemd-analyze", required=True)
    rc, out, err = module.run_command([analyze, "verify", path])
    if rc == 0:  # loaded, but a setting systemd ignores is an error too: the unit would run without it
        lost = unit_complaints(out + err, path)
        complaint = "; ".join(f"{unit_name}:{line}: {message}" for line, message in lost)
    else:
        complaint = (out + err).replace(path, unit_name).strip()
        complaint = complaint.replace(os.path.basename(path), unit_name)
    if private:
        shutil.rmtree(folder, ignore_errors=True)
    elif complaint:
        os.unlink(path)
    return path, complaint

"""python3 ansiballz_files.py MODULE.py...: the files Ansible puts in each module's payload, as
JSON {module path: [file names in the zip]}, found by ansible-core's own module_utils finder
(executor/module_common.py recursive_finder, as the controller builds the AnsiballZ zip of a
task). The collection comes from ANSIBLE_COLLECTIONS_PATH, as on a real run. Run as a
separate process: the finder needs Ansible's collection loader installed, which a test process
should not carry into the tests after it."""

from __future__ import annotations

import datetime
import inspect
import io
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

from ansible.executor import module_common
from ansible.plugins.loader import init_plugin_loader


def payload_files(path: Path) -> list[str]:
    """The names in the zip ansible-core builds for the module at `path` (a module of the collection,
    shipped as `orchestrator.sglang.NAME`)."""
    kwargs: dict[str, Any] = {}
    if "extension_manager" in inspect.signature(module_common.recursive_finder).parameters:
        from ansible._internal._ansiballz import _builder  # ansible-core 2.19 and later

        kwargs["extension_manager"] = _builder.ExtensionManager.create(task_vars={})
    with zipfile.ZipFile(io.BytesIO(), "w") as zf:
        module_common.recursive_finder(
            path.stem,
            f"orchestrator.sglang.{path.stem}",
            path.read_bytes(),
            zf,
            datetime.datetime.now(datetime.UTC),
            **kwargs,
        )
        return sorted(zf.namelist())


if __name__ == "__main__":
    init_plugin_loader()
    json.dump({arg: payload_files(Path(arg)) for arg in sys.argv[1:]}, sys.stdout)

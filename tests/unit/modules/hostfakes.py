"""Helpers of the module tests, which test the roles' modules as ansible-core tests its own
(test/units/modules/).

The module files (plugins/modules) are imported directly, their imports of
`ansible_collections.orchestrator.sglang.plugins.module_utils` finding the checkout's
plugins/module_utils (orchestrator/paths.py host_imports), as Ansible's collection loader finds it
on a real run. The `run_module`
fixture (conftest.py) drives a module's main() with the documented pattern: module args
patched in (module_args), exit_json/fail_json raising Exit. What only a host has (systemctl,
nvidia-smi) is answered by `FakeHost`, whose nvidia-smi output is captured real output
(tests/data/nvidia-smi, tests/unit/modules/data).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from ansible.module_utils import basic

from orchestrator.paths import MODULES_DIR, ROOT, host_imports
from orchestrator.render import launch

host_imports()

CAPTURES = ROOT / "tests/data/nvidia-smi"
#: Binaries absent from a FakeHost unless a test answers them.
ENGINES = ("docker", "podman")
DATA = Path(__file__).parent / "data"


def load_module(name: str) -> types.ModuleType:
    """plugins/modules/<name>.py as a Python module."""
    spec = importlib.util.spec_from_file_location(name, MODULES_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def module_args(args: dict[str, Any]) -> Iterator[None]:
    """Hand `args` to the next AnsibleModule: ansible-core 2.19's patch_module_args, or the older
    set_module_args way on 2.17 and 2.18."""
    try:
        from ansible.module_utils.testing import patch_module_args
    except ImportError:
        payload = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
        with mock.patch.object(basic, "_ANSIBLE_ARGS", payload):
            yield
        return
    with patch_module_args(args):
        yield


class Exit(Exception):
    def __init__(self, result: dict, failed: bool) -> None:
        super().__init__(result.get("msg", ""))
        self.result, self.failed = result, failed


def exit_json(self: basic.AnsibleModule, **result: Any) -> None:
    raise Exit(result, failed=False)


def fail_json(self: basic.AnsibleModule, msg: str, **result: Any) -> None:
    raise Exit({"msg": msg, **result}, failed=True)


def capture(name: str) -> str:
    path = DATA / name if (DATA / name).exists() else CAPTURES / name
    return path.read_text()


class FakeHost:
    """Answers run_command for the binaries a module calls. `answers[name]` is a list of
    (rc, stdout, stderr) or a function of argv; a list is consumed one call at a time, its
    last entry repeating. nvidia-smi takes (gpu_csv, apps_csv) pairs in `smi`."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.answers: dict[str, Any] = {}
        self.smi: list[tuple[str, str]] = []
        self._smi_at = 0

    def run_command(self, argv: list[str], **_: Any) -> tuple[int, str, str]:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        name = Path(argv[0]).name
        if name == "nvidia-smi":
            return self._nvidia_smi(argv)
        answer = self.answers.get(name)
        if answer is None:
            raise AssertionError(f"unexpected command {argv}")
        if callable(answer):
            return answer(argv)
        return answer.pop(0) if len(answer) > 1 else answer[0]

    def _nvidia_smi(self, argv: list[str]) -> tuple[int, str, str]:
        gpu_csv, apps_csv = self.smi[min(self._smi_at, len(self.smi) - 1)]
        if argv[1].startswith("--query-gpu="):
            return 0, gpu_csv, ""
        self._smi_at += 1  # a snapshot is the gpu query, then the apps query
        return 0, apps_csv, ""

    def get_bin_path(self, arg: str) -> str | None:
        """Every binary is installed but the container engines, which are only where the test
        answers them (as AnsibleModule.get_bin_path says None for a binary it cannot find)."""
        if arg in ENGINES and arg not in self.answers:
            return None
        return arg if arg.startswith("/") else f"/usr/bin/{arg}"

    def ran(self, name: str) -> list[list[str]]:
        return [c for c in self.calls if Path(c[0]).name == name]


def store_unit(paths: dict[str, str], unit: str, installed: bool = True, **facts: Any) -> None:
    """Another unit orchestrator deployed on the host: its facts as sglang_unit stores them
    (units/<unit>.json), and its unit file unless not `installed`."""
    folder = Path(paths["state_dir"], "units")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{unit}.json").write_text(json.dumps({**facts, "digest": "0123456789abcdef"}))
    if installed:
        Path(paths["unit_dir"], unit).write_text(f"{MANAGED}[Unit]\n")


def gpu_uuid(index: int) -> str:
    """The UUID of GPU `index` of a made-up H200 host (the captured GPU's, its last digit the index)."""
    return f"GPU-8b9e1fa8-32f8-da01-8524-833ee60332e{index}"


def query_gpu(count: int, used: dict[int, int] | None = None) -> str:
    """`--query-gpu=index,uuid,name,memory.used,memory.total` (noheader, nounits) of an H200 host
    with `count` GPUs, each line shaped as the captured one (released-query-gpu.csv)."""
    used = used or {}
    return "".join(f"{i}, {gpu_uuid(i)}, NVIDIA H200, {used.get(i, 0)}, 143771\n" for i in range(count))


def compute_apps(*rows: tuple[int, str, int, int]) -> str:
    """`--query-compute-apps=pid,process_name,used_memory,gpu_uuid` of (pid, name, MiB, GPU index) rows."""
    return "".join(f"{pid}, {name}, {mib}, {gpu_uuid(gpu)}\n" for pid, name, mib, gpu in rows)


def systemctl_show(**props: str) -> tuple[int, str, str]:
    return 0, "".join(f"{k}={v}\n" for k, v in props.items()), ""


#: The first line of a unit orchestrator wrote (launch.MANAGED, as templates/sglang.service.j2 puts it).
MANAGED = f"# {launch.MANAGED}\n"
#: `systemctl show UNIT --property=Id,LoadState,FragmentPath` of a unit systemd knows nowhere.
NOT_FOUND = systemctl_show(Id="sglang.service", LoadState="not-found", FragmentPath="")


class Engine:
    """docker or podman as the modules call them (`version`, `ps`, `inspect`, `image inspect`,
    `run`), answering in the engine's own output format: podman's `ps --format json` is one
    array with a Labels map, docker's `--format '{{json .}}'` an object a line with a `k=v,...`
    Labels string (docker-ps(1)); `image inspect` is captured podman output
    (data/podman-image-inspect.json). `containers` are {ID: (unit label, main PID)}; `image`
    None: no image here; `run(argv)` answers `run` (argv after the image ID); `daemon` False
    answers as docker does without its daemon (data/docker-version-no-daemon.txt)."""

    def __init__(self, kind: str, containers: dict[str, tuple[str, int]] | None = None) -> None:
        self.kind, self.containers = kind, containers or {}
        self.image: dict | None = json.loads(capture("podman-image-inspect.json"))[0]
        self.run: Any = lambda argv: (0, "", "")
        self.daemon = True

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        if not self.daemon:
            return 1, "", capture("docker-version-no-daemon.txt")
        verb = argv[1]
        if verb == "version":
            return 0, f"Client:       {self.kind}\nVersion:      4.3.1\n", ""
        if verb == "ps":
            rows = [
                {"Id" if self.kind == "podman" else "ID": cid, "Labels": self._labels(unit)}
                for cid, (unit, _) in self.containers.items()
            ]
            if self.kind == "podman":
                return 0, json.dumps(rows), ""
            return 0, "".join(json.dumps(r) + "\n" for r in rows), ""
        if verb == "inspect":
            assert argv[2:4] == ["--format", "{{.State.Pid}}"], argv
            known = self.containers.get(argv[4])
            return (0, f"{known[1]}\n", "") if known else (125, "", f"Error: no such container {argv[4]}")
        if argv[1:3] == ["image", "inspect"]:
            return (
                (0, json.dumps([self.image]), "") if self.image else (125, "[]\n", "Error: image not known")
            )
        if verb == "run":
            image_at = argv.index(self.image["Id"]) if self.image else len(argv)
            return self.run(argv[image_at + 1 :])
        raise AssertionError(f"unexpected {self.kind} command {argv}")

    def label(self, labels: dict[str, str]) -> None:
        """The image's labels (podman prints them twice: in Config and at the top)."""
        assert self.image is not None
        self.image["Config"]["Labels"] = self.image["Labels"] = labels

    def _labels(self, unit: str) -> Any:
        labels = {"orchestrator.unit": unit, "org.opencontainers.image.version": "22.04"}
        return labels if self.kind == "podman" else ",".join(f"{k}={v}" for k, v in labels.items())

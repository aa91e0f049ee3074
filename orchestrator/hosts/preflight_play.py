"""The preflight command's play: every read-only check a deploy makes before it stops anything.
With more than one host it also compares the model's and the drafter's files across them.

Engine layer: never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import ledger, paths
from orchestrator.errors import OrchestratorError
from orchestrator.hosts import readback
from orchestrator.hosts.module_results import PreflightFailed
from orchestrator.hosts.playvars import HostPlan, Placement, PlayVars, for_profile, placements
from orchestrator.hosts.runner import run_playbook
from orchestrator.profile.model import Profile
from orchestrator.render import systemd_check

#: Where each scanned directory is named in a profile.
FIELDS = {"model": "server.model_path", "draft": "speculative.draft_model_path"}


@dataclass
class PreflightResult:
    host: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    #: What could not be checked yet without being a problem (an image the engine pulls at start).
    notes: list[str] = field(default_factory=list)
    sglang_version: str = ""
    gpus: int = 0
    elapsed_s: float = 0.0
    #: The GPU memory fit (module_utils memfit.predict); {} where it did not run.
    memory: dict[str, Any] = field(default_factory=dict)
    #: The model's and drafter's fingerprints, {"model": ..., "draft": ...}.
    model_files: dict[str, Any] = field(default_factory=dict)
    #: How this host's files differ from the first host's (also among its problems).
    differences: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["model_files"] = {
            role: {k: v for k, v in scan.items() if k not in ("files", "weights")}
            for role, scan in self.model_files.items()
        }
        return out


class FilesDiffer(OrchestratorError):
    """The model's or drafter's files are not the same on every host: nothing was stopped."""


def preflight(prof: Profile, inventory: Path, limit: str | None = None) -> list[PreflightResult]:
    """Every read-only check a deploy of this profile makes before stopping anything, on every host
    (a multi-node rank: its own flags and its share of the GPUs). The --help check always runs.
    With several hosts, a host whose model or drafter files differ from the first host's has
    that difference as a problem."""
    return check(prof, inventory, placements(prof, inventory, limit), limit)


def check(
    prof: Profile, inventory: Path, where: dict[str, Placement], limit: str | None = None
) -> list[PreflightResult]:
    """preflight() for placements already made (a deploy's)."""
    systemd_check.require(prof, [p.plan for p in where.values()])  # systemd's reading, before any host
    compare = len(where) > 1
    hosts = {}
    for name, p in where.items():
        hp = calibrated(for_profile(prof, p.plan, p.facts), name)
        checks = None
        if hp.preflight:
            checks = hp.preflight.model_copy(update={"skip_flags_if_digest": "", "file_lists": compare})
        hosts[name] = hp.model_copy(update={"preflight": checks})
    play = run_playbook("preflight.yml", inventory, PlayVars(hosts=hosts), limit=limit)
    results = []
    for run in play.hosts.values():
        f = readback.of_run(run)
        res = f.preflight or PreflightFailed()  # the check never ran: nothing known
        problems = f.problems or ([f.message or "failed"] if f.failed else [])
        results.append(
            PreflightResult(
                host=run.host,
                ok=not problems,
                problems=problems,
                notes=list(res.notes or []),
                sglang_version=res.sglang_version or "",
                gpus=res.gpus or 0,
                elapsed_s=f.elapsed_s,
                memory=dict(res.memory or {}),
                model_files=dict(res.model_files or {}),
            )
        )
    results.sort(key=lambda r: r.host)
    if compare:
        add_differences(results)
    return results


#: The settings a start's logged memory depends on: calibration uses a start only where they match.
SAME_LAYOUT = (
    "sglang_version",
    "tp_size",
    "pp_size",
    "ep_size",
    "dp_size",
    "enable_dp_attention",
    "kv_cache_dtype",
    "cuda_graph",
    "cuda_graph_max_bs",
    "chunked_prefill_size",
    "page_size",
    "quantization",
    "speculative",
)


def calibration(host: str, model: str, memory: dict[str, Any]) -> dict[str, Any]:
    """What the server logged of its memory on its newest healthy start of `model` on `host` with
    the same layout (SAME_LAYOUT of `memory`: PreflightChecks.memory), with the model files it
    read: the host's fit uses it when its files are still those. {} when there is none."""
    for found in ledger.measured_memory(host, model):
        predicted = found.get("predicted")
        settings = found.get("settings") or (
            predicted.get("settings") if isinstance(predicted, dict) else None
        )
        if not isinstance(settings, dict):
            continue
        if all(settings.get(k) == memory.get(k) for k in SAME_LAYOUT):
            return {**found["measured"], "model_digest": found.get("model_digest", "")}
    return {}


def calibrated(hp: HostPlan, host: str) -> HostPlan:
    """`hp` with its preflight's calibration from the ledger (calibration)."""
    if hp.preflight is None or not hp.preflight.memory:
        return hp
    found = calibration(host, hp.preflight.model_path, hp.preflight.memory)
    return hp.model_copy(update={"preflight": hp.preflight.model_copy(update={"calibration": found})})


def differences(scans: dict[str, dict[str, Any]]) -> dict[str, str]:
    """host -> the first difference of its files from the most common set (on a tie, the first
    host's in sorted order), for each host whose fingerprint differs; {} when all agree. A host
    whose scan failed is left out: its own preflight names why."""
    modelfiles = paths.module_utils("orchestrator_host.modelfiles")
    ok = {h: s for h, s in sorted(scans.items()) if not s.get("error") and s.get("digest")}
    if len(ok) < 2:
        return {}
    counts: dict[str, int] = {}
    for s in ok.values():
        counts[s["digest"]] = counts.get(s["digest"], 0) + 1
    ref = next(h for h, s in ok.items() if counts[s["digest"]] == max(counts.values()))
    out = {}
    for host, scan in ok.items():
        if scan["digest"] != ok[ref]["digest"]:
            out[host] = modelfiles.first_difference({ref: ok[ref], host: scan}, ref)
    return out


def add_differences(results: list[PreflightResult]) -> None:
    """Each host whose model or drafter files differ from the first host's gets that as a problem."""
    by_host = {r.host: r for r in results}
    for role, name in FIELDS.items():
        scans = {r.host: r.model_files[role] for r in results if role in r.model_files}
        for host, line in differences(scans).items():
            by_host[host].differences.append(f"{name}: {line}")
            by_host[host].problems.append(f"{name}: {line}")
            by_host[host].ok = False


def require_same_files(prof: Profile, inventory: Path, where: dict[str, Placement]) -> list[PreflightResult]:
    """Before a run on several hosts stops anything: every host's preflight, and the same model and
    drafter files everywhere. Raises FilesDiffer naming each host whose files differ; other
    problems are the caller's (a deploy's probe finds them again on its host)."""
    results = check(prof, inventory, where, ",".join(where))
    lines = [f"{r.host}: {d}" for r in results for d in r.differences]
    if lines:
        raise FilesDiffer(
            "the model files are not the same on every host; nothing was stopped:\n  " + "\n  ".join(lines)
        )
    return results


def require_same_files_on(prof: Profile, inventory: Path, hosts: list[str]) -> list[PreflightResult]:
    """require_same_files on these hosts of the inventory (a campaign's)."""
    return require_same_files(prof, inventory, placements(prof, inventory, ",".join(hosts)))

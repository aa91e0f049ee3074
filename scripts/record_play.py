"""One archived lab run (ansible-runner's private data dir) as a compact play fixture for the unit tests.

    python3 scripts/record_play.py RUN_DIR tests/data/plays/NAME.json

RUN_DIR is a run as orchestrator left it (orch.json, artifacts/<id>/job_events/*.json). The fixture holds
each host's events as runner.run_playbook would hand them to the engine (kind, role, action, module
result), how long the host took, the plan the run was made for (profile, digest, rank per host; no
unit text, lock or secrets) and where it came from: the run and the lab test that made it (read from
the play's environment, of which nothing else is kept).

What is dropped: event timestamps and ids, module arguments (`invocation`, where a secret argument
would be), tracebacks, Ansible's internal keys. What is scrubbed: any value under a key that names a
secret, and any text shaped like a key or token. The script refuses to write a fixture in which
something secret-shaped is left.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The kinds exactly as run_playbook reads them.
from orchestrator.hosts.runner import TaskEvent, _event_kind, own_name, split_steps

#: Result keys that are noise to the engine: the module's arguments, tracebacks, Ansible's own.
DROPPED = {"invocation", "exception", "argument_spec_data", "validate_args_context", "deprecations"}
#: A key whose value is a secret (its path or file name is not: secret_path, secret_file).
SECRET_KEY = re.compile(r"(?i)(api_?key|passw(or)?d|token|authorization|secret(?!_path|_file|_files))")
#: Text shaped like a credential, wherever it is (a journal line, a message).
SECRET_TEXT = re.compile(
    r"(sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{16,}|Bearer\s+\S+"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|(--api-key|--admin-api-key)[= ]\S+)"
)
SCRUBBED = "<scrubbed>"
#: Ansible's own placeholder for a no_log value: nothing secret in it.
NO_LOG = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def scrub(value: Any) -> Any:
    """`value` without noise keys, secret values or secret-shaped text."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in DROPPED or key.startswith("_ansible"):
                continue
            secret = SECRET_KEY.search(key) and isinstance(item, str) and item not in ("", NO_LOG)
            out[key] = SCRUBBED if secret else scrub(item)
        return out
    if isinstance(value, list):
        return [scrub(item) for item in value]
    if isinstance(value, str):
        return SECRET_TEXT.sub(SCRUBBED, value)
    return value


def _events(run: Path) -> tuple[Path, list[dict[str, Any]]]:
    [artifacts] = list((run / "artifacts").iterdir())
    events = [json.loads(p.read_text()) for p in (artifacts / "job_events").glob("*.json")]
    return artifacts, sorted((e for e in events if "counter" in e), key=lambda e: e["counter"])


def _when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["created"]).timestamp()


def _lab_test(artifacts: Path) -> str:
    """The lab test that ran the play: pytest's PYTEST_CURRENT_TEST in the play's environment."""
    found = re.search(r'"PYTEST_CURRENT_TEST": "([^"]+)"', (artifacts / "command").read_text())
    return found.group(1).removesuffix(" (call)") if found else ""


def _plan(orch: dict[str, Any]) -> dict[str, Any]:
    """What the run was asked for, without unit texts, locks or secrets."""
    hosts = {}
    for name, p in (orch.get("hosts") or {}).items():
        facts = p.get("facts") or {}
        hosts[name] = {
            "profile": p["profile"],
            "digest": p["digest"],
            "unit_name": p["unit_name"],
            "rank": facts.get("rank", 0),
            "nnodes": facts.get("nnodes", 1),
            "rollback": bool(p.get("trusted_digest")),
            "gateway": {k: p["gateway"][k] for k in ("url", "worker_url")} if p.get("gateway") else None,
        }
    plan: dict[str, Any] = {"serial": orch.get("serial"), "max_fail_percent": orch.get("max_fail_percent")}
    if orch.get("target"):
        plan["target"] = {"unit_name": orch["target"]["unit_name"]}
    return {**plan, "hosts": hosts}


def record(run: Path) -> dict[str, Any]:
    """The fixture of one run (see the module's docstring)."""
    artifacts, events = _events(run)
    orch = json.loads((run / "orch.json").read_text())["orch"]
    hosts: dict[str, dict[str, Any]] = {}
    spans: dict[str, list[float]] = {}
    for e in events:
        kind, data = _event_kind(e), e.get("event_data", {})
        host = data.get("host")
        if kind is None or host is None:
            continue
        role, action = own_name(data.get("role", "")), own_name(data.get("task_action", ""))
        task = TaskEvent(host, kind, role, action, data.get("res") or {})
        for each in split_steps(task):  # as runner._collect hands them on: a restart's steps each
            result = scrub(each.result)
            entry = {"kind": each.kind, "role": each.role, "action": each.action}
            hosts.setdefault(host, {"events": []})["events"].append(
                {**entry, **({"result": result} if result else {})}
            )
        span = spans.setdefault(host, [_when(e), 0.0])
        if not span[1] and (kind == "unreachable" or (kind == "failed" and not data.get("ignore_errors"))):
            span[1] = _when(e)  # as runner._collect: a host is done at its first failure
    end = _when(events[-1])
    for host, (start, done) in spans.items():
        hosts[host]["elapsed_s"] = round((done or end) - start, 1)
    plan = _plan(orch)
    return {
        "recorded": {
            "run": run.name,
            "lab_test": _lab_test(artifacts),
            "playbook": f"{run.name.split('-')[2]}.yml",
            "status": (artifacts / "status").read_text().strip(),
            "rc": int((artifacts / "rc").read_text().strip() or 0),
        },
        "plan": plan,
        "unreached": sorted(set(plan["hosts"]) - set(hosts)),
        "hosts": hosts,
    }


def write(run: Path, out: Path) -> bool:
    text = json.dumps(record(run), indent=1, sort_keys=False) + "\n"
    left = SECRET_TEXT.search(text)
    if left:
        print(f"refused: {out} would hold secret-shaped text at {left.start()}", file=sys.stderr)
        return False
    out.write_text(text)
    print(f"{out}: {len(text) // 1024} KiB, from {run.name}")
    return True


def _by_test(runs: list[Path]) -> dict[str, list[Path]]:
    """Runs grouped by the lab test that made them, each group in the order they ran."""
    found: dict[str, list[Path]] = {}
    for run in sorted(runs, key=lambda r: r.name):
        artifacts = next((run / "artifacts").iterdir(), None) if (run / "artifacts").is_dir() else None
        if artifacts is not None and (artifacts / "command").exists():
            found.setdefault(_lab_test(artifacts), []).append(run)
    return found


def _kind(run: Path) -> tuple[str, str]:
    artifacts = next((run / "artifacts").iterdir())
    return f"{run.name.split('-')[2]}.yml", (artifacts / "status").read_text().strip()


def _same_kind(was: dict[str, Any], recorded: Any, runs: list[Path]) -> Path:
    """The run of `runs` whose playbook and status are the fixture's, at the fixture's place among
    the test's fixtures of that kind counted from the last (a test's first plays set the lab up;
    its fixtures are of the plays under test, then the rollback): IndexError when there is none."""
    kind = (was["playbook"], was["status"])
    mine = sorted(
        r["run"]
        for r in recorded
        if r["lab_test"] == was["lab_test"] and (r["playbook"], r["status"]) == kind
    )
    return [r for r in runs if _kind(r) == kind][mine.index(was["run"]) - len(mine)]


def again(archive: Path, after: str, fixtures: Path) -> int:
    """Every fixture recorded anew from the lab run made after `after` (a run directory's
    timestamp prefix): the same lab test's play at the same place in that test's plays. For when
    a module's results change: the fixtures stay what the lab really returns."""
    runs = [r for r in archive.iterdir() if r.is_dir()]
    old, new = _by_test([r for r in runs if r.name < after]), _by_test([r for r in runs if r.name >= after])
    failed = 0
    recorded = {path: json.loads(path.read_text())["recorded"] for path in sorted(fixtures.glob("*.json"))}
    for path, was in recorded.items():
        test = was["lab_test"]
        try:
            if test in old:
                place = [r.name for r in old[test]].index(was["run"])
                run = new.get(test, [])[place]
            else:  # the old runs are gone: the same playbook and outcome, at the same place
                run = _same_kind(was, recorded.values(), new.get(test, []))
        except (ValueError, IndexError):
            print(f"{path}: no new run of {test} at the place of {was['run']}", file=sys.stderr)
            failed += 1
            continue
        failed += not write(run, path)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, nargs="?", help="the run's directory (orch.json, artifacts/)")
    parser.add_argument("out", type=Path, nargs="?", help="the fixture to write (tests/data/plays/NAME.json)")
    parser.add_argument("--again", type=Path, metavar="ARCHIVE", help="re-record every fixture from ARCHIVE")
    parser.add_argument("--after", default="", help="with --again: the new runs' first timestamp")
    args = parser.parse_args()
    if args.again:
        return again(args.again, args.after, Path(__file__).resolve().parents[1] / "tests/data/plays")
    if not (args.run and args.out):
        parser.error("give RUN_DIR and OUT.json, or --again ARCHIVE --after STAMP")
    return 0 if write(args.run, args.out) else 1


if __name__ == "__main__":
    sys.exit(main())

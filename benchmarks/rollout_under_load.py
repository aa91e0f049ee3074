"""What clients of a gateway see during a rolling deploy, with and without draining (issue #16).

Steps: the lab up with 4 hosts, the profile deployed on it (plain lab inventory), the lab gateway
(`smg`, round robin) in front of them. Then a steady load through the gateway with no rollout, and
the same load during `deploy --serial 1 --force-restart` through inventory-gateway.yml, once per
mode: `drain` (the default deploy) and `no-drain` (`--no-drain`). The load runs until the deploy has
ended and at least --requests were sent.

The load: --clients threads in a loop, every other one streaming /generate (SSE `data: {...}`
lines, then `data: [DONE]`), the others not; --max-new-tokens each. A stream that ends without
[DONE], or whose last meta_info.completion_tokens is short of max_new_tokens, is truncated.
Latencies are of whole requests that succeeded (200, not truncated), in ms.

--pd (issue #44): a prefill/decode fleet instead. lab1 and lab2 serve pd_prefill, lab3 and lab4
pd_decode, behind smg in PD mode (`lab gateway up --prefill lab1,lab2 --decode lab3,lab4`). The
rollout restarts the decode role only: `deploy -p pd_decode --serial 1 --force-restart`.

Prints a table (and --json PATH writes its rows); asserts nothing. Leaves the lab and gateway up.
Usage: python3 benchmarks/rollout_under_load.py [--profile NAME] [--clients N] [--requests N]
       [--modes drain,no-drain] [--pd] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from _timing import timed

from orchestrator.lab import gateway as lab_gateway
from orchestrator.lab import nspawn
from orchestrator.tuning.bench import Stats

HOSTS = 4
MODES = {"drain": [], "no-drain": ["--no-drain"]}
PROMPT = "Write a short story about a lighthouse keeper who collects maps."
#: A request stuck this long (a worker restarted under it) fails as a ReadTimeout.
REQUEST_TIMEOUT_S = 60.0
#: smg checks a worker's health once a minute: one restarted without draining may wait that long to
#: be healthy again in its eyes.
GATEWAY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    stream: bool
    latency_s: float
    status: int | None
    """The HTTP status; None when the request raised."""
    error: str | None = None
    """The exception's type (ReadTimeout, RemoteProtocolError...), when it raised."""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and not self.truncated


@dataclass(frozen=True)
class LoadStats:
    """What a run of the load adds up to; every request sent is counted exactly once in
    ok + failed_by_status + failed_by_exception + truncated."""

    sent: int
    ok: int
    failed_by_status: dict[int, int]
    failed_by_exception: dict[str, int]
    truncated: int
    p50_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> LoadStats:
        failed = Counter(o.status for o in outcomes if o.error is None and o.status != 200)
        raised = Counter(o.error for o in outcomes if o.error is not None)
        latency = Stats.of([o.latency_s * 1000 for o in outcomes if o.ok])
        return cls(
            sent=len(outcomes),
            ok=sum(o.ok for o in outcomes),
            failed_by_status={int(code): n for code, n in sorted(failed.items()) if code is not None},
            failed_by_exception=dict(sorted(raised.items())),
            truncated=sum(o.truncated for o in outcomes),
            p50_ms=latency.p50,
            p99_ms=latency.p99,
        )


def stream_truncated(lines: Iterable[str], max_new_tokens: int) -> bool:
    """SGLang's SSE from /generate: cumulative meta_info in each event, then `data: [DONE]`. smg 1.x
    ends a stream its worker cut with an error event (no meta_info), then `[DONE]`: truncated."""
    done, tokens, error = False, 0, False
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            continue
        item = json.loads(data)
        if "meta_info" in item:
            tokens = item["meta_info"]["completion_tokens"]
        else:
            error = True
    return error or not done or tokens < max_new_tokens


def one_request(client: httpx.Client, stream: bool, max_new_tokens: int) -> Outcome:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens}, "stream": stream}
    start = time.monotonic()
    status = None
    try:
        with client.stream("POST", "/generate", json=body) as resp:
            status = resp.status_code
            if status != 200:
                resp.read()
                truncated = False
            elif stream:
                truncated = stream_truncated(resp.iter_lines(), max_new_tokens)
            else:  # a whole answer short of its tokens is cut off as well
                resp.read()
                truncated = resp.json()["meta_info"]["completion_tokens"] < max_new_tokens
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        return Outcome(stream, time.monotonic() - start, status, error=type(err).__name__)
    return Outcome(stream, time.monotonic() - start, status, truncated=truncated)


class Load:
    """`clients` threads sending requests to `url` from `start()` until `finish()` has been called
    and at least `min_requests` were sent; every other client streams."""

    def __init__(self, url: str, clients: int = 4, min_requests: int = 500, max_new_tokens: int = 32) -> None:
        self.url, self.clients, self.min_requests, self.max_new_tokens = (
            url,
            clients,
            min_requests,
            max_new_tokens,
        )
        self.outcomes: list[Outcome] = []
        self._sent = 0
        self._finishing = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index % 2 == 0,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self) -> LoadStats:
        """Let the clients stop once `min_requests` are sent; wait for their last requests."""
        self._finishing.set()
        for thread in self._threads:
            thread.join()
        return LoadStats.of(self.outcomes)

    def _ticket(self) -> bool:
        with self._lock:
            if self._finishing.is_set() and self._sent >= self.min_requests:
                return False
            self._sent += 1
            return True

    def _client(self, stream: bool) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as client:
            while self._ticket():
                outcome = one_request(client, stream, self.max_new_tokens)
                with self._lock:
                    self.outcomes.append(outcome)


# ---------------------------------------------------------------- the lab run


def _deploy_argv(inventory: Path, profile: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "deploy", "-i", str(inventory), "-p", profile, *extra]


#: The PD fleet of --pd: two prefill and two decode lab hosts.
PD = lab_gateway.PdSplit(("lab1", "lab2"), ("lab3", "lab4"))
PD_PROFILES = ("pd_prefill", "pd_decode")


def _gateway(pd: bool) -> lab_gateway.GatewayState:
    return lab_gateway.up(timeout_s=GATEWAY_TIMEOUT_S, pd=PD if pd else None)


def _lab_with_gateway(profile: str, pd: bool = False) -> Path:
    """The lab of HOSTS hosts with `profile` deployed and the gateway in front; its gateway inventory.
    A PD fleet is deployed through its gateway: smg registers each server once it answers."""
    seen = nspawn.status()
    if seen.exists and len(seen.hosts) != HOSTS:
        nspawn.down()
    state = nspawn.up(hosts=HOSTS)
    if pd:
        inventory = _gateway(True).inventory
        argv = _deploy_argv(inventory, PD_PROFILES[0], "-p", PD_PROFILES[1])
        took = timed(argv)
        print(f"lab: {HOSTS} hosts, {' + '.join(PD_PROFILES)} deployed ({took:.1f} s)", file=sys.stderr)
        _wait_all_ready(lab_gateway.up(pd=PD).url, HOSTS)
        return inventory
    took = timed(_deploy_argv(state.inventory, profile))
    print(f"lab: {HOSTS} hosts, {profile} deployed ({took:.1f} s)", file=sys.stderr)
    return _gateway(False).inventory


def _wait_all_ready(url: str, count: int, timeout_s: float = GATEWAY_TIMEOUT_S) -> None:
    """Until smg lists `count` workers ready (a PD gateway's `up` does not wait for them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(f"{url}/workers", timeout=10).json()["workers"]
        if sum(w.get("status") == "ready" for w in workers) >= count:
            return
        time.sleep(0.5)
    raise SystemExit(f"the gateway at {url} lists fewer than {count} workers ready after {timeout_s:.0f} s")


def _rollout(args: argparse.Namespace, inventory: Path, url: str, mode: str, steady: LoadStats) -> dict:
    """The load during one rolling deploy; the table's row."""
    gw = _gateway(args.pd)  # every worker in rotation and healthy before the start
    if args.pd:
        _wait_all_ready(gw.url, HOSTS)
    profile = PD_PROFILES[1] if args.pd else args.profile
    argv = _deploy_argv(inventory, profile, "--serial", "1", "--force-restart", *MODES[mode])
    load = Load(url, args.clients, args.requests, args.max_new_tokens)
    load.start()
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    took = time.monotonic() - began
    seen = load.finish()
    if done.returncode != 0:
        print(f"{mode}: deploy exited {done.returncode}:\n{done.stderr[-2000:]}", file=sys.stderr)
    ratio = seen.p99_ms / steady.p99_ms if seen.p99_ms and steady.p99_ms else None
    return {
        "mode": mode,
        **asdict(seen),
        "steady_p50_ms": steady.p50_ms,
        "steady_p99_ms": steady.p99_ms,
        "p99_ratio": ratio,
        "rollout_s": round(took, 1),
        "deploy_rc": done.returncode,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _counts(counts: dict) -> str:
    return " ".join(f"{key}:{n}" for key, n in counts.items()) or "0"


def print_table(rows: list[dict]) -> None:
    head = ("mode", "sent", "failed http", "failed exc", "trunc", "p50", "p99", "st p50", "st p99")
    head += ("p99 x", "rollout s", "rc")
    lines = [head]
    for r in rows:
        ratio = "-" if r["p99_ratio"] is None else f"{r['p99_ratio']:.2f}"
        failed = _counts(r["failed_by_status"]), _counts(r["failed_by_exception"]), str(r["truncated"])
        during = _ms(r["p50_ms"]), _ms(r["p99_ms"])
        steady = _ms(r["steady_p50_ms"]), _ms(r["steady_p99_ms"])
        took = f"{r['rollout_s']:.1f}", str(r["deploy_rc"])
        lines.append((r["mode"], str(r["sent"]), *failed, *during, *steady, ratio, *took))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    print("latencies in ms, of requests that succeeded; st: steady state, no rollout")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="cg_5tok")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients, half of them streaming")
    parser.add_argument("--requests", type=int, default=500, help="at least this many per measurement")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--modes", default="drain,no-drain", help="comma list of: " + ", ".join(MODES))
    parser.add_argument("--json", type=Path, help="write the table's rows here as JSON")
    parser.add_argument(
        "--pd", action="store_true", help="a prefill/decode fleet; the rollout restarts decode"
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"--modes takes a comma list of {', '.join(MODES)}, not {args.modes!r}")
    if args.clients < 1 or args.requests < 1 or args.max_new_tokens < 1:
        parser.error("--clients, --requests and --max-new-tokens must be at least 1")
    inventory = _lab_with_gateway(args.profile, args.pd)
    url = _gateway(args.pd).url
    steady_load = Load(url, args.clients, args.requests, args.max_new_tokens)
    steady_load.start()
    steady = steady_load.finish()
    print(f"steady: {steady.sent} requests, {steady.ok} ok", file=sys.stderr)
    rows = [_rollout(args, inventory, url, mode, steady) for mode in modes]
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""A lab in memory for tune: deploy and bench replaced by hosts that run at the stand-in's own speed
model (orchestrator/lab/standins/host/sglang/_speed.py), with run-to-run noise and host factors.

tests/unit/test_tune.py drives campaigns through it; benchmarks/tune_quality.py --simulate measures
the search with it.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.hosts.host_report import DeployReport, HostReport
from orchestrator.tuning import bench, tune

SPEED_FILE = Path(tune.__file__).parents[1] / "lab" / "standins" / "host" / "sglang" / "_speed.py"
_spec = importlib.util.spec_from_file_location("standin_speed", SPEED_FILE)
assert _spec and _spec.loader
speed = importlib.util.module_from_spec(_spec)
sys.modules["standin_speed"] = speed
_spec.loader.exec_module(speed)

#: code prompts through the chat template: the stand-in's accept_top1 for code.jsonl
ACCEPT = 0.65
GRID = {
    "speculative.num_steps": [1, 2, 3, 5],
    "speculative.eagle_topk": [1, 2, 4],
    "speculative.num_draft_tokens": [2, 4, 5, 8, 16],
}


def model_of(prof: Any, concurrency: int, accept: float = ACCEPT) -> Any:
    """The stand-in's speed of `prof` at a batch of `concurrency`. In adaptive mode, a batch runs
    the steps of its tier (the largest batch size at most this one) as a chain: top-k 1, steps + 1
    draft tokens, none at 0 steps (single-candidate tiers: the tier alone decides)."""
    s = prof.speculative
    spec = None
    if s.algorithm is not None and s.adaptive is not None and s.adaptive.tiers:
        size = max((k for k in s.adaptive.tiers if k <= concurrency), default=min(s.adaptive.tiers))
        steps = s.adaptive.tiers[size][-1]
        if steps:
            spec = speed.SpecSettings(steps, 1, steps + 1, accept_top1=accept)
    elif s.algorithm is not None:
        spec = speed.SpecSettings(s.num_steps, s.eagle_topk, s.num_draft_tokens, accept_top1=accept)
    return speed.decode_model(90.0, spec, prof.server.cuda_graph, batch=concurrency)


def model_tok_s_of(prof: Any, concurrency: int, accept: float = ACCEPT) -> float:
    """tok/s of one of `concurrency` streams of `prof`."""
    return model_of(prof, concurrency, accept).tok_s


def model_tok_s(prof: Any, concurrency: int) -> float:
    return model_of(prof, concurrency).tok_s


class Lab:
    """Hosts that run what was deployed at the model's speed, with noise; a profile whose env
    says FAIL dies on start."""

    def __init__(self, hosts: dict[str, float], seed: int = 0, sigma: float = 0.015):
        self.factor = hosts
        self.rng = random.Random(seed)
        self.sigma = sigma
        self.running: dict[str, Any] = {}
        self.deploys: list[dict[str, str]] = []
        self.interrupt_at: int | None = None
        #: the drafter's top-1 acceptance on this traffic
        self.accept = ACCEPT
        #: (host, time, message) lines of the servers' journals, and the hosts of each read
        self.journal: list[tuple[str, float, str]] = []
        self.reads: list[str] = []
        #: Ctrl-C during the deploy that leaves the hosts at a campaign's end
        self.interrupt_leave = False
        #: the hosts of each comparison of model files; a host named here has other files
        self.files_checked: list[list[str]] = []
        self.other_files: str | None = None

    def same_files(self, prof, inventory, hosts):
        """preflight_play.require_same_files_on: the campaign's hosts' files compared, before a stop."""
        from orchestrator.hosts.preflight_play import FilesDiffer

        self.files_checked.append(sorted(hosts))
        if self.other_files:
            raise FilesDiffer(f"{self.other_files}: speculative.draft_model_path: {self.other_files} differs")
        return []

    def deploy(self, prof, inventory, options, on_event, each=None):
        assign = each or {"lab1": prof}
        self.deploys.append({h: p.name for h, p in assign.items()})
        leaving = self.interrupt_leave and not options.keep_lock  # tune's last deploy
        if leaving or (self.interrupt_at is not None and len(self.deploys) >= self.interrupt_at):
            report = DeployReport(prof.name, "", False, [], "", "run")
            report.interrupted = True
            return report
        hosts = []
        for host, p in assign.items():
            same = self.running.get(host) is not None and self.running[host].name == p.name
            if p.env.get("FAIL"):
                hosts.append(
                    HostReport(
                        host=host,
                        ok=False,
                        step="health",
                        restarted=True,
                        stopped=True,
                        diagnosis="CUDA out of memory: OutOfMemoryError",
                    )
                )
                self.running[host] = None
                continue
            hosts.append(HostReport(host=host, ok=True, step="record", restarted=not same))
            self.running[host] = p
        return DeployReport(prof.name, "", False, hosts, "", "run")

    def run(self, target, settings, on_progress, log=None, *, log_later=False):
        """c streams of 1 + 100 tokens: the first after a TTFT that grows with the batch, then one
        chunk of the accept length's tokens each round (the stand-in's round time)."""
        prof = self.running[target.host]
        c = settings.concurrency
        m = model_of(prof, c, self.accept)
        rate = m.tok_s * self.factor[target.host] * self.rng.gauss(1.0, self.sigma)
        length = m.accept_len
        ttft = 0.05 * (1 + 0.1 * (c - 1)) / self.factor[target.host]
        streams = []
        for _ in range(c):
            events, t, n = [(ttft, 1)], ttft, 1.0
            while events[-1][1] < 101:
                t, n = t + length / rate, n + length
                if min(101, int(n)) > events[-1][1]:
                    events.append((t, min(101, int(n))))
            streams.append(bench.Stream(0.0, events, t))
        spec = prof.speculative.algorithm is not None
        result = bench.BenchResult(target, settings, streams, t, "0.5.9", spec, length if spec else None)
        result.began_epoch = time.time()
        if spec:  # SGLang's decode log line, in this run's window of the host's journal
            self.journal.append((target.host, result.began_epoch, f"Decode batch. accept len: {length:.2f}"))
        result.ended_epoch = time.time()
        return result

    def journal_lines(self, inventory, host, unit=""):
        """The journal reader: (time, message) of `host`'s lines since a time; counts its reads."""

        def read(since):
            self.reads.append(host)
            return [(t, m) for h, t, m in self.journal if h == host and t >= since]

        return read

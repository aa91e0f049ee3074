"""A server's start-up, read from its own log lines: which phase it is in, how far, since when.

SGLang prints a line where each phase of its start begins (and often ends), with spellings that
change between releases; the patterns below take the spelling of every shipped version (0.5.9 and
0.5.23), and a line none of them knows changes nothing. Each TP rank prints the same lines: the
first rank tag seen (`[... TP0]`) is followed, untagged lines (tqdm bars, uvicorn) always count.

Phases in the order the server passes them (a phase can come back, e.g. JIT compiles during the
graph capture: its time is added up):

    launch -> init -> weights -> kv_cache -> jit -> graphs -> draft -> draft_graphs -> warmup -> ready

Durations run from one phase's first line to the next phase's; a progress bar (`k/N`) is the
loader's or the capture's tqdm line, of which only the last redraw (after the last `\\r`) counts.
"""

from __future__ import annotations

import re

PHASES = (
    "launch",
    "init",
    "weights",
    "kv_cache",
    "jit",
    "graphs",
    "draft",
    "draft_graphs",
    "warmup",
    "ready",
)
LABELS = {
    "launch": "launch",
    "init": "distributed init",
    "weights": "weights",
    "kv_cache": "KV cache",
    "jit": "JIT kernels",
    "graphs": "CUDA graphs",
    "draft": "draft model",
    "draft_graphs": "draft CUDA graphs",
    "warmup": "warm-up",
    "ready": "ready",
}

_TAG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: (?P<tag>(?:[A-Z]{2}\d+ ?)+))?\] ")
_INIT = re.compile(r"Init (?:torch distributed|parallel) begin")
_WEIGHTS = re.compile(r"Load weight begin")
_WEIGHTS_END = re.compile(r"Load weight end")
_KV_DONE = re.compile(r"KV Cache is allocated|Memory pool end")
_JIT = re.compile(r"DeepGEMM|JIT Compil", re.IGNORECASE)
_DRAFT_GRAPHS = re.compile(r"Capture draft (?:extend |decode )?cuda graph begin", re.IGNORECASE)
_GRAPHS = re.compile(r"Capture (?:target (?:decode |prefill |verify )?)?cuda graph begin", re.IGNORECASE)
_GRAPHS_ANY = re.compile(r"Capture .*cuda graph (?:begin|end)|Capturing batches", re.IGNORECASE)
_SERVING = re.compile(r"Uvicorn running on|Application startup complete|Started server process")
_READY = re.compile(r"The server is fired up and ready to roll")
_BAR = re.compile(r"(?P<k>\d+)/(?P<n>\d+) \[")
_BS = re.compile(r"bs=(\d+)")
_LOADING = re.compile(r"loading .*shards|checkpoint shards", re.IGNORECASE)
#: The lines where the server says what its memory holds: weights, KV cache, graphs (memfit reads them).
_FRACTION = re.compile(r"mem_fraction_static=[\d.]+")
_MEMORY = re.compile(
    r"Load weight (?:begin|end)\.|KV Cache is allocated\.|Memory pool end\.|(?i:cuda graph end)"
    r"|mem_fraction_static="
)
#: At most this many of them are kept (a start prints one of each per worker).
MEMORY_LINES = 16
#: The access log line of a health poll (the wait's own, uvicorn's format): no sign of progress.
_POLL = re.compile(r'"GET /(?:health|health_generate|get_server_info|server_info)\b[^"]*" \d{3}')


def last_redraw(message: str) -> str:
    """What a terminal would show of a line a progress bar redrew with carriage returns."""
    parts = [p for p in message.split("\r") if p.strip()]
    return parts[-1] if parts else ""


class Startup:
    """Feed it a start's log lines with their times (seconds on one clock, from the process start);
    it keeps the phase, its progress and each phase's duration so far."""

    def __init__(self, origin: float = 0.0):
        self.origin = origin
        self.phase = "launch"
        self.since = origin
        self.totals: dict[str, float] = {}
        self.order: list[str] = ["launch"]
        self.progress: dict[str, object] | None = None
        self.last_line = origin
        self.lines = 0
        self._tag: str | None = None
        self._graphs_done = False
        #: The memory lines of this start, in their order, without their tag (_MEMORY).
        self.memory_lines: list[str] = []

    def _enter(self, phase: str, at: float) -> None:
        if phase == self.phase:
            return
        self.totals[self.phase] = self.totals.get(self.phase, 0.0) + max(0.0, at - self.since)
        self.phase, self.since, self.progress = phase, at, None
        if phase not in self.order:
            self.order.append(phase)

    def touch(self, at: float) -> None:
        """Progress seen without a line (the weights being read): not stalled as of `at`."""
        self.last_line = max(self.last_line, at)

    def enter_ready(self, at: float) -> None:
        """/health answered 200: ready, whether or not the log said so."""
        self._enter("ready", at)

    def feed(self, at: float, message: str) -> None:
        """One journal line (`at`: its time). Never raises for a line it does not know. A health
        poll's access line is counted but is no progress: a server stuck in its warm-up answers
        every poll with 503 and logs it."""
        self.lines += 1
        text = last_redraw(message)
        if _POLL.search(text):
            return
        self.last_line = max(self.last_line, at)
        tagged = _TAG.match(text)
        if tagged:
            tag = (tagged.group("tag") or "").strip()
            if tag:
                if self._tag is None:
                    self._tag = tag
                elif tag != self._tag:
                    return
            text = text[tagged.end() :]
        self._line(at, text)

    def _line(self, at: float, text: str) -> None:
        found = _MEMORY.search(text)
        if found and len(self.memory_lines) < MEMORY_LINES:
            # server_args' line holds every argument (an API key too): only its fraction is kept
            if not found.group().startswith("mem_fraction"):
                self.memory_lines.append(text[:300])
            elif fraction := _FRACTION.search(text):
                self.memory_lines.append(fraction.group())
        if self.phase == "ready":
            return
        after_target = self.phase in ("graphs", "jit") or self._graphs_done
        if _READY.search(text):
            self._enter("ready", at)
        elif _SERVING.search(text):
            self._enter("warmup", at)
        elif _INIT.search(text) or _WEIGHTS.search(text):
            begun_weights = "weights" in self.order
            if after_target or (_INIT.search(text) and begun_weights and self.phase != "init"):
                self._graphs_done = self._graphs_done or after_target
                self._enter("draft", at)
            elif _INIT.search(text):
                self._enter("init", at)
            elif self.phase != "draft":
                self._enter("weights", at)
        elif _WEIGHTS_END.search(text) and self.phase == "weights":
            self._enter("kv_cache", at)
        elif _DRAFT_GRAPHS.search(text):
            self._graphs_done = True
            self._enter("draft_graphs", at)
        elif _GRAPHS.search(text) and self.phase not in ("draft", "draft_graphs"):
            self._enter("graphs", at)
        elif _JIT.search(text) and self.phase not in ("warmup",):
            self._enter("jit", at)
        elif _KV_DONE.search(text):
            pass  # the phase runs on until the capture begins
        progress = _BAR.search(text)
        if progress:
            if _LOADING.search(text) and self.phase in ("launch", "init"):
                self._enter("weights", at)
            elif _GRAPHS_ANY.search(text) and self.phase in ("kv_cache", "jit"):
                self._enter("graphs", at)
            bs = _BS.search(text)
            self.progress = {
                "done": int(progress.group("k")),
                "total": int(progress.group("n")),
                "detail": f"bs {bs.group(1)}" if bs else "",
            }

    def durations(self, now: float) -> list[dict[str, object]]:
        """[{phase, s}] in the order the phases came, the current one counted up to `now`."""
        totals = dict(self.totals)
        if self.phase != "ready":
            totals[self.phase] = totals.get(self.phase, 0.0) + max(0.0, now - self.since)
        return [{"phase": p, "s": round(totals.get(p, 0.0), 2)} for p in self.order if p != "ready"]

    def report(self, now: float) -> dict[str, object]:
        """Where the start stands at `now`: phase, its progress, time in it, quiet time, durations."""
        return {
            "phase": self.phase,
            "progress": self.progress,
            "phase_s": round(max(0.0, now - self.since), 2),
            "quiet_s": round(max(0.0, now - self.last_line), 2),
            "phases": self.durations(now),
            "lines": self.lines,
            "memory_lines": list(self.memory_lines),
        }

    def eta(self, now: float, usual: dict[str, float]) -> float | None:
        """Seconds left by `usual` (each phase's usual seconds on this host): the rest of this phase
        and every usual phase not reached yet; None without a usual length of this phase."""
        if self.phase not in usual or self.phase == "ready":
            return None
        later = PHASES[PHASES.index(self.phase) + 1 :] if self.phase in PHASES else ()
        rest = sum(float(usual[p]) for p in later if p in usual and p not in self.order and p != "ready")
        return round(max(0.0, float(usual[self.phase]) - (now - self.since)) + rest, 1)

    def stalled(self, now: float, limits: dict[str, float]) -> float | None:
        """The limit the start went past: no line for longer than its phase's limit (`limits`, by
        phase, `*` for any other); None while it is within it."""
        limit = limits.get(self.phase, limits.get("*"))
        if limit is None or limit <= 0 or self.phase == "ready":
            return None
        return float(limit) if now - self.last_line > limit else None

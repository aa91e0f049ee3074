"""Prefill/decode disaggregation as SGLang runs it (disaggregation/, server_args.py).

A gateway (smg --pd-disaggregation) sends each request to a prefill and a decode server at once,
with the same body plus `bootstrap_host` (the prefill URL's host), `bootstrap_port` (an int, or
null: then the receiving server's own --disaggregation-bootstrap-port) and `bootstrap_room` (a
random int below 2**63).

--disaggregation-mode prefill: the bootstrap server (sglang._bootstrap) listens on
--host:--disaggregation-bootstrap-port from the start; once loaded, the ranks register there. A
request waits until its decode asked for its room (at most SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
seconds), then spends the prefill time, samples one token, hands the room's KV over, and answers
with that one token (finish_reason length 0), as SGLang's prefill does.

--disaggregation-mode decode: a request reads the prefill's layout from its bootstrap server (the
first time for that address), then waits for its room's KV (at most
SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds), then decodes: rounds at the speed model's decode
speed, speculative decoding included, with no prefill time. Every prefill it has reached is
heartbeaten (GET /health every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL s, at least 2) and
forgotten after SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE misses, failing the requests that wait
on it. Failures end requests as SGLang's scheduler aborts them: 500 (400 without a room).

Bootstrap host 2.2.2.2 (SGLang's FAKE_BOOTSTRAP_HOST, its warm-up's) moves no KV, on both sides.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang import _bootstrap
from sglang._args import ServerArgs, version_tuple
from sglang._common import SRT, die, log
from sglang._engine import WORDS, Chunk, Engine
from sglang._load import fail

if TYPE_CHECKING:
    from sglang._startup import Runtime

FAKE_BOOTSTRAP_HOST = "2.2.2.2"
MIN_HEARTBEAT_S = 2.0  # SGLang floors the interval at 2 s and the misses at 1
#: The stand-in's own: how long a computed KV waits for its decode, and one long poll.
HANDOVER_S = 5.0
POLL_S = 1.0
#: 0.5.23 tries a prefill's layout this often, 1 s apart, before failing its requests.
ENSURE_TRIES = 15
RANK = "TP0"

#: What each transfer backend imports when its KV manager starts, and the error without it.
BACKEND_IMPORTS = {
    "mooncake": (
        "mooncake.engine",
        "ImportError: Please install mooncake by following the instructions at "
        "https://kvcache-ai.github.io/Mooncake/getting_started/build.html "
        "to run SGLang with MooncakeTransferEngine.",
    ),
    "nixl": (
        "nixl._api",
        "ImportError: Please install NIXL by following the instructions at "
        "https://github.com/ai-dynamo/nixl/blob/main/README.md to run SGLang with NixlTransferEngine.",
    ),
    "ascend": (
        "memfabric_hybrid",
        "ImportError: Please install memfabric_hybrid, for details, see docs/backend/pd_disaggregation.md",
    ),
    "mori": ("mori.cpp", "ModuleNotFoundError: No module named 'mori'"),
}


def env_number(name: str, default: float, kind: type = int) -> float:
    """SGLang's EnvInt / EnvFloat: the variable parsed as `kind`, else the default."""
    raw = os.environ.get(name)
    try:
        return kind(raw) if raw is not None else default
    except ValueError:
        return default


@dataclass
class Failure:
    """A request SGLang's scheduler aborts: the HTTP status and its message."""

    status: int
    message: str


def fields(body: dict) -> tuple[str | None, int | None, int | None]:
    """bootstrap_host, bootstrap_port, bootstrap_room (a batch's lists: the first request's)."""
    values = []
    for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room"):
        value = body.get(name)
        values.append(value[0] if isinstance(value, list) and value else value)
    host, port, room = values
    return (
        None if host is None else str(host),
        None if port is None else int(port),
        None if room is None else int(room),
    )


def kv_error(room: int, reason: str) -> str:
    return f"KVTransferError(bootstrap_room={room}): {reason}"


@contextlib.contextmanager
def queued(engine: Engine, queue: str) -> Iterator[None]:
    """A request in one of the engine's PD queues (the decode and prefill batch lines show them)."""
    with engine.lock:
        engine.disagg[queue] += 1
    try:
        yield
    finally:
        with engine.lock:
            engine.disagg[queue] -= 1


# --- server_args ------------------------------------------------------------------------------


def resolve(args: ServerArgs, frames: list) -> None:
    """server_args' PD handling (_handle_pd_disaggregation in 0.5.9, pd_disaggregation_hook and
    cuda_graph_hook in 0.5.23): its assertions, warnings and the values it sets."""
    mode, raw = args.disaggregation_mode, args.raw
    if mode == "null":
        return
    if args.transfer_backend == "mooncake_tcp":
        os.environ.setdefault("MC_FORCE_TCP", "1")
        args.transfer_backend, raw.disaggregation_ib_device = "mooncake", None
        log(
            "disaggregation transfer backend 'mooncake_tcp' -> mooncake "
            "with MC_FORCE_TCP=1 (TCP transport, no RDMA)"
        )
    method = getattr(raw, "load_balance_method", None)
    if mode == "prefill" and method == "round_robin":
        log(
            "In PD-disaggregation prefill mode, the 'round_robin' load balancing method means "
            "`bootstrap_room` routing (use 'follow_bootstrap_room' instead). Falling back to "
            "'follow_bootstrap_room' for backward compatibility."
        )
    if method in (None, "auto", "round_robin"):  # _handle_load_balance_method
        raw.load_balance_method = "follow_bootstrap_room" if mode == "prefill" else "round_robin"
    if mode == "decode":
        _resolve_decode(args, frames)
    else:
        _resolve_prefill(args, frames)


def _resolve_decode(args: ServerArgs, frames: list) -> None:
    raw = args.raw
    if version_tuple() < (0, 5, 23):
        for name in ("decode_tp", "decode_dp"):
            if getattr(raw, f"disaggregation_{name}", None) is not None:
                where = (f"{SRT}/server_args.py", 2548, "_handle_pd_disaggregation", "assert (")
                flag = name.replace("_", "-")
                die(
                    [*frames, where],
                    f"AssertionError: Cannot set --disaggregation-{flag} for the decode engine.",
                )
        raw.disable_radix_cache = True
        log("KV cache is forced as chunk cache for decode server")
    elif getattr(raw, "disaggregation_decode_enable_radix_cache", False):
        raw.disable_radix_cache = False
        log("EXPERIMENTAL: Radix cache is enabled for decode server")
    else:
        raw.disable_radix_cache = True
        log("Radix cache is disabled for decode server")


def _resolve_prefill(args: ServerArgs, frames: list) -> None:
    raw = args.raw
    if version_tuple() >= (0, 5, 23):
        if args.transfer_backend == "fake":
            where = (
                f"{SRT}/arg_groups/pd_disaggregation_hook.py",
                146,
                "handle_pd_disaggregation",
                "assert (",
            )
            die(
                [*frames, where],
                "AssertionError: Prefill server does not support 'fake' as the transfer backend",
            )
        if getattr(raw, "cuda_graph_backend_decode", None) is None:
            args.cuda_graph = False  # cuda_graph_hook: no decode-phase graph on a prefill server
        return
    raw.disaggregation_decode_tp = getattr(raw, "disaggregation_decode_tp", None) or args.tp_size
    raw.disaggregation_decode_dp = getattr(raw, "disaggregation_decode_dp", None) or args.dp_size
    raw.disaggregation_prefill_pp = int(str(getattr(raw, "pp_size", None) or 1))
    if not getattr(raw, "enable_piecewise_cuda_graph", False):
        args.cuda_graph = False
        log("Cuda graph is disabled for prefill server when piecewise cuda graph is not enabled.")


def check_backend(rt: Runtime) -> None:
    """The KV manager's transfer engine import (scheduler.init_disaggregation, after the load):
    without its package the scheduler dies as SGLang's does. The lab has a stand-in `mooncake`."""
    module, error = BACKEND_IMPORTS.get(rt.args.transfer_backend, (None, ""))
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError:
        frames = [
            (
                f"{SRT}/managers/scheduler.py",
                865,
                "init_disaggregation",
                "self.disagg_kv_manager = kv_manager_class(",
            ),
        ]
        fail(frames, error, rt.tp_label)


def local_ip() -> str:
    """SGLang's get_local_ip_auto: SGLANG_HOST_IP or HOST_IP, else the address of the default route."""
    for name in ("SGLANG_HOST_IP", "HOST_IP"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def free_port() -> int:
    """A port as ZMQ's bind to a random port picks one (each rank's, for its registration)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


# --- HTTP between the servers ---------------------------------------------------------------------


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def requests_error(addr: str, path: str, err: OSError) -> str:
    """The text `requests` gives for a failed call (what SGLang's log lines carry)."""
    host, port = split_addr(addr)
    if isinstance(err, TimeoutError | socket.timeout):
        return f"HTTPConnectionPool(host='{host}', port={port}): Read timed out."
    return (
        f"HTTPConnectionPool(host='{host}', port={port}): Max retries exceeded with url: {path} "
        "(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f3c1c2d5e50>: "
        f"Failed to establish a new connection: [Errno {err.errno}] {err.strerror}'))"
    )


def call(addr: str, method: str, path: str, timeout: float, body: dict | None = None) -> tuple[int, bytes]:
    """One HTTP call to another server's bootstrap port; OSError when it cannot be reached."""
    host, port = split_addr(addr)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, data, headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --- the prefill ----------------------------------------------------------------------------------


def start_bootstrap(rt: Runtime) -> _bootstrap.BootstrapServer | None:
    """The bootstrap server of a prefill's node rank 0, up before the model loads. A taken port
    is logged and the server goes on without it, as SGLang's thread does."""
    args = rt.args
    if args.disaggregation_mode != "prefill" or args.node_rank != 0:
        return None
    try:
        server = _bootstrap.BootstrapServer((args.host, args.bootstrap_port))
    except OSError as err:
        reason = err.strerror.lower() if err.strerror else str(err)
        log(
            f"Server error: [Errno {err.errno}] error while attempting to bind on address "
            f"('{args.host}', {args.bootstrap_port}): {reason}"
        )
        return None
    server.start()
    if version_tuple() >= (0, 5, 23):
        log(f"CommonKVBootstrapServer started successfully on {args.host}:{args.bootstrap_port}")
    return server


class Role:
    """What both roles check: a request needs its bootstrap room."""

    mode = "null"

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def check(self, body: dict, rid: str) -> Failure | None:
        room = fields(body)[2]
        if room is not None or (version_tuple() >= (0, 5, 23) and self.rt.args.transfer_backend == "fake"):
            return None
        message = (
            f"Invalid request: Disaggregated request received without bootstrap room id. req.rid={rid!r}"
        )
        log(message, RANK)
        return Failure(400, message)


class Prefill(Role):
    mode = "prefill"

    def __init__(self, rt: Runtime, server: _bootstrap.BootstrapServer | None) -> None:
        super().__init__(rt)
        self.server = server
        self.rooms = server.rooms if server is not None else _bootstrap.Rooms()
        self.bootstrap_timeout = env_number("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)
        self.warned = False

    def register(self) -> None:
        """Each rank's PUT /route to the bootstrap server (CommonKVManager._register_to_bootstrap)."""
        args, raw = self.rt.args, self.rt.args.raw
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(args.host, args.host)
        if args.dist_init_addr:
            host = socket.gethostbyname(args.dist_init_addr.rsplit(":", 1)[0])
        attention_dp = bool(getattr(raw, "enable_dp_attention", False)) and args.dp_size > 1
        attn_tp = args.tp_size // args.dp_size if attention_dp else args.tp_size
        common = {
            "attn_tp_size": attn_tp,
            "attn_dp_size": args.dp_size if attention_dp else 1,
            "pp_size": int(str(getattr(raw, "pp_size", None) or 1)),
            "pp_rank": 0,
            "system_dp_size": 1 if attention_dp else args.dp_size,
            "rank_ip": local_ip(),
            "page_size": int(str(getattr(raw, "page_size", None) or 1)),
        }
        if version_tuple() >= (0, 5, 23):
            common.update(
                attn_cp_size=1,
                attn_cp_rank=0,
                kv_cache_dtype=str(getattr(raw, "kv_cache_dtype", None) or "auto"),
                load_balance_method=raw.load_balance_method,
                prefill_http_port=args.port,
                decode_allocation_policy="early",
            )
        else:
            common["role"] = "Prefill"
        for dp in range(args.dp_size):
            for tp in range(attn_tp):
                payload = dict(common, attn_tp_rank=tp, rank_port=free_port())
                payload.update(
                    attn_dp_rank=dp if attention_dp else 0, system_dp_rank=0 if attention_dp else dp
                )
                self._put(f"{host}:{args.bootstrap_port}", payload)

    def _put(self, addr: str, payload: dict) -> None:
        try:
            status, text = call(addr, "PUT", "/route", 5.0, payload)
        except OSError as err:
            log(
                "Prefill instance failed to register to bootstrap server: "
                + requests_error(addr, "/route", err),
                RANK,
            )
            return
        if status != 200:
            log(f"Prefill instance failed to connect to bootstrap server: {status}, {text.decode()}", RANK)

    def serve(self, engine: Engine, body: dict, prompt: int, rid: str) -> Chunk | Failure:
        """Wait for the decode's handshake, prefill, hand the KV over: the one token, or why not."""
        host, _, room = fields(body)
        if host == FAKE_BOOTSTRAP_HOST or room is None:
            return engine.prefill_only(prompt)
        slot = self.rooms.open(room)
        start = time.monotonic()
        with queued(engine, "prealloc"):
            bootstrapped = self.rooms.wait(lambda: slot.decode is not None, float(self.bootstrap_timeout))
        if not bootstrapped:
            if not self.warned:
                self.warned = True
                log(
                    "Some requests timed out when bootstrapping, which means prefill instances fail to "
                    "receive the KV indices from the decode instance of this request. If a greater mean "
                    "TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=600' "
                    "(10 minutes) to relax the timeout condition. ",
                    RANK,
                )
            reason = f"Request {room} timed out after {time.monotonic() - start:.1f}s in KVPoll.Bootstrapping"
            return self._failed(room, slot, rid, "bootstrap", reason)
        chunk = engine.prefill_only(prompt)
        kv = {"bootstrap_room": room, "prompt_tokens": prompt, "text": chunk.text, "output_ids": [1000]}
        self.rooms.publish(slot, kv)
        with queued(engine, "inflight"):
            taken = self.rooms.wait(lambda: slot.taken, HANDOVER_S)
        if not taken:
            return self._failed(
                room, slot, rid, "transfer", f"Failed to send kv chunk of {room} to {slot.decode}"
            )
        return chunk

    def _failed(self, room: int, slot: _bootstrap.Room, rid: str, stage: str, reason: str) -> Failure:
        self.rooms.fail(room, slot, reason)
        message = (
            f"Prefill {stage} failed for request rank=0 req.rid={rid!r} req.bootstrap_room={room} "
            f"with exception {kv_error(room, reason)}"
        )
        log(message, RANK)
        return Failure(500, message)


# --- the decode -----------------------------------------------------------------------------------


class Decode(Role):
    mode = "decode"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.newer = version_tuple() >= (0, 5, 23)
        self.waiting_timeout = env_number("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300)
        self.interval = max(
            env_number("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0, float), MIN_HEARTBEAT_S
        )
        self.max_failures = max(int(env_number("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1)
        self.lock = threading.Lock()
        self.peers: dict[str, dict] = {}  # bootstrap addr -> its layout (prefill_dp_size_table)
        self.ranks: dict[tuple[str, int], dict] = {}  # (addr, dp group) -> rank_ip/port (connection_pool)
        self.failures: dict[str, int] = {}
        self.waiting: dict[str, set[int]] = {}  # addr -> rooms without their KV (addr_to_rooms_tracker)
        self.lost: dict[int, str] = {}  # room -> why the heartbeat failed it
        self.warned = False
        threading.Thread(target=self.heartbeat, name="HeartbeatChecker", daemon=True).start()

    def receive(self, engine: Engine, body: dict, rid: str) -> Failure | None:
        """Handshake with the request's prefill and wait for its KV; None once it is here."""
        host, port, room = fields(body)
        if host == FAKE_BOOTSTRAP_HOST or room is None or self.rt.args.transfer_backend == "fake":
            return None  # SGLang's FakeKVReceiver: nothing to wait for
        addr = f"{host}:{port if port is not None else self.rt.args.bootstrap_port}"
        with queued(engine, "prealloc"):
            reason = self.handshake(addr, room)
        if reason is not None:
            return self._failed(room, rid, "handshake", reason)
        with self.lock:
            self.waiting.setdefault(addr, set()).add(room)
        try:
            with queued(engine, "transfer"):
                reason = self.wait_kv(addr, room)
        finally:
            with self.lock:
                self.waiting.get(addr, set()).discard(room)
        return None if reason is None else self._failed(room, rid, "transfer", reason)

    def _failed(self, room: int, rid: str, stage: str, reason: str) -> Failure:
        message = (
            f"Decode {stage} failed for request rank=0 decode_req.req.rid={rid!r} "
            f"decode_req.req.bootstrap_room={room} with exception {kv_error(room, reason)}"
        )
        log(message, RANK)
        return Failure(500, message)

    # -- the handshake: the prefill's layout (once per address) and its rank's address

    def handshake(self, addr: str, room: int) -> str | None:
        with self.lock:
            info = self.peers.get(addr)
        if info is None:
            info = self.fetch_layout(addr)
            if info is None:
                return f"Could not fetch prefill parallel info from bootstrap_addr: {addr}"
            with self.lock:
                first = addr not in self.peers
                self.peers[addr] = info
            if first:
                log(self.connected_line(addr, info), RANK)
        dp = room % max(int(info["dp_size"]), 1)
        with self.lock:
            known = (addr, dp) in self.ranks
        if not known:
            rank = self.fetch_rank(addr, dp)
            if rank is None:
                return (
                    f"Could not fetch bootstrap info for engine rank: 0 and target_dp_group: {dp} "
                    "and target_pp_rank 0"
                )
            with self.lock:
                self.ranks[(addr, dp)] = rank
        return None

    def connected_line(self, addr: str, info: dict) -> str:
        """The line SGLang logs (at DEBUG) when a decode first reads a prefill's layout."""
        if not self.newer:
            return (
                f"Fetch prefill parallel info from [{addr}]: DP size:{info['dp_size']}, "
                f"TP size:{info['attn_tp_size']} PP size:{info['pp_size']} Page size:{info['page_size']}"
            )
        shown = ", ".join(f"{k}={v!r}" for k, v in info.items())
        return f"Prefill parallel info for [{addr}]: PrefillServerInfo({shown})"

    def fetch_layout(self, addr: str) -> dict | None:
        """GET /route with every rank -1; 0.5.23 tries ENSURE_TRIES times, 1 s apart."""
        if not self.newer:
            path = "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"
            data = self._get_json(addr, path, "Failed to get prefill parallel info", "parallel info")
            if data is None:
                return None
            try:
                keys = ("attn_tp_size", "dp_size", "pp_size", "page_size")
                return {k: int(data[f"prefill_{k}"]) for k in keys}
            except TypeError as err:
                log(f"Error fetching prefill parallel info from bootstrap: {err}", RANK)
                return None
        path = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        for attempt in range(1, ENSURE_TRIES + 1):
            data = self._get_json(addr, path, "Failed to get prefill server info", "server info")
            if data is not None:
                return data
            if attempt < ENSURE_TRIES:
                time.sleep(1.0)
        log(f"Could not fetch prefill parallel info from {addr} after {ENSURE_TRIES} attempts", RANK)
        return None

    def fetch_rank(self, addr: str, dp: int) -> dict | None:
        if self.newer:
            path = f"/route?prefill_dp_rank={dp}&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        else:
            path = f"/route?engine_rank=0&target_dp_group={dp}&target_pp_rank=0"
        return self._get_json(addr, path, "Failed to get prefill server info", "info")

    def _get_json(self, addr: str, path: str, refused: str, what: str) -> dict | None:
        try:
            status, text = call(addr, "GET", path, 5.0)
        except OSError as err:
            log(f"Error fetching prefill {what} from bootstrap: {requests_error(addr, path, err)}", RANK)
            return None
        if status != 200:
            log(f"{refused}: {status}, {text.decode(errors='replace')}", RANK)
            return None
        data = json.loads(text)
        return data if isinstance(data, dict) else None

    # -- the transfer: long polls until the KV came, the heartbeat lost the prefill, or time ran out

    def wait_kv(self, addr: str, room: int) -> str | None:
        start = time.monotonic()
        deadline = start + float(self.waiting_timeout)
        path = f"{_bootstrap.KV_ROUTE}?room={room}&wait="
        while True:
            with self.lock:
                lost = self.lost.pop(room, None)
            if lost is not None:
                return lost
            left = deadline - time.monotonic()
            if left <= 0:
                self._warn_waiting()
                elapsed = time.monotonic() - start
                return f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"
            wait = min(POLL_S, left)
            try:
                status, _ = call(addr, "GET", f"{path}{wait:.3f}", wait + 3.0)
            except OSError:
                time.sleep(min(0.2, max(left, 0.0)))
                continue
            if status == 200:
                return None
            if status == 410:
                return "Failed to get kvcache from prefill instance, it might be dead"
            if status != 204:
                time.sleep(min(0.2, max(left, 0.0)))

    def _warn_waiting(self) -> None:
        if self.warned:
            return
        self.warned = True
        log(
            "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a "
            "greater mean TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' "
            "(10 minutes) to relax the timeout condition. ",
            RANK,
        )

    # -- the heartbeat

    def heartbeat(self) -> None:
        while True:
            time.sleep(self.interval)
            with self.lock:
                addrs = list(self.peers)
            for addr in addrs:
                try:
                    alive = call(addr, "GET", "/health", 3.0)[0] == 200
                except OSError:
                    alive = False
                if alive:
                    self.failures[addr] = 0
                    continue
                log(f"Attempting to reconnect to {addr}...", RANK)
                self.failures[addr] = self.failures.get(addr, 0) + 1
                if self.failures[addr] >= self.max_failures:
                    self.node_failure(addr)

    def node_failure(self, addr: str) -> None:
        """_handle_node_failure: forget the prefill, fail the requests waiting on it."""
        verb = "Lost" if self.newer else "Losing"
        reason = f"{verb} connection with prefill instance (bootstrap_addr: {addr})"
        with self.lock:
            self.peers.pop(addr, None)
            for key in [k for k in self.ranks if k[0] == addr]:
                del self.ranks[key]
            if self.newer:
                self.failures.pop(addr, None)
            rooms = self.waiting.pop(addr, set())
            for room in rooms:
                self.lost[room] = reason
        log(f"{reason}, {len(rooms)} requests affected", RANK)


# --- the server's view ----------------------------------------------------------------------------


def attach(rt: Runtime, server: _bootstrap.BootstrapServer | None) -> Role | None:
    """The KV manager of this server's role, made after the load (scheduler.init_disaggregation)."""
    mode = rt.args.disaggregation_mode
    if mode == "null":
        return None
    if mode == "prefill" or rt.args.transfer_backend != "fake":
        check_backend(rt)
    if mode == "decode":
        return Decode(rt)
    prefill = Prefill(rt, server)
    if rt.args.node_rank == 0:
        prefill.register()
    return prefill


def tokens(
    role: Role | None,
    engine: Engine,
    body: dict,
    rid: str,
    prompt: int,
    max_new: int,
    accept: float | None,
) -> Iterator[Chunk] | Failure:
    """A request's chunks on a server of any mode, or the failure that ends it first."""
    if role is None:
        return engine.generate(prompt, max_new, accept)
    failure = role.check(body, rid)
    if failure is not None:
        return failure
    if isinstance(role, Prefill):
        got = role.serve(engine, body, prompt, rid)
        return got if isinstance(got, Failure) else iter([got])
    assert isinstance(role, Decode)
    failure = role.receive(engine, body, rid)
    return failure if failure is not None else engine.generate(prompt, max_new, accept, prefill=False)


def warmup_lines(rt: Runtime) -> tuple[list[str], list[str]]:
    """The warm-up's lines around its request in PD mode (http_server._execute_server_warmup)."""
    mode = rt.args.disaggregation_mode
    if mode == "null":
        return [], []
    before = ["Start of pd disaggregation warmup ..."]
    if version_tuple() >= (0, 5, 23):
        dp = rt.args.dp_size
        return before, [
            f"Disaggregation warmup requests completed for all {dp} DP ranks",
            "End of disaggregation warmup",
        ]
    count = 1 if mode == "prefill" else 8  # the warm-up asks for 8; a prefill samples one
    text = "".join(" " + WORDS[i % len(WORDS)] for i in range(count))
    meta = {
        "id": os.urandom(16).hex(),
        "finish_reason": {"type": "length", "length": 0 if mode == "prefill" else count},
        "prompt_tokens": 4,
        "completion_tokens": count,
        "cached_tokens": 0,
    }
    resp = [{"text": text, "output_ids": list(range(1000, 1000 + count)), "meta_info": meta}]
    return before, [f"End of prefill disaggregation mode warmup with status 200, resp: {resp}"]

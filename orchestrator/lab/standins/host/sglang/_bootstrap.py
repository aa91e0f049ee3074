"""SGLang's KV bootstrap server on a PD prefill server, with the stand-in's loopback KV transfer.

The real one (disaggregation/common/conn.py, CommonKVBootstrapServer: an aiohttp app in a thread)
binds --host:--disaggregation-bootstrap-port as the server starts, while the model loads. Each
prefill rank registers there once it is loaded (PUT /route). A decode reads the prefill's layout and
ranks there (GET /route) and heartbeats it (GET /health). The routes:

    GET  /health          200 `OK`
    PUT  /route           a prefill rank registers (JSON body): 200 `OK`
    GET  /route           0.5.9: ?engine_rank=&target_dp_group=&target_pp_rank= ; all -1:
                          {"prefill_attn_tp_size", "prefill_dp_size", "prefill_pp_size",
                          "prefill_page_size"}; else {"rank_ip", "rank_port"} of that rank.
                          0.5.23: ?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank= ;
                          all -1: the PrefillServerInfo fields; 503 until every rank registered.
                          A missing parameter: 400 `Missing inputs for bootstrap server.`
    POST /register_dp_rank, /query_dp_ranks     0.5.23 only

On a real pair the KV moves over RDMA, rank to rank. The stand-in moves each request's "KV" (its
prompt length and first token) over this port, with a route of its own:

    GET  /standin/kv?room=R&wait=S
        The decode asks for room R and waits up to S seconds (at most MAX_WAIT_S). Asking is its
        handshake: the prefill starts a room's prefill only once its decode asked.
        200 {"bootstrap_room", "prompt_tokens", "text", "output_ids"}   the KV, handed over once
        204                                                              not computed yet
        410 {"error": reason}                                            the prefill failed it
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sglang._args import version_tuple

KV_ROUTE = "/standin/kv"
MAX_WAIT_S = 5.0
#: A room nobody touched for this long is dropped (a decode that gave up, a prefill never sent).
STALE_S = 900.0
TEXT = "text/plain; charset=utf-8"
JSON = "application/json; charset=utf-8"


# --- the KV rooms -------------------------------------------------------------------------------


@dataclass
class Room:
    """One request's KV on its way from prefill to decode."""

    seen: float = field(default_factory=time.monotonic)
    decode: str | None = None
    """The decode's address once it asked for the room (its handshake)."""
    kv: dict | None = None
    taken: bool = False
    error: str | None = None


class Rooms:
    """The prefill's rooms, by bootstrap_room; both sides wait on one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rooms: dict[int, Room] = {}

    def _room(self, room: int) -> Room:
        now = time.monotonic()
        for key in [k for k, r in self.rooms.items() if now - r.seen > STALE_S]:
            del self.rooms[key]
        found = self.rooms.setdefault(room, Room())
        found.seen = now
        return found

    def open(self, room: int) -> Room:
        """The prefill's side: the room of a request that arrived."""
        with self.cond:
            return self._room(room)

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def publish(self, room: Room, kv: dict) -> None:
        with self.cond:
            room.kv = kv
            self.cond.notify_all()

    def fail(self, key: int, room: Room, reason: str) -> None:
        """The prefill gave up on the room; a decode asking later gets 410 with the reason."""
        with self.cond:
            room.error, room.seen = reason, time.monotonic()
            self.rooms[key] = room
            self.cond.notify_all()

    def ask(self, key: int, decode: str, wait: float) -> tuple[int, dict | None]:
        """The decode's side: (200, kv), (204, None) or (410, {"error": ...})."""
        with self.cond:
            room = self._room(key)
            room.decode = room.decode or decode
            self.cond.notify_all()
            self.cond.wait_for(lambda: room.kv is not None or room.error is not None, wait)
            if room.error is not None:
                return 410, {"error": room.error}
            if room.kv is None:
                return 204, None
            room.taken = True
            self.rooms.pop(key, None)
            self.cond.notify_all()
            return 200, room.kv


# --- what the prefill's ranks registered --------------------------------------------------------


class Table:
    """CommonKVBootstrapServer's state: the layout the first rank gave, and every rank's address."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.layout: dict[str, Any] = {}
        self.ranks: dict[tuple[int, int, int, int], dict] = {}  # (dp, cp, tp, pp) -> rank_ip/port
        self.room_to_dp_rank: dict[int, int] = {}

    def register(self, data: dict) -> None:
        """PUT /route. A missing key raises KeyError (aiohttp answers 500), as in SGLang."""
        keys = ["attn_tp_size", "attn_tp_rank", "attn_dp_size", "attn_dp_rank", "pp_size", "pp_rank"]
        keys += ["system_dp_size", "system_dp_rank", "rank_ip", "rank_port", "page_size"]
        newer = version_tuple() >= (0, 5, 23)
        keys += ["attn_cp_size", "attn_cp_rank", "kv_cache_dtype"] if newer else ["role"]
        values = {k: data[k] for k in keys}
        system_dp = values["system_dp_size"]
        with self.lock:
            layout = self.layout
            layout.setdefault("attn_tp_size", values["attn_tp_size"])
            layout.setdefault("attn_cp_size", values.get("attn_cp_size", 1))
            layout.setdefault("dp_size", values["attn_dp_size"] if system_dp == 1 else system_dp)
            layout.setdefault("pp_size", values["pp_size"])
            layout.setdefault("page_size", int(values["page_size"]))
            layout.setdefault("kv_cache_dtype", values.get("kv_cache_dtype"))
            layout.setdefault("prefill_http_port", data.get("prefill_http_port"))
            layout.setdefault("load_balance_method", data.get("load_balance_method", "follow_bootstrap_room"))
            layout.setdefault("decode_allocation_policy", data.get("decode_allocation_policy", "early"))
            dp = values["attn_dp_rank"] if system_dp == 1 else values["system_dp_rank"]
            key = (dp, values.get("attn_cp_rank", 0), values["attn_tp_rank"], values["pp_rank"])
            self.ranks[key] = {"rank_ip": str(values["rank_ip"]), "rank_port": int(values["rank_port"])}

    def ready(self) -> bool:
        """0.5.23: every rank the layout names has registered."""
        with self.lock:
            if not self.layout:
                return False
            lay = self.layout
            return (
                len(self.ranks) >= lay["dp_size"] * lay["attn_cp_size"] * lay["attn_tp_size"] * lay["pp_size"]
            )

    def info_059(self) -> dict:
        with self.lock:
            lay = self.layout
            return {
                "prefill_attn_tp_size": lay.get("attn_tp_size"),
                "prefill_dp_size": lay.get("dp_size"),
                "prefill_pp_size": lay.get("pp_size"),
                "prefill_page_size": lay.get("page_size"),
            }

    def info_0523(self) -> dict:
        """PrefillServerInfo as 0.5.23 sends it (kv_layout and dsv41_spec_layout left out: None)."""
        with self.lock:
            lay = self.layout
            return {
                "attn_tp_size": lay["attn_tp_size"],
                "attn_cp_size": lay["attn_cp_size"],
                "dp_size": lay["dp_size"],
                "pp_size": lay["pp_size"],
                "page_size": lay["page_size"],
                "kv_cache_dtype": lay["kv_cache_dtype"],
                "follow_bootstrap_room": lay["load_balance_method"] == "follow_bootstrap_room",
                "enable_dsa_cache_layer_split": False,
                "enable_kv_cache_sharding": False,
                "prefill_http_port": lay["prefill_http_port"],
                "decode_allocation_policy": lay["decode_allocation_policy"],
            }


# --- the HTTP server ----------------------------------------------------------------------------


class BootstrapServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, Handler)
        self.table = Table()
        self.rooms = Rooms()

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Python/3.11 aiohttp/3.11.18"
    sys_version = ""
    server: BootstrapServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # aiohttp's access log is on only at DEBUG level there

    def reply(self, code: int, body: str | dict | None, content_type: str = TEXT) -> None:
        data = b"" if body is None else (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", JSON if isinstance(body, dict) else content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        data = json.loads(self.rfile.read(length) or b"null")
        if not isinstance(data, dict):
            raise KeyError("role")
        return data

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_PUT(self) -> None:
        self.dispatch("PUT")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def do_DELETE(self) -> None:
        self.dispatch("DELETE")

    def dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        newer = version_tuple() >= (0, 5, 23)
        routes: dict[tuple[str, str], Callable[[dict], None]] = {
            ("GET", "/health"): lambda q: self.reply(200, "OK"),
            ("GET", "/route"): self.route_get,
            ("PUT", "/route"): self.route_put,
            ("GET", KV_ROUTE): self.kv,
        }
        if newer:
            routes[("POST", "/register_dp_rank")] = self.register_dp_rank
            routes[("POST", "/query_dp_ranks")] = self.query_dp_ranks
        handler = routes.get((method, url.path))
        try:
            if handler is not None:
                handler(query)
            elif url.path == "/route":
                self.reply(405, "Method not allowed", JSON)  # the route's own answer, as SGLang's
            elif any(path == url.path for _, path in routes):
                self.reply(405, "405: Method Not Allowed")
            else:
                self.reply(404, "404: Not Found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except (KeyError, TypeError, ValueError):
            self.reply(500, "500 Internal Server Error\n\nServer got itself in trouble")

    def route_put(self, query: dict) -> None:
        self.server.table.register(self.body())
        self.reply(200, "OK")

    def route_get(self, query: dict) -> None:
        table = self.server.table
        if version_tuple() < (0, 5, 23):
            names = ("target_dp_group", "engine_rank", "target_pp_rank")
            if not all(query.get(n) for n in names):
                self.reply(400, "Missing inputs for bootstrap server.")
                return
            dp, tp, pp = (int(query[n]) for n in names)
            if (dp, tp, pp) == (-1, -1, -1):
                self.reply(200, table.info_059())
                return
            with table.lock:
                info = table.ranks[(dp, 0, tp, pp)]  # KeyError: 500, as the real table lookup
            self.reply(200, info)
            return
        names = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(query.get(n) for n in names):
            self.reply(400, "Missing inputs for bootstrap server.")
            return
        key = tuple(int(query[n]) for n in names)
        if not table.ready():
            with table.lock:
                count = len(table.ranks)
            self.reply(503, f"Prefill server not fully registered yet ({count} workers registered).")
            return
        if key == (-1, -1, -1, -1):
            self.reply(200, table.info_0523())
            return
        with table.lock:
            rank = table.ranks.get(key)  # type: ignore[arg-type]
        if rank is None:
            dp, cp, tp, pp = key
            self.reply(
                404, f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
            )
            return
        self.reply(200, rank)

    def register_dp_rank(self, query: dict) -> None:
        data = self.body()
        with self.server.table.lock:
            self.server.table.room_to_dp_rank[int(data["bootstrap_room"])] = int(data["dp_rank"])
        self.reply(200, "OK")

    def query_dp_ranks(self, query: dict) -> None:
        data = self.body()
        table = self.server.table
        rooms = [int(r) for r in data["bootstrap_rooms"]]
        with table.lock:
            found = {str(r): table.room_to_dp_rank[r] for r in rooms if r in table.room_to_dp_rank}
        self.reply(200, found)

    def kv(self, query: dict) -> None:
        """The stand-in's transfer: the decode's long poll for one room's KV."""
        room = int(query.get("room", ""))
        wait = min(max(float(query.get("wait", "0") or 0), 0.0), MAX_WAIT_S)
        decode = f"{self.client_address[0]}:{self.client_address[1]}"
        code, data = self.server.rooms.ask(room, decode, wait)
        self.reply(code, data)

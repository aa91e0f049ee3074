"""Several nodes as one server: the part of torch.distributed and NCCL a deployment sees.

`--nnodes N --node-rank R --dist-init-addr HOST:PORT`. Node rank 0 listens on PORT on all
interfaces (as torch's TCPStore server does) and every other rank connects to HOST:PORT,
retrying until the dist timeout (`--dist-timeout`, else the `dist_timeout_s` knob). One TCP
connection per node, newline-framed text:

    rank R -> 0   JOIN <R> <N> <hostname>
    0 -> rank R   WELCOME <hostname>       once all N-1 ranks joined (the barrier)
    0 -> rank R   REJECT <reason>          rank out of range, already joined, or another N
    rank R -> 0   LOADED                   its weights, KV cache and graphs are done
    0 -> rank R   LOST <rank> <host> <ip<port>>   that rank's connection closed

A killed process's sockets are closed by the kernel, so a closed connection is a dead peer.
The survivors then print NCCL's error naming the node rank that died first and exit 1 within
moments, as SGLang's schedulers do when a broadcast to a dead peer fails. A frozen peer (no
close) goes unnoticed, as with NCCL until the watchdog fires. IPv4 only.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from nvidia_standin import registry

from sglang._common import LAUNCH_FRAME, SRT, die

if TYPE_CHECKING:
    from sglang._startup import Runtime

NCCL_VERSION = "2.27.3"
NCCL_PORT_OFFSET = 233  # no --dist-init-addr: each node looks on its own 127.0.0.1, never meeting
RETRY_S = 0.2
JOIN_READ_S = 2.0  # a connection that sends no JOIN line in this time is not one of ours
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
INIT_FRAMES = [
    (f"{SRT}/managers/scheduler.py", 2871, "run_scheduler_process", "scheduler = Scheduler("),
    (f"{SRT}/model_executor/model_runner.py", 455, "init_torch_distributed", "init_distributed_environment("),
    (
        f"{SRT}/distributed/parallel_state.py",
        1251,
        "init_distributed_environment",
        "torch.distributed.init_process_group(",
    ),
]
LOOP_FRAMES = [
    (f"{SRT}/managers/scheduler.py", 2880, "run_scheduler_process", "scheduler.event_loop_overlap()"),
    (
        f"{SRT}/utils/common.py",
        1194,
        "broadcast_pyobj",
        "dist.broadcast(tensor_size, src=src, group=dist_group)",
    ),
]


def stamp(rank: str = "") -> str:
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{' ' + rank if rank else ''}]"


def _framing(rt: Runtime, error: str) -> tuple[str, str]:
    """(line before, error) of a scheduler exception, as _load.fail frames them."""
    return f"{stamp(rt.tp_label)} Scheduler hit an exception: ", f"{error}\n{stamp()} {SIGQUIT}"


def fatal(rt: Runtime, frames: list[tuple[str, int, str, str]], error: str) -> NoReturn:
    """A start-up failure in the main thread: traceback, exit 1 (the caller unregisters)."""
    before, text = _framing(rt, error)
    die(frames, text, before)
    raise AssertionError("unreachable")


def crash(rt: Runtime, frames: list[tuple[str, int, str, str]], error: str) -> NoReturn:
    """The same from a watcher thread: print, free the GPUs, end the whole process now."""
    before, text = _framing(rt, error)
    lines = [before, "Traceback (most recent call last):"]
    for path, line, func, source in frames:
        lines += [f'  File "{path}", line {line}, in {func}', f"    {source}"]
    print("\n".join([*lines, text]), file=sys.stderr, flush=True)
    registry.unregister()
    os._exit(1)


def nccl_error(rank: int, host: str, where: str) -> str:
    """What a survivor prints; the first line names the node rank whose connection closed."""
    return (
        "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network "
        f"error, NCCL version {NCCL_VERSION} (peer: node rank {rank}, host {host})\n"
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
        "prematurely.\nLast error:\n"
        f"socketProgress: Connection closed by remote peer {where}"
    )


class Lines:
    """Newline-framed text over a socket; read() gives None once the other side has closed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def read(self) -> str | None:
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                raise
            except OSError:  # reset by a dying peer: the same as a close
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def send(self, text: str) -> bool:
        try:
            self.sock.sendall(text.encode() + b"\n")
            return True
        except OSError:
            return False


@dataclass
class Peer:
    """The other end of one of this node's connections."""

    rank: int
    host: str
    where: str  # `ip<port>`, as NCCL names a remote peer
    conn: Lines
    loaded: bool = False


class Group:
    """A joined group, as this node sees it: a watcher thread per connection ends the process
    when one closes (naming that rank) or when rank 0 reports a lost rank."""

    def __init__(self, rt: Runtime, peers: list[Peer]) -> None:
        self.rt, self.peers = rt, peers
        self.cond = threading.Condition()
        self.ending = False
        for peer in peers:
            threading.Thread(target=self._watch, args=(peer,), daemon=True).start()

    def _watch(self, peer: Peer) -> None:
        while True:
            line = peer.conn.read()
            if line is None:
                self.lost(peer.rank, peer.host, peer.where)
            words = line.split()
            if words == ["LOADED"]:
                with self.cond:
                    peer.loaded = True
                    self.cond.notify_all()
            elif words[:1] == ["LOST"] and len(words) == 4 and words[1].isdigit():
                self.lost(int(words[1]), words[2], words[3])

    def lost(self, rank: int, host: str, where: str) -> NoReturn:
        with self.cond:
            first, self.ending = not self.ending, True
        if not first:  # another watcher is already ending the process
            while True:
                time.sleep(3600)
        for peer in self.peers:  # a ring has every rank touch the dead one: tell the others
            if peer.rank != rank:
                peer.conn.send(f"LOST {rank} {host} {where}")
        crash(self.rt, LOOP_FRAMES, nccl_error(rank, host, where))

    def loaded(self) -> None:
        """Rank >= 1: tell rank 0 this node finished loading."""
        for peer in self.peers:
            peer.conn.send("LOADED")

    def wait_loaded(self) -> None:
        """Rank 0: the collectives after loading need every rank, so wait for all (no timeout:
        the real server hangs here until its watchdog)."""
        with self.cond:
            while not self.cond.wait_for(lambda: all(p.loaded for p in self.peers), timeout=0.5):
                pass


def store_address(rt: Runtime) -> tuple[str, int]:
    addr = rt.args.dist_init_addr
    if addr is None:
        return "127.0.0.1", rt.args.port + NCCL_PORT_OFFSET
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        die([LAUNCH_FRAME], "AssertionError: please provide --dist-init-addr as host:port of head node")
    return host.strip("[]"), int(port)


def timeout_s(rt: Runtime) -> float:
    given = rt.args.dist_timeout
    return float(given) if given is not None else float(rt.model.knob("dist_timeout_s"))


def join(rt: Runtime) -> Group | None:
    """Meet the other nodes (None on a single node), or die as torch.distributed does."""
    if rt.args.nnodes <= 1:
        return None
    host, port = store_address(rt)
    if rt.args.node_rank == 0:
        return _serve_store(rt, port, timeout_s(rt))
    return _connect(rt, host, port, timeout_s(rt))


# --- node rank 0 ----------------------------------------------------------------------------


def _serve_store(rt: Runtime, port: int, timeout: float) -> Group:
    try:
        listener = socket.create_server(("0.0.0.0", port), backlog=max(8, rt.args.nnodes))
    except OSError as err:
        fatal(
            rt,
            INIT_FRAMES,
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
            f"network address. The server socket has failed to bind to 0.0.0.0:{port} "
            f"(errno: {err.errno} - {os.strerror(err.errno or 0)}).",
        )
    with listener:
        peers = _gather(rt, listener, timeout)
    me = socket.gethostname()
    for peer in peers:
        peer.conn.send(f"WELCOME {me}")
    return Group(rt, peers)


def _gather(rt: Runtime, listener: socket.socket, timeout: float) -> list[Peer]:
    """Accept JOINs until every rank is in; TCPStore's wait for workers, timeout included."""
    start = time.monotonic()
    peers: dict[int, Peer] = {}
    listener.settimeout(RETRY_S)
    while len(peers) < rt.args.nnodes - 1:
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            per_node = len(rt.gpus)  # each GPU's process is one store client
            fatal(
                rt,
                INIT_FRAMES,
                f"torch.distributed.DistStoreError: Timed out after {int(elapsed)} seconds waiting for "
                f"clients. {per_node * (1 + len(peers))}/{per_node * rt.args.nnodes} clients joined.",
            )
        _drop_closed(peers)
        try:
            sock, (ip, their_port) = listener.accept()
        except TimeoutError:
            continue
        peer = _admit(rt, sock, f"{ip}<{their_port}>", peers)
        if peer is not None:
            peers[peer.rank] = peer
    return [peers[r] for r in sorted(peers)]


def _admit(rt: Runtime, sock: socket.socket, where: str, peers: dict[int, Peer]) -> Peer | None:
    sock.settimeout(JOIN_READ_S)
    conn = Lines(sock)
    try:
        words = (conn.read() or "").split()
    except TimeoutError:
        words = []
    if len(words) != 4 or words[0] != "JOIN" or not words[1].isdigit() or not words[2].isdigit():
        sock.close()
        return None
    rank, nnodes, host = int(words[1]), int(words[2]), words[3]
    reason = ""
    if nnodes != rt.args.nnodes:
        reason = f"nnodes {nnodes} differs from node rank 0's {rt.args.nnodes}"
    elif not 1 <= rank < rt.args.nnodes:
        reason = f"node rank {rank} is out of range for nnodes {rt.args.nnodes}"
    elif rank in peers:
        reason = f"node rank {rank} already joined from {peers[rank].host}"
    if reason:
        conn.send(f"REJECT {reason}")
        sock.close()
        return None
    sock.settimeout(None)
    return Peer(rank, host, where, conn)


def _drop_closed(peers: dict[int, Peer]) -> None:
    """A rank that joined and died before the barrier no longer counts (it may come back)."""
    if not peers:
        return
    readable, _, _ = select.select([p.conn.sock for p in peers.values()], [], [], 0)
    for rank, peer in list(peers.items()):
        if peer.conn.sock not in readable:
            continue
        try:
            gone = peer.conn.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            gone = True
        if gone:
            peer.conn.sock.close()
            del peers[rank]


# --- node ranks 1 and up --------------------------------------------------------------------


def _connect(rt: Runtime, host: str, port: int, timeout: float) -> Group:
    start = time.monotonic()
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() - start + RETRY_S > timeout:
                fatal(
                    rt,
                    INIT_FRAMES,
                    f"torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{int(timeout * 1000)}ms while trying to connect to ({host}, {port}).",
                )
            time.sleep(RETRY_S)
    conn = Lines(sock)
    conn.send(f"JOIN {rt.args.node_rank} {rt.args.nnodes} {socket.gethostname()}")
    sock.settimeout(timeout + 5)  # rank 0 gives up first and closes; this is for a frozen rank 0
    try:
        words = (conn.read() or "").split(maxsplit=1)
    except TimeoutError:
        fatal(
            rt,
            INIT_FRAMES,
            f"torch.distributed.DistStoreError: Timed out waiting for the process group barrier at "
            f"({host}, {port}) after {int((timeout + 5) * 1000)}ms",
        )
    if words[:1] == ["REJECT"]:
        reason = words[1] if len(words) > 1 else "rejected"
        refused = f"torch.distributed.DistStoreError: the store at ({host}, {port}) refused: {reason}"
        fatal(rt, INIT_FRAMES, refused)
    if words[:1] != ["WELCOME"]:
        fatal(rt, INIT_FRAMES, "torch.distributed.DistNetworkError: failed to recv, got 0 bytes")
    sock.settimeout(None)
    rank0 = words[1].strip() if len(words) > 1 else host
    return Group(rt, [Peer(0, rank0, f"{host}<{port}>", conn)])

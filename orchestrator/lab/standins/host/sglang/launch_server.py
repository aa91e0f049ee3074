"""`python3 -m sglang.launch_server`: the lab's SGLang, run unchanged by the real systemd unit.

It accepts exactly the flags of the installed version (from that version's real --help),
starts like the real server (checks, then a load delay with the port closed, then a short
warm-up answering 503), serves SGLang's HTTP API at the speed the model in sglang._speed
gives, holds its GPU memory in the lab's registry, and fails the way SGLang fails.
With --nnodes > 1 the nodes meet at --dist-init-addr first (sglang._dist). With
--disaggregation-mode prefill or decode it serves its half of a PD pair (sglang._pd).
Knobs: the model dir's standin.json, or SGLANG_STANDIN_<KEY> environment variables.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from nvidia_standin import registry

from sglang import _args, _bootstrap, _dist, _load, _pd, _progress, _startup
from sglang._common import LAUNCH_FRAME, log
from sglang._engine import Engine
from sglang._http import Server


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def bind(rt: _startup.Runtime, engine: Engine, pd: _pd.Role | None) -> Server:
    """Open the port only now, as the real server does after loading; a taken port is fatal."""
    try:
        return Server((rt.args.host, rt.args.port), engine, pd)
    except OSError as err:
        log(
            f"ERROR:    [Errno {err.errno}] error while attempting to bind on address "
            f"('{rt.args.host}', {rt.args.port}): {err.strerror.lower() if err.strerror else err}"
        )
        raise SystemExit(1) from None


def warm_up(rt: _startup.Runtime, engine: Engine) -> None:
    """503 on /health until a first generation went through, then the famous line. Without
    CUDA graphs that generation is the first forward pass, where DeepGEMM compiles."""
    if not rt.args.cuda_graph:
        _load.deep_gemm(rt, rt.gpu_cfg.total_mib * (1 - rt.mem_fraction))
    if rt.stall == "warmup":
        _progress.forever()  # the port is open and /health answers 503 for good
    time.sleep(float(rt.model.knob("warmup_s")))
    error = rt.model.knob("warmup_error")
    if error:
        log(f"Initialization failed. warmup error: {error}")
        registry.unregister()
        os._exit(1)  # the real server kills its own process tree here
    before, after = _pd.warmup_lines(rt)
    for line in before:
        log(line)
    log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    for line in after:
        log(line)
    engine.ready = True
    log("The server is fired up and ready to roll!")
    crash_after = rt.model.knob("crash_after_s")
    if crash_after is not None:
        time.sleep(float(crash_after))
        log(
            "Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access was encountered",
            "TP0",
        )
        log("Received sigquit from a child process. It usually means the child failed.")
        registry.unregister()
        os._exit(1)


def serve(
    rt: _startup.Runtime, group: _dist.Group | None, bootstrap: _bootstrap.BootstrapServer | None
) -> None:
    """Node rank 0 opens the port once every node has loaded; the others hold their GPUs
    while the group's watcher threads end the process if a peer dies. A PD server's KV manager
    comes first (its transfer engine, a prefill's registration at its bootstrap server)."""
    engine = Engine(rt)
    pd = _pd.attach(rt, bootstrap)
    if rt.args.node_rank > 0:
        if group is not None:
            group.loaded()
        log(f"Node rank {rt.args.node_rank} holds its GPUs; only node rank 0 serves HTTP.")
        while True:
            time.sleep(3600)
    if group is not None:
        group.wait_loaded()
    if _load.newer():
        log(_load.startup_timings(rt))
    server = bind(rt, engine, pd)
    log(f"INFO:     Started server process [{os.getpid()}]")
    log("INFO:     Waiting for application startup.")
    log("INFO:     Application startup complete.")
    log(f"INFO:     Uvicorn running on http://{rt.args.host}:{rt.args.port} (Press CTRL+C to quit)")
    threading.Thread(target=warm_up, args=(rt, engine), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        log("INFO:     Shutting down")
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGTERM, _on_sigterm)
    args = _args.parse(sys.argv[1:] if argv is None else argv)
    try:
        rt = _startup.prepare(args)
        _pd.resolve(args, [LAUNCH_FRAME, _startup.ARGS_FRAME])
        shown = ", ".join(f"{k}={v!r}" for k, v in args.as_dict().items())
        log(f"server_args=ServerArgs({shown})")
        bootstrap = _pd.start_bootstrap(rt)  # the tokenizer manager's, up while the model loads
        serve(rt, _load.load(rt), bootstrap)
    finally:
        registry.unregister()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

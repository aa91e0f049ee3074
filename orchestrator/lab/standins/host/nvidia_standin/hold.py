"""`gpu-hold`: a "foreign" process holding GPU memory until it is killed.

Lab tests start one over ssh to play another user's job on a GPU, e.g.
`systemd-run --unit gpu-hold-0 /usr/local/bin/gpu-hold --gpu 0 --mib 4000`. The memory
is released when the process ends, however it ends (the registry checks the PID).
"""

from __future__ import annotations

import argparse
import signal
import sys

from nvidia_standin import registry


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-hold", description="Hold GPU memory until killed.")
    parser.add_argument("--gpu", default="0", help="GPU index, or a comma list (0,1)")
    parser.add_argument("--mib", type=int, required=True, help="MiB to hold on each of those GPUs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    cfg = registry.load_config()
    gpus = [int(g) for g in args.gpu.split(",")]
    given = registry.container_gpus()  # in a container: its GPU i is the host's given[i]
    count = cfg.count if given is None else len(given)
    bad = [g for g in gpus if not 0 <= g < count]
    if bad:
        print(f"gpu-hold: no GPU {bad[0]} on this host ({count} GPUs)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    registry.register(gpus if given is None else [given[g] for g in gpus], args.mib)
    try:
        print(f"holding {args.mib} MiB on GPU {args.gpu}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0
    finally:
        registry.unregister()


if __name__ == "__main__":
    raise SystemExit(main())

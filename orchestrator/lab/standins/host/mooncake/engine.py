"""`mooncake.engine.TransferEngine`, as SGLang imports it; the lab's stand-in for RDMA.

Making one raises: a lab host has no RDMA device, and nothing in the lab should transfer with it.
"""

from __future__ import annotations


class TransferEngine:
    """Mooncake's transfer engine: only its name is real here."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "mooncake stand-in: TransferEngine cannot run on a lab host (no RDMA device). "
            "The SGLang stand-in moves PD KV caches over its bootstrap port and never creates one."
        )

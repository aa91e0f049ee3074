"""Mooncake stand-in for the lab hosts: importable, so SGLang's `mooncake` transfer backend passes
the checks that import it; it moves nothing.

The real package (PyPI `mooncake-transfer-engine`) moves KV caches between a prefill and a decode
server over RDMA. Lab hosts have no RDMA NICs: the SGLang stand-in moves its KV over its bootstrap
port instead (sglang/_pd.py) and never calls this package.
"""

__version__ = "0.3.13.post1"

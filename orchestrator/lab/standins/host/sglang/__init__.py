"""SGLang stand-in for the lab hosts (see sglang.launch_server); not the real package."""

from sglang.version import __version__

__all__ = ["__version__"]

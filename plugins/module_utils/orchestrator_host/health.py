"""A server's HTTP health, as its /health answers."""

from __future__ import annotations

import urllib.error
import urllib.request


def health_status(url: str, timeout: float) -> int | None:
    """The HTTP status of `url`; None when nothing answered (refused, timed out)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None

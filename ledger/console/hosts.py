"""Which ``Host`` headers the console answers (no DNS rebinding)."""

from __future__ import annotations

import ipaddress

#: The loopback names: the ``Host`` headers a console bound to loopback answers.
LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> list[str]:
    """``Host`` header values the console answers when bound to ``host``.

    Loopback: the loopback names only (a page elsewhere cannot reach it
    through a rebound DNS name); a named host: that name and loopback; a
    wildcard address (``0.0.0.0``, ``::``): any.
    """
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    names = list(LOOPBACK_HOSTS)
    return names if host in names else [host, *names]

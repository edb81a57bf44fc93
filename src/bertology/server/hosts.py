"""The ``Host`` header check against DNS rebinding.

A web page on another site can make a browser send requests to a server on loopback by pointing its own
host name at 127.0.0.1; the request then carries that site's name in its ``Host`` header. A server bound
to loopback therefore answers only requests whose ``Host`` is one of its own loopback names with its
port (:func:`loopback_hosts`); others get 400. Starlette's ``TrustedHostMiddleware`` compares host names
without the port, so this small middleware compares the whole header.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from bertology.server.errors import error_response, shown

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def loopback_hosts(port: int) -> frozenset[str]:
    """The ``Host`` values a browser sends to a loopback server on ``port`` (without the port on 80)."""
    hosts = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    return frozenset(hosts | set(LOOPBACK_NAMES) if port == 80 else hosts)


class HostCheck:
    """ASGI middleware: answer 400 to a request whose ``Host`` header (case-insensitive) is not in
    ``hosts``."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host.lower() not in self.hosts:
                answer = error_response(
                    400,
                    f"The Host header '{shown(host)}' is not this server's; "
                    f"it answers to {', '.join(sorted(self.hosts))}.",
                )
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""Start the web app with uvicorn on a socket bound here, so the startup line names the real port
(``--port 0`` picks a free one)."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from bertology.errors import BertologyError
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, Dtype
from bertology.server.app import create_app
from bertology.server.hosts import loopback_hosts
from bertology.server.limits import Limits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
#: Connections the kernel queues before the server accepts them (capped by ``net.core.somaxconn``,
#: 4096 on current Linux): enough that a burst of hundreds of clients connecting at once is never refused.
BACKLOG = 2048


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Raises:
        BertologyError: the address cannot be used (taken, not this machine's, not a host name).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as error:
        raise BertologyError(f"Cannot listen on {host}:{port}: {error.strerror or error}.") from error
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_server(app: FastAPI) -> uvicorn.Server:
    """A uvicorn server for ``app`` that logs only warnings (the startup line is ours)."""
    return uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", backlog=BACKLOG)
    )


def computation_threads(parallel: int) -> int:
    """Torch intra-op threads per computation: this machine's cores shared by ``parallel`` computations
    (more threads than cores make every forward pass many times slower)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // parallel)


def serve(
    models: Sequence[str],
    runs: str | Path | None = None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    limits: Limits | None = None,
    announce: Callable[[str], None] = print,
    device: str = DEFAULT_DEVICE,
    dtype: Dtype = DEFAULT_DTYPE,
    index: str | Path | None = None,
) -> None:
    """Load ``models`` (on ``device``, in ``dtype``), bind ``host:port``, announce where it listens, and
    serve until interrupted; ``index``: a corpus index folder for corpus search.

    The process's torch threads are the caller's to set (``bertology serve`` sets them to
    :func:`computation_threads` of ``limits.parallel``; the library changes no process-wide setting). Bound to
    loopback, the server answers only requests whose ``Host`` header is a loopback name with its port
    (:mod:`bertology.server.hosts`, against DNS rebinding).
    """
    limits = limits or Limits()
    sock = bind(host, port)  # first, so a taken port fails before the models load
    hosts = loopback_hosts(sock.getsockname()[1]) if is_loopback(host) else None
    try:
        app = create_app(models, runs, limits, hosts=hosts, device=device, dtype=dtype, index=index)
    except BaseException:
        sock.close()
        raise
    names = ", ".join(app.state.models)
    where = f"; runs: {Path(runs).resolve()}" if runs is not None else ""
    announce(f"bertology serve: listening on {url_of(sock)} (models: {names}{where})")
    if not is_loopback(host):
        announce(f"Warning: {host} is reachable from other machines; anyone who can reach it can use it.")
    make_server(app).run(sockets=[sock])

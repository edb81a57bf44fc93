"""The server's limits, with their defaults, and the request-body guard.

=====================  =========  ==================================================================
limit                  default    when exceeded
=====================  =========  ==================================================================
max_tokens             512        422: the input's token count (special tokens included) and the limit;
                                  a model that takes fewer tokens (its own limit) lowers it
max_body_bytes         65536      413, checked on ``Content-Length`` and on the bytes actually received
timeout_s              30         503 with ``Retry-After``: waiting for a free model plus computing took
                                  longer; a computation already running finishes in the background and
                                  its result is dropped
parallel               2          computations at once per model; more requests wait (within timeout_s)
max_attention_values   2000000    422 from ``/api/attention``: layers x heads x n x n asked for; ask for
                                  one layer or one head of a long input
=====================  =========  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertology.errors import BertologyError
from bertology.server.errors import error_response


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (see the module docstring for the answers)."""

    max_tokens: int = 512
    max_body_bytes: int = 64 * 1024
    timeout_s: float = 30.0
    parallel: int = 2
    max_attention_values: int = 2_000_000

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_body_bytes", "timeout_s", "parallel", "max_attention_values"):
            if not getattr(self, name) > 0:
                raise BertologyError(f"The server limit {name} must be positive, not {getattr(self, name)}.")


class BodySizeLimit:
    """ASGI middleware: answer 413 to a body over ``max_bytes``, at once when ``Content-Length`` says so,
    else as soon as the bytes read (e.g. of a chunked body) pass the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self, size: str) -> str:
        return f"The request body is {size}; this server accepts at most {self.max_bytes} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(413, self._message(f"{int(declared)} bytes"))(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException passes through FastAPI's body parsing to the error handlers.
                    raise HTTPException(413, self._message(f"over {self.max_bytes} bytes"))
            return message

        await self.app(scope, counting_receive, send)

"""An HTTP answer sent from a file already opened (:meth:`bertology.server.runs.RunsFolder.open`).

The body comes from that descriptor and nothing else: its ``Content-Length`` is the size ``fstat``
gives for it when the answer starts, and at most that many bytes are sent (a file that grows meanwhile
is cut at that length). The content type is :func:`served_type`: guessed from the name the file was
opened under, as Starlette's ``FileResponse`` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from mimetypes import guess_type
from typing import BinaryIO

import anyio.to_thread
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


def served_type(file: BinaryIO) -> str:
    """The content type ``file`` is served with: guessed from its ``name``, the normalised path it was
    opened under (:meth:`bertology.files.beneath.OpenFolder.open`: empty and ``.`` components left out, no
    link followed, so the name of the file itself, however the request spelled it), and
    ``application/octet-stream`` when the name says nothing."""
    return guess_type(str(file.name))[0] or "application/octet-stream"


class OpenedFileResponse(Response):
    """``file`` (a regular file opened for binary reading; closed when the answer ends) as the body."""

    chunk_size = 64 * 1024

    def __init__(self, file: BinaryIO, headers: Mapping[str, str] | None = None) -> None:
        self.file = file
        self.size = os.fstat(file.fileno()).st_size
        self.status_code = 200
        self.media_type = served_type(file)
        self.background = None
        self.init_headers(headers)
        self.headers["content-length"] = str(self.size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            left = 0 if scope.get("method") == "HEAD" else self.size
            if left == 0:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            while left > 0:
                chunk = await anyio.to_thread.run_sync(self.file.read, min(self.chunk_size, left))
                if not chunk:
                    break  # the file shrank since it was opened: the connection ends short of the length
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
        finally:
            self.file.close()

"""Every failed request gets a JSON answer ``{"error": "<one sentence>"}`` with a 4xx (or 503) status.

Library errors (:class:`~bertology.errors.BertologyError`: empty text, a layer that does not exist)
become 422, a symbolic link met in the runs folder (:class:`~bertology.files.beneath.LinkRefused`) 403;
request-shape errors name the field and what is wrong with it; anything unexpected is logged and
answered 500 with a generic sentence, so no request can take the server down. An answer echoes at most
:data:`ECHO_CHARS` characters of any one thing the request sent, and names at most :data:`MAX_PROBLEMS`
problems.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from bertology.errors import BertologyError
from bertology.files.beneath import LinkRefused

log = logging.getLogger("bertology.server")

#: FastAPI's 400 detail for a body it could not parse (not UTF-8 text, or JSON nested too deeply).
_UNPARSABLE_BODY = "There was an error parsing the body"


def _unparsable_body(cause: BaseException | None) -> str:
    """The sentence for a body FastAPI could not parse, by why (``cause``): JSON nested deeper than Python's
    decoder goes (about 1,000 levels), or bytes that are not UTF-8 text."""
    if isinstance(cause, RecursionError):
        return (
            "Bad request: the body's JSON is nested too deeply to read (about 1,000 levels or more); "
            "send an object of the documented fields."
        )
    return "Bad request: the body could not be read; send JSON encoded as UTF-8."


#: Most characters of a value sent by the client (a field name, a path, a model name) an error repeats.
ECHO_CHARS = 60
#: Most problems of one invalid body that an error answer lists.
MAX_PROBLEMS = 5


def shown(value: str) -> str:
    """``value`` as an error message repeats it: cut to :data:`ECHO_CHARS` characters, saying so."""
    if len(value) <= ECHO_CHARS:
        return value
    return f"{value[: ECHO_CHARS - 1]}… ({len(value)} characters)"


class ErrorAnswer(BaseModel):
    """The body of every error answer."""

    error: str


class RequestError(Exception):
    """A request the server refuses: ``status`` is the HTTP status, ``message`` one sentence."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def describe_validation(error: RequestValidationError) -> str:
    """One sentence naming each bad field (``text: String should have at least 1 character``), the first
    :data:`MAX_PROBLEMS` of them."""
    problems = error.errors()
    parts = []
    for problem in problems[:MAX_PROBLEMS]:
        location = [shown(str(part)) for part in problem.get("loc", ()) if part != "body"]
        message = str(problem.get("msg", "invalid"))
        if problem.get("type") == "json_invalid":
            message = f"the body is not valid JSON ({problem.get('ctx', {}).get('error', message)})"
            location = []
        parts.append(f"{'.'.join(location)}: {message}" if location else message)
    if len(problems) > MAX_PROBLEMS:
        parts.append(f"and {len(problems) - MAX_PROBLEMS} more problems")
    return "Bad request: " + "; ".join(parts) + "."


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure as JSON (see the module docstring)."""

    @app.exception_handler(RequestError)
    async def refused(_: Request, error: RequestError) -> JSONResponse:
        return error_response(error.status, error.message, error.headers)

    @app.exception_handler(LinkRefused)
    async def link_refused(_: Request, error: LinkRefused) -> JSONResponse:
        return error_response(
            403,
            f"'{shown(error.path)}' is a symbolic link; the server follows none, so nothing that leads "
            "outside the runs folder is read.",
        )

    @app.exception_handler(BertologyError)
    async def library_error(_: Request, error: BertologyError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(422, describe_validation(error))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        message = str(error.detail)
        if message == _UNPARSABLE_BODY:
            message = _unparsable_body(error.__cause__)
        return error_response(error.status_code, message, getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("Unexpected error answering %s %s", request.method, request.url.path)
        return error_response(500, f"Internal error ({type(error).__name__}); the server keeps running.")

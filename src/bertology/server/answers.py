"""What the routes of every area share: JSON answers serialised where they are made, and the OpenAPI
entries of their error answers."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel

from bertology.server.errors import ErrorAnswer

#: The OpenAPI entry of an HTML answer.
HTML_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {"schema": {"type": "string"}}}}
}
#: Statuses any route that reads a JSON body may answer.
BODY_ERRORS = {
    400: "The body could not be read as UTF-8 JSON.",
    413: "The request body is over the limit.",
}


def error_answers(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses: JSON :class:`ErrorAnswer` bodies, whatever the route's own
    content type."""
    schema = ErrorAnswer.model_json_schema()
    return {
        status: {"description": text, "content": {"application/json": {"schema": schema}}}
        for status, text in descriptions.items()
    }


def json_answer(answer: BaseModel) -> Response:
    """``answer`` as a JSON response, serialised where it is called (in the worker thread, so a large
    answer does not hold up the event loop)."""
    return Response(answer.model_dump_json(), media_type="application/json")

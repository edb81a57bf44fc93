"""A bounded fuzz of the JSON API from its own OpenAPI schema, as ``schemathesis run --checks all`` runs
it (every phase, every check, valid and invalid requests) over every operation, with a real analysis
folder and a real corpus index behind the explorer and search routes: no answer is a 5xx, every answer
matches the schema's status codes, content types, headers and bodies, and the schema says exactly what
the server takes.

Two allowances, checked rather than assumed: a schema-valid request that depends on the data (a span
or token beyond the input, more tokens than the server takes, a head beyond the analysis) may get the
422 the schema's descriptions promise, and any body over the byte limit 413; the test works out
independently, from the tokenizer, the analysis's grid and the bytes sent, that the request is beyond
the data or the limit before it lets one pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis import BaseSchema, GenerationMode
from schemathesis.engine import events, from_schema
from support.run_folders import write_analysis

from bertology.index.token_index import build_index
from bertology.models.loading import LoadedModel
from bertology.server import Limits, create_app
from bertology.server.schemas import MOST_HEADS

LIMITS = Limits(max_tokens=32, max_body_bytes=4096)
INDEXED_LAYERS = [1, 3, 5]
#: Examples per operation, phase and generation mode: the whole fuzz (about 2,000 requests) takes well
#: under a minute.
MAX_EXAMPLES = 150


@dataclass(frozen=True)
class Served:
    """The fuzzed app and what the test knows independently of it."""

    app: FastAPI
    model: LoadedModel


@pytest.fixture(scope="module")
def served(
    default_model: LoadedModel, sample_corpus_head: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    runs = tmp_path_factory.mktemp("fuzz_runs")
    write_analysis(sample_corpus_head(6), default_model, runs)  # the runs folder itself: run "" explores it
    (runs / "probe").mkdir()
    (runs / "probe" / "report.html").write_text("<!DOCTYPE html><title>probe</title>")
    # Short inputs keep each model call cheap; the limits themselves are part of what is fuzzed.
    index = build_index(
        sample_corpus_head(4), runs / "index", model=default_model, layers=INDEXED_LAYERS, threads=1
    )
    app = create_app([default_model], runs=runs, limits=LIMITS, index=index.folder)
    # One intra-op thread, as `bertology serve` gives each computation on a small machine: the fuzz's
    # tiny forward passes are slower with threads competing for two busy cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Served(app, default_model)
    torch.set_num_threads(threads)


def _tokens(model: LoadedModel, body: dict[str, Any], *, truncated: bool = False) -> int:
    """How many tokens the request's text (and text B) has, special tokens included; ``truncated``: as
    the search reads it, cut at the server's token limit."""
    if truncated:
        limit = min(LIMITS.max_tokens, model.max_length)
        return len(model.tokenizer(body["text"], truncation=True, max_length=limit)["input_ids"])
    return len(model.tokenizer(body["text"], body.get("text_b"), verbose=False)["input_ids"])


def _outside(span: list[int] | None, n: int) -> bool:
    return span is not None and not 0 <= span[0] < span[1] <= n


def beyond_the_data(model: LoadedModel, path: str, body: Any) -> bool:
    """Whether a schema-valid ``body`` for ``path`` asks for something the data does not have, worked out
    from the tokenizer and the analysis's grid (the 422 cases the schema's descriptions name)."""
    if not isinstance(body, dict):
        return False
    if path in ("/api/attention", "/api/statistics", "/api/view"):
        n = _tokens(model, body)
        return (
            n > LIMITS.max_tokens
            or _outside(body.get("rows"), n)
            or _outside(body.get("keys"), n)
            or body.get("query", 0) >= n
        )
    if path == "/api/search/input":
        return body.get("token") is not None and body["token"] >= _tokens(model, body, truncated=True)
    if path in ("/api/explore/head", "/api/explore/example"):
        return body["layer"] >= model.num_layers or body["head"] >= model.num_heads
    return False


def _explained(model: LoadedModel, check: str, case: schemathesis.Case, response: Any) -> bool:
    """Whether a failed ``check`` is a refusal the schema documents (module docstring): a body over the
    byte limit refused 413 before it is read (a rejection, though not in the status list of
    ``negative_data_rejection``), or a schema-valid request beyond the data refused 422."""
    if check not in ("positive_data_acceptance", "negative_data_rejection"):
        return False
    if response.status_code == 413:
        return len(response.request.body or b"") > LIMITS.max_body_bytes
    return (
        check == "positive_data_acceptance"
        and response.status_code == 422
        and beyond_the_data(model, case.path, case.body)
    )


def fuzz_failures(schema: BaseSchema, model: LoadedModel) -> list[str]:
    """Every failed check and engine error of a ``--checks all`` run over ``schema``, one line each."""
    failures = []
    for event in from_schema(schema).execute():
        if isinstance(event, events.NonFatalError):
            failures.append(f"engine error: {event.value}")
        if isinstance(event, events.FatalError):
            failures.append(f"engine error: {event.exception}")
        recorder = getattr(event, "recorder", None)
        if not isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished) or recorder is None:
            continue
        for case_id, checks in recorder.checks.items():
            for check in checks:
                if check.failure_info is None:
                    continue
                case = recorder.cases[case_id].value
                response = recorder.find_response(case_id=case_id)
                if response is not None and _explained(model, check.name, case, response):
                    continue
                status = None if response is None else response.status_code
                failures.append(
                    f"{check.name}: {case.operation.label} {json.dumps(case.body, default=str)[:300]} -> "
                    f"{status}: {check.failure_info.failure.title}"
                )
    return failures


@pytest.mark.slow
def test_api_passes_every_check_on_every_operation(served: Served) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", served.app)
    assert len([result.ok() for result in schema.get_all_operations()]) == 14
    schema.config.checks.update(included_check_names=["all"])
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=MAX_EXAMPLES,
        deterministic=True,
    )
    failures = fuzz_failures(schema, served.model)
    assert failures == []


def _body_schema(app: FastAPI, path: str) -> dict[str, Any]:
    openapi = app.openapi()
    reference = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return openapi["components"]["schemas"][reference["$ref"].rsplit("/", 1)[1]]


@pytest.mark.parametrize("path", ["/api/search/input", "/api/search/word", "/api/search/token"])
def test_search_schema_names_the_indexed_layers(served: Served, path: str) -> None:
    layer = _body_schema(served.app, path)["properties"]["layer"]
    assert layer["enum"] == INDEXED_LAYERS
    body = {"/api/search/input": {"text": "a cat"}, "/api/search/word": {"word": "the"}}.get(path, {"row": 0})
    client = TestClient(served.app)
    assert client.post(path, json={**body, "layer": 3}).status_code == 200
    refused = client.post(path, json={**body, "layer": 2})
    assert refused.status_code == 422 and "layer" in refused.json()["error"]


def test_search_schema_bounds_rows_and_tokens_by_the_index_and_the_limit(served: Served) -> None:
    client = TestClient(served.app)
    info = client.post("/api/search/info").json()
    row = _body_schema(served.app, "/api/search/token")["properties"]["row"]
    assert (row["minimum"], row["maximum"]) == (0, info["tokens"] - 1)
    token = _body_schema(served.app, "/api/search/input")["properties"]["token"]["anyOf"][0]
    assert token["maximum"] == LIMITS.max_tokens - 1
    last = client.post("/api/search/token", json={"row": info["tokens"] - 1, "layer": 1, "k": 1})
    assert last.status_code == 200 and last.json()["neighbours"][0]["row"] == info["tokens"] - 1
    assert client.post("/api/search/token", json={"row": info["tokens"], "layer": 1}).status_code == 422


def test_explorer_schema_bounds_layers_and_heads(served: Served) -> None:
    body = _body_schema(served.app, "/api/explore/head")["properties"]
    assert body["layer"]["maximum"] == body["head"]["maximum"] == MOST_HEADS - 1 == 1023
    client = TestClient(served.app)
    beyond = client.post("/api/explore/head", json={"run": "", "layer": 0, "head": MOST_HEADS - 1})
    assert beyond.status_code == 422 and "does not exist" in beyond.json()["error"]
    assert (
        client.post("/api/explore/head", json={"run": "", "layer": 0, "head": MOST_HEADS}).status_code == 422
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/attention", {"text": "The cat sat.", "layer": 2, "head": 3}),
        ("/api/explore/head", {"run": "", "layer": 2, "head": 3}),
        ("/api/search/token", {"row": 2, "layer": 3, "k": 2}),
    ],
)
def test_whole_numbers_written_with_a_point_are_integers(served: Served, path: str, body: dict) -> None:
    """JSON Schema counts 2.0 an integer: the server answers it exactly as it answers 2."""
    client = TestClient(served.app)
    exact = client.post(path, json=body)
    pointed = client.post(
        path, json={name: float(value) if isinstance(value, int) else value for name, value in body.items()}
    )
    assert exact.status_code == pointed.status_code == 200
    assert pointed.json() == exact.json()
    for bad in ("2", True, 2.5):
        refused = client.post(path, json={**body, "layer": bad})
        assert refused.status_code == 422 and "layer" in refused.json()["error"]


def test_the_fuzz_oracle_knows_what_is_beyond_the_data(served: Served) -> None:
    """The allowance above is narrow: it passes only requests that really are beyond the data."""
    model = served.model
    n = _tokens(model, {"text": "a b"})
    assert n == 4  # [CLS] a b [SEP]
    assert beyond_the_data(model, "/api/attention", {"text": "a b", "rows": [0, 5]})
    assert beyond_the_data(model, "/api/attention", {"text": "a b", "keys": [2, 2]})
    assert not beyond_the_data(model, "/api/attention", {"text": "a b", "rows": [0, 4], "layer": 9})
    assert beyond_the_data(model, "/api/view", {"text": "a b", "query": 4})
    assert not beyond_the_data(model, "/api/view", {"text": "a b", "query": 3})
    assert beyond_the_data(model, "/api/statistics", {"text": "a " * 40})
    assert beyond_the_data(model, "/api/explore/head", {"run": "", "layer": 6, "head": 0})
    assert not beyond_the_data(model, "/api/explore/head", {"run": "", "layer": 5, "head": 11})
    assert not beyond_the_data(model, "/api/search/word", {"word": "a", "layer": 2})

"""The web app's JSON API in-process (FastAPI TestClient): answers equal the library's, every bad request
gets a 4xx JSON error that says what is wrong, limits hold, and concurrent requests never mix.

Tolerances: the API's attention is the capture's float32 weights written as JSON with the digits a float32
needs: atol 6e-7 (about 10 units of 2^-24 on weights <= 1, the float32 to decimal round trip); statistics
against float64 ones computed here from the same weights, atol 1e-6 (entropies, with their logarithms, 1e-5;
the float64 table itself through JSON, 1e-9); rtol 1e-5 on a mean of float32 weights.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology import capture
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, load_model
from bertology.server import Limits, create_app
from bertology.server import compute as server_compute
from bertology.server.hosts import loopback_hosts
from bertology.stats.rows import SpecialTokens
from bertology.stats.surface import SurfaceAccumulator
from bertology.views import render_view

#: /api/attention rounds the same capture's float32 weights to ATTENTION_DECIMALS = 6 decimals: <= 5e-7.
ROUNDED_WEIGHTS = 6e-7
#: The server's statistics (float32 sums over a row and over the queries, n <= 16 tokens here) against the
#: float64 formulas on the same weights (<= 1): ~n u = 16 x 6e-8 ~ 1e-6 at most (seen 6e-8).
FLOAT32_STATISTICS = 1e-6

PAIR = {"text": "I went to the store.", "text_b": "At the store, I bought fresh strawberries."}


@pytest.fixture(scope="module")
def client(default_model: LoadedModel) -> Iterator[TestClient]:
    with TestClient(create_app([default_model])) as test_client:
        yield test_client


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]


# --- Answers ------------------------------------------------------------------------------------------


def test_health_and_models(client: TestClient) -> None:
    assert client.get("/api/health").json() == {"status": "ok", "models": ["all-MiniLM-L6-v2"]}
    answer = client.get("/api/models").json()
    assert answer == {
        "default": "all-MiniLM-L6-v2",
        "models": [
            {"name": "all-MiniLM-L6-v2", "model_type": "bert", "layers": 6, "heads": 12, "max_tokens": 512}
        ],
    }


def test_attention_equals_capture(client: TestClient, default_model: LoadedModel) -> None:
    expected = capture(PAIR["text"], PAIR["text_b"], model=default_model)
    answer = client.post("/api/attention", json=PAIR).json()
    assert answer["tokens"] == expected.tokens
    assert answer["segments"] == expected.segment_ids.tolist()
    assert answer["layers"] == list(range(6)) and answer["heads"] == list(range(12))
    np.testing.assert_allclose(np.array(answer["attention"]), expected.probs, atol=ROUNDED_WEIGHTS)

    one = client.post("/api/attention", json={**PAIR, "layer": 4, "head": 7}).json()
    assert (one["layers"], one["heads"]) == ([4], [7])
    np.testing.assert_allclose(np.array(one["attention"])[0, 0], expected.probs[4, 7], atol=ROUNDED_WEIGHTS)


def test_norm_based_weights_through_every_endpoint(client: TestClient, default_model: LoadedModel) -> None:
    expected = capture(PAIR["text"], PAIR["text_b"], model=default_model, weights="norm")
    answer = client.post("/api/attention", json={**PAIR, "weights": "norm"}).json()
    np.testing.assert_allclose(np.array(answer["attention"]), expected.probs, atol=ROUNDED_WEIGHTS)
    statistics = client.post("/api/statistics", json={**PAIR, "weights": "norm"}).json()
    plain = client.post("/api/statistics", json=PAIR).json()
    # float32 sums as for FLOAT32_STATISTICS, relative here: 1e-5 leaves a margin (seen 2e-7).
    np.testing.assert_allclose(
        np.array(statistics["surface"]["cls"]), expected.probs[..., 0].mean(-1), rtol=1e-5
    )
    assert statistics["surface"]["cls"] != plain["surface"]["cls"]
    page = client.post("/api/view", json={**PAIR, "view": "model", "weights": "norm"})
    assert page.status_code == 200 and "norm-based weights" in page.text
    neuron = client.post("/api/view", json={**PAIR, "view": "neuron", "weights": "norm"})
    assert neuron.status_code == 200 and '"valueNorms":' in neuron.text
    assert "weights" in error_of(client.post("/api/attention", json={**PAIR, "weights": "value"}), 422)


def test_statistics_follow_their_formulas(client: TestClient, default_model: LoadedModel) -> None:
    text = "The cat sat on the mat, and the dog sat on the log."
    probs = capture(text, model=default_model).probs.astype(np.float64)  # [layers, heads, n, n]
    answer = client.post("/api/statistics", json={"text": text}).json()
    n = probs.shape[-1]
    surface = {name: np.array(values, dtype=float) for name, values in answer["surface"].items()}
    # Clark et al.: attention to the previous token, averaged over queries 1..n-1; to [CLS] (position 0).
    np.testing.assert_allclose(
        surface["previous"], probs[..., np.arange(1, n), np.arange(n - 1)].mean(-1), atol=FLOAT32_STATISTICS
    )
    np.testing.assert_allclose(surface["cls"], probs[..., :, 0].mean(-1), atol=FLOAT32_STATISTICS)
    entropy = -(probs * np.log(np.where(probs > 0, probs, 1))).sum(-1).mean(-1)
    # float32 logs too, and entropies up to ln 16 ~ 2.8: ~n u H ~ 3e-6 (seen 3e-7).
    np.testing.assert_allclose(surface["entropy"], entropy, atol=1e-5)
    assert np.array(answer["labels"]).shape == (6, 12)
    # A single text has no other sentence: that pattern is undefined (null), not 0.
    assert all(value is None for row in answer["patterns"]["other_sentence"] for value in row)


def test_statistics_match_the_corpus_accumulator(client: TestClient, default_model: LoadedModel) -> None:
    from bertology import capture_batch

    accumulator = SurfaceAccumulator(SpecialTokens.of(default_model))
    accumulator.update(capture_batch([PAIR["text"]], [PAIR["text_b"]], model=default_model))
    answer = client.post("/api/statistics", json=PAIR).json()
    assert answer["tokens"] == capture(PAIR["text"], PAIR["text_b"], model=default_model).tokens
    columns = accumulator.result().columns
    assert np.isnan(columns["sink"]).all()  # a decoder's statistic: not offered for this encoder
    assert set(answer["surface"]) == set(columns) - {"sink"} == set(answer["descriptions"]["surface"])
    for name, values in columns.items():
        if name != "sink":
            # Exact by construction (the same accumulator on the same batch, JSON keeps float64); seen 0.
            np.testing.assert_allclose(np.array(answer["surface"][name], dtype=float), values, atol=1e-9)
    descriptions = answer["descriptions"]["patterns"]
    word_pieces = "score of the label word_pieces (other word pieces of the same word)"
    assert descriptions["word_pieces"] == word_pieces
    assert descriptions["next"] == "score of the label next (next word)"


@pytest.mark.parametrize(("kind", "layer", "head"), [("head", 2, 0), ("model", 0, 0), ("neuron", 3, 5)])
def test_view_is_the_page_bertology_view_writes(
    client: TestClient, default_model: LoadedModel, kind: str, layer: int, head: int
) -> None:
    response = client.post("/api/view", json={**PAIR, "view": kind, "layer": layer, "head": head})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    page = render_view(PAIR["text"], PAIR["text_b"], kind=kind, model=default_model, layer=layer, head=head)
    assert response.text == page.html


def test_page_has_a_strict_policy_that_admits_only_the_view_code(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert (
        "default-src 'none'" in policy and "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    )
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in response.text and "<style>" not in response.text  # nothing inline of its own
    view = client.post("/api/view", json={"text": "Hello there."}).text
    inline = re.search(r"<script>(.*?)</script>", view, re.DOTALL)
    assert inline is not None
    digest = base64.b64encode(hashlib.sha256(inline.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy.split("script-src")[1].split(";")[0]
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")


def test_openapi_schema_lists_the_api(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/api/models", "/api/attention", "/api/statistics", "/api/view", "/api/runs"} <= set(
        schema["paths"]
    )
    errors = schema["paths"]["/api/attention"]["post"]["responses"]
    assert {"413", "422", "503"} <= set(errors)


def test_schema_says_the_limits(client: TestClient) -> None:
    """What the schema allows is what the server accepts: model names, layers, heads, query tokens."""
    bodies = client.get("/openapi.json").json()["components"]["schemas"]

    def of_type(body: str, field: str, kind: str) -> dict[str, Any]:
        spec = bodies[body]["properties"][field]
        (typed,) = [option for option in spec.get("anyOf", [spec]) if option.get("type") == kind]
        return typed

    def bounds(body: str, field: str) -> tuple[float, float]:
        number = of_type(body, field, "integer")
        return number["minimum"], number["maximum"]

    assert bounds("AttentionRequest", "layer") == (0, 5) and bounds("AttentionRequest", "head") == (0, 11)
    assert bounds("ViewRequest", "layer") == (0, 5) and bounds("ViewRequest", "query") == (0, 511)
    for body in ("InputRequest", "AttentionRequest", "ViewRequest"):
        names = of_type(body, "model", "string")
        assert names.get("enum", [names.get("const")]) == ["all-MiniLM-L6-v2"]
        assert bodies[body]["properties"]["text"]["minLength"] == 1


def test_a_smaller_model_refuses_what_it_does_not_have(
    default_model: LoadedModel, tiny_model_dirs: dict[str, Path]
) -> None:
    """With two models the schema allows the larger one's layers; the smaller one says what it has."""
    tiny = load_model(tiny_model_dirs["bert"])  # 3 layers, 4 heads
    with TestClient(create_app([default_model, tiny])) as both:
        body = {"text": "a b", "model": tiny.name, "layer": 5}
        assert "Layer 5 does not exist; there are 3" in error_of(both.post("/api/attention", json=body), 422)
        assert both.post("/api/attention", json={**body, "model": default_model.name}).status_code == 200


def test_error_messages_echo_little_of_the_input(default_model: LoadedModel, tmp_path: Path) -> None:
    with TestClient(create_app([default_model], runs=tmp_path)) as small:
        body = {"text": "a", **{f"{index}{'k' * 1000}": 1 for index in range(50)}}
        message = error_of(small.post("/api/statistics", json=body), 422)
        assert len(message) < 600 and "(1001 characters)" in message and "and 45 more problems" in message
        message = error_of(small.get("/runs/" + "p" * 5000), 404)
        assert len(message) < 200 and "(5000 characters)" in message


def test_only_its_own_host_names_are_answered(default_model: LoadedModel) -> None:
    """Against DNS rebinding: a loopback server answers only to its own names and port."""
    app = create_app([default_model], hosts=loopback_hosts(8123))
    for host, status in [("127.0.0.1:8123", 200), ("localhost:8123", 200), ("[::1]:8123", 200),
                         ("LOCALHOST:8123", 200), ("attacker.example:8123", 400), ("localhost:8124", 400),
                         ("127.0.0.1", 400), ("x" * 300, 400)]:  # fmt: skip
        with TestClient(app, base_url=f"http://{host}") as http:
            response = http.get("/api/health")
            assert response.status_code == status, host
            if status == 400:
                assert "is not this server's" in response.json()["error"]
                assert len(response.json()["error"]) < 200
    assert loopback_hosts(80) >= {"localhost", "127.0.0.1", "[::1]", "localhost:80"}


# --- Bad requests -------------------------------------------------------------------------------------

TOO_LONG = "word " * 600

BAD_BODIES: list[tuple[str, dict[str, Any], str]] = [
    ("/api/attention", {}, "text: Field required"),
    ("/api/attention", {"text": ""}, "text: String should have at least 1 character"),
    ("/api/attention", {"text": "   "}, "empty or only whitespace"),
    ("/api/attention", {"text": 5}, "text: Input should be a valid string"),
    ("/api/attention", {"text": "a", "text_b": ""}, "text_b: String should have at least 1 character"),
    ("/api/attention", {"text": "a", "colour": "red"}, "colour: Extra inputs are not permitted"),
    ("/api/attention", {"text": "a", "model": "bert-large"}, "model: Input should be 'all-MiniLM-L6-v2'"),
    ("/api/statistics", {"text": "a", "model": ""}, "model: Input should be 'all-MiniLM-L6-v2'"),
    ("/api/attention", {"text": "a", "layer": 6}, "layer: Input should be less than or equal to 5"),
    ("/api/attention", {"text": "a", "head": 12}, "head: Input should be less than or equal to 11"),
    ("/api/attention", {"text": "a", "layer": -1}, "layer: Input should be greater than or equal to 0"),
    ("/api/attention", {"text": "a", "layer": 1.5}, "layer: Input should be a valid integer"),
    # Strict types: no JSON value is converted into another type.
    ("/api/attention", {"text": "a", "head": False}, "head: Input should be a valid integer"),
    ("/api/attention", {"text": "a", "layer": "1"}, "layer: Input should be a valid integer"),
    ("/api/view", {"text": "a", "query": True}, "query: Input should be a valid integer"),
    ("/api/view", {"text": "a", "query": 512}, "query: Input should be less than or equal to 511"),
    ("/api/attention", {"text": TOO_LONG}, "The input has 602 tokens; at most 512 are accepted"),
    ("/api/statistics", {"text": TOO_LONG[:1000], "text_b": TOO_LONG}, "at most 512 are accepted"),
    ("/api/statistics", {"text": "\t\n"}, "empty or only whitespace"),
    ("/api/view", {"text": "a", "view": "graph"}, "view: Input should be 'head', 'model' or 'neuron'"),
    ("/api/view", {"text": "a", "theme": "sepia"}, "theme: Input should be 'light' or 'dark'"),
    ("/api/view", {"text": "a", "layer": 10**30}, "layer: Input should be less than or equal to 5"),
    ("/api/view", {"text": "a b", "view": "neuron", "query": 4}, "Query token 4 does not exist"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_BODIES)
def test_bad_requests_say_what_is_wrong(
    client: TestClient, path: str, body: dict[str, Any], message: str
) -> None:
    assert message in error_of(client.post(path, json=body), 422)


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b"{not json", 422, "the body is not valid JSON"),
        (b"[1, 2]", 422, "valid dictionary"),
        (b"null", 422, "valid dictionary"),
        (b'{"text": "\\ud800 lone surrogate"}', 422, "text: Input should be a valid string"),
        (b"\xff\xfe", 422, "not valid JSON"),
        (b'{"text": "\xff\xff"}', 400, "the body could not be read; send JSON encoded as UTF-8"),
        (b'{"a": ' * 1000 + b"1" + b"}" * 1000, 400, "the body's JSON is nested too deeply to read"),
        (b"[" * 30_000 + b"]" * 30_000, 400, "the body's JSON is nested too deeply to read"),
    ],
)
def test_malformed_bodies_are_refused(client: TestClient, raw: bytes, status: int, message: str) -> None:
    response = client.post("/api/statistics", content=raw, headers={"content-type": "application/json"})
    assert message in error_of(response, status)


def test_unknown_routes_and_methods_are_json(client: TestClient) -> None:
    assert error_of(client.get("/api/nothing"), 404) == "Not Found"
    assert error_of(client.get("/api/attention"), 405) == "Method Not Allowed"
    assert "no runs folder" in error_of(client.get("/runs/report.html"), 404)


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    big = b'{"text": "' + b"a" * 70_000 + b'"}'
    message = error_of(
        client.post("/api/attention", content=big, headers={"content-type": "application/json"}), 413
    )
    assert message == "The request body is 70012 bytes; this server accepts at most 65536 bytes."
    # A chunked body announces no length: it is counted as it arrives.
    chunks = iter([b'{"text": "', b"a" * 40_000, b"a" * 40_000, b'"}'])
    response = client.post("/api/attention", content=chunks, headers={"content-type": "application/json"})
    assert "over 65536 bytes" in error_of(response, 413)
    assert client.get("/api/health").status_code == 200


def test_limits_must_be_positive() -> None:
    with pytest.raises(BertologyError, match="max_tokens must be positive"):
        Limits(max_tokens=0)


def test_server_token_limit_and_attention_size_limit(default_model: LoadedModel) -> None:
    with TestClient(
        create_app([default_model], limits=Limits(max_tokens=8, max_attention_values=1000))
    ) as small:
        assert small.get("/api/models").json()["models"][0]["max_tokens"] == 8
        message = error_of(small.post("/api/view", json={"text": "one two three four five six seven"}), 422)
        assert message == "The input has 9 tokens; at most 8 are accepted per input with 'all-MiniLM-L6-v2'."
        message = error_of(small.post("/api/attention", json={"text": "one two three"}), 422)
        assert message.startswith("That is 1800 attention values (6 layers x 12 heads x 5 x 5 tokens)")
        assert "ask for one layer or one head" in message
        assert small.post("/api/attention", json={"text": "one two three", "layer": 0}).status_code == 200


def test_timeout_is_503_and_the_server_keeps_going(default_model: LoadedModel) -> None:
    app = create_app([default_model], limits=Limits(timeout_s=0.005, parallel=1))
    with TestClient(app) as slow:
        response = slow.post("/api/statistics", json={"text": "a long input " * 100})
        assert "longer than the server's limit of 0.005 s" in error_of(response, 503)
        assert response.headers["retry-after"] == "5"
        assert slow.get("/api/health").status_code == 200


def test_unexpected_failure_is_a_json_500_not_a_crash(
    default_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(server_compute, "statistics_answer", broken)
    with TestClient(create_app([default_model]), raise_server_exceptions=False) as fragile:
        assert "Internal error (RuntimeError)" in error_of(fragile.post("/api/statistics", json=PAIR), 500)
        assert fragile.post("/api/attention", json={**PAIR, "layer": 0}).status_code == 200


# --- Concurrency --------------------------------------------------------------------------------------

SENTENCES = [
    "The cat sat on the mat.",
    "Colourless green ideas sleep furiously.",
    "She sells sea shells by the sea shore.",
    "A stitch in time saves nine.",
    "Time flies like an arrow; fruit flies like a banana.",
    "The quick brown fox jumps over the lazy dog.",
    "To be or not to be, that is the question.",
    "All that glitters is not gold.",
]


def test_concurrent_requests_get_their_own_answers(default_model: LoadedModel) -> None:
    app = create_app([default_model], limits=Limits(parallel=3))
    expected = {text: capture(text, model=default_model) for text in SENTENCES}

    async def ask_all() -> list[tuple[str, httpx.Response]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            requests = [
                (text, path) for text in SENTENCES * 2 for path in ("/api/attention", "/api/statistics")
            ]
            answers = await asyncio.gather(
                *(
                    http.post(
                        path, json={"text": text, "layer": 1} if path == "/api/attention" else {"text": text}
                    )
                    for text, path in requests
                )
            )
        return [(text, answer) for (text, _), answer in zip(requests, answers, strict=True)]

    # Its own thread: the session's Playwright browser (sync API) keeps an event loop running in this one.
    with ThreadPoolExecutor(max_workers=1) as runner:
        answers = runner.submit(asyncio.run, ask_all()).result(timeout=600)  # a guard against a deadlock
    for text, response in answers:
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["tokens"] == expected[text].tokens
        if "attention" in body:
            np.testing.assert_allclose(
                np.array(body["attention"])[0], expected[text].probs[1], atol=ROUNDED_WEIGHTS
            )


def _in_own_loop(scenario: Callable[[], Any]) -> Any:
    """Run the coroutine function ``scenario`` in a fresh event loop of its own thread (the session's
    Playwright browser keeps an event loop running in this one)."""
    with ThreadPoolExecutor(max_workers=1) as runner:
        return runner.submit(asyncio.run, scenario()).result()


@pytest.fixture
def blocked_statistics(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """``/api/statistics`` computations wait for the returned event; the list gets each computed text."""
    release, computed = threading.Event(), []
    real = server_compute.statistics_answer

    def blocked(loaded: LoadedModel, request: Any, **kwargs: Any) -> dict[str, Any]:
        computed.append(request.text)
        release.wait(60)
        return real(loaded, request, **kwargs)

    monkeypatch.setattr(server_compute, "statistics_answer", blocked)
    return release, computed


def test_health_answers_at_once_while_every_slot_is_busy(
    default_model: LoadedModel, blocked_statistics: tuple[threading.Event, list[str]]
) -> None:
    """45 model requests hold the only slot or wait for it (more than the 40 threads of the worker pool):
    waiting holds no thread, so /api/health and the page answer while the slot is still held and every
    model request still waits (checked by state, not by a time: the slot is held until the test lets go).
    The 45 then answer in turn, within a timeout that holds on a loaded machine."""
    release, computed = blocked_statistics
    app = create_app([default_model], limits=Limits(parallel=1, timeout_s=600))

    async def scenario() -> tuple[list[int], list[int], int, list[int]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=600) as http:
            waiting = [
                asyncio.create_task(http.post("/api/statistics", json={"text": f"text {index}"}))
                for index in range(45)
            ]
            try:
                while not computed:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)  # the others queue
                health = await asyncio.wait_for(http.get("/api/health"), 50)
                page = await asyncio.wait_for(http.get("/"), 50)
                answered_while_held = [health.status_code, page.status_code]
                done_while_held = [index for index, task in enumerate(waiting) if task.done()]
                computing_while_held = len(computed)
            finally:
                release.set()
            answers = await asyncio.gather(*waiting)
        statuses = [answer.status_code for answer in answers]
        return answered_while_held, done_while_held, computing_while_held, statuses

    answered, done, computing, statuses = _in_own_loop(scenario)
    assert answered == [200, 200]
    assert done == [] and computing == 1  # the slot was still held: nothing else had been answered
    assert statuses == [200] * 45


def _post_then_leave(app: Any, body: dict[str, Any], gone: asyncio.Event) -> Any:
    """A raw ASGI POST /api/statistics whose client disconnects when ``gone`` is set; returns its status."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/api/statistics", "raw_path": b"/api/statistics", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 5000), "server": ("test", 80),
        "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
    }  # fmt: skip
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def call() -> int:
        await app(scope, receive, send)
        return int(sent[0]["status"])

    return call()


def test_requests_of_clients_that_left_are_not_computed(
    default_model: LoadedModel, blocked_statistics: tuple[threading.Event, list[str]]
) -> None:
    """Five clients queue behind a busy slot and disconnect: they stop waiting while the slot is still
    busy, and once it is free nothing is computed for them."""
    release, computed = blocked_statistics
    app = create_app([default_model], limits=Limits(parallel=1))

    async def scenario() -> tuple[int, list[int]]:
        stays, leave = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(_post_then_leave(app, {"text": "stays"}, stays))
        while not computed:
            await asyncio.sleep(0.01)
        leaving = [
            asyncio.create_task(_post_then_leave(app, {"text": f"leaves {index}"}, leave))
            for index in range(5)
        ]
        await asyncio.sleep(0.3)  # they queue (were one not queued yet, it would leave the sooner)
        leave.set()
        try:
            # The slot stays busy until release: a request that waited for it could not be done here.
            # (120 s: a guard against a hang, not a measure of speed.)
            done, _ = await asyncio.wait(leaving, timeout=120)
        finally:
            release.set()
        statuses = [task.result() for task in done]
        await asyncio.gather(*leaving)
        # All five ended before the slot was free, so none can take it now: only "stays" is computed.
        return await first, statuses

    status, statuses = _in_own_loop(scenario)
    assert status == 200
    assert len(statuses) == 5  # they left while the slot was still busy
    assert computed == ["stays"]

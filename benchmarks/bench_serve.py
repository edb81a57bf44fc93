"""Load test of `bertology serve`: a bounded burst of mixed valid and invalid requests from this process
to a server in another process on loopback.

The server is started as ``python -m bertology serve --port 0 --runs DIR`` (default limits: 2
computations at once per model, 512 tokens, 64 KiB bodies, 30 s timeout). Every answer is checked:
valid requests must give the same tokens and attention as ``bertology.capture`` in this process (or a
complete view page / statistics table), invalid ones their 4xx JSON error. Afterwards the server must
still be healthy. Prints p50 / p95 latency and requests per second, overall and per kind of request.

Then health under load: ``--load-clients`` clients (default 200) each send ``/api/statistics`` requests
one after another for ``--load-seconds`` (default 10), so every computation slot is busy and the rest
queue, while a separate process asks ``/api/health`` every 100 ms, each time on a new connection;
prints the health latency (p50, p95, max; the target: p95 under 50 ms), the model requests answered and
the connections dropped (refused, reset or timed out; the target: none). It stops by itself: the clients send
no new request after the time is up and each request has the server's 30 s timeout.

Run: ``.venv/bin/python benchmarks/bench_serve.py [--requests 300] [--concurrency 8] [--model default]
[--load-clients 200] [--load-seconds 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

import bertology

SENTENCES = [
    "The cat sat on the mat because it was warm.",
    "I went to the store. At the store, I bought fresh strawberries.",
    "Colourless green ideas sleep furiously.",
    "Time flies like an arrow; fruit flies like a banana.",
    "The committee said that it would publish its findings next week.",
    "Researchers measured how much each head attends to punctuation.",
    "She sells sea shells by the sea shore, or so they say.",
    "A stitch in time saves nine, and a penny saved is a penny earned.",
]

Check = Callable[[httpx.Response], None]


@dataclass
class Request:
    kind: str
    method: str
    path: str
    check: Check
    body: bytes | None = None


def expect_error(status: int, fragment: str) -> Check:
    def check(response: httpx.Response) -> None:
        assert response.status_code == status, (response.status_code, response.text[:200])
        assert fragment in response.json()["error"], response.text[:200]

    return check


def build_requests(count: int, seed: int, model: bertology.LoadedModel) -> list[Request]:
    """``count`` requests, about 60% valid (attention, statistics, views, listing) and 40% invalid."""
    expected = {text: bertology.capture(text, model=model) for text in SENTENCES}

    def attention(text: str, layer: int) -> Request:
        def check(response: httpx.Response) -> None:
            assert response.status_code == 200, response.text[:200]
            answer = response.json()
            assert answer["tokens"] == expected[text].tokens
            # 1e-5: another thread count sums in another order (~1e-6); a mixed-up answer is off by ~0.1.
            np.testing.assert_allclose(
                np.array(answer["attention"])[0], expected[text].probs[layer], atol=1e-5
            )

        body = {"text": text, "layer": layer}
        return Request("attention", "POST", "/api/attention", check, json.dumps(body).encode())

    def statistics(text: str) -> Request:
        def check(response: httpx.Response) -> None:
            assert response.status_code == 200, response.text[:200]
            answer = response.json()
            assert answer["tokens"] == expected[text].tokens
            assert np.array(answer["labels"]).shape == (model.num_layers, model.num_heads)

        return Request("statistics", "POST", "/api/statistics", check, json.dumps({"text": text}).encode())

    def view(text: str, kind: str) -> Request:
        def check(response: httpx.Response) -> None:
            assert response.status_code == 200, response.text[:200]
            assert response.headers["content-type"].startswith("text/html")
            assert response.text.count('id="bertology-data"') == 1

        body = json.dumps({"text": text, "view": kind}).encode()
        return Request(f"view ({kind})", "POST", "/api/view", check, body)

    def models_list(response: httpx.Response) -> None:
        assert response.json()["default"] == model.name

    invalid = [
        Request("bad JSON", "POST", "/api/attention", expect_error(422, "not valid JSON"), b"{text"),
        Request(
            "unknown model",
            "POST",
            "/api/statistics",
            expect_error(422, "model: Input should be"),
            b'{"text": "hi", "model": "gpt-9"}',
        ),
        Request(
            "too many tokens",
            "POST",
            "/api/attention",
            expect_error(422, "The input has 1202 tokens; at most 512"),
            json.dumps({"text": "word " * 1200}).encode(),
        ),
        Request(
            "empty text", "POST", "/api/view", expect_error(422, "at least 1 character"), b'{"text": ""}'
        ),
        Request(
            "body too large",
            "POST",
            "/api/attention",
            expect_error(413, "at most 65536 bytes"),
            b'{"text": "' + b"a" * 70_000 + b'"}',
        ),
        Request("path traversal", "GET", "/runs/%2e%2e/%2e%2e/etc/passwd", expect_error(403, "refused")),
    ]
    chooser = random.Random(seed)
    requests = []
    for _ in range(count):
        text = chooser.choice(SENTENCES)
        roll = chooser.random()
        if roll < 0.2:
            requests.append(attention(text, chooser.randrange(model.num_layers)))
        elif roll < 0.35:
            requests.append(statistics(text))
        elif roll < 0.5:
            requests.append(view(text, chooser.choice(["head", "model", "neuron"])))
        elif roll < 0.6:
            requests.append(Request("models", "GET", "/api/models", models_list))
        else:
            requests.append(chooser.choice(invalid))
    return requests


def start_server(model: str, runs: Path) -> tuple[subprocess.Popen[str], str]:
    command = [
        sys.executable,
        "-m",
        "bertology",
        "serve",
        "--model",
        model,
        "--port",
        "0",
        "--runs",
        str(runs),
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline() if server.stdout else ""
    if "listening on " not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    print(line.strip())
    return server, line.split("listening on ")[1].split()[0]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


# The health probe: its own process (so the load clients' event loop does not delay its timing), one
# HTTP/1.1 connection per request as a new visitor opens it; asks /api/health every 100 ms for argv[2]
# seconds and prints the latencies (s) as JSON, None for a connection refused, reset or timed out.
_PROBE = """
import http.client, json, sys, time
host, port = sys.argv[1].removeprefix("http://").rsplit(":", 1)
stop, latencies = time.perf_counter() + float(sys.argv[2]), []
while time.perf_counter() < stop:
    started = time.perf_counter()
    try:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", "/api/health")
        response = connection.getresponse()
        ok = response.status == 200 and b'"ok"' in response.read()
        connection.close()
        latencies.append(time.perf_counter() - started if ok else None)
    except OSError:
        latencies.append(None)
    time.sleep(0.1)
print(json.dumps(latencies))
"""


async def health_under_load(
    url: str, clients: int, seconds: float
) -> tuple[list[float | None], Counter[int | str]]:
    """Health latencies (s; ``None``: no answer) while ``clients`` clients, each on its own connection,
    keep every model slot busy for ``seconds``, and the model requests' answers by status (``"dropped"``:
    a connection refused, reset or timed out)."""
    statuses: Counter[int | str] = Counter()
    pool = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=pool) as load:
        stop = time.perf_counter() + seconds

        async def client(index: int) -> None:
            text = SENTENCES[index % len(SENTENCES)]
            while time.perf_counter() < stop:
                try:
                    statuses[(await load.post("/api/statistics", json={"text": text})).status_code] += 1
                except httpx.TransportError:
                    statuses["dropped"] += 1

        tasks = [asyncio.create_task(client(index)) for index in range(clients)]
        await asyncio.sleep(min(2.0, seconds / 4))  # every client has sent its first request
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PROBE, url, str(stop - time.perf_counter()), stdout=subprocess.PIPE
        )
        output, _ = await probe.communicate()
        await asyncio.gather(*tasks)
    return json.loads(output), statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-clients", type=int, default=200, help="0: no health-under-load phase")
    parser.add_argument("--load-seconds", type=float, default=10.0)
    args = parser.parse_args()

    model = bertology.load_model(args.model)
    requests = build_requests(args.requests, args.seed, model)
    with tempfile.TemporaryDirectory() as runs:
        server, url = start_server(args.model, Path(runs))
        try:
            with httpx.Client(
                base_url=url, timeout=120, limits=httpx.Limits(max_connections=args.concurrency)
            ) as http:

                def send(request: Request) -> tuple[str, float, str | None]:
                    started = time.perf_counter()
                    response = http.request(
                        request.method,
                        request.path,
                        content=request.body,
                        headers={"content-type": "application/json"} if request.body is not None else None,
                    )
                    elapsed = time.perf_counter() - started
                    try:
                        request.check(response)
                    except AssertionError as problem:
                        return request.kind, elapsed, f"{request.kind}: {problem}"
                    return request.kind, elapsed, None

                started = time.perf_counter()
                with ThreadPoolExecutor(args.concurrency) as pool:
                    results = list(pool.map(send, requests))
                wall = time.perf_counter() - started
                healthy = http.get("/api/health").json() == {"status": "ok", "models": [model.name]}
                after = send(build_requests(1, args.seed, model)[0])[2] is None
            if args.load_clients:
                health, statuses = asyncio.run(health_under_load(url, args.load_clients, args.load_seconds))
        finally:
            alive = server.poll() is None
            server.terminate()
            server.wait(30)

    wrong = [problem for _, _, problem in results if problem]
    latencies = [elapsed for _, elapsed, _ in results]
    errors = sum(1 for request in requests if request.kind not in {"attention", "statistics", "models"}
                 and not request.kind.startswith("view"))  # fmt: skip
    rate = len(results) / wall
    print(f"{len(results)} requests at concurrency {args.concurrency} in {wall:.1f} s: {rate:.1f} req/s")
    print(f"latency p50 {percentile(latencies, 50):.0f} ms, p95 {percentile(latencies, 95):.0f} ms")
    print(f"invalid requests (answered 4xx as expected): {errors}; wrong answers: {len(wrong)}")
    print(f"server alive afterwards: {alive}, healthy: {healthy}, answers correctly: {after}")
    print("\n| request | count | p50 ms | p95 ms |\n|---|---|---|---|")
    for kind in sorted({kind for kind, _, _ in results}):
        times = [elapsed for name, elapsed, _ in results if name == kind]
        print(f"| {kind} | {len(times)} | {percentile(times, 50):.0f} | {percentile(times, 95):.0f} |")
    if args.load_clients:
        answered = sum(count for status, count in statuses.items() if status != "dropped")
        timed = [latency for latency in health if latency is not None]
        print(
            f"\nhealth under load ({args.load_clients} clients keeping the model busy for "
            f"{args.load_seconds:g} s): {len(health)} health requests, p50 {percentile(timed, 50):.1f} ms, "
            f"p95 {percentile(timed, 95):.1f} ms, max {max(timed) * 1000:.1f} ms, unanswered "
            f"{len(health) - len(timed)}; model requests answered: {answered} "
            f"({answered / args.load_seconds:.1f} per s), by status {dict(statuses.most_common())}; "
            f"dropped connections: {statuses['dropped']}"
        )
    for problem in wrong[:10]:
        print("WRONG:", problem)
    lost = args.load_clients and (statuses["dropped"] or None in health)
    if wrong or lost or not (alive and healthy and after):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

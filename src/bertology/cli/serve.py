"""``bertology serve``: the local web app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import app, out
from bertology.cli.options import DeviceOption, DtypeOption, positive_finite
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
)


@app.command()
def serve(
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="A model to serve; repeat for more, the first is the default."),
    ] = None,
    runs: Annotated[
        Path | None,
        typer.Option(
            "--runs",
            help="Folder of reports and training runs to browse (its fine-tuned runs become models too).",
        ),
    ] = None,
    corpus_index: Annotated[
        Path | None,
        typer.Option("--index", help="A corpus index folder (`bertology index`) for corpus search."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; any but 127.0.0.1 opens it to others.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 8000,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Most tokens per input.")] = 512,
    max_body: Annotated[
        int, typer.Option("--max-body", min=1, help="Largest request body, in bytes.")
    ] = 65536,
    timeout: Annotated[
        float,
        typer.Option("--timeout", callback=positive_finite, help="Seconds a request may take (above 0)."),
    ] = 30.0,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="Computations at once per model.")] = 2,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """A local web app: type a text, see its views and per-head statistics; browse RUNS; a JSON API."""
    import torch

    from bertology.server import Limits
    from bertology.server import serve as serve_app
    from bertology.server.serve import computation_threads

    limits = Limits(max_tokens=max_tokens, max_body_bytes=max_body, timeout_s=timeout, parallel=parallel)
    torch.set_num_threads(computation_threads(parallel))  # this process is the server's own
    serve_app(
        model or ["default"],
        runs,
        host=host,
        port=port,
        limits=limits,
        announce=lambda line: out.print(line, highlight=False, markup=False),
        device=device,
        dtype=dtype,
        index=corpus_index,
    )

"""``bertology view``, ``relevance`` and ``models``: one input's attention, and what can be loaded."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich import box
from rich.table import Table

from bertology.cli.app import app, out, say_model_note
from bertology.cli.options import (
    DeviceOption,
    DtypeOption,
    ModelOption,
    TextArgument,
    TextBArgument,
    WeightsOption,
    utf8_text,
)
from bertology.cli.progress import progress_bar
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    FLOW_MAX_TOKENS,
    AttentionSetName,
    Theme,
    ViewKind,
)


@app.command()
def view(
    text: TextArgument,
    text_b: TextBArgument = None,
    model: ModelOption = "default",
    kind: Annotated[ViewKind, typer.Option("--view", "-v", help="head, model or neuron.")] = "head",
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer shown first (0-based).")] = 0,
    head: Annotated[int, typer.Option("--head", help="Head shown first in the neuron view (0-based).")] = 0,
    query: Annotated[
        int | None,
        typer.Option(
            "--query",
            help="Query token of the neuron view; a long input's window is centred on it (0-based; default: "
            "the last token for a decoder, whose first query sees only itself, else the first).",
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            help="Most tokens read (default: the model's own limit; over 1,024 the long-input views).",
        ),
    ] = None,
    theme: Annotated[
        Theme | None,
        typer.Option(
            help="light or dark (default: dark for the model and neuron views, light for the head view)."
        ),
    ] = None,
    prettify: Annotated[
        bool,
        typer.Option(
            "--prettify/--no-prettify",
            help="Show the word-start marks Ġ and ▁ of byte-level BPE and SentencePiece tokens as spaces.",
        ),
    ] = True,
    faint: Annotated[
        bool,
        typer.Option(
            "--faint",
            help="Head view: draw every line at an opacity of at least 0.1, so weak attention stays visible.",
        ),
    ] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="HTML file to write.")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
    weights: WeightsOption = "attention",
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Encoder-decoder models: the target text (TEXT is the source).",
            callback=utf8_text,
        ),
    ] = None,
    attention: Annotated[
        AttentionSetName,
        typer.Option("--attention", help="Encoder-decoder models: encoder, decoder or cross, shown first."),
    ] = "cross",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Write a head, model or neuron view of TEXT (or the pair TEXT TEXT_B, or for an encoder-decoder model
    the source TEXT and --target) as one self-contained page."""
    from bertology.files.outputs import check_output_file
    from bertology.models.loading import load_model
    from bertology.views import render_view

    target_file = check_output_file(output or Path(f"{kind}_view.html"))
    loaded = load_model(model, device=device, dtype=dtype)
    page = render_view(
        text,
        text_b,
        kind=kind,
        model=loaded,
        layer=layer,
        head=head,
        query=query,
        theme=theme,
        weights=weights,
        target=target,
        attention_set=attention,
        max_tokens=max_tokens,
        prettify_tokens=prettify,
        faint_lines=faint,
    )
    say_model_note(loaded.name)
    written = page.save(target_file)
    size_mb = written.stat().st_size / 1e6
    out.print(
        f"Wrote the {kind} view of {page.token_count} to {written} ({size_mb:.2f} MB).", highlight=False
    )
    if open_:
        webbrowser.open(written.resolve().as_uri())


@app.command()
def relevance(
    text: TextArgument,
    text_b: TextBArgument = None,
    model: ModelOption = "default",
    method: Annotated[
        Literal["rollout", "flow", "both"], typer.Option("--method", help="rollout, flow or both.")
    ] = "both",
    max_tokens: Annotated[
        int,
        typer.Option("--max-tokens", min=1, help="Longest input flow accepts (its time grows about as n^4)."),
    ] = FLOW_MAX_TOKENS,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path("relevance.html"),
    weights: WeightsOption = "attention",
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Attention rollout and flow (Abnar and Zuidema 2020) of TEXT as a model view, plus a JSON file
    beside the page: {model, tokens, formula, attention, rollout, flow}, each matrix [layers][n][n]
    (row: token at that layer's output, column: input token; flow rows not normalised)."""
    from bertology.analysis.relevance import JSON_MARKS, RELEVANCE_METHODS, flow_pair_count
    from bertology.attention.capturing import capture
    from bertology.files.outputs import check_output_file
    from bertology.models.loading import load_model
    from bertology.views.relevance import relevance_view

    methods = RELEVANCE_METHODS if method == "both" else (method,)
    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    loaded = load_model(model, device=device, dtype=dtype)
    attention = capture(text, text_b, model=loaded, weights=weights)
    n = len(attention.tokens)
    pairs = flow_pair_count(attention.num_layers, n) if "flow" in methods else 0
    with progress_bar("Attention flow (max-flow problems)", pairs) as on_progress:
        page = relevance_view(attention, methods, max_tokens=max_tokens, on_progress=on_progress)
    html_path = page.save(output)
    json_path = page.save_json(output.with_suffix(".json"))
    out.print(
        f"Wrote the {' and '.join(methods)} of {n} tokens to {html_path} and {json_path}.", highlight=False
    )


def _letters(names: tuple[str, ...]) -> dict[str, str]:
    """One capital letter per feature for its column heading: the first letter of its first word not
    taken by an earlier feature ("views" V, "neuron view" N, ..., "norm weights" W)."""
    letters: dict[str, str] = {}
    for name in names:
        letters[name] = next(
            word[0].upper() for word in name.split() if word[0].upper() not in letters.values()
        )
    return letters


@app.command()
def models() -> None:
    """List the supported model types with their kind, capture route and features, and the default model."""
    from bertology.models.model_store import (
        DEFAULT_LABEL,
        PACKAGED_MODELS,
        assembled_path,
        default_model_path,
    )
    from bertology.models.model_types import (
        ENCODER_DECODER_FEATURES,
        FEATURES,
        MODEL_TYPES,
        REFUSED,
        features,
    )

    # one line per type in 80 columns: a narrow column per feature, its initial as the heading
    table = Table(
        title="Supported model types (config.model_type)",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
    )
    for column in ("model_type", "name", "kind", "route"):
        table.add_column(column, no_wrap=True)
    initials = _letters(FEATURES)
    for initial in initials.values():
        table.add_column(initial, justify="center", no_wrap=True)
    for model_type, entry in MODEL_TYPES.items():
        marks = ["✓" if present else "·" for present in features(model_type).values()]
        table.add_row(model_type, entry.name, entry.kind, entry.route, *marks)
    out.print(table)
    legend = ", ".join(f"{initial}: {name}" for name, initial in initials.items())
    out.print(f"Features ({legend}): ✓ has it, · has not.", highlight=False)
    meanings = "; ".join(f"{initials[name]}: {meaning}" for name, meaning in ENCODER_DECODER_FEATURES.items())
    out.print(f"For encoder-decoders: {meanings}.", highlight=False)
    for model_type, reason in REFUSED.items():
        out.print(f"Not supported: {model_type}, which {reason}.", highlight=False)
    out.print(f"Default model ('default'): {DEFAULT_LABEL}, 6 layers x 12 heads, at {default_model_path()}")
    for name, packaged in PACKAGED_MODELS.items():
        folder = assembled_path(name)
        where = f"at {folder}" if folder else f"{packaged.origin} at first use (make real-models)"
        out.print(
            f"Real model ('{name}'): {where}{f'. {packaged.note}.' if packaged.note else ''}", highlight=False
        )
    out.print("Any other hub name or local directory of a supported architecture also works.")

"""``bertology attribute``: self-attention attribution of one input (Hao et al. 2021)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import app, out
from bertology.cli.interventions import ClassifierArgument
from bertology.cli.options import DeviceOption, DtypeOption, TextArgument, TextBArgument, share
from bertology.files.run_files import ATTRIBUTION_FILE
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, MAX_IG_STEPS, IntegrationRule


@app.command()
def attribute(
    model: ClassifierArgument,
    text: TextArgument,
    text_b: TextBArgument = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="HTML file to write; the JSON goes beside it.")
    ] = Path(ATTRIBUTION_FILE),
    label: Annotated[
        str | None,
        typer.Option("--label", help="Attribute this label's probability (default: the predicted)."),
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=MAX_IG_STEPS, help="Integration steps (the paper: 20).")
    ] = 20,
    rule: Annotated[
        IntegrationRule,
        typer.Option("--rule", help="The paper's Riemann sum (riemann) or Gauss-Legendre quadrature."),
    ] = "riemann",
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            callback=share,
            help="Share of a layer's largest attribution an edge of the tree needs (0 to 1).",
        ),
    ] = 0.4,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Which attention links the prediction rests on: integrated gradients of each head's attention map,
    head scores and the attribution tree (Hao et al. 2021)."""
    from bertology.files.outputs import check_output_file
    from bertology.interventions.attention_attribution import JSON_MARKS
    from bertology.interventions.attention_attribution import attribute as attribute_attention
    from bertology.models.loading import load_model
    from bertology.report.attribution import write_attribution

    check_output_file(output, beside=(".json",), marks=JSON_MARKS)
    loaded = load_model(model, classifier=True, device=device, dtype=dtype)
    result = attribute_attention(loaded, text, text_b, label=label, steps=steps, rule=rule)
    page_path, json_path = write_attribution(result, output, threshold=threshold)
    gap = float(abs(result.completeness_gap).max())
    tree = result.tree(threshold)
    out.print(
        f"Attributed {result.label!r} (probability {result.probability:.3f}; predicted {result.predicted!r}) "
        f"in {result.seconds:.1f} s; the tree has {len(tree.edges)} edges from {result.tokens[tree.root]!r}; "
        f"the layers' integrals miss F(A) - F(0) by at most {gap:.2g} (more --steps, less). "
        f"Wrote {page_path} and {json_path}.",
        highlight=False,
    )

"""``bertology circuit``: edge attribution patching (EAP, EAP-IG or exact) and faithfulness curves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertology.cli.app import app, out
from bertology.cli.options import DeviceOption, DtypeOption, require_inputs
from bertology.cli.patching import load_for_pairs
from bertology.cli.progress import progress_bar
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    CircuitAblation,
    CircuitMethod,
    PatchDirection,
    PatchMetric,
)


@app.command()
def circuit(
    model: Annotated[
        str,
        typer.Argument(
            help="A decoder language model (a name or folder) or a fine-tuned post-norm encoder classifier "
            "(BERT, RoBERTa, ELECTRA, MPNet and their kin: a run folder of 'bertology finetune')."
        ),
    ],
    pairs: Annotated[
        Path,
        typer.Argument(
            help="JSONL, one pair a line, as for 'bertology patch': 'clean' and 'corrupted' texts of equal "
            "token count with 'answer' and 'wrong' (a classifier: optional 'label' and 'wrong_label')."
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="Folder for edges.csv, faithfulness.csv, summary.json, graph.json, curves.png.",
        ),
    ],
    method: Annotated[
        CircuitMethod,
        typer.Option(
            "--method",
            help="eap: activation difference times gradient (one backward pass); eap-ig: the gradient "
            "averaged over --ig-steps inputs between the corrupted and the clean embeddings; exact: a "
            "patched pass per edge (small models).",
        ),
    ] = "eap-ig",
    ig_steps: Annotated[int, typer.Option("--ig-steps", help="EAP-IG's points (MIB uses 5).")] = 5,
    metric: Annotated[
        PatchMetric,
        typer.Option("--metric", help="logit-diff, prob-diff or kl, as for 'bertology patch'."),
    ] = "logit-diff",
    direction: Annotated[
        PatchDirection,
        typer.Option(
            "--direction",
            help="noising (MIB's): the clean input runs and edges outside the circuit carry the corrupted "
            "run's values; denoising: the reverse.",
        ),
    ] = "noising",
    ablation: Annotated[
        CircuitAblation,
        typer.Option(
            "--ablation",
            help="What an edge outside the circuit carries: counterfactual (the other run's value, MIB's "
            "default) or mean (its mean over the pairs).",
        ),
    ] = "counterfactual",
    prepend_bos: Annotated[
        bool,
        typer.Option(
            "--prepend-bos/--no-prepend-bos", help="Put the tokenizer's BOS token before the texts."
        ),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random ranking.")] = 0,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Find a circuit: score every edge between heads, MLPs, the input and the logits (MIB's graph), then
    measure the faithfulness of the top edges at sizes from 0.1 % to 100 % beside a random ranking, with
    the areas CPR (higher is better) and CMD (lower is better)."""
    require_inputs({"PAIRS": pairs})
    from bertology.files.outputs import output_folder
    from bertology.interventions.circuit import circuit as find_circuit
    from bertology.report.circuit import finish_circuit_run
    from bertology.report.circuit_files import write_circuit_files

    loaded, chosen = load_for_pairs(model, pairs, output, device, dtype, encoder_decoder=False)
    with output_folder(output) as folder:
        with progress_bar("circuit", None) as on_progress:
            result = find_circuit(
                loaded,
                chosen,
                method=method,
                ig_steps=ig_steps,
                metric=metric,
                direction=direction,
                ablation=ablation,
                prepend_bos=prepend_bos,
                seed=seed,
                on_progress=on_progress,
            )
        write_circuit_files(result, folder)
        finish_circuit_run(folder, loaded, chosen[0], prepend_bos)
    found = result.areas()
    out.print(
        f"{result.graph.edge_count} edges scored by {method} on {result.pairs} pairs. "
        f"CPR {found['cpr'][method]:.3f} "
        f"(random {found['cpr']['random']:.3f}), CMD {found['cmd'][method]:.3f} (random "
        f"{found['cmd']['random']:.3f}). Wrote the edges, curves, summary and circuit.html to {output}.",
        highlight=False,
    )

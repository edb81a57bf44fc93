"""``bertology patch``: activation, attribution and path patching on pairs of clean and corrupted inputs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from bertology.interventions.patching_pairs import PatchPair
    from bertology.models.loading import LoadedModel

from bertology.cli.app import app, out, say_model_note
from bertology.cli.options import DeviceOption, DtypeOption, require_inputs
from bertology.cli.progress import progress_bar
from bertology.files.run_files import REPORT_FILE
from bertology.options import (
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    PatchAblation,
    PatchDirection,
    PatchGranularity,
    PatchMethod,
    PatchMetric,
)

#: A head as printed everywhere, ``layer-head`` (0-based), or the older ``layer.head``.
_SENDER = re.compile(r"(\d+)[-.](\d+)")
_RECEIVER = re.compile(r"(\d+)[-.](\d+):([qkv])(?:@(-?\d+))?")


def parse_senders(text: str) -> list[tuple[int, int]] | None:
    """``"9-6,10-0"`` -> ``[(9, 6), (10, 0)]`` (0-based layer-head; ``9.6`` is read too); ``"each"`` ->
    ``None``, every head before the receivers.

    Raises:
        typer.BadParameter: an item that is not ``L-H``.
    """
    if text.strip() == "each":
        return None
    heads = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _SENDER.fullmatch(item)
        if match is None:
            raise typer.BadParameter(
                f"{item!r} is not a head written L-H (0-based), nor 'each'.", param_hint="--senders"
            )
        heads.append((int(match[1]), int(match[2])))
    return heads


def parse_receivers(text: str) -> list[tuple[int, int, str, int | None]]:
    """``"11-2:q,11-2:k@-1"`` -> ``[(11, 2, "q", None), (11, 2, "k", -1)]`` (``11.2:q`` is read too;
    ``@P``: only position ``P`` of the texts, 0-based or negative from the end).

    Raises:
        typer.BadParameter: an item that is not ``L-H:q``, ``L-H:k`` or ``L-H:v``, with or without ``@P``.
    """
    receivers = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _RECEIVER.fullmatch(item)
        if match is None:
            raise typer.BadParameter(
                f"{item!r} is not a receiver written L-H:q, L-H:k or L-H:v (0-based), with @P for one "
                "position.",
                param_hint="--receivers",
            )
        position = None if match[4] is None else int(match[4])
        receivers.append((int(match[1]), int(match[2]), match[3], position))
    return receivers


def _path_patching(
    loaded: LoadedModel,
    pairs: list[PatchPair],
    senders: list[tuple[int, int]] | None,
    receivers: list[tuple[int, int, str, int | None]],
    sweep: bool,
    folder: Path,
    direction: PatchDirection,
    metric: PatchMetric,
    prepend_bos: bool,
) -> str:
    """Run path patching (each sender alone where ``senders`` is ``None`` or ``sweep``), write its report
    into ``folder`` and return the sentence the command prints."""
    from bertology.interventions.patching import roles
    from bertology.interventions.path_patching import path_patch, path_patch_each
    from bertology.report.patching import (
        largest_path_effects,
        write_path_patching_report,
        write_path_sweep_report,
    )

    frozen = roles(direction)[1]
    options = {"direction": direction, "metric": metric, "prepend_bos": prepend_bos}
    if senders is not None and not sweep:
        result = path_patch(loaded, pairs, senders, receivers, **options)  # type: ignore[arg-type]
        write_path_patching_report(result, loaded.name, folder)
        return (
            f"Path patching effect {result.effect:.3f} on {metric} ({direction}: the {frozen} run frozen and "
            "patched)."
        )
    with progress_bar("senders", None) as on_progress:
        swept = path_patch_each(loaded, pairs, receivers, senders, on_progress=on_progress, **options)  # type: ignore[arg-type]
    write_path_sweep_report(swept, loaded.name, folder)
    top = ", ".join(f"{cell['name']} {cell['effect']:+.3f}" for cell in largest_path_effects(swept, 5))
    return (
        f"Path patching of {len(swept.senders)} senders one at a time on {metric} ({direction}: the {frozen} "
        f"run frozen and patched); largest effects by size (heads layer-head, 0-based): {top}."
    )


def load_for_pairs(
    model: str, pairs: Path, output: Path, device: str, dtype: str, encoder_decoder: bool = True
) -> tuple[LoadedModel, list[PatchPair]]:
    """The pairs file's pairs and the model loaded with the head they need (a decoder's or an
    encoder-decoder's language-model head, else a classifier's), after every check that needs no model:
    the pairs suit the model's kind (an encoder-decoder refused unless ``encoder_decoder``) and ``output``
    may be written (``patch`` and ``circuit``)."""
    from bertology.errors import BertologyError
    from bertology.files.outputs import check_output_folder
    from bertology.interventions.patching_pairs import check_pairs_fit, read_pairs
    from bertology.models.loading import load_model, model_kind

    chosen = read_pairs(pairs)
    kind = model_kind(model)
    if kind == "encoder-decoder" and not encoder_decoder:
        raise BertologyError(
            f"'{model}' is an encoder-decoder; circuits are found in encoder and decoder models (bertology "
            "patch patches an encoder-decoder's sites)."
        )
    check_pairs_fit(chosen, model, kind)
    classifier = kind == "encoder"
    check_output_folder(output)
    loaded = load_model(
        model, language_model=not classifier, classifier=classifier, device=device, dtype=dtype
    )
    say_model_note(loaded.name)
    return loaded, chosen


@app.command()
def patch(
    model: Annotated[
        str,
        typer.Argument(
            help="A decoder language model (a name or folder; pairs with 'answer' and 'wrong'), an "
            "encoder-decoder (BART, T5: the same, sources swapped, an optional shared 'target' prefix) or a "
            "fine-tuned classifier (a run folder from 'bertology finetune' or a model folder)."
        ),
    ],
    pairs: Annotated[
        Path,
        typer.Argument(
            help="JSONL, one pair a line: 'clean' and 'corrupted' texts of equal token count, with 'answer' "
            "and 'wrong' (one token each, or several: scored by the sum of their log-probabilities) for a "
            "language model, optional 'label' and 'wrong_label' for a classifier."
        ),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Folder for report.html, CSV, JSON and plots.")
    ],
    direction: Annotated[
        PatchDirection | None,
        typer.Option(
            "--direction",
            help="denoising (the default): clean activations into the corrupted run; noising: the reverse "
            "(the default with --ablation zero or mean).",
        ),
    ] = None,
    site: Annotated[
        str,
        typer.Option(
            "--site",
            help="What is patched in each layer: resid_pre, q, k, v, z (each head's output), attn_out, "
            "resid_mid, mlp_out or resid_post; or once: embed, final or logits (the README's table of "
            "sites); an encoder-decoder's with its stack: encoder:z, decoder:resid_pre, cross:q, ...",
        ),
    ] = "z",
    granularity: Annotated[
        PatchGranularity,
        typer.Option(
            "--granularity",
            help="head: each head at every position; head-position: each head at each position (heads: "
            "q, k, v, z only); layer: the whole site of each layer; position: the whole site at each "
            "position.",
        ),
    ] = "head",
    method: Annotated[
        PatchMethod,
        typer.Option(
            "--method",
            help="exact: a patched pass per patch; attribution: the first-order estimate from one backward "
            "pass; both: both and their agreement.",
        ),
    ] = "exact",
    metric: Annotated[
        PatchMetric,
        typer.Option(
            "--metric",
            help="logit-diff: logit(answer) - logit(wrong); prob-diff: p(answer) - p(wrong); kl: the KL "
            "divergence KL(clean || patched) of the next-token (or label) distribution from the clean run's.",
        ),
    ] = "logit-diff",
    ablation: Annotated[
        PatchAblation,
        typer.Option(
            "--ablation",
            help="What a patch writes: counterfactual (the other run's activation), zero, or mean (the other "
            "run's activation averaged over every pair and position of its texts, as circuit's mean).",
        ),
    ] = "counterfactual",
    prepend_bos: Annotated[
        bool,
        typer.Option(
            "--prepend-bos/--no-prepend-bos",
            help="Put the tokenizer's BOS token before a language model's texts (TransformerLens does by "
            "default; off: the texts as the tokenizer writes them).",
        ),
    ] = False,
    senders: Annotated[
        str | None,
        typer.Option(
            "--senders",
            help="Path patching: sender heads L-H,... (0-based; with --receivers), patched together; 'each': "
            "every head before the first receiver's layer, one at a time (a layer x head grid).",
        ),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="Path patching: each of the --senders listed alone, not together."),
    ] = False,
    receivers: Annotated[
        str | None,
        typer.Option(
            "--receivers",
            help="Path patching: receivers L-H:q|k|v,... in layers after every sender's (with --senders); "
            "L-H:q@-1: only the texts' last position (@P: position P, 0-based, negative from the end).",
        ),
    ] = None,
    patches_per_pass: Annotated[
        int, typer.Option("--patches-per-pass", min=1, help="Exact patching: patches run side by side.")
    ] = 16,
    device: DeviceOption = DEFAULT_DEVICE,
    dtype: DtypeOption = DEFAULT_DTYPE,
) -> None:
    """Patch activations between clean and corrupted inputs: how much of the behaviour (by default the logit
    difference of the answer and the wrong token, or of two labels; --metric) each head, head and position,
    layer or position of a site (--site, --granularity) restores, or with --ablation zero or mean how much
    removing it takes away. With --senders and --receivers: path patching (Wang et al. 2022)."""
    if (senders is None) != (receivers is None):
        raise typer.BadParameter("path patching needs both --senders and --receivers.")
    if sweep and senders is None:
        raise typer.BadParameter(
            "--sweep sweeps the --senders of path patching: give --senders and --receivers."
        )
    if senders is not None and ablation != "counterfactual":
        raise typer.BadParameter(
            "path patching takes its senders' outputs from the other run; --ablation is for activation "
            "patching (without --senders and --receivers)."
        )
    path_heads = None if senders is None else (parse_senders(senders), parse_receivers(receivers or ""))
    require_inputs({"PAIRS": pairs})
    from bertology.interventions.patching import default_direction

    direction = default_direction(ablation, direction)
    if path_heads is None:
        from bertology.interventions.patching import check_options

        check_options(None, direction, granularity, method, metric, site, ablation)
    elif path_heads[0] is not None:
        from bertology.interventions.path_patching import check_receivers_after_senders

        check_receivers_after_senders(*path_heads)  # type: ignore[arg-type]
    from bertology.files.outputs import output_folder

    loaded, chosen = load_for_pairs(model, pairs, output, device, dtype)
    with output_folder(output) as folder:
        if path_heads is not None:
            text = _path_patching(loaded, chosen, *path_heads, sweep, folder, direction, metric, prepend_bos)
            out.print(f"{text} Wrote {output / REPORT_FILE}.", highlight=False)
            return
        from bertology.interventions.patching import patch as run_patching
        from bertology.report.patching import largest_effects_text, write_patching_report

        with progress_bar("patches", None) as on_progress:
            study = run_patching(
                loaded,
                chosen,
                direction=direction,
                site=site,
                granularity=granularity,
                method=method,
                metric=metric,
                ablation=ablation,
                prepend_bos=prepend_bos,
                patches_per_pass=patches_per_pass,
                on_progress=on_progress,
            )
        report = output / write_patching_report(study, folder).name
    main = study.exact or study.attribution
    assert main is not None
    from bertology.interventions.patching_metrics import METRICS

    out.print(
        f"Mean {METRICS[main.metric].symbol} clean {main.ld_clean.mean():.3f}, corrupted "
        f"{main.ld_corrupted.mean():.3f} on "
        f"{len(chosen)} pairs. Largest effects by size ({main.site}, {main.method}, {main.direction}"
        f"{'' if main.ablation == 'counterfactual' else ', ' + main.ablation + ' ablation'}; "
        f"{'heads layer-head, ' if main.grid.per_head else 'layers and positions '}0-based): "
        f"{largest_effects_text(main)}. Wrote {report} and the CSV, JSON and plots beside it.",
        highlight=False,
    )

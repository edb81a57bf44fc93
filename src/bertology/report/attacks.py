"""The page and JSON of an attack that explains by changing the input (``bertology attack``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bertology.files.outputs import write_text
from bertology.interventions.attacks import Attack, AttackStep
from bertology.report import page
from bertology.report.interventions import CONVENTION_NAMES

#: Display names of the attacks.
METHOD_TITLES = {"input-reduction": "Input reduction", "hotflip": "HotFlip"}
#: Token styles: a removed token, a swapped one, any other.
REMOVED = "text-decoration: line-through; opacity: .45; padding: 0 .15em"
SWAPPED = "background-color: rgba(214, 39, 40, .85); color: #fff; padding: 0 .15em; border-radius: 3px"
KEPT = "padding: 0 .15em"


def _change(step: AttackStep) -> str:
    if step.replacement is None:
        return f"removed {step.token!r} (token {step.position})"
    return f"{step.token!r} → {step.replacement!r} (token {step.position})"


def _result_tokens(attack: Attack) -> page.Markup:
    """The original tokens, each removed one struck through and each swapped one shown as its
    replacement on red (hover: what it was)."""
    result = attack.result
    now = {} if result is None else dict(zip(result.positions, result.tokens, strict=True))
    spans = []
    for position, token in enumerate(attack.tokens):
        if position not in now:
            spans.append((token, REMOVED, "removed"))
        elif now[position] != token:
            spans.append((now[position], SWAPPED, f"was {token}"))
        else:
            spans.append((token, KEPT, ""))
    return page.coloured_tokens(spans)


def _summary(attack: Attack) -> str:
    result = attack.result
    if attack.method == "input-reduction":
        if result is None:
            return "No token could be removed with the prediction kept."
        kept = sum(not attack.special[position] for position in result.positions)
        total = int((~attack.special).sum())
        return f"Reduced to {kept} of {total} tokens with the prediction kept ({result.probability:.3f})."
    if attack.flipped and result is not None:
        swaps = len(attack.steps)
        return (
            f"The prediction changed to {result.label!r} ({result.probability:.3f}) after {swaps} "
            f"swap{'s' if swaps != 1 else ''}."
        )
    return f"The prediction held through {len(attack.steps)} swaps."


def write_attack(attack: Attack, path: str | Path) -> tuple[Path, Path]:
    """Write ``attack`` as an HTML page at ``path`` (the input as the attack left it, and a table of its
    steps) and as JSON beside it (same name, ``.json``); return both paths."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    json_path = target.with_suffix(".json")
    write_text(json_path, attack.to_json())
    result = attack.result
    blocks = [page.paragraph(_summary(attack)), _result_tokens(attack)]
    if result is not None:
        blocks += [
            page.quotation("Text", result.text),
            *([] if result.text_b is None else [page.quotation("Second text", result.text_b)]),
        ]
    steps = pd.DataFrame(
        {
            "step": range(1, len(attack.steps) + 1),
            "change": [_change(step) for step in attack.steps],
            "text": [
                step.text if step.text_b is None else f"{step.text} | {step.text_b}" for step in attack.steps
            ],
            "label": [step.label for step in attack.steps],
            "probability": [step.probability for step in attack.steps],
            f"p({attack.label})": [step.original_probability for step in attack.steps],
        }
    )
    header = [
        page.definitions(
            {
                "attack": METHOD_TITLES[attack.method],
                "convention": CONVENTION_NAMES[attack.convention],
                "text": attack.text,
                "second text": attack.text_b,
                "predicted label": attack.label,
                "probability": round(attack.probability, 4),
            }
        )
    ]
    sections = [
        page.Section("Result", "result", blocks),
        page.Section("Steps", "steps", [page.table(steps, float_format="{:.4f}")]),
    ]
    title = f"{METHOD_TITLES[attack.method]}: {attack.label}"
    write_text(target, page.render_page(title, sections, header=header))
    return target, json_path

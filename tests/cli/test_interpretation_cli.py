"""``bertology explain --method`` and ``bertology attack`` on a run folder of a classifier whose answers are
known: the files they write, what they print, and their usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import run_in_process
from support.known_classifier import known_sentiment_classifier
from typer.testing import CliRunner

from bertology.cli import app

HOSTILE = '<script>alert("x")</script> good <b>film</b>'


@pytest.fixture(scope="module")
def known_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding the hand-built sentiment classifier in ``model/``."""
    run = tmp_path_factory.mktemp("known_run")
    loaded = known_sentiment_classifier()
    loaded.model.save_pretrained(run / "model")
    loaded.tokenizer.save_pretrained(run / "model")
    return run


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_attack_hotflip_writes_the_flipped_input(known_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "out" / "flip.html"
    code, output = invoke(
        "attack", str(known_run), "the film was good", "--method", "hotflip", "-o", str(target)
    )
    assert code == 0, output
    assert "Predicted 'pos'" in output and "'neg'" in output and "the film was awful" in output
    data = json.loads(target.with_suffix(".json").read_text(encoding="utf-8"))
    assert (data["method"], data["label"], data["flipped"]) == ("hotflip", "pos", True)
    assert [(s["token"], s["replacement"], s["label"]) for s in data["steps"]] == [("good", "awful", "neg")]
    page = target.read_text(encoding="utf-8")
    assert "HotFlip" in page and "was good" in page and "awful" in page


def test_attack_input_reduction_page_is_safe(known_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "reduced.html"
    code, output = invoke("attack", str(known_run), HOSTILE, "-o", str(target))  # input reduction by default
    assert code == 0, output
    data = json.loads(target.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["text"] == HOSTILE and data["method"] == "input-reduction" and not data["flipped"]
    assert data["steps"][-1]["text"] == "good" and {s["label"] for s in data["steps"]} == {"pos"}
    page = target.read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>film" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; good &lt;b&gt;film&lt;/b&gt;" in page
    assert 'http-equiv="Content-Security-Policy"' in page and "Reduced to 1 of" in page


def test_attack_refuses_a_json_it_did_not_write(
    known_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "flip.html"
    target.with_suffix(".json").write_text('{"mine": 1}', encoding="utf-8")
    code, error = run_in_process(["attack", str(known_run), "good", "-o", str(target)], capsys)
    assert code == 1 and "flip.json exists and is not a file bertology wrote" in " ".join(error.split())
    assert not target.exists()
    assert target.with_suffix(".json").read_text(encoding="utf-8") == '{"mine": 1}'


def test_explain_method_chooses_the_methods(known_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "why.html"
    args = [
        "explain",
        str(known_run),
        "the film was good",
        "-o",
        str(target),
        "--noise",
        "0",
        "--samples",
        "3",
    ]
    code, output = invoke(*args, "--method", "gradient,smoothgrad")
    assert code == 0, output
    assert "integrated gradients miss" not in output
    data = json.loads(target.with_suffix(".json").read_text(encoding="utf-8"))
    assert list(data["attributions"]) == ["gradient", "smoothgrad"] and data["samples"] == 3
    # no noise: the mean of equal float32 gradients, summed in float32: rel 1e-5
    assert data["attributions"]["smoothgrad"] == pytest.approx(data["attributions"]["gradient"], rel=1e-5)
    page = target.read_text(encoding="utf-8")
    assert "<h3>SmoothGrad</h3>" in page and "Integrated gradients" not in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["explain", "run", "hi", "--method", "gradient,lime"],
            "'lime' is not one of gradient, input-x-gradient",
        ),
        (["explain", "run", "hi", "--samples", "0"], "greater than or equal to 1"),
        (["explain", "run", "hi", "--noise", "-1"], "-1 is not a number from 0 to 10."),
        (["attack", "run", "hi", "--method", "lime"], "'lime' is not one of 'input-reduction', 'hotflip'"),
        (["attack", "run", "hi", "--beam", "0"], "greater than or equal to 1"),
    ],
)
def test_interpretation_usage_errors(args: list[str], message: str) -> None:
    code, output = invoke(*args)
    assert code == 2
    assert message in " ".join(output.replace("│", " ").split())


def test_explain_a_decoders_next_token(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A decoder's next token: the saliency of its prompt's tokens and the heads' direct logit attribution,
    for a --target token the model does not predict."""
    target = tmp_path / "next.html"
    code, output = invoke(
        "explain", str(tiny_model_dirs["llama"]), "the quick brown fox", "--target", "▁dog",
        "--method", "integrated-gradients", "--steps", "10", "-o", str(target),
    )  # fmt: skip
    assert code == 0, output
    data = json.loads(target.with_suffix(".json").read_text(encoding="utf-8"))
    assert data["label"] == "dog" and data["tokens"][0] == "<s>"
    assert list(data["attributions"]) == ["integrated-gradients"]
    heads = data["direct_logit_attribution"]
    assert len(heads["heads"]) == 2 and len(heads["heads"][0]) == 4  # the tiny Llama's 2 x 4 heads
    # the float32 terms of the logit summed again: 1e-5
    assert heads["total"] == pytest.approx(data["logit"], abs=1e-5)
    page = target.read_text(encoding="utf-8")
    assert "Direct logit attribution" in page and page.count("data:image/png") == 1
    assert "target next token" in page and "Explained 'dog'" in output

"""Corpus analysis of encoder-decoders (BART, T5): each stack's statistics against the model's own
``output_attentions``, computed here one source at a time without padding.

Tolerances: each stack's statistics against ones computed here from the model's own output_attentions of
the same float32 pass, atol 1e-6; the diagonal distance of a uniform row (float32 weights of 1e-3 over 1,000
keys) against its exact 1/4, 1e-6; the explorer's JSON of the float64 table, 1e-9.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from support.cli import run_command, run_in_process
from support.tiny_models import GENERATIVE_ARCHITECTURES, save_tiny_model
from transformers import AutoModel, AutoModelForSeq2SeqLM

import bertology
from bertology.analysis.seq2seq import (
    analyze_seq2seq_corpus,
    compare_seq2seq_models,
    diagonal_distance,
    read_sources,
)
from bertology.models.loading import LoadedModel, load_model
from bertology.report.seq2seq import save_seq2seq_tables
from bertology.server import create_app

#: Sources of different lengths (so a batch of two pads), with punctuation; the third has no target, so
#: the decoder reads the model's greedy output; batches of two mix a given and a greedy target.
CORPUS = [
    {
        "text": "I went to the store. At the store, I bought fresh strawberries.",
        "target": "She bought fruit.",
    },
    {"text": "The quick brown fox jumps.", "target": "A fox, quick and brown, jumps over the lazy dog."},
    {"text": "Researchers measured how much each head attends to punctuation."},
    {
        "text": "She said that the committee would publish its findings.",
        "target": "The committee will publish.",
    },
]
MAX_NEW_TOKENS = 5


@pytest.fixture(scope="module")
def generative_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generative_models")
    return {name: save_tiny_model(name, root) for name in GENERATIVE_ARCHITECTURES}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seq2seq") / "sources.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in CORPUS))
    return path


def _punctuation(tokens: list[str], special: np.ndarray) -> np.ndarray:
    return np.array([token.lstrip("Ġ▁") in {".", ","} for token in tokens]) & ~special


def _greedy(directory: Path, loaded: LoadedModel, source: str) -> list[int]:
    """The model's greedy output by transformers' own generate (its LM head tied to the embeddings)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    inputs = loaded.tokenizer([source], return_tensors="pt")
    generated = model.generate(
        **inputs,
        do_sample=False,
        num_beams=1,
        max_new_tokens=MAX_NEW_TOKENS,
        min_length=0,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        no_repeat_ngram_size=0,
        repetition_penalty=1.0,
    )[0].tolist()
    output = generated[1:]  # without the start token
    end = loaded.tokenizer.eos_token_id
    return output[: output.index(end) + 1] if end in output else output


def _expected(directory: Path, loaded: LoadedModel) -> dict[str, dict[str, float]]:
    """Per stack, statistics averaged over each source's queries, then over the sources, from a plain eager
    model's ``output_attentions``."""
    model = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = loaded.tokenizer
    start = model.config.decoder_start_token_id
    special_ids = set(tokenizer.all_special_ids)
    per_source: dict[str, dict[str, list[np.ndarray]]] = {"encoder": {}, "decoder": {}, "cross": {}}
    for record in CORPUS:
        source_ids = tokenizer(record["text"])["input_ids"]
        if "target" in record:
            labels = tokenizer(text_target=record["target"])["input_ids"]
        else:
            labels = _greedy(directory, loaded, record["text"])
        decoder_ids = [start, *labels[:-1]]
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([source_ids]),
                decoder_input_ids=torch.tensor([decoder_ids]),
                output_attentions=True,
            )
        tokens = {"source": tokenizer.convert_ids_to_tokens(source_ids)}
        special = np.array([token in special_ids for token in source_ids])
        end = special & (np.array(tokens["source"]) == tokenizer.eos_token)
        punct = _punctuation(tokens["source"], special)
        encoder = torch.stack(out.encoder_attentions)[:, 0].double().numpy()  # [L, H, S, S]
        decoder = torch.stack(out.decoder_attentions)[:, 0].double().numpy()  # [L, H, T, T]
        cross = torch.stack(out.cross_attentions)[:, 0].double().numpy()  # [L, H, T, S]
        n_s, n_t = len(source_ids), len(decoder_ids)

        def entropy(probs: np.ndarray) -> np.ndarray:
            return -(probs * np.log(np.clip(probs, 1e-30, None))).sum(-1)

        def add(stack: str, name: str, values: list[np.ndarray] | np.ndarray) -> None:
            """values: [L, H, queries] (or a list of [L, H] per query); a source without such a query
            leaves the statistic undefined there."""
            if len(values) if isinstance(values, list) else values.shape[-1]:
                per_query = np.stack(values, -1) if isinstance(values, list) else values
                per_source[stack].setdefault(name, []).append(per_query.mean(-1))

        for stack, probs in (("encoder", encoder), ("decoder", decoder)):
            n = probs.shape[-1]
            add(stack, "entropy", entropy(probs))
            add(stack, "confidence", probs.max(-1))
            add(stack, "previous", [probs[..., q, q - 1] for q in range(1, n)])
            add(stack, "current", np.diagonal(probs, axis1=-2, axis2=-1))
        add("encoder", "sep", encoder[..., end].sum(-1))
        add("encoder", "punct", encoder[..., punct].sum(-1))
        add("encoder", "next", [encoder[..., q, q + 1] for q in range(n_s - 1)])
        add("encoder", "entropy_uniform", np.full((*encoder.shape[:2], n_s), np.log(n_s)))
        # the decoder's later keys are left out: uniform attention spreads over keys 0..t only
        add("decoder", "entropy_uniform", np.broadcast_to(np.log(np.arange(1, n_t + 1)), decoder.shape[:3]))
        add("cross", "sep", cross[..., end].sum(-1))
        add("cross", "punct", cross[..., punct].sum(-1))
        add("cross", "entropy", entropy(cross))
        add("cross", "entropy_uniform", np.full(cross.shape[:3], np.log(n_s)))
        add("cross", "confidence", cross.max(-1))
        gap = np.abs((np.arange(n_s) + 0.5)[None, :] / n_s - (np.arange(n_t) + 0.5)[:, None] / n_t)
        add("cross", "diagonal", (cross * gap).sum(-1))
    return {
        stack: {name: np.mean(values, axis=0) for name, values in columns.items()}
        for stack, columns in per_source.items()
    }


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_each_stack_equals_output_attentions(
    architecture: str, generative_dirs: dict[str, Path], corpus: Path
) -> None:
    loaded = load_model(generative_dirs[architecture])
    analysis = analyze_seq2seq_corpus(corpus, loaded, batch_size=2, max_new_tokens=MAX_NEW_TOKENS)
    assert (analysis.segments, analysis.greedy_segments) == (4, 1)
    expected = _expected(generative_dirs[architecture], loaded)
    frame = analysis.heads_frame()
    encoder_layers, decoder_layers = (3, 2) if architecture == "bart" else (2, 2)
    layers = {"encoder": encoder_layers, "decoder": decoder_layers, "cross": decoder_layers}
    for stack, columns in expected.items():
        rows = frame[frame["stack"] == stack]
        assert len(rows) == layers[stack] * 4
        for name, values in columns.items():
            np.testing.assert_allclose(
                rows[name].to_numpy().reshape(values.shape), values, atol=1e-6, err_msg=f"{stack} {name}"
            )
    decoder = frame[frame["stack"] == "decoder"]
    assert decoder["next"].isna().all() and decoder["cls"].isna().all()  # a later key is never a statistic
    assert (decoder["score_next"].isna()).all()
    cross = frame[frame["stack"] == "cross"]
    assert cross["label"].isna().all() and cross["previous"].isna().all()
    assert frame[frame["stack"] != "cross"]["diagonal"].isna().all()
    assert "greedy output (at most 5 new tokens) for 1 sources" in analysis.decoder_reads()


def test_diagonal_distance_known_answers() -> None:
    identity = torch.eye(4)[None, None]  # [1, 1, 4, 4]: each decoder token on its own source token
    lengths = torch.tensor([4])
    assert diagonal_distance(identity, lengths, lengths).abs().max() == 0
    far = torch.zeros(1, 1, 2, 4)
    far[..., 0, 3] = far[..., 1, 0] = 1.0  # the first token looks at the last source token and back
    # |3.5/4 - 0.5/2| = 0.625 for both
    np.testing.assert_allclose(diagonal_distance(far, torch.tensor([2]), lengths).numpy(), 0.625)
    uniform = torch.full((1, 1, 1, 1000), 1e-3)  # a lone query in the middle, uniform: mean gap 1/4
    np.testing.assert_allclose(
        diagonal_distance(uniform, torch.tensor([1]), torch.tensor([1000])).numpy(), 0.25, atol=1e-6
    )


def test_encoders_keep_their_heads_table(loaded_types: Callable[[str], LoadedModel]) -> None:
    """An encoder's analysis has no ``stack`` column (its heads.csv is as before)."""
    from bertology.analysis.analyze import analyze_corpus
    from bertology.analysis.settings import AnalysisSettings

    path = Path(bertology.__file__).parent / "data" / "sample_corpus.txt"
    analysis = analyze_corpus(path, loaded_types("bert"), AnalysisSettings(limit=4, cache=False))
    assert list(analysis.heads_frame().columns[:3]) == ["layer", "head", "previous"]


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_cli_analyze_writes_three_stacks(
    architecture: str,
    generative_dirs: dict[str, Path],
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "run"
    model = str(generative_dirs[architecture])
    result = run_command(
        [
            "analyze",
            str(corpus),
            "-o",
            str(output),
            "--model",
            model,
            "--max-new-tokens",
            "4",
            "--max-len",
            "64",
        ],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    heads = pd.read_csv(output / "heads.csv")
    assert list(heads.columns[:3]) == ["stack", "layer", "head"]
    assert heads["stack"].drop_duplicates().tolist() == ["encoder", "decoder", "cross"]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["greedy_segments"] == 1 and "at most 4 new tokens" in summary["decoder_reads"]
    report = (output / "report.html").read_text()
    assert "Cross-attention" in report and "at most 4 new tokens" in report


@pytest.mark.parametrize(
    ("options", "model", "message"),
    [
        (["--max-new-tokens", "4"], "gpt2", "--max-new-tokens is for encoder-decoder models; "),
        (["--js-tokens", "8"], "bart", "--js-tokens is for encoder and decoder models"),
    ],
)
def test_cli_refuses_options_of_another_kind(
    options: list[str],
    model: str,
    message: str,
    generative_dirs: dict[str, Path],
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In this process (the refusal comes before any model loads)."""
    arguments = ["analyze", str(corpus), "-o", str(tmp_path / "x"), "--model", str(generative_dirs[model])]
    code, stderr = run_in_process([*arguments, *options], capsys)
    said = " ".join(stderr.split())  # a long line may wrap
    assert code == 1 and "Traceback" not in said and not (tmp_path / "x").exists()
    assert said.startswith(f"Error: {message}") and said.endswith("model.") and ". " not in said


def test_compare_encoder_decoders_head_by_head(generative_dirs: dict[str, Path], corpus: Path) -> None:
    bart = load_model(generative_dirs["bart"])
    same = compare_seq2seq_models(bart, bart, corpus, max_new_tokens=MAX_NEW_TOKENS)
    frame = same.to_frame()
    assert frame["stack"].drop_duplicates().tolist() == ["encoder", "decoder", "cross"]
    changes = frame[[name for name in frame.columns if name.endswith("_change")]]
    assert {"diagonal_change", "entropy_change", "score_previous_change"} <= set(changes.columns)
    assert np.nanmax(np.abs(changes.to_numpy())) == 0  # one model against itself changes nothing
    assert frame["entropy_a"].notna().all()
    with pytest.raises(bertology.BertologyError, match=r"one shape; .* encoder 3 x 4, .* encoder 2 x 4"):
        compare_seq2seq_models(bart, load_model(generative_dirs["t5"]), corpus)
    with pytest.raises(bertology.BertologyError, match="is a decoder model; an encoder-decoder is compared"):
        compare_seq2seq_models(bart, load_model(generative_dirs["gpt2"]), corpus)


@pytest.mark.slow
def test_cli_compare_writes_each_stacks_changes(
    generative_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(generative_dirs["t5"])
    output = tmp_path / "compared"
    targets = tmp_path / "targets.jsonl"  # targets only: no greedy decoding, to keep the test short
    targets.write_text("".join(json.dumps(record) + "\n" for record in CORPUS if "target" in record))
    arguments = ["compare", model, model, "-o", str(output), "--corpus", str(targets), "--max-len", "64"]
    result = run_command(arguments, capsys)
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(output / "comparison.csv")
    assert len(frame) == (2 + 2 + 2) * 4 and (frame["confidence_change"] == 0).all()
    assert json.loads((output / "summary.json").read_text())["segments"] == 3
    assert "Cross-attention" in (output / "report.html").read_text()


def test_the_explorer_opens_each_stack(
    generative_dirs: dict[str, Path], corpus: Path, tmp_path: Path
) -> None:
    bart = load_model(generative_dirs["bart"])
    analysis = analyze_seq2seq_corpus(corpus, bart, max_new_tokens=MAX_NEW_TOKENS)
    save_seq2seq_tables(analysis, tmp_path / "run")  # the report is the CLI test's
    with TestClient(create_app([bart], runs=tmp_path)) as client:
        listed = {run["path"]: run for run in client.get("/api/runs").json()["runs"]}
        for stack in ("encoder", "decoder", "cross"):
            assert listed[f"run/{stack}"]["explore"] == f"/explore?run=run%2F{stack}"
        assert listed.get("run", {}).get("explore") is None  # the whole run is no one grid
        for stack, layers in (("encoder", 3), ("decoder", 2), ("cross", 2)):
            answer = client.post("/api/explore/analysis", json={"run": f"run/{stack}"}).json()
            assert (answer["layers"], answer["heads"], answer["summary"]["stack"]) == (layers, 4, stack)
            table = analysis.cross if stack == "cross" else analysis.surface[stack]
            np.testing.assert_allclose(answer["statistics"]["entropy"], table["entropy"], atol=1e-9)
            assert len(answer["map"]) == layers * 4
    assert "diagonal" in answer["statistics"] and "previous" not in answer["statistics"]
    for stack in ("encoder", "decoder", "cross"):
        distances = pd.read_csv(tmp_path / "run" / stack / "head_js_divergence.csv", index_col=0).to_numpy()
        assert np.allclose(distances, distances.T) and np.all(np.diag(distances) == 0) and distances.max() > 0


def test_sources_from_plain_text_and_jsonl(tmp_path: Path) -> None:
    text = tmp_path / "sources.txt"
    text.write_text("First source.\n\n  Second source.  \n")
    assert [(s.line, s.source, s.target) for s in read_sources(text)] == [
        (1, "First source.", None),
        (3, "Second source.", None),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "A source.", "target": "A target."}\n{"text": "Another.", "target": 3}\n')
    with pytest.raises(
        bertology.BertologyError, match=r"bad.jsonl line 2 needs a string 'target' field \(got a"
    ):
        list(read_sources(bad))
    with pytest.raises(bertology.BertologyError, match="reads plain text or JSONL sources, not the 'conllu'"):
        read_sources(text, "conllu")

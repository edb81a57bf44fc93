"""Patching's metrics (logit difference, probability difference, KL divergence from the clean run),
answers of several tokens and ``prepend_bos``, checked against references written here: one plain forward
pass per patched head with a forward pre-hook on the output projection, the metric computed from the full
logits by hand.

Tolerances: as in test_patching.py, the same float32 passes batched differently: logits, log-probabilities
and KL divergences of order 1 within atol 1e-5 (a KL of a distribution with itself within 1e-6); the
attribution estimate against autograd here within atol 1e-5, rtol 1e-4 (gradients of two graphs); the
probability difference of answers whose probabilities are about 1e-5 relatively, rtol 1e-4 (the
log-probabilities' 1e-6 absolute error becomes a relative one after exp).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.patching_reference import (
    answer_ids,
    output_projection,
    reference_head_patching,
    tiny_models_by_type,
)
from typer.testing import CliRunner

from bertology import BertologyError
from bertology.cli import app
from bertology.interventions.patching import patch
from bertology.interventions.patching_pairs import PatchPair, encode_pairs
from bertology.interventions.path_patching import path_patch
from bertology.models.loading import LoadedModel

#: One word swapped, or two words exchanged: the same token count in the tiny models' tokenizers.
TEXTS = [
    ("The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"),
    (
        "She said that the committee would publish its findings",
        "She said that the findings would publish its committee",
    ),
]
#: Per pair, an answer and a wrong token: for the tiny llama tokens of the clean and the corrupted run's
#: top five next tokens (probabilities 0.03 to 0.19), so that their probabilities move visibly.
ANSWERS = {"llama": [(" p", " un"), (" store,", " token")], "gpt2": [(" the", " next")] * 2}


def pairs_for(model_type: str, answers: tuple[str, str] | None = None) -> list[PatchPair]:
    chosen = [answers] * len(TEXTS) if answers else ANSWERS.get(model_type, [(None, None)] * len(TEXTS))
    return [
        PatchPair(clean, corrupted, answer, wrong, *((None, None) if answer else ("pos", "neg")), i + 1)
        for i, ((clean, corrupted), (answer, wrong)) in enumerate(zip(TEXTS, chosen, strict=True))
    ]


@pytest.fixture(scope="module")
def models(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    return tiny_models_by_type(tiny_model_dirs)


def ids_of(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer(text)["input_ids"]


def continuation(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer(text, add_special_tokens=False)["input_ids"]


def forward(
    loaded: LoadedModel, ids: list[int], hook: Callable[..., object] | None = None, layer: int = 0
) -> torch.Tensor:
    """[tokens, vocabulary] (a classifier: [labels]) double logits of one plain forward pass of ``ids``,
    with ``hook`` a forward pre-hook on ``layer``'s output projection."""
    handle = None if hook is None else output_projection(loaded, layer).register_forward_pre_hook(hook)
    try:
        inputs = torch.tensor([ids])
        logits = loaded.model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits[0]
    finally:
        if handle is not None:
            handle.remove()
    return logits.double()


def answer_log_prob(loaded: LoadedModel, prompt: list[int], answer: list[int], **hooked: object) -> float:
    """log p(answer | prompt) under teacher forcing: the log-softmax of each answer token at the position
    before it, summed."""
    logits = forward(loaded, prompt + answer[:-1], **hooked)  # type: ignore[arg-type]
    log_p = torch.log_softmax(logits, -1)
    return sum(float(log_p[len(prompt) - 1 + i, token]) for i, token in enumerate(answer))


def head_outputs(loaded: LoadedModel, ids: list[int], layer: int) -> torch.Tensor:
    """[1, tokens, hidden] the input of ``layer``'s output projection in a plain pass of ``ids``."""
    kept: list[torch.Tensor] = []
    forward(loaded, ids, lambda _, args: kept.append(args[0].clone()), layer)
    return kept[0]


def swap_head(source: torch.Tensor, head: int, d: int) -> Callable[..., tuple[torch.Tensor]]:
    """A pre-hook putting ``source``'s head ``head`` (at ``source``'s positions, the first ones) in."""

    def hook(_: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        patched = args[0].clone()
        span = source.shape[1]
        patched[:, :span, head * d : (head + 1) * d] = source[:, :, head * d : (head + 1) * d]
        return (patched,)

    return hook


@pytest.mark.parametrize(
    ("model_type", "metric"),
    [
        ("llama", "logit-diff"),
        ("llama", "prob-diff"),
        ("llama", "kl"),
        ("bert", "logit-diff"),
        ("bert", "prob-diff"),
    ],
)
def test_each_metric_of_exact_patching_equals_a_plain_forward_pass_per_head(
    model_type: str, metric: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    pairs = pairs_for(model_type)
    study = patch(loaded, pairs, metric=metric)  # type: ignore[arg-type]
    result = study.exact
    assert result is not None and result.metric == metric
    expected = reference_head_patching(loaded, pairs, metric=metric)
    np.testing.assert_allclose(result.ld_patched, expected, atol=1e-5)
    assert np.ptp(expected) > 1e-4  # the heads' patches differ: the comparison can fail
    # the effect: (mean m_patched - mean m_corrupted) / (mean m_clean - mean m_corrupted); for KL, whose
    # clean value is 0, 1 - mean KL_patched / mean KL_corrupted
    # (both sides times the denominator)
    corrupted = result.ld_corrupted.mean()
    if metric == "kl":
        np.testing.assert_allclose(result.ld_clean, 0, atol=1e-6)
        np.testing.assert_allclose(result.effect * corrupted, corrupted - expected.mean(-1), atol=1e-5)
    else:
        gap = result.ld_clean.mean() - corrupted
        np.testing.assert_allclose(result.effect * gap, expected.mean(-1) - corrupted, atol=1e-5)


def test_the_default_metric_is_the_logit_difference(models: Callable[[str], LoadedModel]) -> None:
    loaded = models("llama")
    default, named = patch(loaded, pairs_for("llama")), patch(loaded, pairs_for("llama"), metric="logit-diff")
    assert default.exact is not None and named.exact is not None and default.exact.metric == "logit-diff"
    np.testing.assert_array_equal(default.exact.ld_patched, named.exact.ld_patched)
    with pytest.raises(BertologyError, match="Unknown patching metric 'loss'; choose one of logit-diff"):
        patch(loaded, pairs_for("llama"), metric="loss")  # type: ignore[arg-type]


@pytest.mark.parametrize("metric", ["prob-diff", "kl"])
def test_attribution_patching_takes_the_gradient_of_the_metric(
    metric: str, models: Callable[[str], LoadedModel]
) -> None:
    """(clean - corrupted head output) . d metric / d head output at the corrupted run, by torch.autograd on
    the metric computed here from the logits."""
    loaded = models("llama")
    pairs = pairs_for("llama")
    study = patch(loaded, pairs, method="attribution", metric=metric)  # type: ignore[arg-type]
    assert study.attribution is not None
    d = loaded.model.config.hidden_size // loaded.num_heads
    for index, pair in enumerate(pairs):
        answer, wrong = answer_ids(loaded, pair)
        clean_ids, corrupted_ids = ids_of(loaded, pair.clean), ids_of(loaded, pair.corrupted)
        kept: list[torch.Tensor] = []
        handles = [
            output_projection(loaded, layer).register_forward_pre_hook(
                lambda _, args, kept=kept: kept.append(args[0])
            )
            for layer in range(loaded.num_layers)
        ]
        with torch.enable_grad():
            logits = forward(loaded, corrupted_ids)[-1]
        for handle in handles:
            handle.remove()
        clean = forward(loaded, clean_ids)[-1].detach()
        if metric == "prob-diff":
            value = torch.softmax(logits, -1)[answer] - torch.softmax(logits, -1)[wrong]
        else:
            p_clean = torch.softmax(clean, -1)
            value = (p_clean * (torch.log_softmax(clean, -1) - torch.log_softmax(logits, -1))).sum()
        gradients = torch.autograd.grad(value, kept)
        expected = np.zeros((loaded.num_layers, loaded.num_heads))
        for layer in range(loaded.num_layers):
            change = (head_outputs(loaded, clean_ids, layer) - kept[layer].detach()) * gradients[layer]
            expected[layer] = change[0].reshape(-1, loaded.num_heads, d).sum((0, 2)).detach().numpy()
        found = study.attribution.ld_patched[..., index] - study.attribution.ld_corrupted[index]
        np.testing.assert_allclose(found, expected, atol=1e-5, rtol=1e-4)
        assert np.abs(expected).max() > 1e-5


def test_path_patching_reads_the_metric_chosen(models: Callable[[str], LoadedModel]) -> None:
    """Path patching scores through the same metric: its clean and corrupted KL are activation patching's,
    and its patched run's KL is the KL, computed here, of a run with the receivers' inputs replaced."""
    loaded = models("llama")
    pairs = pairs_for("llama")
    study = patch(loaded, pairs, metric="kl")
    path = path_patch(loaded, pairs, [(0, 1)], [(1, 0, "q")], metric="kl")
    assert study.exact is not None and path.metric == "kl"
    np.testing.assert_allclose(path.ld_clean, 0, atol=1e-6)
    np.testing.assert_allclose(path.ld_corrupted, study.exact.ld_corrupted, atol=1e-6)
    default = path_patch(loaded, pairs, [(0, 1)], [(1, 0, "q")])
    # the same patched runs, read by two metrics: both move off the corrupted run or neither does
    assert (np.abs(default.ld_patched - default.ld_corrupted) > 1e-6).tolist() == (
        np.abs(path.ld_patched - path.ld_corrupted) > 1e-6
    ).tolist()


def test_an_answer_of_several_tokens_scores_the_sum_of_its_log_probabilities(
    models: Callable[[str], LoadedModel],
) -> None:
    """``answer`` " week" (two tokens of the tiny llama), ``wrong`` " dog" (one): each scored by teacher
    forcing, log p(answer) = sum_i log_softmax(logits at the position before answer token i)[token i];
    patching acts at the texts' positions only (a head's clean output there, by a plain pass of the clean
    text alone: a causal decoder's activations there do not depend on what follows)."""
    loaded = models("llama")
    pairs = pairs_for("llama", (" week", " dog"))
    week, dog = continuation(loaded, " week"), continuation(loaded, " dog")
    assert len(week) == 2 and len(dog) == 1
    d = loaded.model.config.hidden_size // loaded.num_heads
    studies = {metric: patch(loaded, pairs, metric=metric) for metric in ("logit-diff", "prob-diff")}
    for index, pair in enumerate(pairs):
        clean_ids, corrupted_ids = ids_of(loaded, pair.clean), ids_of(loaded, pair.corrupted)
        with torch.no_grad():
            clean = [answer_log_prob(loaded, clean_ids, tokens) for tokens in (week, dog)]
            corrupted = [answer_log_prob(loaded, corrupted_ids, tokens) for tokens in (week, dog)]
            patched = np.zeros((loaded.num_layers, loaded.num_heads, 2))
            for layer in range(loaded.num_layers):
                source = head_outputs(loaded, clean_ids, layer)
                for head in range(loaded.num_heads):
                    hooked = {"hook": swap_head(source, head, d), "layer": layer}
                    patched[layer, head] = [
                        answer_log_prob(loaded, corrupted_ids, tokens, **hooked) for tokens in (week, dog)
                    ]
        ld, pd = studies["logit-diff"].exact, studies["prob-diff"].exact
        assert ld is not None and pd is not None
        assert ld.ld_clean[index] == pytest.approx(clean[0] - clean[1], abs=1e-5)
        assert ld.ld_corrupted[index] == pytest.approx(corrupted[0] - corrupted[1], abs=1e-5)
        np.testing.assert_allclose(ld.ld_patched[..., index], patched[..., 0] - patched[..., 1], atol=1e-5)
        probabilities = np.exp(patched)  # small (about 1e-5 and less): compared relatively
        np.testing.assert_allclose(
            pd.ld_patched[..., index], probabilities[..., 0] - probabilities[..., 1], rtol=1e-4, atol=0
        )
        assert np.ptp(patched[..., 0]) > 1e-4
    assert studies["logit-diff"].labels[0] == (loaded.tokenizer.decode(week), loaded.tokenizer.decode(dog))


def test_an_answer_of_several_tokens_keeps_the_grid_on_the_texts_positions(
    models: Callable[[str], LoadedModel],
) -> None:
    """Per-position patching with a two-token answer: the grid has the text's positions (not the appended
    answer's), and attribution's estimate sums a pair's answer and wrong-answer rows."""
    loaded = models("llama")
    pairs = pairs_for("llama", (" week", " dog"))[:1]
    tokens = len(ids_of(loaded, pairs[0].clean))
    study = patch(loaded, pairs, site="resid_pre", granularity="position", method="both")
    assert study.exact is not None and study.attribution is not None
    assert (
        study.exact.ld_patched.shape == study.attribution.ld_patched.shape == (loaded.num_layers, tokens, 1)
    )
    # the residual stream before layer 0 at the one differing token is the whole difference of the inputs
    differing = [i for i, (a, b) in enumerate(zip(*study.tokens[0], strict=True)) if a != b]
    assert len(differing) == 1
    np.testing.assert_allclose(study.exact.ld_patched[0, differing[0]], study.exact.ld_clean, atol=1e-5)


def test_prepend_bos_puts_one_bos_token_first(models: Callable[[str], LoadedModel]) -> None:
    """The tiny gpt2's tokenizer adds no BOS token: with ``prepend_bos`` each input starts with exactly one
    more token, its BOS; the tiny llama's adds one already, which stays the only one; a tokenizer without a
    BOS token (the tiny qwen2's) and a classifier are refused."""
    gpt2 = models("gpt2")
    pairs = pairs_for("gpt2")
    bos = gpt2.tokenizer.bos_token_id
    plain, with_bos = encode_pairs(gpt2, pairs), encode_pairs(gpt2, pairs, prepend_bos=True)
    for before, after in zip(plain.groups, with_bos.groups, strict=True):
        for run in ("clean", "corrupted"):
            ids, prepended = getattr(before, run)["input_ids"], getattr(after, run)["input_ids"]
            assert bool((ids[:, 0] != bos).all())
            assert torch.equal(prepended, torch.cat([torch.full_like(ids[:, :1], bos), ids], 1))
    assert with_bos.tokens[0][0] == [gpt2.tokenizer.bos_token, *plain.tokens[0][0]]
    default, prepended_study = patch(gpt2, pairs), patch(gpt2, pairs, prepend_bos=True)
    assert default.exact is not None and prepended_study.exact is not None
    assert np.abs(default.exact.ld_clean - prepended_study.exact.ld_clean).max() > 1e-4
    llama = models("llama")
    llama_pairs = pairs_for("llama")
    (group,), (same,) = (
        encode_pairs(llama, llama_pairs[:1]).groups,
        encode_pairs(llama, llama_pairs[:1], prepend_bos=True).groups,
    )
    assert int(group.clean["input_ids"][0, 0]) == llama.tokenizer.bos_token_id
    assert torch.equal(group.clean["input_ids"], same.clean["input_ids"])
    qwen2 = models("qwen2")
    assert qwen2.tokenizer.bos_token_id is None
    with pytest.raises(BertologyError, match="tokenizer has no BOS token to prepend"):
        encode_pairs(qwen2, pairs_for("gpt2"), prepend_bos=True)
    with pytest.raises(BertologyError, match="--prepend-bos is for a language model's pairs"):
        encode_pairs(models("bert"), pairs_for("bert"), prepend_bos=True)


def test_patch_command_takes_the_metric_and_prepend_bos(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """``--metric kl --prepend-bos``: summary.json and the report name the metric; the clean run's KL from
    itself is 0."""
    pairs = tmp_path / "pairs.jsonl"
    records = [{"clean": c, "corrupted": k, "answer": " the", "wrong": " next"} for c, k in TEXTS]
    pairs.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    output = tmp_path / "out"
    arguments = [str(tiny_model_dirs["gpt2"]), str(pairs), "-o", str(output)]
    result = CliRunner().invoke(app, ["patch", *arguments, "--metric", "kl", "--prepend-bos"])
    assert result.exit_code == 0, result.output
    assert "Mean KL clean 0.000" in result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["metric"] == "kl" and "KL(p_clean || p)" in summary["metric_description"]
    assert summary["ld_clean"] == pytest.approx(0, abs=1e-6) and summary["ld_corrupted"] > 0
    report = (output / "report.html").read_text()
    assert "mean KL corrupted" in report and "mean KL_patched - mean KL_corrupted" in report
    refused = CliRunner().invoke(app, ["patch", *arguments, "--metric", "loss"])
    assert refused.exit_code == 2 and "loss" in refused.output

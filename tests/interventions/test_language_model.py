"""Head interventions on decoders by the language-model loss, checked against hand-written hooks on the
output projection's input (tiny random decoders with grouped-query attention: 4 query heads, 2 key/value
heads).

Tolerances: a sequence's summed loss from float32 logits against a float64 log-sum-exp written here, atol
1e-9 per predicted token (the loss is computed in float64 from the float32 logits: exact to float64
rounding); losses of order 1 to 10 through gates or hooks, in padded batches
against one sequence at a time, rtol 1e-5 (float32 sums reordered), the same full pass rel 1e-6;
importance against autograd per sequence, rtol 1e-4 with atol 1e-7 (gradients of two float32 graphs);
a pruned decoder's loss against the gated one, abs 1e-5 (smaller matrices, sums of other lengths), saved
and reloaded 1e-6 (the same weights).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_models import (
    DECODERS,
    llama_output_projections,
    tiny_grouped_query_llama,
    tiny_language_model,
)
from typer.testing import CliRunner

from bertology import BertologyError
from bertology.cli import app
from bertology.corpus.segments import sample_corpus
from bertology.interventions.ablation import ablation_sweep
from bertology.interventions.curves import pruning_curve
from bertology.interventions.importance import head_importance
from bertology.interventions.language_model import (
    LanguageModelTask,
    TokenSequences,
    language_model_loss,
    next_token_losses,
)
from bertology.interventions.pruning import prune_and_measure, save_model
from bertology.models.loading import LoadedModel, load_model

#: Relative tolerance of a loss (~10 nats per token here) from the same float32 forward passes batched
#: differently (padded batches against one sequence at a time, gates against hooks): logits differ by a few
#: u |logit| (u = 2^-24 ~ 6e-8), ~1e-6 of the loss at most once averaged in float64; 1e-5 leaves a margin.
LOSS_REORDERED = 1e-5
#: The same loss computed again by another entry point over the same batches: equal in practice (seen
#: exactly); rel 1e-6 only allows a different batch split.
LOSS_RECOMPUTED = 1e-6


@pytest.fixture(scope="module")
def llama(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_grouped_query_llama(tiny_model_dirs["llama"])


@pytest.fixture(scope="module")
def corpus(llama: LoadedModel) -> TokenSequences:
    return TokenSequences.of_corpus(llama, sample_corpus(), max_length=24, max_segments=5)


@contextmanager
def scaled_heads(loaded: LoadedModel, scales: Callable[[int], torch.Tensor]) -> Iterator[None]:
    """Each layer's o_proj input [batch, tokens, heads * d] times ``scales(layer)`` ([heads] or [batch,
    heads]), by a forward pre-hook written here."""
    d = loaded.model.config.head_dim

    def hook_for(layer: int) -> Callable[..., tuple[torch.Tensor]]:
        def hook(_: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
            factor = scales(layer)
            per_head = factor.repeat_interleave(d, dim=-1)
            return (args[0] * (per_head if per_head.dim() == 1 else per_head[:, None, :]),)

        return hook

    handles = [
        o.register_forward_pre_hook(hook_for(layer))
        for layer, o in enumerate(llama_output_projections(loaded))
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def hand_losses(loaded: LoadedModel, data: TokenSequences) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (one at a time, no padding): the summed next-token -log p and the number of tokens."""
    sums, counts = [], []
    for ids in data.ids:
        tokens = torch.as_tensor(ids)[None]
        logits = loaded.model(input_ids=tokens, use_cache=False).logits[0, :-1]
        log_probs = torch.log_softmax(logits.double(), -1)
        sums.append(-log_probs[torch.arange(len(ids) - 1), tokens[0, 1:]].sum())
        counts.append(len(ids) - 1)
    return torch.stack(sums), torch.tensor(counts, dtype=torch.float64)


def test_corpus_is_read_as_decoder_segments(llama: LoadedModel, corpus: TokenSequences) -> None:
    assert len(corpus) == 5 and all(2 <= len(ids) <= 24 for ids in corpus.ids)
    assert corpus.origins[0].startswith("sample_corpus.txt:")
    assert corpus.ids[0][0] == llama.tokenizer.bos_token_id
    assert corpus.predicted_tokens == sum(len(ids) - 1 for ids in corpus.ids)


def test_loss_is_the_mean_next_token_cross_entropy(llama: LoadedModel, corpus: TokenSequences) -> None:
    with torch.no_grad():
        sums, counts = hand_losses(llama, corpus)
    # batches of 2 pad the shorter sequences: padding must not count
    assert language_model_loss(llama, corpus, batch_size=2) == pytest.approx(
        float(sums.sum() / counts.sum()), rel=LOSS_REORDERED
    )


def test_next_token_losses_are_exact_on_a_large_vocabulary() -> None:
    """Float32 logits over a SmolLM2-sized vocabulary (49,152), scored against a float64 log-sum-exp written
    here: a float32 cross-entropy is off by about 7e-5 nats per token on these, the exact one by < 1e-9."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 40, 49152, generator=generator) * 4 + 20
    ids = torch.randint(0, 49152, (2, 40), generator=generator)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    sums, counts = next_token_losses(logits, ids, mask, chunk=16)
    table = logits.double().numpy()
    expected = []
    for row, length in enumerate((40, 30)):
        scores = table[row, : length - 1]
        top = scores.max(1, keepdims=True)
        log_sum_exp = top[:, 0] + np.log(np.exp(scores - top).sum(1))
        targets = ids[row, 1:length].numpy()
        expected.append(float((log_sum_exp - scores[np.arange(length - 1), targets]).sum()))
    assert counts.tolist() == [39, 29]
    # Both float64 log-sum-exps of the same float32 logits: < 1e-9 nats per token (the docstring's bound,
    # a few ulps of the ~20-nat terms plus the float64 exp sums) over at most 39 tokens.
    np.testing.assert_allclose(sums.numpy(), expected, rtol=0, atol=1e-9 * 39)


def test_single_head_ablation_equals_zeroing_its_output_by_hand(
    llama: LoadedModel, corpus: TokenSequences
) -> None:
    ablation = ablation_sweep(LanguageModelTask(llama, corpus), batch_size=2)
    expected = np.empty((2, 4))
    for layer, head in np.ndindex(2, 4):
        keep = torch.ones(4)
        keep[head] = 0
        with (
            torch.no_grad(),
            scaled_heads(llama, lambda at, keep=keep, layer=layer: keep if at == layer else torch.ones(4)),
        ):
            sums, counts = hand_losses(llama, corpus)
        expected[layer, head] = float(sums.sum() / counts.sum())
    np.testing.assert_allclose(ablation.scores, expected, rtol=LOSS_REORDERED)
    assert ablation.count == corpus.predicted_tokens
    assert ablation.baseline == pytest.approx(language_model_loss(llama, corpus), rel=LOSS_RECOMPUTED)
    assert np.ptp(ablation.change) > 1e-3  # the heads matter unequally
    frame = ablation.to_frame()
    assert list(frame.columns) == ["layer", "head", "loss", "change"] and len(frame) == 8
    assert ablation.removal_order()[0] == tuple(np.unravel_index(np.argmin(expected), expected.shape))


def test_importance_equals_autograd_on_a_hand_written_gate(
    llama: LoadedModel, corpus: TokenSequences
) -> None:
    importance = head_importance(LanguageModelTask(llama, corpus), batch_size=3)
    magnitudes = []
    for index in range(len(corpus)):
        gate = torch.ones(2, 4, dtype=torch.float32, requires_grad=True)
        with scaled_heads(llama, lambda layer, gate=gate: gate[layer]):
            sums, counts = hand_losses(llama, corpus.part(index, index + 1))
        (gradient,) = torch.autograd.grad((sums / counts).sum(), gate)
        magnitudes.append(gradient.abs().double().numpy())
    # float32 backward passes of 3 sequences against 1: gradients summed over tokens in another order
    # (seen <= 1e-7 relative); rtol 1e-4 is generous, atol for a gate whose gradient nearly cancels.
    np.testing.assert_allclose(importance.raw, np.mean(magnitudes, axis=0), rtol=1e-4, atol=1e-7)
    assert importance.examples == 5 and (importance.raw > 0).all()


def test_pruning_curve_ends_with_every_head_removed(llama: LoadedModel, corpus: TokenSequences) -> None:
    order = [(1, 3), (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    curve = pruning_curve(LanguageModelTask(llama, corpus), order, [0, 1, 8])
    assert curve[0] == pytest.approx(language_model_loss(llama, corpus), rel=LOSS_RECOMPUTED)
    with torch.no_grad():
        with scaled_heads(llama, lambda layer: torch.tensor([1.0, 1, 1, 0]) if layer == 1 else torch.ones(4)):
            one = hand_losses(llama, corpus)
        with scaled_heads(llama, lambda layer: torch.zeros(4)):
            none = hand_losses(llama, corpus)
    assert curve[1] == pytest.approx(float(one[0].sum() / one[1].sum()), rel=LOSS_REORDERED)
    assert curve[2] == pytest.approx(float(none[0].sum() / none[1].sum()), rel=LOSS_REORDERED)


#: Heads removed: layer 0 loses one query head of key/value head 0 (which keeps a zeroed filler, as key/value
#: head 1 keeps two query heads), layer 1 both query heads of key/value head 0 (removed with them).
REMOVED = {(0, 1), (1, 0), (1, 1)}


@pytest.mark.parametrize("model_type", DECODERS)
def test_pruned_decoder_equals_the_gated_one(
    model_type: str, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    loaded = tiny_language_model(tiny_model_dirs[model_type])
    data = TokenSequences.of_texts(loaded, ["The quick brown fox jumps over the lazy dog.", "She said that"])
    kv = loaded.model.config.num_key_value_heads
    pruned, outcome = prune_and_measure(LanguageModelTask(loaded, data), REMOVED, batch_size=8, repeats=1)
    assert outcome.largest_difference < 1e-5
    # Smaller projections in place of zeroed heads: float32 sums reordered, ~u |loss| with |loss| <= ~20 nats
    # -> ~1e-6 (seen 7e-7); 1e-5 leaves a margin.
    assert outcome.value == pytest.approx(outcome.gated, abs=1e-5)
    assert abs(outcome.value - outcome.baseline) > 1e-4  # the heads removed mattered
    attention = [layer.self_attn for layer in pruned.model.model.layers]
    d = loaded.model.config.head_dim
    if kv == 2:  # layer 0: 4 query slots (one zeroed filler), 2 k/v heads; layer 1: heads 2, 3 and k/v head 1
        assert [(a.q_proj.out_features // d, a.k_proj.out_features // d) for a in attention] == [
            (4, 2),
            (2, 1),
        ]
        assert outcome.total_key_value_heads - outcome.key_value_heads == 1
    else:  # Gemma's one key/value head keeps heads 0, 2, 3 in layer 0 and 2, 3 in layer 1
        assert [(a.q_proj.out_features // d, a.k_proj.out_features // d) for a in attention] == [
            (3, 1),
            (2, 1),
        ]
    assert [a.num_key_value_groups for a in attention] == ([2, 2] if kv == 2 else [3, 2])
    assert outcome.parameters < outcome.baseline_parameters
    save_model(pruned, tmp_path)
    reloaded = load_model(tmp_path, language_model=True)
    # Exact by construction (float32 weights saved losslessly, the same computation); 1e-6 hides nothing.
    assert language_model_loss(reloaded, data) == pytest.approx(outcome.value, abs=1e-6)


def test_an_encoder_has_no_language_model_loss(default_model: LoadedModel) -> None:
    with pytest.raises(BertologyError, match="needs a decoder with its language-modelling head"):
        language_model_loss(default_model, TokenSequences.of_ids([[1, 2, 3]]))
    with pytest.raises(BertologyError, match="needs a decoder or encoder-decoder language model"):
        load_model(None, language_model=True)


def test_ablate_command_on_a_language_model(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "ablation"
    arguments = [
        "ablate",
        str(tiny_model_dirs["qwen2"]),
        "--lm-corpus",
        str(sample_corpus()),
        "-o",
        str(output),
    ]
    result = CliRunner().invoke(
        app, [*arguments, "--max-segments", "3", "--max-len", "20", "--prune", "0.25"]
    )
    assert result.exit_code == 0, result.output
    assert "Language-model loss" in result.output and "Pruned 2 heads" in result.output
    ablation = pd.read_csv(output / "ablation.csv")
    assert list(ablation.columns) == ["layer", "head", "loss", "change"] and len(ablation) == 8
    assert list(pd.read_csv(output / "importance.csv").columns) == [
        "layer", "head", "importance", "importance_normalized"
    ]  # fmt: skip
    curve = pd.read_csv(output / "pruning_curve.csv")
    assert curve["heads_removed"].tolist() == [0, 3, 8]
    assert curve["loss_by_ablation"][0] == curve["loss_by_importance"][0] == curve["loss_at_random"][0]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["sequences"] == 3 and summary["pruning"]["heads_removed"] == 2
    assert summary["pruning"]["largest_logit_difference_to_gated"] < 1e-4
    for name in ("ablation", "importance", "pruning_curve"):
        assert (output / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    report = (output / "report.html").read_text()
    assert "Single-head ablation" in report and "Structural pruning" in report and "nats per token" in report
    assert (output / "pruned" / "model" / "config.json").is_file()


def test_ablate_command_on_gpt2_ablates_but_refuses_to_prune_its_conv1d_heads(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    arguments = ["ablate", str(tiny_model_dirs["gpt2"]), "--lm-corpus", str(sample_corpus())]
    small = ["--max-segments", "3", "--max-len", "20"]
    refused = CliRunner().invoke(app, [*arguments, *small, "-o", str(tmp_path / "pruned")])
    assert isinstance(refused.exception, BertologyError)  # the command line prints it as one sentence
    assert "'gpt2' model's are Conv1D modules, so its heads can be gated or ablated but not removed" in str(
        refused.exception
    )
    assert not (tmp_path / "pruned" / "ablation.csv").exists()
    output = tmp_path / "ablation"
    result = CliRunner().invoke(
        app, [*arguments, *small, "--prune", "0", "--ablation", "mean", "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    ablation = pd.read_csv(output / "ablation.csv")
    assert len(ablation) == 8 and ablation["change"].abs().max() > 0


def test_ablate_takes_either_a_task_or_a_corpus(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    neither = CliRunner().invoke(app, ["ablate", str(tiny_model_dirs["llama"]), "-o", str(tmp_path / "a")])
    assert neither.exit_code == 2 and "either --task" in neither.output
    missing = tmp_path / "missing.txt"
    result = CliRunner().invoke(app, ["ablate", "x", "--lm-corpus", str(missing), "-o", str(tmp_path / "b")])
    assert result.exit_code == 2 and "does not exist" in result.output

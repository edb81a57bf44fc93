"""Capture equals transformers' own eager attention, for every supported architecture and the real model.

Tolerances: captured weights against transformers' own eager pass or a softmax recomputed here: the same
float32 computation blocked differently (batch, padding, threads), so weights <= 1 differ by a few units of
2^-24 per layer; atol 1e-6 where the inputs are identical, 1e-5 across batch shapes; rows sum to 1 within
1e-5 (a float32 sum of up to a few hundred weights).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import ARCHITECTURES
from transformers import AutoModel

import bertology
from bertology.models.loading import LoadedModel

PAIRS = [
    ("Unbelievably, the quick fox jumps.", "The store is near the riverbank."),
    ("I went to the store.", "At the store, I bought fresh strawberries."),
]


def _reference_attention(directory: Path | str, loaded: LoadedModel, encoded: dict) -> torch.Tensor:
    """[batch, layers, heads, n, n] from an independently loaded eager model with output_attentions."""
    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    accepted = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if loaded.model_type == "distilbert":
        accepted.pop("token_type_ids", None)
    with torch.no_grad():
        return torch.stack(reference(**accepted, output_attentions=True).attentions, dim=1)


def _check_against_eager(directory: Path | str, loaded: LoadedModel) -> None:
    batch = bertology.capture_batch([a for a, _ in PAIRS], [b for _, b in PAIRS], model=loaded, qk=True)
    expected = _reference_attention(directory, loaded, batch.encoded.model_inputs)
    assert batch.probs.shape == expected.shape
    for index, example in enumerate(batch):
        n = len(example.tokens)
        assert example.probs.shape == (loaded.num_layers, loaded.num_heads, n, n)
        # BERT-style attention scales the query, not the scores: equal to float32 rounding (rtol 1e-5).
        np.testing.assert_allclose(example.probs, expected[index, :, :, :n, :n].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(example.probs.sum(-1), 1.0, atol=1e-5)

    # softmax(q·k * scaling + mask), recomputed from the captured q and k over the padded batch.
    mask = batch.encoded.model_inputs["attention_mask"]
    additive = (1.0 - mask[:, None, None, None, :].float()) * torch.finfo(torch.float32).min
    scores = torch.einsum("blhqd,blhkd->blhqk", batch.queries, batch.keys)
    scores = scores * torch.tensor(batch.scaling, dtype=torch.float32)[None, :, None, None, None]
    recomputed = torch.softmax(scores + additive, dim=-1)
    for index, n in enumerate(batch.lengths):
        np.testing.assert_allclose(
            recomputed[index, :, :, :n, :n].numpy(), batch.probs[index, :, :, :n, :n].numpy(), atol=1e-5
        )


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_capture_equals_eager_for_each_architecture(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    directory = tiny_model_dirs[architecture]
    loaded = bertology.load_model(directory)
    assert loaded.model_type == architecture
    _check_against_eager(directory, loaded)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_capture_stops_the_pass_after_the_last_attention(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    """Nothing after the last layer's attention runs (its feed-forward block), yet every layer is
    captured; a plain forward pass on the same model runs every layer's feed-forward block."""
    loaded = bertology.load_model(tiny_model_dirs[architecture])
    calls: list[str] = []
    for name, module in loaded.model.named_modules():
        if name.endswith(("output.dense", "ffn.lin2", "ffn_output")):  # each layer's last linear map
            module.register_forward_hook(lambda *_, name=name: calls.append(name))
    batch = bertology.capture_batch([PAIRS[0][0]], model=loaded)
    captured = len(calls)
    calls.clear()
    with torch.no_grad():
        loaded.model(**loaded.model_inputs(batch.encoded))
    assert batch.probs.shape[1] == loaded.num_layers
    assert len(calls) % loaded.num_layers == 0 and len(calls) > 0
    assert captured == len(calls) // loaded.num_layers * (loaded.num_layers - 1)


def test_capture_equals_eager_on_default_model(default_model: LoadedModel) -> None:
    from bertology.models.loading import default_model_path

    assert default_model.num_layers == 6 and default_model.num_heads == 12
    _check_against_eager(default_model_path(), default_model)


def test_word_split_into_pieces_maps_to_one_word(default_model: LoadedModel) -> None:
    attention = bertology.capture("I bought fresh strawberries.", model=default_model)
    assert attention.tokens == ["[CLS]", "i", "bought", "fresh", "straw", "##berries", ".", "[SEP]"]
    assert attention.words == ["I", "bought", "fresh", "strawberries."]
    assert attention.word_ids.tolist() == [-1, 0, 1, 2, 3, 3, 3, -1]
    assert attention.special.tolist() == [True] + [False] * 6 + [True]


def test_presplit_words_are_kept(default_model: LoadedModel) -> None:
    words = ["Unbelievably", ",", "New", "York", "won", "."]
    attention = bertology.capture(words, model=default_model)
    assert attention.words == words
    pieces_of = {
        w: [t for t, i in zip(attention.tokens, attention.word_ids, strict=True) if i == k]
        for k, w in enumerate(words)
    }
    assert "".join(pieces_of["Unbelievably"]).replace("##", "") == "unbelievably"
    assert len(pieces_of["Unbelievably"]) > 1
    assert pieces_of["York"] == ["york"]


@pytest.mark.parametrize("architecture", ["roberta", "xlm-roberta", "albert"])
def test_alignment_for_bpe_and_sentencepiece(architecture: str, tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(tiny_model_dirs[architecture])
    attention = bertology.capture("Unbelievably, the fox jumps.", model=loaded)
    text = "Unbelievably, the fox jumps."
    word_spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    offsets = loaded.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    for (start, end), word in zip(offsets, attention.word_ids, strict=True):
        if word >= 0 and end > start:  # every real token lies inside its word (or the space before it)
            word_start, word_end = word_spans[word]
            assert word_start - 1 <= start and end <= word_end, (start, end, word)
    assert sorted(set(attention.word_ids.tolist()) - {-1}) == list(range(len(word_spans)))


def test_pair_segment_ids_match_bert_token_types(default_model: LoadedModel) -> None:
    a, b = PAIRS[1]
    attention = bertology.capture(a, b, model=default_model)
    token_types = default_model.tokenizer(a, b)["token_type_ids"]
    assert attention.segment_ids.tolist() == token_types
    assert attention.is_pair
    assert attention.word_segments.tolist() == [0] * 5 + [1] * 7


def test_pair_segment_ids_roberta_layout(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(tiny_model_dirs["roberta"])
    attention = bertology.capture("the fox", "the store", model=loaded)
    tokens, segments = attention.tokens, attention.segment_ids.tolist()
    second_start = tokens.index("</s>") + 2  # <s> A </s></s> B </s>
    assert tokens[second_start - 2 : second_start] == ["</s>", "</s>"]
    assert segments == [0] * second_start + [1] * (len(tokens) - second_start)


def test_truncation_warns_with_count(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(tiny_model_dirs["bert"])  # at most 64 tokens
    text = " ".join(["word"] * 100)  # 100 word tokens + [CLS] + [SEP]
    with pytest.warns(bertology.TruncationWarning, match=r"102 tokens .* at most 64; 38 tokens were cut"):
        attention = bertology.capture(text, model=loaded)
    assert len(attention.tokens) == 64 and attention.truncated == 38
    assert attention.tokens[-1] == "[SEP]"


def test_long_input_at_512_tokens_on_default_model(default_model: LoadedModel) -> None:
    text = " ".join(["attention"] * 600)
    with pytest.warns(bertology.TruncationWarning, match="90 tokens were cut"):
        attention = bertology.capture(text, model=default_model)
    assert attention.probs.shape == (6, 12, 512, 512)


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_a_clear_error(text: str, default_model: LoadedModel) -> None:
    with pytest.raises(bertology.BertologyError, match="empty or only whitespace"):
        bertology.capture(text, model=default_model)
    with pytest.raises(bertology.BertologyError, match="Second text 0 is empty"):
        bertology.capture("fine", text, model=default_model)


def test_concurrent_captures_do_not_mix(default_model: LoadedModel) -> None:
    texts = ["The cat sat on the mat.", "Colourless green ideas sleep furiously tonight in Paris."]
    expected = {text: bertology.capture(text, model=default_model).probs for text in texts}
    results: dict[tuple[int, str], np.ndarray] = {}

    def work(worker: int) -> None:
        for repeat in range(5):
            text = texts[(worker + repeat) % 2]
            results[(worker * 10 + repeat, text)] = bertology.capture(text, model=default_model).probs

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20
    for (_, text), probs in results.items():
        np.testing.assert_allclose(probs, expected[text], atol=1e-6)


def test_mixed_batch_of_pairs_and_single_texts_equals_separate_captures(default_model: LoadedModel) -> None:
    texts = ["I went to the store.", "A single sentence with strawberries.", "The cat sat."]
    seconds = ["At the store, I bought fresh strawberries.", None, "It was happy."]
    batch = bertology.capture_batch(texts, seconds, model=default_model, pad_to_multiple_of=16)
    assert batch.probs.shape[-1] % 16 == 0
    for index, (a, b) in enumerate(zip(texts, seconds, strict=True)):
        alone = bertology.capture(a, b, model=default_model)
        mixed = batch[index]
        assert mixed.tokens == alone.tokens
        assert mixed.segment_ids.tolist() == alone.segment_ids.tolist()
        assert mixed.word_ids.tolist() == alone.word_ids.tolist()
        np.testing.assert_allclose(mixed.probs, alone.probs, atol=1e-5)


def test_one_input_is_numpy_on_the_host_and_a_batch_stays_where_the_model_ran(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """The array rule (bertology.attention.capturing's docstring, README "Capture and views"): one input's
    arrays are float32 numpy, a batch's torch tensors on the model's device, in its dtype (bfloat16 here, so a
    batch brought to float32 by mistake, or an input left in torch, shows) but for the float32 value norms."""
    loaded = bertology.load_model(tiny_model_dirs["bert"], dtype="bfloat16")
    batch = bertology.capture_batch(*zip(*PAIRS, strict=True), model=loaded, qk=True, weights="norm")
    for tensor in (batch.probs, batch.queries, batch.keys, batch.value_norms):
        assert isinstance(tensor, torch.Tensor) and tensor.device == loaded.device
    assert batch.probs.dtype == batch.queries.dtype == batch.keys.dtype == torch.bfloat16
    assert batch.value_norms.dtype == torch.float32
    single = bertology.capture(*PAIRS[1], model=loaded, qk=True, weights="norm")
    for attention in (single, batch[1], next(iter(batch))):
        for array in (attention.probs, attention.queries, attention.keys, attention.value_norms):
            assert isinstance(array, np.ndarray) and array.dtype == np.float32
    n = len(single.tokens)
    np.testing.assert_array_equal(batch[1].probs, batch.probs[1, :, :, :n, :n].float().numpy())
    np.testing.assert_array_equal(single.probs, batch[1].probs)  # the same pass, unpadded

    long = bertology.capture(PAIRS[0][0], model=loaded, mode="qk")
    assert isinstance(long, bertology.LongAttention)
    for array in (long.block(0), long.thumbnails(4), long.query_vectors(0, 1), long.key_vectors(0, 1)):
        assert isinstance(array, np.ndarray) and array.dtype == np.float32

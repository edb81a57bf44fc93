"""Activation and attribution patching checked against implementations written here: one forward pass per
head with a plain forward pre-hook on the output projection, a hook on a layer's attention output, known
answers (clean into clean; the residual stream at the one token that differs), a model made linear in the
patched activation, and gradients taken here.

Tolerances: the patching code and the references here run the same float32 forward passes, but batch the
patches differently (several per pass, the lower layers computed once, a decoder's shared prefix cached),
which reorders the matmuls' sums: on the tiny models (hidden width 32 to 64, logits of order 1 to 10) a
logit differs by about sqrt(d)·2^-24·|x| per layer, some 1e-6; atol 1e-5 leaves a margin. 1e-4 where a
comparison also runs through the cached shared prefix and recomputed positions of a decoder, or sets an
autograd gradient taken in two graphs against each other (attribution patching, also rtol 1e-4). An
effect is a ratio of such means: compared after multiplying by its denominator, at the same 1e-5.
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
    final_logits,
    output_projection,
    pre_hook,
    reference_head_patching,
    tiny_models_by_type,
)
from support.tiny_models import tiny_language_model

from bertology import BertologyError
from bertology.interventions.patching import Patch, exact_patching, patch, run_group
from bertology.interventions.patching_pairs import PatchPair, encode_pairs, read_pairs, sst2_pairs
from bertology.interventions.path_patching import path_patch
from bertology.models.loading import LoadedModel, load_model

# Tolerances. Both sides run the same float32 model (u = 2^-24 ~ 6e-8): three layers of width 32, |LD| <= ~7.
#: LDs of passes batched differently or hooked here: matmul and softmax sums reordered, each rounding ~u |x|,
#: compounded over the layers -> ~1e-6 (seen <= 1.3e-6); 1e-5 leaves a margin.
LD_REORDERED = 1e-5
#: A decoder's patched passes run after a cached shared start (or not): keys split over two blocks, other
#: matmul shapes; seen <= 1.5e-6 on |LD| <= 1.2, so 1e-4 is generous.
LD_SPLIT_START = 1e-4
#: Attribution: autograd gradients of the same pass, (clean - corrupted) . gradient summed per head in
#: another order here; seen <= 1e-8 on values <= 0.3, so 1e-4 (absolute and relative) is generous. Where LD
#: is linear in the head outputs, exact patching's LD equals it in exact arithmetic; in float32 the two
#: differ by the roundings of two forward passes (seen 2e-8).
ATTRIBUTION = 1e-4

#: One word swapped (the first pair) or two words exchanged: the same token count in each tiny model's
#: tokenizer; the pairs' counts differ.
TEXTS = [
    ("The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"),
    (
        "She said that the committee would publish its findings",
        "She said that the findings would publish its committee",
    ),
]
ANSWERS = {"llama": (" the", " dog"), "qwen2": (" the", " next"), "gpt2": (" the", " next")}


def pairs_for(model_type: str, texts: list[tuple[str, str]] = TEXTS) -> list[PatchPair]:
    answer, wrong = ANSWERS.get(model_type, (None, None))
    label, wrong_label = (None, None) if answer else ("pos", "neg")  # tiny_classifier's labels
    return [
        PatchPair(clean, corrupted, answer, wrong, label, wrong_label, i + 1)
        for i, (clean, corrupted) in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def models(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    return tiny_models_by_type(tiny_model_dirs)


def attention_module(loaded: LoadedModel, layer: int) -> torch.nn.Module:
    return loaded.model.model.layers[layer].self_attn


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2", "bert"])
def test_exact_head_patching_equals_one_hooked_pass_per_head(
    model_type: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    pairs = pairs_for(model_type)
    study = patch(loaded, pairs, patches_per_pass=3)
    expected = reference_head_patching(loaded, pairs)
    assert study.exact is not None and study.exact.ld_patched.shape == expected.shape
    np.testing.assert_allclose(study.exact.ld_patched, expected, atol=LD_REORDERED)
    assert np.ptp(expected) > 1e-3  # the heads do change LD
    with torch.no_grad():
        clean = [final_logits(loaded, p.clean)[list(answer_ids(loaded, p))] for p in pairs]
    np.testing.assert_allclose(study.exact.ld_clean, [float(c[0] - c[1]) for c in clean], atol=LD_REORDERED)
    gap = study.exact.ld_clean.mean() - study.exact.ld_corrupted.mean()
    np.testing.assert_allclose(
        study.exact.effect * gap, expected.mean(-1) - study.exact.ld_corrupted.mean(), atol=LD_REORDERED
    )


def test_noising_patches_corrupted_heads_into_the_clean_run(models: Callable[[str], LoadedModel]) -> None:
    loaded = models("llama")
    pairs = pairs_for("llama")
    study = patch(loaded, pairs, direction="noising")
    assert study.exact is not None
    np.testing.assert_allclose(
        study.exact.ld_patched, reference_head_patching(loaded, pairs, denoising=False), atol=LD_REORDERED
    )
    gap = study.exact.ld_clean.mean() - study.exact.ld_corrupted.mean()
    expected = (study.exact.ld_patched.mean(-1) - study.exact.ld_clean.mean()) / gap
    np.testing.assert_allclose(study.exact.effect, expected)


@pytest.mark.parametrize(("model_type", "ablation"), [("bert", "zero"), ("qwen2", "mean")])
def test_ablating_each_head_equals_one_hooked_pass_per_head(
    model_type: str, ablation: str, models: Callable[[str], LoadedModel]
) -> None:
    """Each head zero- or mean-ablated in the clean run (noising, an ablation's default): the classifier,
    and a grouped-query decoder whose mean spans the pairs' two token counts."""
    loaded = models(model_type)
    pairs = pairs_for(model_type)
    study = patch(loaded, pairs, ablation=ablation)  # type: ignore[arg-type]
    assert study.exact is not None and study.exact.direction == "noising"
    expected = reference_head_patching(loaded, pairs, denoising=False, ablation=ablation)
    np.testing.assert_allclose(study.exact.ld_patched, expected, atol=LD_REORDERED)
    assert np.ptp(expected) > 1e-3  # the heads' ablations do change LD
    gap = study.exact.ld_clean.mean() - study.exact.ld_corrupted.mean()
    np.testing.assert_allclose(
        study.exact.effect * gap, expected.mean(-1) - study.exact.ld_clean.mean(), atol=LD_REORDERED
    )


def test_all_heads_of_a_layer_at_once_equal_patching_the_attention_output(
    models: Callable[[str], LoadedModel],
) -> None:
    loaded = models("llama")
    pairs = pairs_for("llama")
    encoded = encode_pairs(loaded, pairs)
    layer = 1
    for group in encoded.groups:
        runs = run_group(loaded, group)
        every = torch.ones(group.tokens, dtype=torch.bool)
        whole = Patch(layer, torch.ones(loaded.num_heads, dtype=torch.bool), every)
        with torch.no_grad():
            found = exact_patching(loaded, group, runs, [whole])[0]
            saved: list[torch.Tensor] = []
            attention = attention_module(loaded, layer)
            handle = attention.register_forward_hook(
                lambda _, __, output, saved=saved: saved.append(output[0])
            )
            loaded.model(**group.clean)
            handle.remove()
            handle = attention.register_forward_hook(
                lambda _, __, output, saved=saved: (saved[0], *output[1:])
            )
            logits = loaded.model(**group.corrupted).logits[:, -1]
            handle.remove()
        expected = (
            logits.gather(1, group.answer[:, None])[:, 0] - logits.gather(1, group.wrong[:, None])[:, 0]
        )
        torch.testing.assert_close(found, expected, atol=LD_REORDERED, rtol=0)


def test_clean_into_clean_changes_nothing(models: Callable[[str], LoadedModel]) -> None:
    loaded = models("qwen2")
    same = [(clean, clean) for clean, _ in TEXTS]
    for site, granularity in (("z", "head"), ("resid_pre", "position")):
        study = patch(loaded, pairs_for("qwen2", same[:1]), site=site, granularity=granularity)
        assert study.exact is not None
        np.testing.assert_allclose(
            study.exact.ld_patched,
            np.broadcast_to(study.exact.ld_clean, study.exact.ld_patched.shape),
            atol=LD_REORDERED,
        )


@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_the_residual_stream_at_the_differing_token_before_layer_0_restores_the_clean_run(
    model_type: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    pairs = pairs_for(model_type, TEXTS[:1])
    study = patch(loaded, pairs, site="resid_pre", granularity="position")
    tokens = study.tokens[0]
    differing = [i for i, (a, b) in enumerate(zip(*tokens, strict=True)) if a != b]
    assert len(differing) == 1
    result = study.exact
    assert result is not None and result.ld_patched.shape == (loaded.num_layers, len(tokens[0]), 1)
    np.testing.assert_allclose(result.ld_patched[0, differing[0]], result.ld_clean, atol=LD_REORDERED)
    others = [i for i in range(len(tokens[0])) if i != differing[0]]
    np.testing.assert_allclose(result.ld_patched[0, others, 0], result.ld_corrupted[0], atol=LD_REORDERED)


def test_head_position_patches_sum_to_nothing_outside_the_head(models: Callable[[str], LoadedModel]) -> None:
    """Head and position patches equal the hooked reference for one head, at each position."""
    loaded = models("llama")
    pairs = pairs_for("llama", TEXTS[:1])
    study = patch(loaded, pairs, granularity="head-position")
    assert study.exact is not None
    grid = study.exact.ld_patched
    assert grid.shape == (loaded.num_layers, loaded.num_heads, len(study.tokens[0][0]), 1)
    # a causal decoder: a position before the swapped token reads the same in both runs
    swapped = next(i for i, (a, b) in enumerate(zip(*study.tokens[0], strict=True)) if a != b)
    np.testing.assert_allclose(grid[:, :, :swapped, 0], study.exact.ld_corrupted[0], atol=LD_REORDERED)
    assert np.abs(grid[:, :, swapped:, 0] - study.exact.ld_corrupted[0]).max() > 1e-3


#: Two pairs of one token count in the tiny llama's and GPT-2's tokenizers whose first difference is at
#: different positions (fox/dog, then over/near): they share their tokens up to the first pair's.
SHARED_START = [
    ("The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"),
    ("The quick brown fox jumps over the lazy", "The quick brown fox jumps near the lazy"),
]
#: A pair that differs at its first token in the tiny GPT-2's tokenizer (which adds no start token).
FIRST_TOKEN = [("She quick brown fox jumps over the lazy", "The quick brown fox jumps over the lazy")]


def decoder_layer(loaded: LoadedModel, layer: int) -> torch.nn.Module:
    model = loaded.model
    return model.transformer.h[layer] if model.config.model_type == "gpt2" else model.model.layers[layer]


def reference_patches(
    loaded: LoadedModel, pair: PatchPair, cases: list[tuple[int, int | None, int | None]], denoising: bool
) -> list[float]:
    """Per case ``(layer, head, position)``: LD of the target text with head ``head``'s output (``None``:
    the residual stream entering ``layer``) at ``position`` (``None``: every position) taken from the
    source text, by plain forward passes with forward pre-hooks written here."""
    source, target = (pair.clean, pair.corrupted) if denoising else (pair.corrupted, pair.clean)
    d = loaded.model.config.hidden_size // loaded.num_heads
    answer, wrong = answer_ids(loaded, pair)
    saved: dict[tuple[int, bool], torch.Tensor] = {}
    found = []
    with torch.no_grad():
        for layer, head, position in cases:
            module = decoder_layer(loaded, layer) if head is None else output_projection(loaded, layer)
            key = (layer, head is None)
            if key not in saved:
                with pre_hook(module, lambda _, args, key=key: saved.setdefault(key, args[0].clone())):
                    final_logits(loaded, source)
            features = slice(None) if head is None else slice(head * d, (head + 1) * d)
            where = slice(None) if position is None else slice(position, position + 1)

            def swap(
                _: torch.nn.Module,
                args: tuple[torch.Tensor, ...],
                key: tuple[int, bool] = key,
                where: slice = where,
                features: slice = features,
            ) -> tuple[torch.Tensor, ...]:
                patched = args[0].clone()
                patched[:, where, features] = saved[key][:, where, features]
                return (patched, *args[1:])

            with pre_hook(module, swap):
                logits = final_logits(loaded, target)
            found.append(float(logits[answer] - logits[wrong]))
    return found


def exact_and_lengths(
    loaded: LoadedModel,
    pairs: list[PatchPair],
    cases: list[tuple[int, int | None, int | None]],
    **options: object,
) -> tuple[np.ndarray, set[int]]:
    """[cases, pairs] LD of exact patching of ``cases`` ((layer, head or None, position or None), one
    granularity), and the token counts the last layer was run on meanwhile."""
    (group,) = encode_pairs(loaded, pairs).groups
    heads, tokens = loaded.num_heads, group.tokens
    patches = [
        Patch(
            layer,
            None if head is None else torch.arange(heads) == head,
            torch.ones(tokens, dtype=torch.bool) if position is None else torch.arange(tokens) == position,
        )
        for layer, head, position in cases
    ]
    lengths: set[int] = set()
    site = "resid_pre" if cases[0][1] is None else "z"  # a case without a head: the residual stream
    with torch.no_grad():
        runs = run_group(loaded, group, site=site)
        last = decoder_layer(loaded, loaded.num_layers - 1)
        with pre_hook(last, lambda _, args: lengths.add(args[0].shape[1])):
            found = exact_patching(loaded, group, runs, patches, patches_per_pass=2, **options)  # type: ignore[arg-type]
    return found.numpy(), lengths


def first_difference(loaded: LoadedModel, pairs: list[PatchPair]) -> int:
    """The first position at which any pair's clean and corrupted tokens differ, found here."""
    tokenized = [
        (loaded.tokenizer(p.clean)["input_ids"], loaded.tokenizer(p.corrupted)["input_ids"]) for p in pairs
    ]
    return min(next(i for i, (a, b) in enumerate(zip(*ids, strict=True)) if a != b) for ids in tokenized)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_a_decoder_runs_only_the_positions_after_the_pairs_shared_start(
    model_type: str, direction: str, models: Callable[[str], LoadedModel]
) -> None:
    """Heads at every position, heads at one position and the residual stream, at positions before the
    first difference, at it and after it: the same LD as one hooked pass per patch and pair, and as
    exact patching run at every position, while the patched passes run only the later positions."""
    loaded = models(model_type)
    pairs = pairs_for(model_type, SHARED_START)
    start, tokens = first_difference(loaded, pairs), len(loaded.tokenizer(pairs[0].clean)["input_ids"])
    assert 1 < start < tokens - 2
    last = loaded.num_layers - 1
    positions = (start - 1, start, tokens - 1)
    granularities = {
        "head": [(0, 0, None), (0, 2, None), (last, 1, None), (last, 3, None)],
        "head-position": [(layer, 1, position) for layer in (0, last) for position in positions],
        "residual": [(layer, None, position) for layer in (0, last) for position in positions],
    }
    denoising = direction == "denoising"
    for granularity, cases in granularities.items():
        expected = np.array([reference_patches(loaded, p, cases, denoising) for p in pairs]).T
        found, lengths = exact_and_lengths(loaded, pairs, cases, direction=direction)
        np.testing.assert_allclose(found, expected, atol=LD_SPLIT_START, err_msg=granularity)
        assert lengths == {start, tokens - start}, granularity  # the shared start once, then the rest
        every, lengths = exact_and_lengths(
            loaded, pairs, cases, direction=direction, skip_shared_prefix=False
        )
        np.testing.assert_allclose(every, expected, atol=LD_SPLIT_START, err_msg=granularity)
        assert lengths == {tokens}, granularity
        assert np.ptp(expected) > 1e-3, granularity  # the patches do change LD


def test_pairs_that_differ_at_their_first_token_run_every_position(
    models: Callable[[str], LoadedModel],
) -> None:
    loaded = models("gpt2")
    pairs = pairs_for("gpt2", FIRST_TOKEN)
    assert first_difference(loaded, pairs) == 0
    tokens = len(loaded.tokenizer(pairs[0].clean)["input_ids"])
    cases = [(layer, head, None) for layer in (0, loaded.num_layers - 1) for head in (0, 3)]
    expected = np.array([reference_patches(loaded, p, cases, True) for p in pairs]).T
    found, lengths = exact_and_lengths(loaded, pairs, cases)
    np.testing.assert_allclose(found, expected, atol=LD_SPLIT_START)
    assert lengths == {tokens}
    assert np.ptp(expected) > 1e-3


def autograd_attribution(loaded: LoadedModel, pair: PatchPair) -> np.ndarray:
    """[layers, heads] (clean - corrupted head output) . dLD/d(head output) at the corrupted run, by hooks
    and torch.autograd written here."""
    d = loaded.model.config.hidden_size // loaded.num_heads
    outputs: dict[str, list[torch.Tensor]] = {"clean": [], "corrupted": []}
    for run, text in (("clean", pair.clean), ("corrupted", pair.corrupted)):
        handles = [
            output_projection(loaded, layer).register_forward_pre_hook(
                lambda _, args, run=run: outputs[run].append(args[0])
            )
            for layer in range(loaded.num_layers)
        ]
        with torch.enable_grad():
            logits = final_logits(loaded, text)
        for handle in handles:
            handle.remove()
        if run == "corrupted":
            answer, wrong = answer_ids(loaded, pair)
            metric = logits[answer] - logits[wrong]
            gradients = torch.autograd.grad(metric, outputs["corrupted"])
    result = np.zeros((loaded.num_layers, loaded.num_heads))
    for layer in range(loaded.num_layers):
        change = (outputs["clean"][layer] - outputs["corrupted"][layer]).detach() * gradients[layer]
        result[layer] = change[0].reshape(-1, loaded.num_heads, d).sum((0, 2)).numpy()
    return result


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_attribution_patching_equals_an_autograd_computation(
    model_type: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    pairs = pairs_for(model_type)
    study = patch(loaded, pairs, method="attribution")
    assert study.attribution is not None and study.exact is None
    for index, pair in enumerate(pairs):
        expected = autograd_attribution(loaded, pair)
        found = study.attribution.ld_patched[..., index] - study.attribution.ld_corrupted[index]
        np.testing.assert_allclose(found, expected, atol=ATTRIBUTION, rtol=ATTRIBUTION)


def test_attribution_is_exact_where_the_metric_is_linear_in_the_activation(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """A llama whose last layer has no MLP (its down projection zero) and no final norm: LD is then a linear
    function of the last layer's head outputs, and attribution patching of those heads is exact."""
    loaded = tiny_language_model(tiny_model_dirs["llama"])
    with torch.no_grad():
        loaded.model.model.layers[-1].mlp.down_proj.weight.zero_()
    loaded.model.model.norm = torch.nn.Identity()
    study = patch(loaded, pairs_for("llama"), method="both")
    assert study.exact is not None and study.attribution is not None
    last = loaded.num_layers - 1
    np.testing.assert_allclose(
        study.attribution.ld_patched[last], study.exact.ld_patched[last], atol=ATTRIBUTION
    )
    assert np.abs(study.exact.effect[last]).max() > 1e-3
    agreement = study.agreement(top=4)
    assert agreement is not None and -1 <= agreement["pearson"] <= 1


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_pair_files_are_refused_in_one_sentence(tmp_path: Path) -> None:
    cases = {
        "empty": ([""], "has no pairs"),
        "malformed": (['{"clean": "a", "corrupted": "b"}', "{not json"], "line 2 is not valid JSON"),
        "one text": (['{"clean": "a"}'], "needs both 'clean' and 'corrupted'"),
        "half answer": (['{"clean": "a", "corrupted": "b", "answer": " x"}'], "both 'answer' and 'wrong'"),
    }
    for name, (lines, message) in cases.items():
        with pytest.raises(BertologyError, match=message):
            read_pairs(write_lines(tmp_path / f"{name.replace(' ', '_')}.jsonl", lines))


def test_pairs_the_model_cannot_read_are_refused(models: Callable[[str], LoadedModel]) -> None:
    llama, bert = models("llama"), models("bert")
    unequal = PatchPair("The quick brown fox", "The quick brown fox jumps", " the", " dog", None, None, 3)
    with pytest.raises(BertologyError, match="Line 3: the clean text is 5 tokens and the corrupted 6"):
        encode_pairs(llama, [unequal])
    with pytest.raises(
        BertologyError,
        match=r"only a language model \(a decoder or an encoder-decoder\) predicts; .* is an encoder model",
    ):
        encode_pairs(bert, pairs_for("llama"))
    with pytest.raises(BertologyError, match="needs the same token count"):
        patch(llama, pairs_for("llama"), site="resid_pre", granularity="position")
    unknown = PatchPair(*TEXTS[0], None, None, "great", None, 1)
    with pytest.raises(BertologyError, match="'label' 'great' is not one of the labels"):
        encode_pairs(bert, [unknown])


def test_a_text_over_the_models_context_is_refused(
    models: Callable[[str], LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny llama takes 64 tokens: 70 words are refused by their token count, not truncated; a text of
    more characters than 64 tokens of its vocabulary's longest entry could spell is refused before the
    tokenizer sees it (issue 43: a 12 MB line ran out of memory after 31 s)."""
    llama = models("llama")
    tokenizer_type = type(llama.tokenizer)
    tokenize, tokenized = tokenizer_type.__call__, []

    def recording(self: object, text: str, **options: object) -> object:
        tokenized.append(text)
        return tokenize(self, text, **options)

    monkeypatch.setattr(tokenizer_type, "__call__", recording)
    words = "The" + " dog" * 70
    with pytest.raises(BertologyError) as caught:
        encode_pairs(llama, [PatchPair(words, words, " the", " dog", None, None, 4)])
    tokens = len(tokenize(llama.tokenizer, words)["input_ids"])
    assert tokens > llama.max_length == 64 and words in tokenized
    assert str(caught.value) == (
        f"Line 4: the clean text is longer than the 64 tokens {llama.name} takes ({tokens} tokens); "
        "shorten it."
    )
    huge = "x" * (64 * max(map(len, llama.tokenizer.get_vocab())) + 1)
    with pytest.raises(
        BertologyError, match=rf"^Line 5: the clean text is longer .* \({len(huge):,} characters\)"
    ):
        encode_pairs(llama, [PatchPair(huge, huge, " the", " dog", None, None, 5)])
    assert huge not in tokenized


def test_the_shipped_sst2_pairs_swap_one_token_of_the_default_tokenizer() -> None:
    pairs = read_pairs(sst2_pairs())
    tokenizer = load_model("default").tokenizer
    assert len(pairs) == 12 and all(
        p.answer is None and (p.label, p.wrong_label) == ("1", "0") for p in pairs
    )
    for pair in pairs:
        clean, corrupted = tokenizer.tokenize(pair.clean), tokenizer.tokenize(pair.corrupted)
        assert len(clean) == len(corrupted)
        assert sum(a != b for a, b in zip(clean, corrupted, strict=True)) == 1, pair.line


def test_a_pairs_file_is_read_in_order(tmp_path: Path) -> None:
    lines = [json.dumps({"clean": c, "corrupted": x, "answer": " the", "wrong": " dog"}) for c, x in TEXTS]
    pairs = read_pairs(write_lines(tmp_path / "pairs.jsonl", [lines[0], "", lines[1]]))
    assert [(p.clean, p.line) for p in pairs] == [(TEXTS[0][0], 1), (TEXTS[1][0], 3)]


def test_path_patching_through_every_later_query_key_and_value_is_all_a_head_does_without_a_direct_path(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """A two-layer llama built so that head (0, 1) reaches the logits only through layer 1's attention: no
    MLPs, no final norm, and an unembedding blind to what the head writes (its rows projected off the
    head's output columns). Its path to every layer-1 head's query, key and value is then its whole effect,
    which activation patching measures."""
    loaded = tiny_language_model(tiny_model_dirs["llama"])
    assert loaded.num_layers == 2
    layers, d = loaded.model.model.layers, loaded.model.config.head_dim
    with torch.no_grad():
        for layer in layers:
            layer.mlp.down_proj.weight.zero_()
        writes = layers[0].self_attn.o_proj.weight[:, d : 2 * d]  # [hidden, d]: what head 1 writes
        basis, _ = torch.linalg.qr(writes)
        unembedding = loaded.model.get_output_embeddings().weight
        unembedding.copy_(unembedding - unembedding @ basis @ basis.T)
    loaded.model.model.norm = torch.nn.Identity()
    pairs = pairs_for("llama")
    everything = [(1, head, which) for head in range(loaded.num_heads) for which in "qkv"]
    path = path_patch(loaded, pairs, [(0, 1)], everything)  # type: ignore[arg-type]
    study = patch(loaded, pairs)
    assert study.exact is not None
    np.testing.assert_allclose(path.ld_patched, study.exact.ld_patched[0, 1], atol=LD_REORDERED)
    assert np.abs(path.ld_patched - path.ld_corrupted).max() > 1e-3
    assert path.effect == pytest.approx(study.exact.effect[0, 1], abs=LD_REORDERED)
    queries_only = path_patch(loaded, pairs, [(0, 1)], [(1, 0, "q")])
    assert np.abs(queries_only.ld_patched - path.ld_patched).max() > 1e-4
    with pytest.raises(BertologyError, match=r"Head 5-0 is not in"):
        path_patch(loaded, pairs, [(5, 0)], [(1, 0, "q")])


def test_path_patching_refuses_a_receiver_not_after_every_sender_before_reading_the_pairs(
    models: Callable[[str], LoadedModel],
) -> None:
    """A receiver in a sender's layer or below cannot be reached (its effect would be exactly 0): refused
    in one sentence before the pairs are read or the model runs (the pairs file does not exist)."""
    loaded = models("llama")
    for senders, receivers, message in (
        (
            [(0, 1)],
            [(0, 2, "v")],
            r"^Receiver 0-2:v is in layer 0, not after every sender \(the last in layer 0\)",
        ),
        (
            [(0, 1), (1, 3)],
            [(1, 0, "q")],
            r"^Receiver 1-0:q is in layer 1, not after every sender \(the last in layer 1\)",
        ),
    ):
        with pytest.raises(BertologyError, match=message) as raised:
            path_patch(loaded, "no-such-pairs.jsonl", senders, receivers)  # type: ignore[arg-type]
        assert str(raised.value).count(". ") == 0 and str(raised.value).endswith(".")


def test_a_model_without_the_head_its_pairs_need_is_refused_in_one_sentence(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """A decoder loaded without its language-modelling head given answers, an encoder loaded without a
    classification head given labels: one sentence each (not transformers' missing ``logits``), before a
    pass of the model."""
    bare_decoder = load_model(tiny_model_dirs["llama"])
    bare_encoder = load_model(tiny_model_dirs["bert"])
    calls: list[int] = []
    for loaded, pairs, message in (
        (bare_decoder, pairs_for("llama"), "loaded without its language-modelling head"),
        (bare_encoder, pairs_for("bert"), "loaded without a classification head"),
    ):
        handle = loaded.model.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            with pytest.raises(BertologyError, match=message) as raised:
                patch(loaded, pairs)
        finally:
            handle.remove()
        assert not calls and str(raised.value).count(". ") == 0

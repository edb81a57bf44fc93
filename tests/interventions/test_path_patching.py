"""Path patching with each sender alone, and receivers at one position, checked against path patching
written here with plain forward hooks on the Hugging Face modules (the output projection's input for the
heads' outputs, the query, key or value projection's output for the receivers), one sender at a time, as
ARENA's
``get_path_patch_head_to_heads`` loops.

Tolerances: the sweep runs several senders side by side in one batch, the reference one per pass, the same
float32 operations on the tiny models (logits of order 1 to 10): batching reorders no sum within a row, but
the matmul kernels may pick other blockings for other batch sizes, some 1e-6 per logit; atol 1e-5 leaves a
margin. Effects are ratios of such means: compared after multiplying by their denominator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import tiny_language_model

from bertology import BertologyError
from bertology.interventions.patching_pairs import PatchPair
from bertology.interventions.path_patching import Receiver, path_patch, path_patch_each
from bertology.models.loading import LoadedModel

#: Clean and corrupted texts of one token count in the tiny llama's and gpt2's tokenizers.
TEXTS = [
    ("The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"),
    (
        "She said that the committee would publish its findings",
        "She said that the findings would publish its committee",
    ),
]
ANSWERS = {"llama": (" the", " dog"), "gpt2": (" the", " next")}


def pairs_for(model_type: str) -> list[PatchPair]:
    answer, wrong = ANSWERS[model_type]
    return [
        PatchPair(clean, corrupted, answer, wrong, None, None, i + 1)
        for i, (clean, corrupted) in enumerate(TEXTS)
    ]


def sharpened(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with its queries and keys scaled by 4 (scores by 16) and its heads' outputs by 5: a random
    tiny model attends almost evenly and its heads write little, so that a path through a query or key
    moves ``LD`` by only some 1e-6, below what the comparisons resolve. GPT-2's by 30: its embedding is
    its unembedding, which :func:`tiny_language_model` scales by 30, and would drown what heads write."""
    louder = 30 if loaded.model_type == "gpt2" else 5
    with torch.no_grad():
        for layer in range(loaded.num_layers):
            output_projection(loaded, layer).weight.mul_(louder)
            for which in "qk":
                module, offset = projection(loaded, layer, which)
                width = loaded.model.config.hidden_size
                if loaded.model_type == "gpt2":  # Conv1D: weight [in, out]
                    module.weight[:, offset : offset + width] *= 4
                    module.bias[offset : offset + width] *= 4
                else:
                    module.weight.mul_(4)
    return loaded


@pytest.fixture(scope="module")
def models(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    cache: dict[str, LoadedModel] = {}

    def load(model_type: str) -> LoadedModel:
        if model_type not in cache:
            cache[model_type] = sharpened(tiny_language_model(tiny_model_dirs[model_type]))
        return cache[model_type]

    return load


def output_projection(loaded: LoadedModel, layer: int) -> torch.nn.Module:
    """The module whose input is every head's output side by side, [b, t, heads * head_dim]."""
    if loaded.model_type == "gpt2":
        return loaded.model.transformer.h[layer].attn.c_proj
    return loaded.model.model.layers[layer].self_attn.o_proj


def projection(loaded: LoadedModel, layer: int, which: str) -> tuple[torch.nn.Module, int]:
    """The module whose output holds the heads' queries, keys or values (``which``) side by side, and
    where in its output they start (GPT-2's ``c_attn`` holds all three)."""
    if loaded.model_type == "gpt2":
        return loaded.model.transformer.h[layer].attn.c_attn, "qkv".index(which) * loaded.model.config.n_embd
    return getattr(loaded.model.model.layers[layer].self_attn, f"{which}_proj"), 0


@contextmanager
def head_outputs_replaced(loaded: LoadedModel, values: list[torch.Tensor]) -> Iterator[None]:
    """Every layer's heads' outputs replaced by ``values[layer]`` [b, t, heads * head_dim]."""
    with ExitStack() as stack:
        for layer, value in enumerate(values):
            hook = output_projection(loaded, layer).register_forward_pre_hook(
                lambda _m, args, v=value: (v.clone(), *args[1:])
            )
            stack.callback(hook.remove)
        yield


#: (model, text) -> what :func:`head_outputs` gave: the reference runs each text once per test module.
_RUNS: dict[tuple[int, str], tuple[list[torch.Tensor], torch.Tensor]] = {}


def head_outputs(loaded: LoadedModel, text: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every layer's heads' outputs [1, t, heads * head_dim] in a pass of ``text``, and its last logits."""
    if (id(loaded), text) in _RUNS:
        outputs, logits = _RUNS[id(loaded), text]
        return [output.clone() for output in outputs], logits
    kept: list[torch.Tensor] = []
    with ExitStack() as stack:
        for layer in range(loaded.num_layers):
            hook = output_projection(loaded, layer).register_forward_pre_hook(
                lambda _m, args: kept.append(args[0].detach().clone())
            )
            stack.callback(hook.remove)
        logits = loaded.model(input_ids=torch.tensor([loaded.tokenizer(text)["input_ids"]])).logits[0, -1]
    _RUNS[id(loaded), text] = (kept, logits)
    return [output.clone() for output in kept], logits


def reference_ld(
    loaded: LoadedModel,
    pair: PatchPair,
    sender: tuple[int, int],
    receivers: list[tuple[int, int, str, int | None]],
    noising: bool,
) -> tuple[float, float, float]:
    """``LD`` clean, corrupted and with ``sender``'s path through the receivers' queries, keys or values
    (layer, head, which, position or ``None``) patched: Wang et al.'s steps with plain hooks."""
    tokenizer = loaded.tokenizer
    answer = tokenizer(pair.answer, add_special_tokens=False)["input_ids"][0]
    wrong = tokenizer(pair.wrong, add_special_tokens=False)["input_ids"][0]

    def ld(logits: torch.Tensor) -> float:
        return float(logits[answer] - logits[wrong])

    target, source = (pair.clean, pair.corrupted) if noising else (pair.corrupted, pair.clean)
    d = loaded.model.config.hidden_size // loaded.num_heads
    kv_heads = getattr(loaded.model.config, "num_key_value_heads", loaded.num_heads)
    with torch.no_grad():
        frozen, target_logits = head_outputs(loaded, target)
        from_source, source_logits = head_outputs(loaded, source)
        clean_logits, corrupted_logits = (
            (target_logits, source_logits) if noising else (source_logits, target_logits)
        )
        layer, head = sender
        frozen[layer][..., head * d : (head + 1) * d] = from_source[layer][..., head * d : (head + 1) * d]
        modules = {(layer, which): projection(loaded, layer, which) for layer, _, which, _ in receivers}
        kept: dict[tuple[int, str], torch.Tensor] = {}
        with ExitStack() as stack:
            stack.enter_context(head_outputs_replaced(loaded, frozen))
            for key, (module, _) in modules.items():
                hook = module.register_forward_hook(
                    lambda _m, _a, out, at=key: kept.__setitem__(at, out.detach().clone())
                )
                stack.callback(hook.remove)
            loaded.model(input_ids=torch.tensor([tokenizer(target)["input_ids"]]))

        def patch_receivers(key: tuple[int, str], output: torch.Tensor) -> torch.Tensor:
            patched = output.clone()
            offset = modules[key][1]
            for layer_r, head_r, which, position in receivers:
                if (layer_r, which) == key:
                    where = slice(None) if position is None else position
                    # a key or value is its key/value head's: the tiny llama has 2 for its 4 query heads
                    slot = head_r if which == "q" else head_r * kv_heads // loaded.num_heads
                    columns = slice(offset + slot * d, offset + (slot + 1) * d)
                    patched[:, where, columns] = kept[key][:, where, columns]
            return patched

        with ExitStack() as stack:
            for key, (module, _) in modules.items():
                hook = module.register_forward_hook(lambda _m, _a, out, at=key: patch_receivers(at, out))
                stack.callback(hook.remove)
            patched = ld(loaded.model(input_ids=torch.tensor([tokenizer(target)["input_ids"]])).logits[0, -1])
        return ld(clean_logits), ld(corrupted_logits), patched


def effect(ld_clean: np.ndarray, ld_corrupted: np.ndarray, ld_patched: np.ndarray, noising: bool) -> float:
    baseline = ld_clean if noising else ld_corrupted
    return float((ld_patched.mean() - baseline.mean()) / (ld_clean.mean() - ld_corrupted.mean()))


@pytest.mark.parametrize(("model_type", "direction"), [("llama", "noising"), ("gpt2", "denoising")])
def test_each_sender_alone_equals_a_loop_of_path_patching_written_with_plain_hooks(
    models: Callable[[str], LoadedModel], model_type: str, direction: str
) -> None:
    """Every layer-0 head as the sender, through layer 1's head 0's query and head 1's value: the sweep
    (senders side by side, 3 a pass so that the last pass is partial)
    equals, sender by sender, the loop here (one direction per model: the two share the code but for
    which run is which); the grid holds each sender's effect at
    its head and NaN in the receivers' layer."""
    loaded = models(model_type)
    pairs = pairs_for(model_type)
    receivers = [(1, 0, "q", None), (1, 1, "v", None)]
    noising = direction == "noising"
    sweep = path_patch_each(loaded, pairs, receivers, direction=direction, senders_per_pass=3)  # type: ignore[arg-type]
    assert sweep.senders == [(0, head) for head in range(loaded.num_heads)]
    for index, sender in enumerate(sweep.senders):
        reference = np.array([reference_ld(loaded, pair, sender, receivers, noising) for pair in pairs])
        np.testing.assert_allclose(sweep.ld_clean, reference[:, 0], atol=1e-5)
        np.testing.assert_allclose(sweep.ld_corrupted, reference[:, 1], atol=1e-5)
        np.testing.assert_allclose(sweep.ld_patched[index], reference[:, 2], atol=1e-5)
        gap = reference[:, 0].mean() - reference[:, 1].mean()
        expected = effect(reference[:, 0], reference[:, 1], reference[:, 2], noising)
        assert sweep.grid[sender] * gap == pytest.approx(expected * gap, abs=1e-5)
    assert np.isnan(sweep.grid[1]).all()
    # the senders' paths move LD: the comparison above is not of unpatched runs
    assert np.abs(sweep.ld_patched - (sweep.ld_clean if noising else sweep.ld_corrupted)).max() > 1e-3


def test_a_receiver_at_one_position_patches_that_position_only(models: Callable[[str], LoadedModel]) -> None:
    """In the last layer only the last token's query reaches the last token's logits: ``1-0:q@-1`` equals
    the hook that patches that query alone, and ``1-0:q@-2`` (an earlier query) leaves the clean run's LD
    exactly. A key at position 0 only is read by every later position and differs from every position's
    keys, by the reference too."""
    loaded = models("llama")
    pairs = pairs_for("llama")

    def both(receiver: tuple[int, int, str, int | None]) -> tuple[np.ndarray, np.ndarray]:
        ours = path_patch(loaded, pairs, [(0, 1)], [receiver], direction="noising")
        reference = np.array([reference_ld(loaded, pair, (0, 1), [receiver], True) for pair in pairs])
        np.testing.assert_allclose(ours.ld_patched, reference[:, 2], atol=1e-5)
        return ours.ld_patched, ours.ld_clean

    last, clean = both((1, 0, "q", -1))
    assert np.abs(last - clean).max() > 1e-4
    earlier, clean = both((1, 0, "q", -2))
    np.testing.assert_array_equal(earlier, clean)
    first_key, _ = both((1, 0, "k", 0))
    every_key, _ = both((1, 0, "k", None))
    assert np.abs(first_key - every_key).max() > 1e-4
    assert Receiver(1, 0, "q", -1).name == "1-0:q@-1"


def test_a_receivers_position_outside_the_texts_is_refused_in_one_sentence(
    models: Callable[[str], LoadedModel],
) -> None:
    loaded = models("llama")
    with pytest.raises(BertologyError, match=r"^Receiver 1-0:q@40 names position 40, outside the \d+ tokens"):
        path_patch(loaded, pairs_for("llama"), [(0, 1)], [Receiver(1, 0, "q", 40)])

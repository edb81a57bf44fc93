"""The patching tests' references, written apart from bertology.interventions.patching: the tiny models by
type, plain forward passes with forward pre-hooks on a layer's head-output projection, and head patching
(or zero and mean ablation) computed one forward pass per head and pair."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from bertology.interventions.patching_pairs import PatchPair
from bertology.models.loading import LoadedModel
from support.tiny_models import tiny_classifier, tiny_language_model


def tiny_models_by_type(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    """load(model_type) -> the tiny model of that type ("bert": a two-label classifier, else a language
    model), loaded on first use and kept."""
    cache: dict[str, LoadedModel] = {}

    def load(model_type: str) -> LoadedModel:
        if model_type not in cache:
            directory = tiny_model_dirs[model_type]
            cache[model_type] = (
                tiny_classifier(directory) if model_type == "bert" else tiny_language_model(directory)
            )
        return cache[model_type]

    return load


def output_projection(loaded: LoadedModel, layer: int) -> torch.nn.Module:
    """``layer``'s attention output projection, whose input [batch, tokens, heads * head_dim] holds the
    heads' outputs side by side (GPT-2's is a Conv1D with the same input)."""
    model = loaded.model
    if model.config.model_type == "gpt2":
        return model.transformer.h[layer].attn.c_proj
    if loaded.kind == "decoder":
        return model.model.layers[layer].self_attn.o_proj
    return model.bert.encoder.layer[layer].attention.output.dense


@contextmanager
def pre_hook(module: torch.nn.Module, hook: Callable[..., object]) -> Iterator[None]:
    """``hook`` registered as ``module``'s forward pre-hook while the block runs."""
    handle = module.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def final_logits(loaded: LoadedModel, text: str) -> torch.Tensor:
    """A classifier's [labels] logits of ``text``, a language model's [vocabulary] at its last token, by a
    plain forward pass."""
    encoded = loaded.tokenizer([text], return_tensors="pt")
    if loaded.kind != "decoder":
        encoded.pop("token_type_ids", None)
    logits = loaded.model(**encoded).logits[0]
    return logits[-1] if loaded.kind == "decoder" else logits


def answer_ids(loaded: LoadedModel, pair: PatchPair) -> tuple[int, int]:
    """A language model's answer and wrong token ids (one token each); a classifier's label ids, by default
    the clean and the corrupted input's predicted labels."""
    if loaded.kind != "decoder" and pair.label is not None and pair.wrong_label is not None:
        return loaded.model.config.label2id[pair.label], loaded.model.config.label2id[pair.wrong_label]
    if loaded.kind != "decoder":
        with torch.no_grad():
            return int(final_logits(loaded, pair.clean).argmax()), int(
                final_logits(loaded, pair.corrupted).argmax()
            )
    ids = (
        loaded.tokenizer(text, add_special_tokens=False)["input_ids"] for text in (pair.answer, pair.wrong)
    )
    answer, wrong = (only for (only,) in ids)
    return answer, wrong


def metric_of(name: str, logits: torch.Tensor, clean: torch.Tensor, answer: int, wrong: int) -> float:
    """The metric ``name`` (logit-diff, prob-diff or kl) of one run's final ``logits`` [vocabulary], in
    float64; ``clean``: the clean run's final logits (kl is the clean run's KL divergence from this run)."""
    logits, clean = logits.double(), clean.double()
    if name == "logit-diff":
        return float(logits[answer] - logits[wrong])
    if name == "prob-diff":
        p = torch.softmax(logits, -1)
        return float(p[answer] - p[wrong])
    p_clean = torch.softmax(clean, -1)
    return float((p_clean * (torch.log(p_clean) - torch.log_softmax(logits, -1))).sum())


def head_outputs(loaded: LoadedModel, layer: int, text: str) -> torch.Tensor:
    """[tokens, heads * head_dim] what enters ``layer``'s output projection in a plain pass of ``text``."""
    saved: list[torch.Tensor] = []
    with pre_hook(output_projection(loaded, layer), lambda _, args: saved.append(args[0].clone())):
        final_logits(loaded, text)
    return saved[0][0]


def reference_head_patching(
    loaded: LoadedModel,
    pairs: list[PatchPair],
    *,
    denoising: bool = True,
    metric: str = "logit-diff",
    ablation: str = "counterfactual",
) -> np.ndarray:
    """[layers, heads, pairs] the metric with each head's output at every position taken from the other run
    (denoising: the clean run's into the corrupted one; else the reverse) or, with ``ablation`` ``zero`` or
    ``mean``, replaced by 0 or by the head's output averaged over every position of every pair's source
    text: one plain forward pass per head and pair, with a forward pre-hook on the output projection."""
    layers, heads = loaded.num_layers, loaded.num_heads
    d = loaded.model.config.hidden_size // heads
    result = np.zeros((layers, heads, len(pairs)))
    sources = [pair.clean if denoising else pair.corrupted for pair in pairs]
    with torch.no_grad():
        means = [
            torch.cat([head_outputs(loaded, layer, text) for text in sources]).double().mean(0).float()
            for layer in range(layers if ablation == "mean" else 0)
        ]
        for index, pair in enumerate(pairs):
            target = pair.corrupted if denoising else pair.clean
            answer, wrong = answer_ids(loaded, pair)
            clean = final_logits(loaded, pair.clean)
            for layer in range(layers):
                if ablation == "counterfactual":
                    written = head_outputs(loaded, layer, sources[index])
                else:
                    written = means[layer] if ablation == "mean" else torch.zeros(heads * d)
                for head in range(heads):

                    def swap(
                        _: torch.nn.Module,
                        args: tuple[torch.Tensor, ...],
                        head: int = head,
                        written: torch.Tensor = written,
                    ) -> tuple[torch.Tensor]:
                        patched = args[0].clone()
                        patched[..., head * d : (head + 1) * d] = written[..., head * d : (head + 1) * d]
                        return (patched,)

                    with pre_hook(output_projection(loaded, layer), swap):
                        logits = final_logits(loaded, target)
                    result[layer, head, index] = metric_of(metric, logits, clean, answer, wrong)
    return result

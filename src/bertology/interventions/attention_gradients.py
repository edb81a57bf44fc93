"""How much the loss depends on attention to [SEP], to punctuation and to other tokens (Clark et al.
2019, "What Does BERT Look At?", Figure 3).

For every attention weight ``A[l, h, q, k]`` of an input, ``|∂L/∂A[l, h, q, k]|`` is its gradient
magnitude, where ``L`` is the input's own loss: the cross-entropy of its gold label for a sequence
classifier, or, for a model with a masked-language-model head, the summed cross-entropy of its masked
tokens (Clark et al.'s setting: 15% of the non-special tokens, chosen with a fixed seed, become [MASK]).
A head's value for a key category (:data:`CATEGORIES`) is the mean of these magnitudes over every
weight from a real query token to a real key token of that category, over all inputs; a layer's value
is the mean over its heads. [SEP] and punctuation ("." and ",") are told apart as in the corpus
statistics (:class:`bertology.stats.rows.TokenRoles`); "other" is every other token, [CLS] included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.nn.functional import cross_entropy

from bertology.errors import BertologyError
from bertology.interventions.data import Batch, LabelledTexts, batches, eval_mode
from bertology.models.hook import recording
from bertology.models.loading import LoadedModel
from bertology.progress import Progress
from bertology.stats.base import head_index_frame
from bertology.stats.rows import SpecialTokens, TokenRoles

#: Key categories, in column order.
CATEGORIES = ("sep", "punct", "other")

#: Share of non-special tokens masked for the masked-language-model loss.
MASK_RATE = 0.15


@dataclass
class AttentionGradients:
    """Mean gradient magnitude of the loss with respect to attention weights, by key category.

    per_head: [layers, heads, 3] mean |dL/dA| (L in nats; A a probability, unitless) of the weights to
        [SEP], punctuation and other keys (:data:`CATEGORIES`); NaN where no input had such a key.
    loss: ``"task"`` (classification cross-entropy) or ``"mlm"`` (masked-language-model cross-entropy).
    examples: number of inputs.
    """

    per_head: np.ndarray
    loss: str
    examples: int

    @property
    def per_layer(self) -> np.ndarray:
        """[layers, 3] mean over each layer's heads."""
        return np.nanmean(self.per_head, axis=1)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), then one column per category."""
        layers, heads, _ = self.per_head.shape
        columns = {name: self.per_head[:, :, index].ravel() for index, name in enumerate(CATEGORIES)}
        return pd.DataFrame({**head_index_frame(layers, heads), **columns})


def _loss_kind(loaded: LoadedModel) -> str:
    model = loaded.model
    if type(model).__name__.endswith("ForSequenceClassification"):
        return "task"
    if model.get_output_embeddings() is not None and loaded.tokenizer.mask_token_id is not None:
        return "mlm"
    raise BertologyError(
        f"'{loaded.name}' has no loss for attention gradients: load it as a classifier "
        "(load_model(..., classifier=True)) or use a model with a masked-language-model head."
    )


def _masked(
    batch: Batch, mask_id: int, generator: torch.Generator
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(inputs with ~15% of the non-special tokens replaced by [MASK], labels [batch, tokens]: the
    original ids there and -100 elsewhere)."""
    ids = batch.inputs["input_ids"]
    special = torch.ones_like(ids, dtype=torch.bool)
    for row, flags in enumerate(batch.encoded.special):
        special[row, : len(flags)] = torch.as_tensor(flags)
    chosen = (torch.rand(ids.shape, generator=generator) < MASK_RATE).to(ids.device) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return {**batch.inputs, "input_ids": torch.where(chosen, torch.full_like(ids, mask_id), ids)}, labels


def _loss(loaded: LoadedModel, kind: str, batch: Batch, generator: torch.Generator) -> torch.Tensor:
    """Sum over the batch of each input's own loss (so each input's gradient is that of its own loss)."""
    if kind == "task":
        logits = loaded.model(**batch.inputs).logits
        return cross_entropy(logits.float(), batch.labels, reduction="sum")
    inputs, labels = _masked(batch, int(loaded.tokenizer.mask_token_id), generator)
    logits = loaded.model(**inputs).logits
    return cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def _category_masks(roles: TokenRoles) -> torch.Tensor:
    """[3, B, N] bool: real keys that are [SEP], punctuation, other."""
    other = roles.valid & ~roles.is_sep & ~roles.is_punct
    return torch.stack([roles.is_sep & roles.valid, roles.is_punct & roles.valid, other])


def attention_gradients(
    loaded: LoadedModel,
    data: LabelledTexts,
    *,
    batch_size: int = 16,
    seed: int = 0,
    on_progress: Progress | None = None,
) -> AttentionGradients:
    """Mean |dL/dA| per head and key category over ``data`` (see the module docstring).

    The task loss needs ``loaded`` to be a sequence classifier; a model with a masked-language-model head
    uses the MLM loss and ignores the labels. seed: chooses the masked tokens. on_progress: told the
    inputs done, out of ``len(data)``.
    """
    kind = _loss_kind(loaded)
    special = SpecialTokens.of(loaded)
    generator = torch.Generator().manual_seed(seed)
    layers, heads = loaded.num_layers, loaded.num_heads
    sums = torch.zeros(len(CATEGORIES), layers, heads, dtype=torch.float64)
    counts = torch.zeros(len(CATEGORIES), dtype=torch.float64)
    done = 0
    with torch.enable_grad(), eval_mode(loaded):
        for batch in batches(loaded, data, batch_size=batch_size):
            with recording(keep_graph=True) as recorder:
                loss = _loss(loaded, kind, batch, generator)
            probs = [call.probs for call in recorder.calls]
            gradients = torch.stack(torch.autograd.grad(loss, probs), dim=1).abs()  # [B, L, H, Q, K]
            roles = special.roles(batch.encoded, gradients.shape[-1], gradients.device)
            keys = _category_masks(roles).to(gradients.dtype)  # [3, B, K]
            queries = roles.valid.to(gradients.dtype)  # [B, Q]
            per_key = torch.einsum("blhqk,bq->blhk", gradients, queries)
            sums += torch.einsum("blhk,cbk->clh", per_key, keys).cpu().double()
            counts += torch.einsum("bq,cbk->c", queries, keys).cpu().double()
            done += len(batch.rows)
            if on_progress is not None:
                on_progress(done, len(data))
    means = sums / torch.where(counts > 0, counts, torch.nan)[:, None, None]
    return AttentionGradients(means.permute(1, 2, 0).numpy(), kind, done)

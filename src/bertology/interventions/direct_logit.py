"""Direct logit attribution: what each attention head of a decoder adds to one token's logit straight
through the residual stream (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits";
computed as TransformerLens's ``logit_attrs`` with the cached final-norm scale).

A pre-norm decoder (Llama, Mistral, Qwen2, Qwen3) keeps a residual stream ``x`` ``[dim]`` at each
position; after the last layer, at the prompt's last position,

    x_final = e + Σ_l (Σ_h head_{l,h} + b_{O,l}) + Σ_l mlp_l

with ``e`` the token's embedding, ``head_{l,h} = z_{l,h} · W_{O,l}[:, h·d:(h+1)·d]ᵀ`` head ``h``'s output
(``z_{l,h}`` ``[d]``: its slice of the input of layer ``l``'s ``o_proj``, whose weight ``W_O`` is
``[dim, heads·d]``), ``b_{O,l}`` that projection's bias (0 where it has none) and ``mlp_l`` the MLP's
output. The target's logit is

    logit = RMSNorm(x_final) · U[t] = s · (w ⊙ x_final) · U[t],    s = 1 / sqrt(mean(x_final²) + ε)

with ``w`` the final norm's weight and ``U[t]`` the unembedding row of the target token ``t``. The
norm's scale ``s`` is frozen: computed once on the actual ``x_final``, then held fixed, so the logit is a
sum of one term ``c · u`` per component ``c``, with ``u = s · w ⊙ U[t]``:

- ``heads[l, h] = head_{l,h} · u``: the head's direct contribution, in logit units;
- ``embedding = e · u``, ``mlps[l] = mlp_l · u``, ``biases[l] = b_{O,l} · u`` (and the unembedding's bias,
  if any): the remaining terms.

They sum to the logit exactly (up to float rounding). A head's direct contribution leaves out what it
does through later layers (their attention and MLPs reading its output): it is not the effect of removing
the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.models.sites import recording

#: Decoder types whose layers add attention and MLP outputs straight into the residual stream and whose
#: final norm is an RMSNorm ``w ⊙ x / rms(x)`` (Gemma's ``(1 + w)`` norms after attention and its scaled
#: embeddings do not fit this sum).
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class DirectLogitAttribution:
    """Each component's direct contribution to the target token's logit at the prompt's last position,
    in logit units (see the module docstring).

    heads: [layers, heads]. mlps, biases: [layers] (biases: the output projections' biases, 0 without).
    embedding: the last token's embedding. unembedding_bias: the unembedding's bias for the target (0
    without). logit: the model's own logit of the target. scale: the final norm's frozen scale ``s``.
    """

    heads: np.ndarray
    mlps: np.ndarray
    biases: np.ndarray
    embedding: float
    unembedding_bias: float
    logit: float
    scale: float

    @property
    def total(self) -> float:
        """The sum of every component's contribution, which equals :attr:`logit` up to rounding."""
        parts = (self.heads.sum(), self.mlps.sum(), self.biases.sum(), self.embedding, self.unembedding_bias)
        return float(sum(np.float64(part) for part in parts))

    def to_frame(self) -> pd.DataFrame:
        """One row per head: layer, head (0-based) and its direct contribution ``logit_contribution``."""
        layers, heads = self.heads.shape
        layer, head = np.divmod(np.arange(layers * heads), heads)
        return pd.DataFrame({"layer": layer, "head": head, "logit_contribution": self.heads.ravel()})

    def to_dict(self) -> dict[str, object]:
        return {
            "heads": self.heads.tolist(),
            "mlps": self.mlps.tolist(),
            "biases": self.biases.tolist(),
            "embedding": self.embedding,
            "unembedding_bias": self.unembedding_bias,
            "logit": self.logit,
            "total": self.total,
            "scale": self.scale,
        }


def decoder_parts(loaded: LoadedModel) -> tuple[list[nn.Module], nn.Module, nn.Linear]:
    """The decoder layers, the final norm and the unembedding of a supported language model.

    Raises:
        BertologyError: a model type outside :data:`SUPPORTED_TYPES` or one without its language-modelling
            head.
    """
    if loaded.model_type not in SUPPORTED_TYPES:
        raise BertologyError(
            f"Direct logit attribution is for the decoders {', '.join(SUPPORTED_TYPES)}; "
            f"'{loaded.name}' is a {loaded.model_type!r} model."
        )
    unembedding = loaded.model.get_output_embeddings()
    if unembedding is None:
        raise BertologyError(
            f"'{loaded.name}' was loaded without its language-modelling head; load it with "
            "load_model(..., language_model=True)."
        )
    base = loaded.model.base_model
    return list(base.layers), base.norm, unembedding


def direct_logit_attribution(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], target: int
) -> DirectLogitAttribution:
    """The direct contributions to token ``target``'s logit at the last position of ``inputs`` (one
    prompt, ``[1, n]`` tensors from ``LoadedModel.model_inputs``), from one forward pass with hooks.

    Raises:
        BertologyError: a model type outside :data:`SUPPORTED_TYPES` or one without its language-modelling
            head.
    """
    layers, norm, unembedding = decoder_parts(loaded)
    last = len(layers) - 1
    # the last layer's output is the final norm's input
    sites = ["embed", "z", "mlp_out", ("resid_post", last)]
    with torch.no_grad(), recording(loaded.model, sites) as cache:
        logit = float(loaded.model(**inputs).logits[0, -1, target])

    def at_last_position(tensor: torch.Tensor) -> torch.Tensor:
        return tensor[0, -1].float()

    seen = {
        "embedding": [at_last_position(cache["embed"])],
        "final": [at_last_position(cache["resid_post", last])],
        "z": [at_last_position(cache["z", layer]).flatten() for layer in range(len(layers))],
        "mlp": [at_last_position(cache["mlp_out", layer]) for layer in range(len(layers))],
    }
    with torch.no_grad():
        return _contributions(layers, norm, unembedding, seen, target, logit)


def _contributions(
    layers: list[nn.Module],
    norm: nn.Module,
    unembedding: nn.Linear,
    seen: dict[str, list[torch.Tensor]],
    target: int,
    logit: float,
) -> DirectLogitAttribution:
    """The contributions from the last position's captured vectors ``seen`` (o_proj inputs ``z``, MLP
    outputs, the final residual and the embedding; ``[features]`` each)."""
    final = seen["final"][0]
    scale = torch.rsqrt(final.pow(2).mean() + norm.variance_epsilon)
    direction = scale * norm.weight.float() * unembedding.weight[target].float()  # [dim]
    head_terms, bias_terms = [], []
    for layer, z in zip(layers, seen["z"], strict=True):
        projection, head_dim = layer.self_attn.o_proj, layer.self_attn.head_dim
        # [heads, d]: each head's slice of o_proj's columns read along the direction
        read = (projection.weight.float().T @ direction).view(-1, head_dim)
        head_terms.append((z.view(-1, head_dim) * read).sum(-1))
        bias = projection.bias
        bias_terms.append(direction.new_zeros(()) if bias is None else bias.float() @ direction)
    logit_bias = unembedding.bias
    return DirectLogitAttribution(
        heads=torch.stack(head_terms).cpu().double().numpy(),
        mlps=torch.stack([mlp @ direction for mlp in seen["mlp"]]).cpu().double().numpy(),
        biases=torch.stack(bias_terms).cpu().double().numpy(),
        embedding=float(seen["embedding"][0] @ direction),
        unembedding_bias=0.0 if logit_bias is None else float(logit_bias[target]),
        logit=logit,
        scale=float(scale),
    )

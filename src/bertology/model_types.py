"""The one table of model types bertology supports: what each is, how its attention is captured, and
which features it has.

Keyed by ``config.model_type``. Each :class:`ModelType` gives a display name, the kind (encoder,
decoder, encoder-decoder), the capture route (``"interface"``: transformers' ``AttentionInterface``,
recorded by :mod:`bertology.hook`; ``"module"``: models that compute attention in their own code,
recorded by :mod:`bertology.module_capture`) and, where the neuron view cannot be shown honestly, why.
The other features follow from the kind and from :mod:`bertology.anatomy` (:func:`features`).
Types bertology knows and refuses on purpose are in :data:`REFUSED`, each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from transformers import PretrainedConfig

from bertology.anatomy import describes
from bertology.errors import BertologyError
from bertology.module_capture import ModuleRoute, bert_style_queries_keys, rotary_queries_keys

ModelKind = Literal["encoder", "encoder-decoder", "decoder"]
Route = Literal["interface", "module"]

#: Each kind with its article, for messages ("'gpt2' is a decoder model").
KIND_PHRASES: dict[ModelKind, str] = {
    "encoder": "an encoder",
    "encoder-decoder": "an encoder-decoder",
    "decoder": "a decoder",
}

_RELATIVE = "adds relative-position terms to q·k, so q·k alone does not give its attention"


@dataclass(frozen=True)
class ModelType:
    """One supported ``config.model_type``.

    name: display name. kind: ``"encoder"``, ``"decoder"`` (causal self-attention) or
    ``"encoder-decoder"``. module_route: for models that compute attention in their own code, how to
    read it (:class:`~bertology.module_capture.ModuleRoute`); ``None`` for the ``AttentionInterface``.
    no_neuron_view: why the neuron view (q, k and q·k) would not show this type's attention honestly
    (a phrase after the model's name), or ``""`` where it does.
    """

    name: str
    kind: ModelKind = "encoder"
    module_route: ModuleRoute | None = None
    no_neuron_view: str = ""

    @property
    def route(self) -> Route:
        return "interface" if self.module_route is None else "module"


def _encoders(**names: str) -> dict[str, ModelType]:
    return {model_type.replace("_", "-"): ModelType(name) for model_type, name in names.items()}


MODEL_TYPES: dict[str, ModelType] = {
    # Encoders whose attention goes through the AttentionInterface.
    **_encoders(bert="BERT", roberta="RoBERTa", xlm_roberta="XLM-RoBERTa", albert="ALBERT"),
    **_encoders(distilbert="DistilBERT", electra="ELECTRA", camembert="CamemBERT", ernie="ERNIE"),
    **_encoders(data2vec_text="Data2Vec-Text", xmod="X-MOD", xlm_roberta_xl="XLM-RoBERTa-XL"),
    "roc_bert": ModelType("RoCBert"),
    "modernbert": ModelType("ModernBERT"),
    "nomic_bert": ModelType("Nomic BERT"),
    "gte": ModelType("GTE"),
    "mobilebert": ModelType("MobileBERT"),
    # Encoders that compute attention in their own code.
    "deberta": ModelType(
        "DeBERTa", module_route=ModuleRoute("DisentangledSelfAttention"), no_neuron_view=_RELATIVE
    ),
    "deberta-v2": ModelType(
        "DeBERTa-v2/v3", module_route=ModuleRoute("DisentangledSelfAttention"), no_neuron_view=_RELATIVE
    ),
    "mpnet": ModelType("MPNet", module_route=ModuleRoute("MPNetSelfAttention"), no_neuron_view=_RELATIVE),
    "megatron-bert": ModelType(
        "Megatron-BERT", module_route=ModuleRoute("MegatronBertSelfAttention", bert_style_queries_keys)
    ),
    "roformer": ModelType("RoFormer", module_route=ModuleRoute("RoFormerSelfAttention", rotary_queries_keys)),
    # Decoders (causal self-attention).
    "gpt2": ModelType("GPT-2", "decoder"),
    "llama": ModelType("Llama", "decoder"),
    "mistral": ModelType("Mistral", "decoder"),
    "qwen2": ModelType("Qwen2", "decoder"),
    "qwen3": ModelType("Qwen3", "decoder"),
    "gemma": ModelType("Gemma", "decoder"),
    "gemma2": ModelType(
        "Gemma 2", "decoder", no_neuron_view="caps its attention scores with tanh before the softmax"
    ),
    "gemma3_text": ModelType("Gemma 3 (text)", "decoder"),
    # Encoder-decoders (views only).
    "bart": ModelType("BART", "encoder-decoder"),
    "t5": ModelType("T5", "encoder-decoder"),
}  # fmt: skip

#: Model types bertology refuses on purpose, with the reason (a phrase after the model's name).
REFUSED: dict[str, str] = {
    "funnel": (
        "pools the sequence between its blocks, so its later layers attend between pooled positions that "
        "are not tokens, which no token-by-token view or statistic can show honestly"
    ),
    "longformer": (
        "returns each token's attention over its local window only, not over the tokens, so its maps "
        "are not token-by-token attention"
    ),
    "big_bird": "attends over random and global blocks of tokens, not over every token",
}

#: The features of :func:`features`, in the order ``bertology models`` shows them.
FEATURES = ("views", "neuron view", "analysis", "probes", "interventions", "norm weights")


def features(model_type: str) -> dict[str, bool]:
    """Which of :data:`FEATURES` a supported ``model_type`` has: every type has the head and model views;
    corpus analysis works on encoders and decoders (single texts, future keys skipped); probes on
    encoders; interventions (head gates, ablation, importance, pruning) and norm-based weights where
    :mod:`bertology.anatomy` describes the layers and projections."""
    entry = MODEL_TYPES[model_type]
    described = entry.kind != "encoder-decoder" and describes(model_type)
    return {
        "views": True,
        "neuron view": entry.kind != "encoder-decoder" and not entry.no_neuron_view,
        "analysis": entry.kind != "encoder-decoder",
        "probes": entry.kind == "encoder",
        "interventions": described,
        "norm weights": described,
    }


def supported_type(config: PretrainedConfig, label: str) -> ModelType:
    """The table entry of ``config.model_type``.

    Raises:
        BertologyError: a type bertology does not support, in one sentence that names it and what is
            supported (and, for :data:`REFUSED` types, why).
    """
    name = config.model_type
    entry = MODEL_TYPES.get(name)
    if entry is not None:
        return entry
    if name in REFUSED:
        raise BertologyError(
            f"'{label}' is a {name!r} model, which bertology does not support: it {REFUSED[name]}."
        )
    supported = {
        kind: ", ".join(entry.name for entry in MODEL_TYPES.values() if entry.kind == kind)
        for kind in ("encoder", "decoder", "encoder-decoder")
    }
    raise BertologyError(
        f"'{label}' is a {name!r} model, which bertology does not support (encoders: {supported['encoder']}; "
        f"decoders: {supported['decoder']}; encoder-decoders: {supported['encoder-decoder']}; "
        "'bertology models' lists them)."
    )


def sliding_window(config: PretrainedConfig) -> int | None:
    """The attention window of a model with sliding-window layers (Mistral, Gemma 2 and 3, ModernBERT's
    local layers: a query sees keys fewer than this many positions away), or ``None`` where every layer
    attends over the whole input."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def neuron_view_refusal(entry: ModelType, config: PretrainedConfig, label: str, tokens: int) -> str | None:
    """Why the neuron view of ``tokens`` tokens of this model would not be honest (a sentence), or ``None``
    where its scaled q·k, masked (causal for a decoder) and softmaxed, is exactly its attention."""
    if entry.kind == "encoder-decoder":
        return f"The neuron view needs an encoder or decoder model; '{label}' is an encoder-decoder model."
    if entry.no_neuron_view:
        return f"The neuron view is not available for '{label}': {entry.name} {entry.no_neuron_view}."
    if getattr(config, "attn_logit_softcapping", None):
        return f"The neuron view is not available for '{label}': it caps its attention scores (tanh)."
    window = sliding_window(config)
    if window is not None and tokens > window:
        return (
            f"The neuron view of '{label}' takes at most {window} tokens (its sliding-window layers hide "
            f"keys further away than that, which q·k alone does not show); this input has {tokens}."
        )
    return None

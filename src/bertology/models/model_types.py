"""The one table of model types bertology supports, :data:`MODEL_TYPES`: one record per type saying what
it is, how its attention is captured, where its layers and attention projections are, and which features
it has.

Keyed by ``config.model_type``. Each :class:`ModelType` gives a display name, the kind (encoder,
decoder, encoder-decoder), the capture route (``"interface"``: transformers' ``AttentionInterface``,
recorded by :mod:`bertology.models.hook`; ``"module"``: models that compute attention in their own code,
recorded by :mod:`bertology.models.module_capture`), where the neuron view cannot be shown honestly, why, and,
for the encoders and decoders whose heads can be gated, removed and weighed, the :class:`Layout` of their
modules (read by :mod:`bertology.models.anatomy`). The other features follow from the kind and the layout
(:func:`features`). Types bertology knows and refuses on purpose are in :data:`REFUSED`, each with its
reason.

Every ``nn.Linear`` stores its weight as ``[out_features, in_features]``. A layer's query, key and value
features are ``head_dim`` output rows per head of a projection: their own ``Linear`` (head ``h`` owns rows
``h * head_dim .. (h + 1) * head_dim``), or one fused ``Linear`` (:class:`Fused`) with q, k and v stacked
(ModernBERT's ``Wqkv``: all heads' q rows, then k, then v) or interleaved per head (DeBERTa's
``in_proj``: head ``h``'s q, k and v rows together). The output projection takes the heads' outputs,
concatenated, as input: head ``h`` owns columns ``h * head_dim .. (h + 1) * head_dim``. GPT-2's projections
are ``Conv1D`` modules, which compute the same map from a weight stored transposed, ``[in_features,
out_features]`` (:func:`bertology.models.anatomy.linear_weight` reads either as ``[out, in]``); its ``c_attn``
stacks q, k and v like ModernBERT's ``Wqkv``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from bertology.errors import BertologyError

if TYPE_CHECKING:  # the table itself needs neither transformers nor torch (`bertology models` lists it)
    from transformers import PretrainedConfig

ModelKind = Literal["encoder", "encoder-decoder", "decoder"]
Route = Literal["interface", "module"]
#: How a module route's queries and keys are recomputed
#: (:data:`bertology.models.module_capture.QUERIES_KEYS`): BERT's ``query`` and ``key`` projections, or those
#: after RoFormer's rotary embedding.
QueriesKeysName = Literal["bert_style", "rotary"]


@dataclass(frozen=True)
class ModuleRoute:
    """How to read the attention of a model that computes it in its own code
    (:mod:`bertology.models.module_capture`).

    attention_class: the class name of the module that computes one layer's attention and returns
        ``(context, probs [batch, heads, query, key], ...)`` when called with ``output_attentions=True``.
    queries_keys: the name of the recipe that gets that module's queries and keys, or ``None`` where
        q·k alone does not give the probabilities (relative position terms); the model type's table
        entry then says why the neuron view is refused.
    """

    attention_class: str
    queries_keys: QueriesKeysName | None = None


#: Each kind with its article, for messages ("'gpt2' is a decoder model").
KIND_PHRASES: dict[ModelKind, str] = {
    "encoder": "an encoder",
    "encoder-decoder": "an encoder-decoder",
    "decoder": "a decoder",
}

_RELATIVE = "adds relative-position terms to q·k, so q·k alone does not give its attention"

#: How a fused projection orders its rows: ``"stacked"`` (q of every head, then k, then v) or
#: ``"interleaved"`` (q, k, v of head 0, then of head 1, ...).
FusedOrder = Literal["stacked", "interleaved"]


@dataclass(frozen=True)
class Fused:
    """One ``Linear`` computing q, k and v (path from the layer), in ``order``; ``biases``: names of
    separate ``[heads * head_dim]`` parameters of the attention module added to q, k, v (or ``None``)."""

    path: str
    order: FusedOrder
    biases: tuple[str | None, str | None, str | None] = (None, None, None)


@dataclass(frozen=True)
class Layout:
    """Where one model type keeps its layers and attention projections, as module paths. With
    grouped-query attention (Llama, Mistral, Qwen, Gemma) the key and value projections have ``head_dim``
    rows per key/value head, each shared by ``num_key_value_groups`` consecutive query heads.

    layers: from the base model to the ``ModuleList`` of layers (ALBERT: its layer groups).
    attention: from a layer to its self-attention module (holds the head size; its head count is kept
        up to date by pruning). qkv: from a layer to the query, key and value ``Linear``\\ s, or one
        fused one. output: from a layer to the output projection.
    per_head: from a layer to further projections with ``head_dim`` rows per head, present or not
        depending on the config (DeBERTa's relative-position projections); pruning slices them too.
    head_argument: index of a positional argument of the attention module holding per-head values
        ``[batch, heads, query, key]`` computed once for all layers (MPNet's relative position bias).
    mlp: from a layer to the module whose output is what the feed-forward block adds to the residual
        stream (before a post-norm's add and normalisation, as TransformerLens's ``hook_mlp_out``).
    mid: from a layer to the module whose output (``mid_is_input`` False: post-norm encoders, where it
        holds the add and norm after attention) or first input (``mid_is_input``: pre-norm models, the norm
        before the feed-forward block) is the residual stream between attention and feed-forward block.
    attn_out: from a layer to the module whose output is what the attention block adds (Gemma 2 and 3
        normalise the output projection's result first); ``None``: the output projection.
    attn_norm: from a layer to the norm between the layer's input and the query, key and value
        projections of a pre-norm model (Llama's ``input_layernorm``, GPT-2's ``ln_1``); ``None`` where the
        layout does not name it (the per-head ``q_input`` sites of :mod:`bertology.models.sites` need it).
    post_norms: from a layer to the two ``LayerNorm``\\ s of a post-norm layer, the one after the attention
        block and the one after the feed-forward block (BERT's ``attention.output.LayerNorm`` and
        ``output.LayerNorm``); ``None`` where the layout does not name them (circuits in encoders need them).
    mlp_input: from a layer to the module whose first input is the feed-forward block's own input in a
        post-norm layer (BERT's ``intermediate``; site ``mlp_in``); ``None`` where not named.
    """

    layers: str
    attention: str
    qkv: tuple[str, str, str] | Fused
    output: str
    per_head: tuple[str, ...] = ()
    head_argument: int | None = None
    mlp: str = "output.dense"
    mid: str = "attention"
    mid_is_input: bool = False
    attn_out: str | None = None
    attn_norm: str | None = None
    post_norms: tuple[str, str] | None = None
    mlp_input: str | None = None


def _separate(
    attention: str, names: tuple[str, str, str] = ("query", "key", "value")
) -> tuple[str, str, str]:
    """Paths of the query, key and value ``Linear``\\ s named ``names`` inside ``attention``."""
    query, key, value = (f"{attention}.{name}" for name in names)
    return query, key, value


#: BERT's layout: ``encoder.layer[i].attention.self.{query,key,value}`` and ``.attention.output.dense``.
_BERT = Layout("encoder.layer", "attention.self", _separate("attention.self"), "attention.output.dense")
#: BERT's post-norm layer as BERT, RoBERTa and their copies have it, its norms and feed-forward input named.
_POST_NORM_BERT = replace(
    _BERT, post_norms=("attention.output.LayerNorm", "output.LayerNorm"), mlp_input="intermediate"
)


def _self_attn(**fields: Any) -> Layout:
    """A layout whose blocks are named like Llama's: ``layers[i].self_attn.{q,k,v,o}_proj`` (``fields``:
    the rest of the :class:`Layout`)."""
    return Layout(
        "layers",
        "self_attn",
        _separate("self_attn", ("q_proj", "k_proj", "v_proj")),
        "self_attn.o_proj",
        **fields,
    )


#: Llama's layout (pre-norm: the residual stream between the blocks enters ``post_attention_layernorm``).
_SELF_ATTN = _self_attn(
    mlp="mlp", mid="post_attention_layernorm", mid_is_input=True, attn_norm="input_layernorm"
)
#: Gemma 2 and 3: each block's output normalised before it is added, a norm before the feed-forward block.
_GEMMA2 = _self_attn(
    mlp="post_feedforward_layernorm",
    mid="pre_feedforward_layernorm",
    mid_is_input=True,
    attn_out="post_attention_layernorm",
)
#: Nomic BERT and GTE: post-norm blocks named like Llama's.
_POST_NORM_SELF_ATTN = _self_attn(mlp="mlp", mid="post_attention_layernorm")


@dataclass(frozen=True)
class Stacks:
    """Where an encoder-decoder (BART, T5) keeps its three kinds of attention, one :class:`Layout` each:
    ``encoder`` (the encoder's self-attention), ``decoder`` (the decoder's causal self-attention) and
    ``cross`` (the decoder's attention over the encoder's output: its ``layers`` are the decoder's).
    Only their ``layers``, ``attention``, ``qkv`` and ``output`` are read (an encoder-decoder has no
    ``resid_mid`` or ``mlp_out`` site)."""

    encoder: Layout
    decoder: Layout
    cross: Layout


def _attention_layout(layers: str, attention: str, names: tuple[str, str, str], output: str) -> Layout:
    """A layout of one attention per layer: ``names`` and ``output`` inside ``attention``."""
    return Layout(layers, attention, _separate(attention, names), f"{attention}.{output}")


_BART_NAMES = ("q_proj", "k_proj", "v_proj")
#: BART: ``encoder.layers[i].self_attn``, ``decoder.layers[i].self_attn`` and ``.encoder_attn``.
_BART_STACKS = Stacks(
    _attention_layout("encoder.layers", "self_attn", _BART_NAMES, "out_proj"),
    _attention_layout("decoder.layers", "self_attn", _BART_NAMES, "out_proj"),
    _attention_layout("decoder.layers", "encoder_attn", _BART_NAMES, "out_proj"),
)
#: T5: ``encoder.block[i].layer[0].SelfAttention``, ``decoder.block[i].layer[0].SelfAttention`` and
#: ``.layer[1].EncDecAttention`` (each with ``q``, ``k``, ``v`` and ``o``).
_T5_STACKS = Stacks(
    _attention_layout("encoder.block", "layer.0.SelfAttention", ("q", "k", "v"), "o"),
    _attention_layout("decoder.block", "layer.0.SelfAttention", ("q", "k", "v"), "o"),
    _attention_layout("decoder.block", "layer.1.EncDecAttention", ("q", "k", "v"), "o"),
)


@dataclass(frozen=True)
class ModelType:
    """One supported ``config.model_type``.

    name: display name. kind: ``"encoder"``, ``"decoder"`` (causal self-attention) or
    ``"encoder-decoder"``. module_route: for models that compute attention in their own code, how to
    read it (:class:`ModuleRoute`); ``None`` for the ``AttentionInterface``.
    no_neuron_view: why the neuron view (q, k and q·k) would not show this type's attention honestly
    (a phrase after the model's name), or ``""`` where it does. layout: where its layers and attention
    projections are, for the types with head gates, ablation, importance, pruning and norm-based
    weights; ``None`` for the others. stacks: an encoder-decoder's three attentions (:class:`Stacks`), for
    its head gates, ablation, importance and sites.
    """

    name: str
    kind: ModelKind = "encoder"
    module_route: ModuleRoute | None = None
    no_neuron_view: str = ""
    layout: Layout | None = None
    stacks: Stacks | None = None

    @property
    def route(self) -> Route:
        return "interface" if self.module_route is None else "module"


def _bert_layout(shape: Layout = _BERT, **names: str) -> dict[str, ModelType]:
    """Encoders with BERT's layout (``shape``) whose attention goes through the ``AttentionInterface``, by
    type."""
    return {model_type.replace("_", "-"): ModelType(name, layout=shape) for model_type, name in names.items()}


MODEL_TYPES: dict[str, ModelType] = {
    # Encoders whose attention goes through the AttentionInterface.
    **_bert_layout(_POST_NORM_BERT, bert="BERT", roberta="RoBERTa", xlm_roberta="XLM-RoBERTa"),
    **_bert_layout(_POST_NORM_BERT, electra="ELECTRA", camembert="CamemBERT", ernie="ERNIE"),
    **_bert_layout(_POST_NORM_BERT, data2vec_text="Data2Vec-Text"),
    **_bert_layout(xmod="X-MOD"),
    **_bert_layout(xlm_roberta_xl="XLM-RoBERTa-XL"),
    "roc_bert": ModelType("RoCBert", layout=_BERT),
    "mobilebert": ModelType("MobileBERT", layout=_BERT),
    "albert": ModelType("ALBERT", layout=Layout(
        "encoder.albert_layer_groups", "albert_layers.0.attention",
        _separate("albert_layers.0.attention"), "albert_layers.0.attention.dense",
        mlp="albert_layers.0.ffn_output", mid="albert_layers.0.attention",
    )),
    "distilbert": ModelType("DistilBERT", layout=Layout(
        "transformer.layer", "attention", _separate("attention", ("q_lin", "k_lin", "v_lin")),
        "attention.out_lin", mlp="ffn", mid="sa_layer_norm",
    )),
    "modernbert": ModelType(
        "ModernBERT", layout=Layout(
            "layers", "attn", Fused("attn.Wqkv", "stacked"), "attn.Wo", mlp="mlp", mid="mlp_norm",
            mid_is_input=True,
        )
    ),
    "nomic_bert": ModelType("Nomic BERT", layout=_POST_NORM_SELF_ATTN),
    "gte": ModelType("GTE", layout=_POST_NORM_SELF_ATTN),
    # Encoders that compute attention in their own code.
    "deberta": ModelType(
        "DeBERTa", module_route=ModuleRoute("DisentangledSelfAttention"), no_neuron_view=_RELATIVE,
        layout=Layout(
            "encoder.layer", "attention.self",
            Fused("attention.self.in_proj", "interleaved", biases=("q_bias", None, "v_bias")),
            "attention.output.dense", per_head=("attention.self.pos_proj", "attention.self.pos_q_proj"),
        ),
    ),
    "deberta-v2": ModelType(
        "DeBERTa-v2/v3", module_route=ModuleRoute("DisentangledSelfAttention"), no_neuron_view=_RELATIVE,
        layout=Layout(
            "encoder.layer", "attention.self",
            _separate("attention.self", ("query_proj", "key_proj", "value_proj")),
            "attention.output.dense",
            per_head=("attention.self.pos_key_proj", "attention.self.pos_query_proj"),
        ),
    ),
    "mpnet": ModelType(
        "MPNet", module_route=ModuleRoute("MPNetSelfAttention"), no_neuron_view=_RELATIVE,
        layout=Layout(
            "encoder.layer", "attention.attn", _separate("attention.attn", ("q", "k", "v")),
            "attention.attn.o", head_argument=2, post_norms=("attention.LayerNorm", "output.LayerNorm"),
            mlp_input="intermediate",
        ),
    ),
    "megatron-bert": ModelType(
        "Megatron-BERT", module_route=ModuleRoute("MegatronBertSelfAttention", "bert_style"),
        layout=_BERT,
    ),
    "roformer": ModelType(
        "RoFormer", module_route=ModuleRoute("RoFormerSelfAttention", "rotary"), layout=_BERT
    ),
    # Decoders (causal self-attention); grouped-query ones share each k/v head among query heads.
    "gpt2": ModelType(
        "GPT-2", "decoder", layout=Layout(
            "h", "attn", Fused("attn.c_attn", "stacked"), "attn.c_proj", mlp="mlp", mid="ln_2",
            mid_is_input=True, attn_norm="ln_1",
        )
    ),
    "llama": ModelType("Llama", "decoder", layout=_SELF_ATTN),
    "mistral": ModelType("Mistral", "decoder", layout=_SELF_ATTN),
    "qwen2": ModelType("Qwen2", "decoder", layout=_SELF_ATTN),
    "qwen3": ModelType("Qwen3", "decoder", layout=_SELF_ATTN),
    "gemma": ModelType("Gemma", "decoder", layout=_SELF_ATTN),
    "gemma2": ModelType(
        "Gemma 2", "decoder", no_neuron_view="caps its attention scores with tanh before the softmax",
        layout=_GEMMA2,
    ),
    "gemma3_text": ModelType("Gemma 3 (text)", "decoder", layout=_GEMMA2),
    # Encoder-decoders: three attentions (encoder, decoder, cross), each with its own sites and gates.
    "bart": ModelType("BART", "encoder-decoder", stacks=_BART_STACKS),
    "t5": ModelType("T5", "encoder-decoder", stacks=_T5_STACKS),
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


#: What each feature column means for an encoder-decoder (BART, T5), for ``bertology models``.
ENCODER_DECODER_FEATURES = {
    "views": "encoder, decoder and cross-attention of a source and a --target",
    "neuron view": "not available",
    "analysis": "heads.csv has a row per stack (encoder, decoder, cross), layer and head; a source "
    "without a target is decoded greedily",
    "probes": "not available",
    "interventions": "head gates, ablation and importance (ablate --lm-corpus with sources and targets, "
    "the target's loss) on all three stacks, heads named stack:layer-head (cross:1-2); no structural pruning",
    "norm weights": "not available",
}


def features(model_type: str) -> dict[str, bool]:
    """Which of :data:`FEATURES` a supported ``model_type`` has: every type has the head and model views;
    corpus analysis works on every kind (a decoder's single texts, future keys skipped; an
    encoder-decoder's sources and targets, its encoder, decoder and cross-attention:
    :data:`ENCODER_DECODER_FEATURES`); probes on encoders; interventions (head gates, ablation, importance,
    pruning) where the record has a :class:`Layout` (an encoder-decoder: :class:`Stacks`, no pruning);
    norm-based weights where it has a :class:`Layout`."""
    entry = MODEL_TYPES[model_type]
    described = entry.layout is not None
    return {
        "views": True,
        "neuron view": entry.kind != "encoder-decoder" and not entry.no_neuron_view,
        "analysis": True,
        "probes": entry.kind == "encoder",
        "interventions": described or entry.stacks is not None,
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

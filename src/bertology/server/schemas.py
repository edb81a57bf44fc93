"""Request and answer bodies of the JSON API (they make its OpenAPI schema).

Heads are ``(layer, head)``, 0-based. Attention rows are the attending (query) token, columns the
attended-to (key) token. Per-head tables are ``[layers][heads]`` lists; ``null`` where a statistic is
not defined for the input (e.g. [SEP]-to-[SEP] without a [SEP]).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model
from pydantic_core import PydanticCustomError

from bertology.attention.norms import WEIGHTS
from bertology.views import VIEW_KINDS

PerHead = list[list[float | None]]
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])

#: Most layers, and most heads per layer, of an analysis the explorer's requests can name (the largest
#: models have well under 200 of either); a head beyond the chosen analysis's own grid gets 422.
MOST_HEADS = 1024


def _whole(value: object) -> object:
    """A JSON number that is a whole number (``2.0``) as the ``int`` it equals, since JSON Schema counts
    it an integer; ``true`` and ``false`` refused, since it counts them no number."""
    if isinstance(value, bool):
        raise PydanticCustomError("int_type", "Input should be a valid integer, not a boolean")
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(most: int | None = None, *, least: int = 0) -> Any:
    """The type of an integer field from ``least`` to ``most`` (``None``: no largest), as JSON Schema
    defines an integer: ``2`` or ``2.0``, never ``"2"`` or ``true`` (the request models are strict)."""
    return Annotated[int, Field(ge=least, le=most), BeforeValidator(_whole)]


def integer_of(values: Sequence[int]) -> Any:
    """The type of an integer field that takes one of ``values`` (an enum in the schema), as
    :func:`integer` reads integers."""
    return Annotated[Literal[tuple(values)], BeforeValidator(_whole)]


def reading_body(endpoint: Endpoint, body: type[BaseModel]) -> Endpoint:
    """``endpoint`` with its ``body`` parameter read as ``body``: a request model made for one server
    (:func:`request_models`, :func:`search_request_models`), whose schema names its limits."""
    endpoint.__annotations__["body"] = body
    return endpoint


class InputRequest(BaseModel):
    """One text, or a pair of texts, for one of the server's models.

    Strict: no field is converted from another JSON type (``"1"`` is not a layer, ``false`` not a head).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(min_length=1, description="The text (text A of a pair).")
    text_b: str | None = Field(None, min_length=1, description="Optional second text (text B of a pair).")
    model: str | None = Field(None, description="A model name from /api/models (default: the first one).")
    weights: Literal[WEIGHTS] = Field(  # type: ignore[valid-type]
        "attention",
        description="attention: the softmax weights; norm: norm-based weights ||a f(x)|| (Kobayashi et al. "
        "2020), rows normalised to sum to 1 (the neuron view shows them beside the softmax).",
    )


#: ``[start, stop]``: tokens ``start .. stop - 1``.
Span = Annotated[list[integer()], Field(min_length=2, max_length=2)]


class AttentionRequest(InputRequest):
    layer: integer() | None = Field(None, description="Only this layer (default: every layer).")
    head: integer() | None = Field(None, description="Only this head (default: every head).")
    rows: Span | None = Field(
        None,
        description="Only these query rows, [start, stop] (default: all); a block of a long input. "
        "422 unless 0 <= start < stop <= the input's token count.",
    )
    keys: Span | None = Field(
        None,
        description="Only these keys, [start, stop] (default: all); 422 unless 0 <= start < stop <= the "
        "input's token count.",
    )


class ViewRequest(InputRequest):
    view: Literal[VIEW_KINDS] = Field("head", description="head, model or neuron.")  # type: ignore[valid-type]
    layer: integer() = Field(0, description="Layer shown first.")
    head: integer() = Field(0, description="Head shown first (neuron view).")
    query: integer() | None = Field(
        None,
        description="Query token shown first (neuron view; default: the last token for a decoder, else the "
        "first); 422 beyond the input's tokens.",
    )
    theme: Literal["light", "dark"] | None = Field(
        None,
        description="light or dark (default: dark for the model and neuron views, light for the head view).",
    )


def _retyped(base: type[BaseModel], name: str, kind: Any) -> tuple[object, object]:
    """The field ``name`` of ``base`` with the type ``kind`` instead (its default and description kept),
    for :func:`pydantic.create_model`."""
    field = base.model_fields[name]
    return kind, Field(field.default, description=field.description)


@dataclass(frozen=True)
class RequestModels:
    """The request bodies of one server, their limits in the schema (see :func:`request_models`)."""

    input: type[InputRequest]
    attention: type[AttentionRequest]
    view: type[ViewRequest]


def request_models(names: Sequence[str], *, layers: int, heads: int, tokens: int) -> RequestModels:
    """Request bodies whose schema says what this server accepts: ``model`` one of ``names``, ``layer``
    below ``layers``, ``head`` below ``heads`` and ``query`` below ``tokens`` (the most of any of the
    server's models; a smaller model still refuses, with 422, what it does not have)."""

    most = {"layer": layers, "head": heads, "query": tokens}

    def bounded(base: type[BaseModel], name: str) -> tuple[object, object]:
        kind = integer(most[name] - 1)
        return _retyped(base, name, kind if base.model_fields[name].default is not None else kind | None)

    model = (Literal[tuple(names)] | None, InputRequest.model_fields["model"])  # type: ignore[valid-type]
    return RequestModels(
        input=create_model("InputRequest", __base__=InputRequest, model=model),
        attention=create_model(
            "AttentionRequest",
            __base__=AttentionRequest,
            model=model,
            layer=bounded(AttentionRequest, "layer"),
            head=bounded(AttentionRequest, "head"),
        ),
        view=create_model(
            "ViewRequest",
            __base__=ViewRequest,
            model=model,
            **{name: bounded(ViewRequest, name) for name in ("layer", "head", "query")},
        ),
    )


class ModelInfo(BaseModel):
    name: str
    model_type: str
    layers: int
    heads: int
    max_tokens: int = Field(description="Most tokens per input, special tokens included.")


class ModelList(BaseModel):
    default: str
    models: list[ModelInfo]


class AttentionAnswer(BaseModel):
    model: str
    tokens: list[str]
    segments: list[int] = Field(description="Per token: 0 = text A, 1 = text B.")
    layers: list[int] = Field(description="The layers in ``attention``, in order.")
    heads: list[int] = Field(description="The heads in ``attention``, in order.")
    rows: Span = Field(description="The query rows in ``attention``, [start, stop].")
    keys: Span = Field(description="The keys in ``attention``, [start, stop].")
    attention: list[list[list[list[float]]]] = Field(
        description="[layers][heads][query][key] attention weights (as requested: softmax or norm-based), "
        "rounded to 6 decimals."
    )


class StatisticsAnswer(BaseModel):
    model: str
    tokens: list[str] = Field(description="The input's tokens, the word-start marks Ġ and ▁ shown as spaces.")
    segments: list[int]
    layers: int
    heads: int
    surface: dict[str, PerHead] = Field(
        description="Surface statistics (bertology.stats.surface), each [layers][heads]."
    )
    patterns: dict[str, PerHead] = Field(
        description="Pattern scores (bertology.analysis.patterns), each [layers][heads]."
    )
    labels: list[list[str]] = Field(description="[layers][heads] primary pattern label, or 'none'.")
    descriptions: dict[str, dict[str, str]] = Field(
        description="One line on each statistic, by group and name: {'surface': {name: text}, "
        "'patterns': {...}, 'labels': {...}}."
    )


class RunEntry(BaseModel):
    path: str = Field(description="Folder, relative to the runs folder, with '/' between parts.")
    kind: Literal[
        "analysis",
        "comparison",
        "probe",
        "ablation",
        "patching",
        "heads",
        "composition",
        "circuit",
        "training",
        "report",
    ] = Field(
        description="What the folder holds, as its writer marked it; 'report': a report without a mark."
    )
    model: str | None = Field(
        None,
        description="The model the run used, as its mark names it ('A vs B': a comparison); null: unnamed.",
    )
    url: str
    explore: str | None = Field(None, description="An analysis's explorer page (/explore?run=PATH), or null.")
    links: dict[str, str] = Field(
        default_factory=dict, description="The run's other files by name: a circuit's 'curves' (its PNG)."
    )


class RunList(BaseModel):
    root: str | None = Field(description="The runs folder, or null when the server has none.")
    runs: list[RunEntry]


class Health(BaseModel):
    status: Literal["ok"]
    models: list[str]


class ExploreRequest(BaseModel):
    """An analysis folder of the runs folder (``bertology analyze`` output), as ``/api/runs`` lists it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    run: str = Field(
        max_length=1000,
        description="The analysis folder, relative to the runs folder ('' for the folder itself).",
    )


class ExploreHeadRequest(ExploreRequest):
    layer: integer(MOST_HEADS - 1) = Field(
        description="The head's layer (0-based); 422 beyond the analysis's layers (/api/explore/analysis)."
    )
    head: integer(MOST_HEADS - 1) = Field(
        description="The head (0-based); 422 beyond the analysis's heads (/api/explore/analysis)."
    )


class ExploreExampleRequest(ExploreHeadRequest):
    rank: integer() = Field(
        description="The example: 0 is the segment where the head's score was highest; 404 beyond the "
        "examples stored (examples_per_head)."
    )
    theme: Literal["light", "dark"] = "light"


class RelatedResults(BaseModel):
    dependency: str | None = Field(description="The dependency probe joined in (its folder), or null.")
    coreference: str | None = Field(description="The coreference probe joined in (its folder), or null.")
    ablation: str | None = Field(description="The ablation joined in (its folder), or null.")
    ablation_model: str | None = Field(
        description="The model the ablation removed heads from (its summary.json), or null when unknown."
    )
    ablation_same_model: bool = Field(
        description="Whether that is the analysis's model; if not, its heads are another model's (e.g. a "
        "classifier fine-tuned from it) and the page says so."
    )
    patching: str | None = Field(
        default=None, description="The patching run of the analysis's model joined in (its folder), or null."
    )
    circuit: str | None = Field(
        default=None, description="The circuit run of the analysis's model joined in (its folder), or null."
    )


class ExploreAnalysis(BaseModel):
    path: str
    summary: dict[str, str | int | float]
    layers: int
    heads: int
    labels: list[list[str]] = Field(description="[layers][heads] primary pattern label, or 'none'.")
    label_descriptions: dict[str, str]
    label_colours: dict[str, str] = Field(
        description="Each label present: its colour (#rrggbb), the same as in the report's map."
    )
    statistics: dict[str, PerHead] = Field(
        description="Every column of heads.csv: surface statistics, pattern scores (score_*), [layers][heads]"
    )
    map: list[list[float]] = Field(
        description="[layers * heads][2] MDS map of the heads (layer-major) by their mean JS divergences."
    )
    examples_per_head: int = Field(description="Examples stored per head (0: none stored).")
    related: RelatedResults


class NearestHead(BaseModel):
    layer: int
    head: int
    label: str
    divergence: float | None = Field(description="Mean JS divergence per query token, nats.")


class ExampleEntry(BaseModel):
    rank: int
    segment: int = Field(description="The segment's number in the analysis's batching order.")
    score: float | None = Field(description="The segment's score for the head's example pattern.")
    origin: str = Field(description="Where the segment comes from: file name and lines.")
    tokens: int


class RelationEntry(BaseModel):
    relation: str
    direction: int = Field(description="0: the dependent attends to its head word; 1: the head word to it.")
    accuracy: float | None
    count: int
    best_head: str | None
    best_accuracy: float | None
    baseline_accuracy: float | None
    gain: float | None = Field(
        description="accuracy - baseline_accuracy: how much better than the fixed-offset baseline this head "
        "finds the relation (the relations are ranked by it)."
    )


class CoreferenceEntry(BaseModel):
    type: str
    accuracy: float | None
    rank: int = Field(description="1: the most accurate head for this mention type.")
    count: int


class AblationEntry(BaseModel):
    change: float | None = Field(description="Dev accuracy with the head removed, minus with every head.")
    accuracy: float | None
    importance: float | None
    rank: int | None = Field(
        description="1: the head whose removal lowers the accuracy most; null when every head's change is "
        "the same (no head ranks above another)."
    )


class PatchingEntry(BaseModel):
    effect: float | None = Field(
        description="The head's patching effect: 1 restores (denoising) or removes (noising, -1) all of the "
        "clean behaviour."
    )
    rank: int = Field(description="1: the head with the largest effect.")
    direction: str
    method: str = Field(description="exact, or attribution (the first-order estimate).")
    ablation: str = Field(
        default="counterfactual",
        description="What the patches wrote: counterfactual (the other run's activation), zero or mean.",
    )


class CircuitEdge(BaseModel):
    node: str = Field(
        description="The edge's other end, as MIB names nodes (input, a{layer}.h{head}, m{layer}, logits)."
    )
    kind: Literal["q", "k", "v", ""] = Field(
        description="The input of the edge's downstream head it reaches (query, key, value); '' for an MLP "
        "or the logits."
    )
    score: float
    rank: int = Field(
        description="Its place in the run's ranking by |score| (1: the largest); a circuit of n "
        "edges holds ranks 1 to n."
    )


class CircuitEntry(BaseModel):
    method: str = Field(description="The method that scored the edges (eap, eap-ig, exact).")
    edges: int = Field(description="How many edges the run ranked.")
    into: list[CircuitEdge] = Field(description="The head's strongest edges in, by |score|.")
    out: list[CircuitEdge] = Field(description="The head's strongest edges out, by |score|.")


class ExploreHead(BaseModel):
    layer: int
    head: int
    label: str
    statistics: dict[str, float | None]
    nearest: list[NearestHead]
    example_pattern: str | None = Field(description="The pattern whose score ranks the examples.")
    examples: list[ExampleEntry]
    relations: list[RelationEntry]
    coreference: list[CoreferenceEntry]
    ablation: AblationEntry | None
    patching: PatchingEntry | None = None
    circuit: CircuitEntry | None = None


class SearchInfo(BaseModel):
    available: bool = Field(description="Whether this server has a corpus index (the rest is empty if not).")
    model: str | None = Field(description="The model the index was built with.")
    layers: list[int] = Field(description="The indexed layers (0-based).")
    tokens: int
    segments: int


class SearchInputRequest(BaseModel):
    """A typed input, and optionally one of its tokens to search the corpus for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(
        min_length=1, max_length=2000, description="The input text (read up to the server's token limit)."
    )
    layer: integer() = Field(description="An indexed layer (0-based).")
    token: integer() | None = Field(
        None, description="The input token (0 is [CLS]); null: none; 422 beyond the input's tokens."
    )
    k: integer(100, least=1) = Field(10, description="How many nearest corpus tokens.")


class SearchWordRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    word: str = Field(min_length=1, max_length=100, description="The word (case ignored).")
    layer: integer() = Field(description="An indexed layer (0-based).")
    k: integer(100, least=1) = Field(20, description="How many occurrences at most, in corpus order.")


class SearchTokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    row: integer() = Field(description="A corpus token: its row in the index (as answers give it).")
    layer: integer() = Field(description="An indexed layer (0-based).")
    k: integer(100, least=1) = Field(10, description="How many nearest corpus tokens.")


@dataclass(frozen=True)
class SearchModels:
    """The search request bodies of one server, its index's limits in the schema (see
    :func:`search_request_models`)."""

    input: type[SearchInputRequest]
    word: type[SearchWordRequest]
    token: type[SearchTokenRequest]


def search_request_models(layers: Sequence[int], *, rows: int, tokens: int) -> SearchModels:
    """Search request bodies whose schema says what this server's index takes: ``layer`` one of
    ``layers`` (the indexed ones), ``row`` below ``rows`` (the indexed tokens) and ``token`` below
    ``tokens`` (the most tokens an input is read to)."""

    layer = integer_of(layers)
    return SearchModels(
        input=create_model(
            "SearchInputRequest",
            __base__=SearchInputRequest,
            layer=_retyped(SearchInputRequest, "layer", layer),
            token=_retyped(SearchInputRequest, "token", integer(tokens - 1) | None),
        ),
        word=create_model(
            "SearchWordRequest", __base__=SearchWordRequest, layer=_retyped(SearchWordRequest, "layer", layer)
        ),
        token=create_model(
            "SearchTokenRequest",
            __base__=SearchTokenRequest,
            layer=_retyped(SearchTokenRequest, "layer", layer),
            row=_retyped(SearchTokenRequest, "row", integer(rows - 1)),
        ),
    )


class CorpusToken(BaseModel):
    row: int = Field(description="The token's row in the index.")
    token: str
    word: int = Field(description="Index of its word in context, -1 for a special token.")
    context: list[str] = Field(description="The words of its segment.")
    relation: str | None = Field(description="Its word's dependency relation (treebank corpora), or null.")
    pos: str | None = Field(
        description="Its word's part-of-speech tag (UPOS in CoNLL-U; treebank corpora), or null."
    )
    origin: str = Field(description="Where its segment comes from: file and line.")
    attends: str = Field(
        description="The token its layer's heads, averaged, attend to most, special tokens ([CLS], [SEP]) "
        "left out."
    )
    similarity: float | None = Field(
        description="Cosine similarity to the query token; null for a word search."
    )


class SearchAnswer(BaseModel):
    tokens: list[str] = Field(description="The input's tokens (empty for a word search).")
    neighbours: list[CorpusToken]
    histogram: list[tuple[str, int]] = Field(description="The neighbours' relations and counts, most first.")
    pos_histogram: list[tuple[str, int]] = Field(
        description="The neighbours' part-of-speech tags and counts, most first."
    )

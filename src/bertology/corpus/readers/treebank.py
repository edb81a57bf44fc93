"""Dependency treebanks as gold trees for the probes: CoNLL-U (Universal Dependencies) and CoNLL-X.

Both formats have ten tab-separated columns per word (ID, FORM, LEMMA, a coarse tag, a fine tag, FEATS,
HEAD, DEPREL, then two more), sentences separated by blank lines and ``#`` comment lines before a
sentence. What differs, and how each is read:

* **CoNLL-U**: multiword-token ranges (``1-2``) and empty nodes (``5.1``) are skipped, so the words are
  the syntactic words; each sentence must have exactly one root. Punctuation: UPOS ``PUNCT``.
* **CoNLL-X** (e.g. GUM's Stanford Dependencies): IDs are plain integers; a sentence may have several
  roots (three GUM sentences do). Punctuation: a Penn Treebank punctuation tag in the fine tag column
  (:data:`PTB_PUNCTUATION`) or the relation ``punct``.

Every sentence is checked to be a tree (or a forest, CoNLL-X): consecutive IDs from 1, integer heads
inside the sentence, no word its own ancestor. Files are read one sentence at a time.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from bertology.corpus.readers import ByteSpan, Passage, corpus_files, require_records
from bertology.corpus.readers.conllu import Block, sentence_blocks
from bertology.errors import BertologyError

#: Treebank formats, by the names :func:`read_treebank` accepts.
TreebankFormat = Literal["conllu", "conllx", "corefud"]
TREEBANK_FORMATS: tuple[TreebankFormat, ...] = get_args(TreebankFormat)
_FORMAT_NAMES = {"conllu": "CoNLL-U", "conllx": "CoNLL-X"}
_ALIASES = {"corefud": "conllu"}  # CorefUD is CoNLL-U with coreference in MISC
#: The treebank format of each file extension.
TREEBANK_EXTENSIONS = {".conllu": "conllu"} | dict.fromkeys(
    (".conll", ".conllx", ".conll10", ".dep"), "conllx"
)

#: Penn Treebank tags counted as punctuation in CoNLL-X files (OntoNotes' HYPH and NFP included).
PTB_PUNCTUATION = frozenset(
    {".", ",", ":", "``", "''", "-LRB-", "-RRB-", "-LSB-", "-RSB-", "-LCB-", "-RCB-", "#", "$", "HYPH", "NFP"}
)
_UPOS = frozenset(
    {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT"}
    | {"SCONJ", "SYM", "VERB", "X"}
)
NOT_A_WORD = re.compile(r"\d+-\d+|\d+\.\d+")  # CoNLL-U multiword-token range or empty node
_COLUMNS = 10
_FORM, _CPOS, _POS, _HEAD, _DEPREL = 1, 3, 4, 6, 7
TokenLines = list[tuple[int, list[str]]]


@dataclass(frozen=True)
class Sentence:
    """One dependency-parsed sentence; every list has one entry per word.

    words: the word forms.
    heads: 0-based index of each word's head word, -1 for a root.
    relations: the full dependency label of each word to its head (``"nmod:poss"``; see
        :func:`base_relation` to drop a UD subtype).
    punct: whether each word is punctuation (the rule depends on the format; see the module docstring).
    origin: where it came from, e.g. ``"<file name>:<first line>"``.
    tags: the coarse part-of-speech tag of each word (CoNLL-U: UPOS; CoNLL-X: its coarse tag column),
        empty where the source has none.
    """

    words: list[str]
    heads: list[int]
    relations: list[str]
    punct: list[bool]
    origin: str
    tags: list[str] = field(default_factory=list)


def base_relation(label: str) -> str:
    """A dependency label without its UD subtype: ``"nmod:poss"`` -> ``"nmod"``."""
    return label.partition(":")[0]


def read_treebank(path: str | Path, format: str | None = None) -> Iterator[Sentence]:
    """Yield the sentences of a treebank file, or of every file of a folder in sorted name order.

    format: ``"conllu"``, ``"conllx"`` or ``"corefud"`` (read as CoNLL-U); by default each file's
        extension decides (``.conllu``: CoNLL-U; ``.conll``, ``.conllx``, ``.conll10``, ``.dep``:
        CoNLL-X), else its first sentence
        (CoNLL-U when it has a multiword token or an empty node, or only UPOS coarse tags).

    Raises:
        BertologyError: an unknown format or a folder without treebank files (at once); then while
            reading, a malformed line (naming the file and line): a wrong column count, an
            out-of-sequence ID, a head that is not an integer or lies outside the sentence, a cycle, or
            (CoNLL-U) a sentence without exactly one root; or no sentence at all.
    """
    if format is not None and format not in TREEBANK_FORMATS:
        raise BertologyError(f"Unknown treebank format '{format}'; use one of {', '.join(TREEBANK_FORMATS)}.")
    files = corpus_files(path, set(TREEBANK_EXTENSIONS))
    sentences = (
        sentence
        for file in files
        for sentence in _read_file(
            file, _ALIASES.get(format or "", format) or TREEBANK_EXTENSIONS.get(file.suffix.lower())
        )
    )
    return require_records(sentences, path, "dependency-parsed sentences")


def check_treebank(path: str | Path, format: str | None = None, limit: int | None = None) -> int:
    """Read the sentences of ``path`` (the first ``limit``) as :func:`read_treebank` does, keeping none, so
    a binary or malformed treebank is refused before any work on it; returns how many were read.

    Raises:
        BertologyError: as :func:`read_treebank`.
    """
    return sum(1 for _ in itertools.islice(read_treebank(path, format), limit))


def _read_file(path: Path, format: str | None) -> Iterator[Sentence]:
    for _, sentence in _checked_blocks(path, format):
        if sentence is not None:
            yield sentence


def _checked_blocks(
    path: Path, format: str | None, span: ByteSpan | None = None
) -> Iterator[tuple[Block, Sentence | None]]:
    """Every sentence block of ``path`` (of its ``span``) with its checked sentence (``None``: a block of
    comments only, or a sentence :func:`block_sentence` leaves out); ``format`` ``None``: sniffed from the
    first sentence.

    Raises:
        BertologyError: as :func:`block_sentence`.
    """
    for block in sentence_blocks(path, span):
        tokens = token_lines(block)
        if not tokens:
            yield block, None
            continue
        format = format or _sniff(tokens)
        yield block, block_sentence(block[0][0], tokens, path, format)


#: A comment that starts a document (``# newdoc`` or ``# newdoc id = ...``).
_NEWDOC = re.compile(r"#\s*newdoc(\s|=|$)")


def read_passages(path: Path, span: ByteSpan | None = None) -> Iterator[Passage]:
    """The words of each sentence of the treebank file ``path`` (of its ``span``, if given) as running text
    for a corpus, a document per ``# newdoc``; every sentence is checked as :func:`read_treebank` checks it
    (the format from the extension, else the file's first sentence), so every corpus command refuses the
    same malformed file.

    Raises:
        BertologyError: as :func:`read_treebank` for a malformed line, naming the file and line.
    """
    format = TREEBANK_EXTENSIONS.get(path.suffix.lower())
    if format is None and span is not None and span.start > 0:
        format = _file_format(path)
    document = 0
    for block, sentence in _checked_blocks(path, format, span):
        document += any(_NEWDOC.match(line) for _, line in block)
        if sentence is not None:
            yield Passage(sentence.words, document, block[0][0], block[-1][0])


def _file_format(path: Path) -> str:
    """The format :func:`_sniff` gives the file's first sentence (``"conllu"`` for a file without any)."""
    for block in sentence_blocks(path):
        if tokens := token_lines(block):
            return _sniff(tokens)
    return "conllu"


def token_lines(block: Block) -> TokenLines:
    """The ``(line number, columns)`` of the block's lines that are not comments."""
    return [(number, line.split("\t")) for number, line in block if not line.startswith("#")]


def _sniff(tokens: TokenLines) -> str:
    """``"conllu"`` when the sentence has a multiword token or empty node, or only UPOS coarse tags."""
    if any(NOT_A_WORD.fullmatch(columns[0]) for _, columns in tokens):
        return "conllu"
    tags = {columns[_CPOS] if len(columns) > _CPOS else "" for _, columns in tokens}
    return "conllu" if tags <= _UPOS else "conllx"


def _invalid(path: Path, number: int, format: str, problem: str) -> BertologyError:
    return BertologyError(f"{path.name} line {number} is not valid {_FORMAT_NAMES[format]} ({problem}).")


def block_sentence(
    first_line: int, tokens: TokenLines, path: Path, format: str, *, single_root: bool = True
) -> Sentence | None:
    """The sentence of one block (``None`` when it has no word), checked to be a tree (with one root for
    CoNLL-U unless ``single_root`` is false: then a forest, several words with head 0)."""
    words: list[str] = []
    heads: list[int] = []
    relations: list[str] = []
    punct: list[bool] = []
    tags: list[str] = []
    lines: list[int] = []
    for number, columns in tokens:
        if len(columns) != _COLUMNS:
            problem = f"{len(columns)} tab-separated columns where {_COLUMNS} were expected"
            raise _invalid(path, number, format, problem)
        if format == "conllu" and NOT_A_WORD.fullmatch(columns[0]):
            continue
        if columns[0] != str(len(words) + 1):
            problem = f"word ID '{columns[0]}' where {len(words) + 1} was expected"
            raise _invalid(path, number, format, problem)
        try:
            heads.append(int(columns[_HEAD]) - 1)
        except ValueError:
            raise _invalid(path, number, format, f"the head '{columns[_HEAD]}' is not an integer") from None
        words.append(columns[_FORM])
        relations.append(columns[_DEPREL])
        tags.append(columns[_CPOS])
        punct.append(
            columns[_CPOS] == "PUNCT"
            if format == "conllu"
            else columns[_POS] in PTB_PUNCTUATION or columns[_DEPREL] == "punct"
        )
        lines.append(number)
    if not words:
        return None
    _check_tree(heads, lines, path, format, single_root=single_root)
    return Sentence(words, heads, relations, punct, f"{path.name}:{first_line}", tags)


def _check_tree(heads: list[int], lines: list[int], path: Path, format: str, *, single_root: bool) -> None:
    """Raise unless every head is in the sentence and every word leads up to a root (one for CoNLL-U when
    ``single_root``)."""
    for head, number in zip(heads, lines, strict=True):
        if not -1 <= head < len(heads):
            problem = f"the head {head + 1} is outside the sentence of {len(heads)} words"
            raise _invalid(path, number, format, problem)
    cycle = _word_on_cycle(heads)
    if cycle is not None:
        raise _invalid(path, lines[cycle], format, f"word {cycle + 1} is its own ancestor (a cycle of heads)")
    roots = heads.count(-1)
    if format == "conllu" and single_root and roots != 1:
        raise _invalid(path, lines[0], format, f"the sentence has {roots} roots where CoNLL-U requires one")


def _word_on_cycle(heads: list[int]) -> int | None:
    """Index of a word whose chain of heads loops, or ``None`` when every chain ends at a root."""
    reaches_root = [False] * len(heads)
    for start in range(len(heads)):
        chain: set[int] = set()
        word = start
        while word != -1 and not reaches_root[word]:
            if word in chain:
                return word
            chain.add(word)
            word = heads[word]
        for visited in chain:
            reaches_root[visited] = True
    return None

"""Corpus search (exBERT's idea, done to scale): every token's contextual vector, searchable by similarity.

:func:`build_index` runs the model over a corpus once and stores, for each chosen layer, the output
vector of every token (L2-normalised, float16) in an on-disk HNSW index of `usearch
<https://github.com/unum-cloud/usearch>`_ (chosen by measurement over faiss-cpu and hnswlib: see
``benchmarks/RESULTS.md``), with a table of token metadata. The folder holds ``manifest.json`` (format
version, model, layers, vector width, token and segment counts, and the name of the generation folder
that holds the rest; a rebuild switches generations whole, :mod:`bertology.index.store`) and in that
generation folder:

* ``layer_<L>.usearch``: the index of layer ``L`` (0-based; the layer's output, ``hidden_states[L + 1]``),
  keys are token rows;
* ``tokens.npz``: one entry per token row: ``segment``, ``position`` (in the model input), ``token_id``,
  ``word`` (index into the segment's words, -1 for a special token) and ``attends_<L>`` (the input
  position the layer's heads, averaged, attend to most from this token, special tokens left out); and
  one entry per segment:
  ``start`` (the row of its first token);
* ``segments.jsonl``: one line per segment, in corpus order: ``words``, ``split`` (where text B starts,
  or null), ``relations`` and ``tags`` (dependency relation and coarse part-of-speech tag per word, UPOS
  in CoNLL-U; treebanks only, else null), ``origin``;
* ``tokenizer/``: the model's tokenizer, so a search needs no model.

Inputs stream through :func:`bertology.corpus.batching.length_sorted_batches`; only one window of segments and
the growing index are held in memory. :class:`TokenIndex` opens a folder with the indexes memory-mapped,
so it is reused across sessions at no cost.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import zipfile
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers.pre_tokenizers import BertPreTokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from usearch.index import Index

from bertology.corpus.batching import PAD_MULTIPLE, length_sorted_batches, prefetched
from bertology.corpus.cache import CacheUse, read_segments
from bertology.corpus.reader_processes import default_readers
from bertology.corpus.readers.treebank import read_treebank
from bertology.corpus.segments import detect_format
from bertology.errors import BertologyError
from bertology.index.store import (
    damaged,
    generation_folder,
    index_file,
    new_generation,
    read_manifest,
)
from bertology.models.hook import recording
from bertology.models.loading import LoadedModel, load_model, require_encoder, require_max_length
from bertology.progress import Progress

SEGMENTS = "segments.jsonl"
TOKENS = "tokens.npz"
TOKENIZER = "tokenizer"
#: HNSW settings: edges per node, candidates while adding and while searching. A narrow build (insertion
#: keeps pace with the forward pass on a spare core) and a wide search make up for each other: recall@10
#: 0.975 on UD EWT train at under 2 ms a query (benchmarks/RESULTS.md, "Corpus search index").
CONNECTIVITY, EXPANSION_ADD, EXPANSION_SEARCH = 16, 32, 2048
#: Batches whose vectors may wait for the indexing thread (bounds the memory they hold).
PENDING_BATCHES = 2


@dataclass(frozen=True)
class IndexedSegment:
    """One model input of the index: its words (text A, then text B from ``split``), and where the corpus
    is a treebank the dependency relation and coarse part-of-speech tag (UPOS in CoNLL-U) of each word."""

    words: list[str]
    split: int | None
    relations: list[str] | None
    tags: list[str] | None
    origin: str


def default_layers(num_layers: int) -> list[int]:
    """Three evenly spaced layers (0-based), the last included: 6 layers -> [1, 3, 5]."""
    return sorted({max(0, round(num_layers * part / 3) - 1) for part in (1, 2, 3)})


def read_indexed_segments(
    path: Path,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    *,
    cache: bool = True,
    readers: int = 1,
    on_cache: Callable[[CacheUse], None] | None = None,
    model: str = "",
) -> Iterator[IndexedSegment]:
    """The corpus as index inputs: a treebank sentence by sentence (with its relations), any other
    corpus as :func:`bertology.corpus.segments.iter_segments` packs it (words split as BERT
    pre-tokenises), through the encoded-corpus cache (:func:`bertology.corpus.cache.read_segments`;
    ``cache=False``: not; ``on_cache`` and ``model`` as it takes them) and read by ``readers`` processes
    where the cache does not serve."""
    format = "conllu" if path.is_dir() else detect_format(path)  # refuses a table at once
    if format == "conllu":
        for sentence in read_treebank(path):
            yield IndexedSegment(sentence.words, None, sentence.relations, sentence.tags, sentence.origin)
        return
    pre_tokenizer = BertPreTokenizer()

    def words(text: str | list[str] | None) -> list[str]:
        if text is None:
            return []
        return text if isinstance(text, list) else [word for word, _ in pre_tokenizer.pre_tokenize_str(text)]

    segments = read_segments(
        path,
        tokenizer,
        max_length=max_length,
        format=format,
        cache=cache,
        readers=readers,
        on_cache=on_cache,
        model=model,
    )
    for segment in segments:
        first, second = words(segment.text_a), words(segment.text_b)
        split = len(first) if segment.is_pair else None
        yield IndexedSegment(first + second, split, None, None, segment.origin)


#: A segment's model input (``input_ids`` and the rest, unpadded) and, per token, its word index
#: (-1: a special token).
Encoded = tuple[dict[str, list[int]], list[int]]


def encode_segment(tokenizer: PreTrainedTokenizerFast, segment: IndexedSegment, max_length: int) -> Encoded:
    """The model input of ``segment`` (truncated to ``max_length``) and, per token, its word index in
    ``segment.words`` (-1 for a special token)."""
    first = segment.words[: segment.split] if segment.split is not None else segment.words
    second = segment.words[segment.split :] if segment.split is not None else None
    encoding = tokenizer(first, second, is_split_into_words=True, truncation=True, max_length=max_length)
    offsets = {0: 0, 1: segment.split or 0}
    word_of = [
        -1 if word is None else word + offsets[sequence]
        for word, sequence in zip(encoding.word_ids(), encoding.sequence_ids(), strict=True)
    ]
    return dict(encoding), word_of


@dataclass(frozen=True)
class ForwardVectors:
    """What indexing keeps of one padded batch's forward pass.

    vectors: per layer, the L2-normalised output vectors [N, d] (float16) of the batch's N real tokens,
        batch-major.
    attends: per layer, for each of those tokens, the key position [N] its layer's heads, averaged,
        attend to most among the segment's ordinary tokens (special tokens such as [CLS] and [SEP] left
        out, which most heads of most layers attend to most and so say nothing; a segment of special
        tokens only keeps them); empty where not asked for.
    """

    vectors: dict[int, np.ndarray]
    attends: dict[int, np.ndarray]


def forward_vectors(
    loaded: LoadedModel, inputs: list[dict[str, list[int]]], layers: Sequence[int], with_attends: bool
) -> ForwardVectors:
    """One forward pass over padded ``inputs``, reduced at once to what the index keeps at ``layers``.

    The attention of each layer streams through a recording and only the head-averaged argmax of the
    wanted layers is kept, so no ``[B, heads, T, T]`` tensor outlives its layer (asking transformers for
    ``output_attentions`` would hold every layer's until the batch ends).
    """
    padded = loaded.tokenizer.pad(inputs, return_tensors="pt", pad_to_multiple_of=PAD_MULTIPLE)
    padded = {name: tensor.to(loaded.device) for name, tensor in padded.items()}
    mask = padded["attention_mask"].bool()
    special = torch.tensor(loaded.tokenizer.all_special_ids, device=mask.device)
    ordinary = mask & ~torch.isin(padded["input_ids"], special)  # [B, T] keys that may be attended to
    ordinary |= mask & ~ordinary.any(dim=-1, keepdim=True)  # a segment of special tokens only keeps them
    wanted = set(layers) if with_attends else set()
    tops: dict[int, torch.Tensor] = {}
    calls = count()  # the layer of each attention call: one call per layer, in order

    def consume(probs: torch.Tensor) -> None:  # [B, heads, T, T]
        layer = next(calls)
        if layer in wanted:
            mean = probs.mean(dim=1)  # [B, T, T]
            keys = ordinary[:, None, : mean.shape[-1]]  # [B, 1, T]
            tops[layer] = mean.masked_fill(~keys, -1.0).argmax(dim=-1)  # [B, T] key position

    with torch.inference_mode(), recording(consume=consume):
        hidden_states = loaded.model(**padded, output_hidden_states=True).hidden_states
    return ForwardVectors(
        vectors={layer: token_vectors(hidden_states[layer + 1], mask) for layer in layers},
        attends={layer: top[mask].cpu().numpy().astype(np.int16) for layer, top in tops.items()},
    )


def token_vectors(hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """The L2-normalised vectors [N, d] (float16) of the real tokens of ``hidden`` [B, T, d] (``mask``
    [B, T]), batch-major."""
    vectors = torch.nn.functional.normalize(hidden[mask].float(), dim=-1)
    return vectors.to(torch.float16).cpu().numpy()


def build_index(
    corpus: str | Path,
    out: str | Path,
    *,
    model: LoadedModel | str | Path | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    max_length: int = 128,
    limit: int | None = None,
    threads: int = 0,
    on_progress: Progress | None = None,
    cache: bool = True,
    readers: int | None = None,
    on_cache: Callable[[CacheUse], None] | None = None,
) -> TokenIndex:
    """Index every token of ``corpus`` at ``layers`` (0-based; default :func:`default_layers`) into the
    folder ``out`` and open it. ``out`` is new, empty or an index, which is replaced whole only once the
    new index is written (:func:`bertology.index.store.new_generation`); its other files stay.

    The corpus is read, segmented and encoded in a thread ahead of the model
    (:func:`~bertology.corpus.batching.prefetched`).

    limit: index at most this many segments (the first; ``None``: all), as ``analyze --limit``.
    threads: threads of each vector addition to an HNSW graph (0: all cores). With the model on an
        accelerator (its CPU threads idle while the device computes), or where torch leaves a core free,
        the additions run in one thread beside the model's forward passes; where the model runs on the CPU
        with torch's threads on every core, between them (a thread beside would only preempt torch's, which
        wait for each other: 1.6x the plain forward pass instead of 2.0x on 2 cores, benchmarks/RESULTS.md).
    on_progress: told the segments indexed after each batch (no total: the corpus is read as it goes;
        :class:`~bertology.progress.Progress`).
    cache: read a text or JSON Lines corpus through the encoded-corpus cache (:mod:`bertology.corpus.cache`);
    on_cache: told how it does (:class:`~bertology.corpus.cache.CacheUse`; a treebank: not called).
    readers: processes that read, segment and encode a text or JSON Lines corpus
    (:mod:`bertology.corpus.reader_processes`; ``None``: the default for the model's device); the index is
    the same for any number.

    Raises:
        BertologyError: an unreadable corpus, a model that is not a BERT-family encoder, a layer the
            model does not have, a ``max_length`` over the model's limit, or an ``out`` that holds files
            but no index, is a file, or another build is writing.
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    require_encoder(loaded, "Corpus indexing")
    require_max_length(loaded, max_length)
    chosen = list(layers) if layers else default_layers(loaded.num_layers)
    if bad := [layer for layer in chosen if not 0 <= layer < loaded.num_layers]:
        raise BertologyError(
            f"Layer {bad[0]} does not exist: the model has layers 0-{loaded.num_layers - 1}."
        )
    corpus = Path(corpus)
    readers = readers or default_readers(str(loaded.device))
    width = loaded.model.config.hidden_size
    indexes = {layer: _new_index(width) for layer in chosen}
    columns = {name: array("l") for name in ("segment", "position", "token_id", "word")}
    attends: dict[int, list[np.ndarray]] = {layer: [] for layer in chosen}
    starts: list[int] = []
    pending: deque[Future[None]] = deque()
    overlap = loaded.device.type != "cpu" or torch.get_num_threads() < _usable_cores()

    def add(keys: np.ndarray, vectors: dict[int, np.ndarray]) -> None:
        for layer, layer_vectors in vectors.items():
            indexes[layer].add(keys, layer_vectors, threads=threads)

    # on an accelerator, or where torch leaves a core free, the HNSW graphs grow in a thread beside the
    # model (usearch releases the GIL while adding)
    with (
        new_generation(out) as generation,
        (generation.folder / SEGMENTS).open("w", encoding="utf-8") as segments_file,
        ThreadPoolExecutor(1) as adder,
    ):

        def numbered() -> Iterator[tuple[int, IndexedSegment]]:
            """The segments in corpus order, numbered; each is written to the segments file as it is read."""
            read = read_indexed_segments(
                corpus,
                loaded.tokenizer,
                max_length,
                cache=cache,
                readers=readers,
                on_cache=on_cache,
                model=loaded.name,
            )
            segments = itertools.islice(read, limit)
            for number, segment in enumerate(segments):
                segments_file.write(json.dumps(segment.__dict__) + "\n")
                starts.append(-1)
                yield number, segment

        def encoded_batches() -> Iterator[tuple[list[tuple[int, IndexedSegment]], list[Encoded]]]:
            """Batches of numbered segments with their encodings, by the reader thread's own tokenizer."""
            reader = copy.deepcopy(loaded.tokenizer)  # a tokenizer serves one thread
            for batch in length_sorted_batches(
                numbered(), lambda item: len(item[1].words), batch_size=batch_size
            ):
                yield batch, [encode_segment(reader, segment, max_length) for _, segment in batch]

        # the corpus is read, segmented and encoded in a thread while the model runs
        indexed = 0
        for batch, encoded in prefetched(encoded_batches()):
            computed = forward_vectors(loaded, [inputs for inputs, _ in encoded], chosen, with_attends=True)
            row = len(columns["segment"])
            for (number, _), (inputs, word_of) in zip(batch, encoded, strict=True):
                starts[number] = len(columns["segment"])
                size = len(word_of)
                columns["segment"].extend([number] * size)
                columns["position"].extend(range(size))
                columns["token_id"].extend(inputs["input_ids"])
                columns["word"].extend(word_of)
            keys = np.arange(row, len(columns["segment"]), dtype=np.uint64)
            if overlap:
                pending.append(adder.submit(add, keys, computed.vectors))
            else:
                add(keys, computed.vectors)
            for layer in chosen:
                attends[layer].append(computed.attends[layer])
            indexed += len(batch)
            if on_progress is not None:
                on_progress(indexed)
            while len(pending) > PENDING_BATCHES or (pending and pending[0].done()):
                pending.popleft().result()
        while pending:
            pending.popleft().result()
        if not starts:
            raise BertologyError(f"The corpus '{corpus}' has no text to index.")
        generation.manifest.update(
            _write(generation.folder, loaded, chosen, indexes, columns, attends, starts)
        )
    return TokenIndex.open(out)


def _usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _new_index(width: int) -> Index:
    return Index(
        ndim=width,
        metric="ip",
        dtype="f16",
        connectivity=CONNECTIVITY,
        expansion_add=EXPANSION_ADD,
        expansion_search=EXPANSION_SEARCH,
    )


def _write(
    folder: Path,
    loaded: LoadedModel,
    layers: list[int],
    indexes: dict[int, Index],
    columns: dict[str, array],
    attends: dict[int, list[np.ndarray]],
    starts: list[int],
) -> dict[str, Any]:
    """Write the index files into the generation folder ``folder``; return the manifest's fields."""
    for layer, index in indexes.items():
        index.save(str(folder / f"layer_{layer}.usearch"))
    tables = {name: np.asarray(values, dtype=np.int32) for name, values in columns.items()}
    tables |= {f"attends_{layer}": np.concatenate(parts) for layer, parts in attends.items()}
    np.savez(folder / TOKENS, start=np.asarray(starts, dtype=np.int64), **tables)
    loaded.tokenizer.save_pretrained(str(folder / TOKENIZER))
    return {
        "model": loaded.name,
        "layers": layers,
        "width": loaded.model.config.hidden_size,
        "tokens": len(columns["segment"]),
        "segments": len(starts),
        "vectors": "float16, L2-normalised; similarity: inner product (cosine)",
    }


def _read_tables(path: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """The token and segment tables of ``path`` (``tokens.npz``), checked against ``manifest``: every
    table there with its rows, segment numbers, segment starts and attended positions in range.

    Raises:
        BertologyError: the file is missing or damaged (named).
    """
    tokens, segments = manifest["tokens"], manifest["segments"]
    rows = {name: tokens for name in ("segment", "position", "token_id", "word")}
    rows |= {f"attends_{layer}": tokens for layer in manifest["layers"]} | {"start": segments}
    with index_file(path):
        if not zipfile.is_zipfile(path):  # else numpy tries it as a pickle and says so
            raise damaged(path, "not a zip archive")
        with np.load(path) as stored:
            tables = {name: stored[name] for name in stored.files}
    for name, size in rows.items():
        if name not in tables or tables[name].shape != (size,):
            raise damaged(path, f"no table '{name}' of {size} rows")
    segment, start = tables["segment"], tables["start"]
    if not ((segment >= 0) & (segment < segments)).all() or not ((start >= 0) & (start < tokens)).all():
        raise damaged(path, "a segment number or start out of range")
    for layer in manifest["layers"]:
        attended = start[segment] + tables[f"attends_{layer}"]
        if not ((start[segment] <= attended) & (attended < tokens)).all():
            raise damaged(path, f"an attended position of layer {layer} out of range")
    return tables


def _restore(path: Path, manifest: dict[str, Any]) -> Index:
    """The usearch index ``path``, memory-mapped, checked to hold ``manifest``'s tokens and width.

    Raises:
        BertologyError: the file is missing or damaged (named).
    """
    with index_file(path):
        index = Index.restore(str(path), view=True)
    if index is None or (len(index), index.ndim) != (manifest["tokens"], manifest["width"]):
        found = "no index" if index is None else f"{len(index)} vectors of width {index.ndim}"
        raise damaged(path, f"{found}, where the manifest says {manifest['tokens']} of {manifest['width']}")
    index.expansion_search = EXPANSION_SEARCH
    return index


class TokenIndex:
    """An index folder written by :func:`build_index`, opened for search (indexes memory-mapped)."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        """Open the generation of ``folder`` that ``manifest`` (:func:`bertology.index.store.read_manifest`)
        names; a missing or damaged file raises a :class:`BertologyError` that names it."""
        self.folder = folder
        self.model: str = manifest["model"]
        self.layers: list[int] = manifest["layers"]
        self.width: int = manifest["width"]
        files = generation_folder(folder, manifest)
        self.tables = _read_tables(files / TOKENS, manifest)
        with index_file(files / SEGMENTS), (files / SEGMENTS).open(encoding="utf-8") as lines:
            self.segments = [IndexedSegment(**json.loads(line)) for line in lines]
        if len(self.segments) != manifest["segments"]:
            raise damaged(
                files / SEGMENTS,
                f"{len(self.segments)} segments, where the manifest says {manifest['segments']}",
            )
        with index_file(files / TOKENIZER):
            self.tokenizer = AutoTokenizer.from_pretrained(str(files / TOKENIZER))
        self._indexes = {layer: _restore(files / f"layer_{layer}.usearch", manifest) for layer in self.layers}
        with index_file(files / SEGMENTS):  # a word beyond its segment's words: the segments do not match
            self._lower_words = np.array(
                [
                    "" if word < 0 else self.segments[segment].words[word].lower()
                    for segment, word in zip(self.tables["segment"], self.tables["word"], strict=True)
                ]
            )

    @classmethod
    def open(cls, folder: str | Path) -> TokenIndex:
        """Open the index folder ``folder``.

        Raises:
            BertologyError: no index there, one written by another version of bertology, or a missing or
                damaged index file (named).
        """
        folder = Path(folder)
        return cls(folder, read_manifest(folder))

    def __len__(self) -> int:
        return len(self.tables["segment"])

    def check_layer(self, layer: int) -> None:
        if layer not in self._indexes:
            raise BertologyError(f"Layer {layer} is not indexed; the index has layers {self.layers}.")

    def search(self, vectors: np.ndarray, layer: int, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest token rows [Q, k] of ``vectors`` [Q, d] (L2-normalised) at ``layer``, with
        their cosine similarities [Q, k], most similar first."""
        self.check_layer(layer)
        found = self._indexes[layer].search(np.atleast_2d(vectors).astype(np.float16), k)
        rows = np.atleast_2d(found.keys).astype(np.int64)
        return rows, 1.0 - np.atleast_2d(found.distances).astype(np.float64)

    def vectors(self, rows: np.ndarray, layer: int) -> np.ndarray:
        """The stored vectors [R, d] (float16) of token ``rows`` [R] at ``layer``."""
        self.check_layer(layer)
        return np.asarray(self._indexes[layer].get(np.asarray(rows, dtype=np.uint64)), dtype=np.float16)

    def find_word(self, word: str, limit: int) -> list[int]:
        """The first ``limit`` token rows whose word is ``word`` (ignoring case)."""
        return np.flatnonzero(self._lower_words == word.strip().lower())[:limit].tolist()

    def describe(self, row: int, layer: int) -> dict[str, Any]:
        """Token ``row``: its token and word, its segment's words (``context``, the word at ``word``),
        its word's relation and part of speech (``pos``; treebanks only, else ``None``), origin, and the
        token the heads of ``layer`` attend to most (averaged over heads)."""
        segment_number = int(self.tables["segment"][row])
        segment = self.segments[segment_number]
        word = int(self.tables["word"][row])
        start = int(self.tables["start"][segment_number])
        target = start + int(self.tables[f"attends_{layer}"][row])
        return {
            "row": row,
            "token": self._token(row),
            "word": word,
            "context": segment.words,
            "relation": segment.relations[word] if segment.relations and word >= 0 else None,
            "pos": segment.tags[word] if segment.tags and word >= 0 else None,
            "origin": segment.origin,
            "attends": self._token(target),
        }

    def _token(self, row: int) -> str:
        return str(self.tokenizer.convert_ids_to_tokens(int(self.tables["token_id"][row])))


def histogram(described: Sequence[dict[str, Any]], field: str) -> list[tuple[str, int]]:
    """How many of ``described`` tokens have each value of ``field`` (``"relation"`` or ``"pos"``;
    ``"none"`` for a special token or a corpus without it), most frequent first."""
    return Counter(item[field] or "none" for item in described).most_common()


def query_vectors(
    loaded: LoadedModel, text: str, layer: int, max_length: int
) -> tuple[list[str], np.ndarray]:
    """The tokens of ``text`` as ``loaded`` reads it and their vectors [T, d] at ``layer`` (as indexed)."""
    limit = min(max_length, loaded.max_length)
    inputs = dict(loaded.tokenizer(text, truncation=True, max_length=limit))
    computed = forward_vectors(loaded, [inputs], [layer], with_attends=False)
    tokens = loaded.tokenizer.convert_ids_to_tokens(inputs["input_ids"])
    return list(tokens), computed.vectors[layer]

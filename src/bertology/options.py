"""The choices and defaults of bertology's options, defined once in a module that imports nothing heavy.

The modules that use them import them from here (``bertology.views``, ``bertology.words``, ...), and the
command line reads them to describe itself (``bertology --help``, a usage error) without loading torch.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The three views (:mod:`bertology.views`).
ViewKind = Literal["head", "model", "neuron"]
VIEW_KINDS: tuple[ViewKind, ...] = get_args(ViewKind)
#: Page colour themes.
Theme = Literal["light", "dark"]
#: Softmax weights, or norm-based weights ||a f(x)|| (Kobayashi et al. 2020; :mod:`bertology.norms`).
Weights = Literal["attention", "norm"]
WEIGHTS: tuple[Weights, ...] = get_args(Weights)
#: How a word split into pieces attends (:mod:`bertology.words`).
WordMode = Literal["mean", "first", "max"]
#: How the attention-only parser decodes (:mod:`bertology.probes.parser`).
Decode = Literal["argmax", "mst"]
#: The attention sets of an encoder-decoder (:mod:`bertology.capture_seq2seq`).
AttentionSetName = Literal["encoder", "decoder", "cross"]
#: Rows compared between two models (:mod:`bertology.comparison`).
Level = Literal["auto", "token", "word"]
#: Attention rollout and flow (:mod:`bertology.analysis.relevance`).
RelevanceMethod = Literal["rollout", "flow"]
RELEVANCE_METHODS: tuple[RelevanceMethod, ...] = get_args(RelevanceMethod)
#: How the surface statistics average (:mod:`bertology.stats.surface`).
Convention = Literal["bertology", "clark"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)
#: Corpus file formats (:mod:`bertology.corpus`).
CorpusFormat = Literal["text", "jsonl", "conllu"]
FORMATS: tuple[CorpusFormat, ...] = get_args(CorpusFormat)

#: Segments per forward pass of ``analyze`` and ``compare``.
BATCH_SIZE = 32
#: Query tokens sampled per segment for the heads' Jensen-Shannon divergences.
JS_TOKENS_PER_SEGMENT = 4
#: Longest input attention flow accepts by default (its time grows about as n^4).
FLOW_MAX_TOKENS = 64

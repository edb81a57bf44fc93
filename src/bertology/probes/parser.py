"""Clark et al. 2019's attention-only dependency parser (Sec. 4.2, "Attention-Only Probe").

The probability that word ``i`` is the syntactic head of word ``j`` is a softmax over the candidates
``i`` of a linear combination of every head's word-level attention, in both directions::

    p(i | j) ∝ exp( Σ_k  w_k · a_k[j, i]  +  u_k · a_k[i, j]  +  b · [i = ROOT] )

``k`` runs over all ``layers x heads`` attention heads; ``a_k`` is head ``k``'s word-level attention
(row = attending unit, column = attended-to unit), so ``w`` weighs dependent -> head attention and ``u``
head -> dependent attention. ``b`` is one learned bias for the ROOT candidate (a global bias would
cancel in the softmax).

Candidates of word ``j`` are the other words of its sentence and ROOT. **ROOT is the first special unit
of the word attention** (``[CLS]`` for BERT, ``<s>`` for RoBERTa): ``a_k[j, ROOT]`` is the attention
of word ``j`` to ``[CLS]`` and ``a_k[ROOT, j]`` the attention of ``[CLS]`` to ``j``. This follows the
layout of Clark et al.'s released data, whose attention maps keep ``[CLS]`` at index 0 and whose heads
number ROOT 0 and the words from 1, so ROOT lines up with ``[CLS]``; the paper itself does not spell
it out. ``[SEP]`` is never a candidate.

Training maximises the mean log-likelihood of the gold heads of every word (punctuation included)
with full-batch L-BFGS (strong-Wolfe line search) from all-zero weights, minus an L2 penalty
``l2 · (‖w‖² + ‖u‖²)`` (the ROOT bias is not penalised). Nothing in it is random: the same examples in
the same order give the same weights, so no seed is needed.

Prediction takes each word's most probable head (``decode="argmax"``, as the probe of the paper, which
scores each word on its own; the result need not be a tree), or the maximum spanning arborescence of
the log-probabilities rooted at ROOT (``decode="mst"``, Chu-Liu/Edmonds; several words may hang from
ROOT).

UAS counts the words whose gold ``punct`` is False, root words included. :func:`evaluate_parser`
reports it beside two baselines on the same words: right-branching (each word's head is the next word,
the last word is the root) and the best single attention head. A single head predicts as
:mod:`bertology.probes.dependency` does (Clark et al.'s notebook): in direction ``dependent->head`` word
``j``'s head is the other word ``i`` with the largest ``a_k[j, i]``, in direction ``head->dependent``
the one with the largest ``a_k[i, j]``; ROOT, ``[SEP]`` and the word itself are not candidates, so a
single head never gets a root word right. The best (head, direction) is chosen by UAS on the training
examples and scored on the evaluation examples.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.options import Decode
from bertology.probes.dependency import DIRECTIONS, predictions
from bertology.stats.base import head_index_frame

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pandas as pd

    from bertology.attention.words import WordAttention
    from bertology.corpus.readers.treebank import Sentence


def check_decode(decode: str) -> None:
    """Raise :class:`BertologyError` unless ``decode`` is ``"argmax"`` or ``"mst"``."""
    if decode not in ("argmax", "mst"):
        raise BertologyError(f"Unknown decode '{decode}'; use 'argmax' or 'mst'.")


#: Largest padded training tensor, in float32 elements (64 MiB).
_CHUNK_ELEMENTS = 16 * 2**20


def arc_features(word_attention: WordAttention) -> np.ndarray:
    """The attention among ROOT and the words that the parser reads, heads on the last axis.

    Returns ``[n + 1, n + 1, layers * heads]`` float32 for ``n`` words: unit 0 is ROOT (the first
    special unit, ``[CLS]``), unit ``i + 1`` is word ``i``; entry ``[a, b, k]`` is the attention of
    unit ``a`` to unit ``b`` in head ``k`` (layer-major: ``k = layer * heads + head``).

    Raises:
        BertologyError: the word attention has no special unit to stand for ROOT.
    """
    if not word_attention.covers_all_words:
        raise BertologyError(
            "Some words have no tokens (cut or dropped), so they have no attention to parse."
        )
    probs = word_attention.probs
    layers, heads, m, _ = probs.shape
    is_word = np.zeros(m, dtype=bool)
    is_word[word_attention.word_positions] = True
    specials = np.flatnonzero(~is_word)
    if specials.size == 0:
        raise BertologyError(
            "The word attention has no special unit ([CLS]) to stand for ROOT; the attention-only "
            "parser needs one."
        )
    units = np.concatenate([specials[:1], word_attention.word_positions])
    chosen = probs[:, :, units][:, :, :, units].reshape(layers * heads, units.size, units.size)
    return np.ascontiguousarray(chosen.transpose(1, 2, 0), dtype=np.float32)


def _gold_and_mask(sentence: Sentence, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gold heads ``[n]`` (-1 root) and the scored-word mask ``[n]`` (not punctuation)."""
    n = features.shape[0] - 1
    if len(sentence.heads) != n:
        raise BertologyError(
            f"Sentence {sentence.origin} has {len(sentence.heads)} words but its word attention has "
            f"{n}; was it truncated to fit the model?"
        )
    return np.asarray(sentence.heads, dtype=np.int64), ~np.asarray(sentence.punct, dtype=bool)


def single_head_predictions(features: np.ndarray) -> np.ndarray:
    """``[2, K, n]`` every head's argmax prediction in both directions (directions as in
    :data:`DIRECTIONS`; :func:`bertology.probes.dependency.predictions`: ROOT, ``[SEP]`` and the word
    itself are never chosen). features: ``[n + 1, n + 1, K]`` from :func:`arc_features`."""
    return predictions(torch.from_numpy(np.ascontiguousarray(features[1:, 1:].transpose(2, 0, 1)))).numpy()


def right_branching(n: int) -> np.ndarray:
    """``[n]`` heads where each word's head is the next word and the last word is the root."""
    heads = np.arange(1, n + 1, dtype=np.int64)
    heads[-1] = -1
    return heads


def _arc_scores(
    features: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor, root_bias: torch.Tensor
) -> torch.Tensor:
    """Masked arc scores of a padded batch.

    features: ``[B, N + 1, N + 1, K]`` (:func:`arc_features`, zero-padded); lengths: ``[B]`` words.
    weights: ``[2, K]``; root_bias: scalar.
    Returns ``[B, N + 1, N + 1]``: ``[b, a, c]`` is the score of candidate ``c`` (0 = ROOT, ``i + 1`` =
    word ``i``) as the head of unit ``a``; ``-inf`` for the unit itself and for padded candidates.
    Row 0 (ROOT as a dependent) and padded rows are meaningless.
    """
    size = features.shape[1]
    candidates = torch.arange(size)
    scores = features @ weights[0] + (features @ weights[1]).transpose(1, 2) + root_bias * (candidates == 0)
    invalid = (candidates[None, None, :] > lengths[:, None, None]) | torch.eye(size, dtype=torch.bool)[None]
    return scores.masked_fill(invalid, float("-inf"))


def _max_arborescence(scores: np.ndarray) -> np.ndarray:
    """Chu-Liu/Edmonds: the heads of the highest-scoring arborescence rooted at node 0.

    scores: ``[N, N]`` finite where an arc is allowed; ``scores[d, h]`` scores the arc ``h -> d``.
    Returns ``[N]`` int64 heads with ``heads[0] = -1``.
    """
    size = scores.shape[0]
    allowed = scores.astype(np.float64, copy=True)
    allowed[np.arange(size), np.arange(size)] = -np.inf
    allowed[0] = -np.inf
    heads = allowed.argmax(axis=1)
    heads[0] = -1
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    in_cycle = np.zeros(size, dtype=bool)
    in_cycle[cycle] = True
    outside = np.flatnonzero(~in_cycle)  # starts with the root, node 0
    inner = np.flatnonzero(in_cycle)
    # The contracted graph: the outside nodes, then the cycle as one node (index len(outside)).
    contracted = np.full((outside.size + 1, outside.size + 1), -np.inf)
    contracted[: outside.size, : outside.size] = allowed[np.ix_(outside, outside)]
    leaving = allowed[np.ix_(outside, inner)]  # arcs from the cycle to outside dependents
    contracted[: outside.size, -1] = leaving.max(axis=1)
    entering = allowed[np.ix_(inner, outside)] - allowed[inner, heads[inner]][:, None]
    contracted[-1, : outside.size] = entering.max(axis=0)
    contracted_heads = _max_arborescence(contracted)
    for position, node in enumerate(outside[1:], start=1):
        head = contracted_heads[position]
        heads[node] = inner[leaving[position].argmax()] if head == outside.size else outside[head]
    entry_head = contracted_heads[-1]
    heads[inner[entering[:, entry_head].argmax()]] = outside[entry_head]
    return heads


def _find_cycle(heads: np.ndarray) -> np.ndarray | None:
    """The nodes of one cycle of the head graph (node 0 is the root, ``heads[0] = -1``), or None."""
    state = np.zeros(heads.size, dtype=np.int8)  # 0 unseen, 1 on the current path, 2 done
    state[0] = 2
    for start in range(1, heads.size):
        path = []
        node = start
        while state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node]
        if state[node] == 1:
            return np.array(path[path.index(node) :])
        state[path] = 2
    return None


@dataclass
class _TrainingSet:
    """What training keeps of the examples.

    kept: per sentence, its :func:`arc_features` ``[n + 1, n + 1, K]`` and gold heads ``[n]``.
    single_head_correct: ``[2, K]`` correct non-punctuation heads of each single head's argmax.
    words: non-punctuation words; sentences: sentences kept; skipped: sentences over the length cap.
    """

    kept: list[tuple[np.ndarray, np.ndarray]]
    single_head_correct: np.ndarray
    num_layers: int
    num_heads: int
    words: int
    sentences: int
    skipped: int

    @classmethod
    def collect(cls, examples: Iterable[tuple[Sentence, WordAttention]], max_words: int) -> _TrainingSet:
        """Consume ``examples``, keeping the features of sentences of at most ``max_words`` words."""
        training: _TrainingSet | None = None
        skipped = 0
        for sentence, word_attention in examples:
            if len(sentence.heads) > max_words:
                skipped += 1
                continue
            features = arc_features(word_attention)
            gold, scored = _gold_and_mask(sentence, features)
            layers, heads = word_attention.probs.shape[:2]
            if training is None:
                training = cls([], np.zeros((2, layers * heads), dtype=np.int64), layers, heads, 0, 0, 0)
            elif (layers, heads) != (training.num_layers, training.num_heads):
                raise BertologyError(
                    f"Sentence {sentence.origin} has attention of {layers} x {heads} layers x heads but "
                    f"the earlier ones have {training.num_layers} x {training.num_heads}; train on one "
                    "model's attention."
                )
            training.single_head_correct += (single_head_predictions(features) == gold)[:, :, scored].sum(
                axis=2
            )
            training.words += int(scored.sum())
            training.sentences += 1
            training.kept.append((features, gold))
        if training is None:
            raise BertologyError(f"There is no sentence of at most {max_words} words to train the parser on.")
        training.skipped = skipped
        return training


def _pad_batches(
    kept: list[tuple[np.ndarray, np.ndarray]],
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Group sentences of similar length into zero-padded tensors, emptying ``kept`` as it goes.

    kept: per sentence, its :func:`arc_features` ``[n + 1, n + 1, K]`` and gold heads ``[n]``.
    Each batch is ``(features [B, N + 1, N + 1, K], lengths [B], gold [B, N + 1])`` where ``gold`` holds
    the candidate column of each word's head (ROOT 0, word ``i`` at ``i + 1``) and -100 for row 0 and
    padding. A batch holds at most ``_CHUNK_ELEMENTS`` floats (or one sentence).
    """
    kept.sort(key=lambda item: item[1].size, reverse=True)  # pop() then gives the shortest first
    batches = []
    while kept:
        group = [kept.pop()]
        heads_count = group[0][0].shape[2]
        while kept and (len(group) + 1) * kept[-1][0].shape[0] ** 2 * heads_count <= _CHUNK_ELEMENTS:
            group.append(kept.pop())
        size = group[-1][0].shape[0]
        features = torch.zeros(len(group), size, size, heads_count)
        gold = torch.full((len(group), size), -100, dtype=torch.int64)
        lengths = torch.zeros(len(group), dtype=torch.int64)
        for row, (sentence_features, heads) in enumerate(group):
            n = heads.size
            features[row, : n + 1, : n + 1] = torch.from_numpy(sentence_features)
            gold[row, 1 : n + 1] = torch.from_numpy(heads + 1)
            lengths[row] = n
        batches.append((features, lengths, gold))
    return batches


def _train(
    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], num_heads: int, l2: float, max_iter: int
) -> tuple[np.ndarray, float, float]:
    """Full-batch L-BFGS from zero weights on the padded ``batches`` (:func:`_pad_batches`).

    Returns the weights ``[2, num_heads]`` float32, the ROOT bias and the final objective (mean negative
    log-likelihood per word plus ``l2 · ‖weights‖²``).
    """
    weights = torch.zeros(2, num_heads, requires_grad=True)
    root_bias = torch.zeros((), requires_grad=True)
    total_words = sum(int(lengths.sum()) for _, lengths, _ in batches)
    optimizer = torch.optim.LBFGS(
        [weights, root_bias], max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe"
    )

    def objective() -> torch.Tensor:
        loss = l2 * weights.square().sum()
        for features, lengths, gold in batches:
            scores = _arc_scores(features, lengths, weights, root_bias)
            nll = torch.nn.functional.cross_entropy(
                scores.flatten(0, 1), gold.flatten(), ignore_index=-100, reduction="sum"
            )
            loss = loss + nll / total_words
        return loss

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        final = float(objective())
    return weights.detach().numpy().copy(), float(root_bias.detach()), final


@dataclass
class AttentionParser:
    """A trained attention-only parser (see the module docstring for the model).

    weights: ``[2, layers, heads]`` float32; ``weights[0]`` is ``w`` (dependent -> head attention),
        ``weights[1]`` is ``u`` (head -> dependent attention).
    root_bias: the learned score added to the ROOT candidate.
    single_head_train_uas: ``[2, layers, heads]`` UAS (no punctuation) on the training examples of each
        head's argmax prediction, directions as in :data:`DIRECTIONS`.
    train_sentences: sentences trained on; skipped: training sentences left out for having more than
        ``max_words`` words; train_words: non-punctuation words in the training sentences.
    l2, max_words, max_iter: the settings of :meth:`fit`. loss: the final training objective.
    """

    weights: np.ndarray
    root_bias: float
    single_head_train_uas: np.ndarray
    train_sentences: int
    train_words: int
    skipped: int
    l2: float
    max_words: int
    max_iter: int
    loss: float

    @classmethod
    def fit(
        cls,
        examples: Iterable[tuple[Sentence, WordAttention]],
        *,
        l2: float = 1e-4,
        max_words: int = 80,
        max_iter: int = 100,
    ) -> AttentionParser:
        """Train ``w``, ``u`` and the ROOT bias on ``examples`` by maximum likelihood.

        Examples are consumed one at a time; only each sentence's :func:`arc_features`
        (``(n + 1)² · layers · heads`` float32) is kept, so memory grows with the training words, not
        with the model's token-level attention.
        l2: weight of the L2 penalty on ``w`` and ``u`` (added to the mean negative log-likelihood per
            word). max_words: longer sentences are skipped (and counted in ``skipped``).
        max_iter: L-BFGS iterations.

        Raises:
            BertologyError: no sentence to train on, or a sentence whose word count does not match its
                word attention.
        """
        training = _TrainingSet.collect(examples, max_words)
        weights, root_bias, loss = _train(
            _pad_batches(training.kept), training.num_layers * training.num_heads, l2, max_iter
        )
        shape = (training.num_layers, training.num_heads)
        return cls(
            weights=weights.reshape(2, *shape),
            root_bias=root_bias,
            single_head_train_uas=(training.single_head_correct / max(training.words, 1)).reshape(2, *shape),
            train_sentences=training.sentences,
            train_words=training.words,
            skipped=training.skipped,
            l2=l2,
            max_words=max_words,
            max_iter=max_iter,
            loss=loss,
        )

    @property
    def num_layers(self) -> int:
        return self.weights.shape[1]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[2]

    @property
    def best_single_head(self) -> tuple[str, int, int]:
        """``(direction, layer, head)`` (0-based) of the single head with the best training UAS."""
        direction, layer, head = np.unravel_index(
            np.argmax(self.single_head_train_uas), self.single_head_train_uas.shape
        )
        return DIRECTIONS[direction], int(layer), int(head)

    def log_probs(self, features: np.ndarray) -> np.ndarray:
        """``[n, n + 1]`` log p(candidate | word): row ``j`` is word ``j``, column 0 ROOT, column
        ``i + 1`` word ``i`` (``-inf`` on the word itself). features: from :func:`arc_features`."""
        n = features.shape[0] - 1
        if features.shape[2] != self.num_layers * self.num_heads:
            raise BertologyError(
                f"The parser was trained on {self.num_layers} x {self.num_heads} heads but the attention "
                f"has {features.shape[2]} heads in all; use the model it was trained with."
            )
        with torch.no_grad():
            scores = _arc_scores(
                torch.from_numpy(features)[None],
                torch.tensor([n]),
                torch.from_numpy(self.weights.reshape(2, -1)),
                torch.tensor(self.root_bias, dtype=torch.float32),
            )
            return torch.log_softmax(scores[0, 1:], dim=-1).numpy()

    def predict_features(self, features: np.ndarray, decode: Decode = "argmax") -> np.ndarray:
        """``[n]`` predicted head of each word (0-based word index, -1 for root) from
        :func:`arc_features` (see :meth:`predict`)."""
        log_probs = self.log_probs(features)
        check_decode(decode)
        if decode == "argmax":
            return log_probs.argmax(axis=1) - 1
        graph = np.vstack([np.full((1, log_probs.shape[1]), -np.inf), log_probs])
        return _max_arborescence(graph)[1:] - 1

    def predict(self, word_attention: WordAttention, decode: Decode = "argmax") -> np.ndarray:
        """``[n_words]`` int64 predicted head of each word (0-based word index, -1 for root).

        decode: ``"argmax"`` takes each word's most probable head; ``"mst"`` the best tree
        (Chu-Liu/Edmonds over the log-probabilities).
        """
        return self.predict_features(arc_features(word_attention), decode)

    def to_frame(self) -> pd.DataFrame:
        """One row per attention head (``layer``, ``head`` 0-based): its weights ``w`` and ``u`` and the
        training UAS of its argmax predictions in each direction (``train_uas_dependent->head``,
        ``train_uas_head->dependent``)."""
        import pandas as pd

        return pd.DataFrame(
            {
                **head_index_frame(self.num_layers, self.num_heads),
                "w": self.weights[0].reshape(-1),
                "u": self.weights[1].reshape(-1),
                **{
                    f"train_uas_{direction}": self.single_head_train_uas[index].reshape(-1)
                    for index, direction in enumerate(DIRECTIONS)
                },
            }
        )


@dataclass
class ParserReport:
    """Unlabelled attachment scores on an evaluation set, all without punctuation.

    uas: the parser's UAS; correct: its correct heads; words: scored (non-punctuation) words;
    sentences: sentences evaluated; decode: how heads were predicted.
    right_branching_uas: UAS of "each word's head is the next word, the last word is the root".
    single_head_layer, single_head_head (0-based), single_head_direction: the head and direction whose
        argmax predictions scored best on the training set; single_head_uas: their UAS here;
        single_head_train_uas: their UAS on the training set.
    """

    uas: float
    correct: int
    words: int
    sentences: int
    decode: str
    right_branching_uas: float
    right_branching_correct: int
    single_head_layer: int
    single_head_head: int
    single_head_direction: str
    single_head_uas: float
    single_head_correct: int
    single_head_train_uas: float

    @property
    def single_head_name(self) -> str:
        """e.g. ``"head (3, 9) dependent->head"`` with 0-based layer and head."""
        return f"head ({self.single_head_layer}, {self.single_head_head}) {self.single_head_direction}"

    def to_frame(self) -> pd.DataFrame:
        """One row per predictor (``parser``, ``right-branching``, the single head): ``uas``,
        ``correct``, ``words``."""
        import pandas as pd

        return pd.DataFrame(
            {
                "predictor": [f"parser ({self.decode})", "right-branching", self.single_head_name],
                "uas": [self.uas, self.right_branching_uas, self.single_head_uas],
                "correct": [self.correct, self.right_branching_correct, self.single_head_correct],
                "words": [self.words] * 3,
            }
        )

    def to_json(self) -> str:
        """JSON text of every field."""
        return json.dumps(asdict(self), allow_nan=False)


def evaluate_parser(
    parser: AttentionParser,
    examples: Iterable[tuple[Sentence, WordAttention]],
    *,
    decode: Decode = "argmax",
) -> ParserReport:
    """UAS without punctuation of ``parser`` on ``examples``, with the right-branching and best
    single-head baselines on the same words (see the module docstring). Examples are consumed one at a
    time; sentences of any length are evaluated.

    Raises:
        BertologyError: no non-punctuation word to score, or a sentence whose word count does not match
            its word attention.
    """
    direction, layer, head = parser.best_single_head
    direction_index, head_index = DIRECTIONS.index(direction), layer * parser.num_heads + head
    correct = baseline = single = words = sentences = 0
    for sentence, word_attention in examples:
        features = arc_features(word_attention)
        gold, scored = _gold_and_mask(sentence, features)
        predicted = parser.predict_features(features, decode)
        single_head = single_head_predictions(features)[direction_index, head_index]
        correct += int((predicted == gold)[scored].sum())
        baseline += int((right_branching(gold.size) == gold)[scored].sum())
        single += int((single_head == gold)[scored].sum())
        words += int(scored.sum())
        sentences += 1
    if words == 0:
        raise BertologyError("The evaluation examples have no non-punctuation word to score.")
    return ParserReport(
        uas=correct / words,
        correct=correct,
        words=words,
        sentences=sentences,
        decode=decode,
        right_branching_uas=baseline / words,
        right_branching_correct=baseline,
        single_head_layer=layer,
        single_head_head=head,
        single_head_direction=direction,
        single_head_uas=single / words,
        single_head_correct=single,
        single_head_train_uas=float(parser.single_head_train_uas[direction_index, layer, head]),
    )

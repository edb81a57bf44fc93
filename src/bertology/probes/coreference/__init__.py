"""Which attention heads find a mention's antecedent (Clark et al. 2019, Section 4.3, Table 2).

**Mentions and antecedents.** In a :class:`~bertology.corpus.readers.coref_documents.CorefDocument`, a mention
``c`` is a *candidate* for a mention ``m`` when it ends before ``m`` starts (``c.end <= m.start``; so a
mention containing ``m`` is not one) and its head word is not ``m``'s head word. A candidate of ``m``'s entity
is an *antecedent*; ``m`` is *coreferent* (and scored) when it has an antecedent in the document.

**Head words.** The head word of a mention is the first word of its span whose syntactic head lies
outside the span (preferring words with a letter or digit), given document-level dependency heads
(:func:`with_heads` takes them from the treebank GUM's coreference is annotated on); without heads it is
the span's last word.

**Mention types** (:data:`TYPES`): ``"pronoun"``: a one-word span in :data:`PRONOUNS` (lowercased);
``"proper"``: the head word starts with an upper-case letter and is not its sentence's first word, or
every word of the span that has a letter starts with an upper-case letter (so a sentence-initial
one-word "Obama" is a name, and so, wrongly, is a sentence-initial "Dogs"); ``"other"``: the rest.

**Windows.** The model takes at most ``max_length`` tokens, so documents are read in windows of whole
sentences: for each sentence ``s`` with scored mentions, the window is the longest run of sentences
ending at ``s`` whose joined words fit the model (counted with the tokenizer, special tokens included);
every mention starting in ``s`` is scored in that window, and each window is captured once. Candidates
that start in a sentence before the window, or whose head word is outside it, are out of reach; a
mention whose antecedents are ALL out of reach is counted in ``out_of_reach`` and not scored. A
sentence that alone does not fit has its mentions counted in ``skipped``.

**Heads.** With ``W`` the word-level attention of the window (mean mode, :mod:`bertology.attention.words`),
head ``(layer, head)`` predicts for ``m`` the candidate head word ``argmax_c W[h(m), h(c)]`` over the distinct
head words of ``m``'s in-reach candidates (a tie goes to the earliest word); it is correct when that word
is the head word of one of ``m``'s antecedents.

**Baselines** (same mentions, same in-reach candidates; correct when the chosen candidate is of ``m``'s
entity): ``nearest``: the candidate starting last (of two starting together, the inner one);
``same_head``: the nearest candidate whose head word equals ``m``'s (lowercased), none = wrong; ``sieve``:
the nearest candidate with the same words as ``m`` (lowercased), else with the same head word, else, for
a pronoun ``m``, the nearest candidate that agrees in person, number and gender (:data:`PRONOUN_FEATURES`;
a non-pronoun candidate is 3rd person with unknown number and gender; unknown agrees with anything),
else the nearest candidate.

**Modules.** :mod:`~bertology.probes.coreference.mentions` (head words, types, baselines),
:mod:`~bertology.probes.coreference.windows` (windows of sentences),
:mod:`~bertology.probes.coreference.counts` (:class:`CorefProbe`, :class:`CorefAccumulator`) and
:mod:`~bertology.probes.coreference.scoring` (a run: batches of windows through the model,
:func:`score_coreference`); :func:`bertology.probes.run.probe_coreference` probes a corpus file.
"""

from bertology.probes.coreference.counts import CorefAccumulator, CorefProbe, DocumentsRead
from bertology.probes.coreference.mentions import (
    ALL,
    BASELINES,
    OTHER,
    PRONOUN,
    PRONOUN_FEATURES,
    PRONOUNS,
    PROPER,
    TYPES,
    document_heads,
    head_word,
    mention_type,
    with_heads,
)
from bertology.probes.coreference.scoring import (
    CorefItem,
    NoMentionScored,
    check_scored,
    coref_batches,
    score_coref_batch,
    score_coref_batches,
    score_coreference,
)
from bertology.probes.coreference.windows import CorefWindow, DocumentWindows, ScoredMention, coref_windows

__all__ = [
    "ALL",
    "BASELINES",
    "OTHER",
    "PRONOUN",
    "PRONOUNS",
    "PRONOUN_FEATURES",
    "PROPER",
    "TYPES",
    "CorefAccumulator",
    "CorefItem",
    "CorefProbe",
    "CorefWindow",
    "DocumentWindows",
    "DocumentsRead",
    "NoMentionScored",
    "ScoredMention",
    "check_scored",
    "coref_batches",
    "coref_windows",
    "document_heads",
    "head_word",
    "mention_type",
    "score_coref_batch",
    "score_coref_batches",
    "score_coreference",
    "with_heads",
]

"""Interventions on attention heads: gates, single-head ablation, importance, pruning, saliency.

May import the captured attention (:mod:`bertology.attention`), the models and what lies below them;
independent of :mod:`bertology.analysis` and :mod:`bertology.probes`.

- :func:`head_gates`: multiply any heads' outputs by a factor (0 removes them) inside a ``with`` block,
  or move them towards a replacement (e.g. :func:`record_head_outputs` of other inputs).
- :class:`Task`: what an intervention is scored by, :class:`ClassifierTask` (accuracy on labelled
  examples) or :class:`LanguageModelTask` (a decoder's mean next-token cross-entropy on
  :class:`TokenSequences`); its ``replacement``: zero, mean or resample ablation (:class:`HeadReplacement`).
- :func:`ablation_sweep`: a task's score with each single head removed (lower layers computed once per
  batch).
- :func:`head_importance`: Michel et al. (2019)'s gradient-based head importance, by a task's loss.
- :func:`pruning_curve`: a task's score as more and more heads are removed in a given order.
- :func:`prune_heads`: remove heads from the weights (a smaller model that saves and loads again).
- :func:`attention_gradients`: Clark et al. (2019)'s gradient of the loss by attended-to token kind.
- :func:`attribute`: Hao et al. (2021)'s self-attention attribution of one input, with its attribution tree;
  :func:`attribution_importance`: their head scores over a data set.
- :func:`explain`: signed per-token attributions (gradient, input x gradient, integrated gradients,
  SmoothGrad), the methods chosen by name, of a classifier's label or a decoder's next token; for a
  decoder with each head's direct contribution to the token's logit (:func:`direct_logit_attribution`).
- :func:`attack`: explanations by changing the input (input reduction, HotFlip), chosen by name.
- :func:`prune_and_measure`: a task's pruned copy, its score, its agreement with gating and its speed.
- :func:`run_ablation`: all of the above on a task (``bertology ablate``): :func:`classifier_task` (a
  classifier on a task's dev set) or :func:`corpus_task` (a decoder's next-token loss, an encoder-decoder's
  target loss, on a corpus: ``bertology ablate MODEL --lm-corpus FILE``); :func:`language_model_loss`.
- For encoder-decoders (BART, T5), by the target's loss, on the heads of all three stacks (encoder,
  decoder, cross; :func:`stack_row` finds a gate row): :class:`TargetLossTask` on :class:`SourceTargets`
  (the same study, ``bertology ablate MODEL --lm-corpus PAIRS.jsonl``) and :func:`patch_target_loss`.
- :func:`patch`: activation (exact) and attribution patching at any site (each head, head and position,
  layer or position) on clean/corrupted pairs (:func:`read_pairs`, :func:`ioi_pairs`, :func:`sst2_pairs`),
  and zero or mean ablation there as a patch of a constant (``patch(..., ablation="mean")``);
  :func:`path_patch`: path patching from sender heads through receivers' queries, keys or values (at
  every position or one), :func:`path_patch_each` with each sender alone, a layer x head grid
  (``bertology patch``).
- :func:`circuit`: circuits by edge attribution patching (EAP, EAP-IG, exact) on MIB's graph of heads and
  MLPs, with faithfulness curves, CPR and CMD as MIB scores them (``bertology circuit``).
"""

from bertology.interventions.ablation import AblationResult, ablation_sweep
from bertology.interventions.attacks import Attack, AttackStep, attack
from bertology.interventions.attention_attribution import (
    AttentionAttribution,
    AttributionImportance,
    attribute,
    attribution_importance,
)
from bertology.interventions.attention_gradients import AttentionGradients, attention_gradients
from bertology.interventions.attribution_tree import AttributionTree, attribution_tree
from bertology.interventions.circuit import CircuitResult, circuit
from bertology.interventions.curves import pruning_curve, removal_counts
from bertology.interventions.data import LabelledTexts
from bertology.interventions.direct_logit import DirectLogitAttribution, direct_logit_attribution
from bertology.interventions.gates import head_gates, record_head_outputs, stack_row
from bertology.interventions.importance import HeadImportance, head_importance
from bertology.interventions.language_model import (
    LanguageModelTask,
    TokenSequences,
    language_model_loss,
)
from bertology.interventions.patching import PatchingResult, PatchingStudy, patch
from bertology.interventions.patching_pairs import PatchPair, ioi_pairs, read_pairs, sst2_pairs
from bertology.interventions.path_patching import (
    PathPatching,
    PathPatchingSweep,
    Receiver,
    path_patch,
    path_patch_each,
)
from bertology.interventions.pruning import Pruning, prune_and_measure, prune_heads, save_model
from bertology.interventions.replacement import HeadReplacement
from bertology.interventions.run import AblationRun, classifier_task, corpus_task, run_ablation
from bertology.interventions.saliency import Explanation, explain
from bertology.interventions.target_loss import SourceTargets, TargetLossTask
from bertology.interventions.target_patching import TargetPatching, patch_target_loss
from bertology.interventions.task import ClassifierTask, Task
from bertology.models.heads import HeadSelection

__all__ = [
    "AblationResult",
    "AblationRun",
    "Attack",
    "AttackStep",
    "AttentionAttribution",
    "AttentionGradients",
    "AttributionImportance",
    "AttributionTree",
    "CircuitResult",
    "ClassifierTask",
    "DirectLogitAttribution",
    "Explanation",
    "HeadImportance",
    "HeadReplacement",
    "HeadSelection",
    "LabelledTexts",
    "LanguageModelTask",
    "PatchPair",
    "PatchingResult",
    "PatchingStudy",
    "PathPatching",
    "PathPatchingSweep",
    "Pruning",
    "Receiver",
    "SourceTargets",
    "TargetLossTask",
    "TargetPatching",
    "Task",
    "TokenSequences",
    "ablation_sweep",
    "attack",
    "attention_gradients",
    "attribute",
    "attribution_importance",
    "attribution_tree",
    "circuit",
    "classifier_task",
    "corpus_task",
    "direct_logit_attribution",
    "explain",
    "head_gates",
    "head_importance",
    "ioi_pairs",
    "language_model_loss",
    "patch",
    "patch_target_loss",
    "path_patch",
    "path_patch_each",
    "prune_and_measure",
    "prune_heads",
    "pruning_curve",
    "read_pairs",
    "record_head_outputs",
    "removal_counts",
    "run_ablation",
    "save_model",
    "sst2_pairs",
    "stack_row",
]

"""The choices and defaults of bertology's options, defined once in a module that imports nothing heavy.

The modules that use them import them from here (``bertology.views``, ``bertology.attention.words``, ...), and
the command line reads them to describe itself (``bertology --help``, a usage error) without loading torch.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

#: The three views (:mod:`bertology.views`).
ViewKind = Literal["head", "model", "neuron"]
VIEW_KINDS: tuple[ViewKind, ...] = get_args(ViewKind)
#: Page colour themes.
Theme = Literal["light", "dark"]
#: Softmax weights, or norm-based weights ||a f(x)|| (Kobayashi et al. 2020;
#: :mod:`bertology.attention.norms`).
Weights = Literal["attention", "norm"]
WEIGHTS: tuple[Weights, ...] = get_args(Weights)
#: How a word split into pieces attends (:mod:`bertology.attention.words`).
WordMode = Literal["mean", "first", "max"]
#: How the attention-only parser decodes (:mod:`bertology.probes.parser`).
Decode = Literal["argmax", "mst"]
#: The attention sets of an encoder-decoder (:mod:`bertology.attention.seq2seq`).
AttentionSetName = Literal["encoder", "decoder", "cross"]
#: Rows compared between two models (:mod:`bertology.analysis.comparison`).
Level = Literal["auto", "token", "word"]
#: Attention rollout and flow (:mod:`bertology.analysis.relevance`).
RelevanceMethod = Literal["rollout", "flow"]
RELEVANCE_METHODS: tuple[RelevanceMethod, ...] = get_args(RelevanceMethod)
#: Per-token attributions of a classifier's prediction (:mod:`bertology.interventions.saliency`).
SaliencyMethod = Literal["gradient", "input-x-gradient", "integrated-gradients", "smoothgrad"]
SALIENCY_METHODS: tuple[SaliencyMethod, ...] = get_args(SaliencyMethod)
#: Explanations by changing the input (:mod:`bertology.interventions.attacks`).
AttackMethod = Literal["input-reduction", "hotflip"]
ATTACK_METHODS: tuple[AttackMethod, ...] = get_args(AttackMethod)
#: Whose definitions ``explain`` and ``attack`` follow: bertology's own, or AllenNLP Interpret's code
#: (:mod:`bertology.interventions.saliency`, :mod:`bertology.interventions.allennlp_attacks`).
InterpretConvention = Literal["bertology", "allennlp"]
INTERPRET_CONVENTIONS: tuple[InterpretConvention, ...] = get_args(InterpretConvention)
#: Activation patching (:mod:`bertology.interventions.patching`): which way activations move, what one
#: patch covers, exact patching or its first-order estimate, and the metric read from the logits.
PatchDirection = Literal["denoising", "noising"]
PATCH_DIRECTIONS: tuple[PatchDirection, ...] = get_args(PatchDirection)
PatchGranularity = Literal["head", "head-position", "layer", "position"]
PATCH_GRANULARITIES: tuple[PatchGranularity, ...] = get_args(PatchGranularity)
PatchMethod = Literal["exact", "attribution", "both"]
PATCH_METHODS: tuple[PatchMethod, ...] = get_args(PatchMethod)
PatchMetric = Literal["logit-diff", "prob-diff", "kl"]
PATCH_METRICS: tuple[PatchMetric, ...] = get_args(PatchMetric)
#: What a patch writes: the source run's activation (``counterfactual``), or a constant, 0 or the source
#: run's mean (:mod:`bertology.interventions.pair_mean`): ablation as a patch.
PatchAblation = Literal["counterfactual", "zero", "mean"]
PATCH_ABLATIONS: tuple[PatchAblation, ...] = get_args(PatchAblation)
#: Circuits (:mod:`bertology.interventions.circuit`): how edges are scored and what an edge outside the
#: circuit carries.
CircuitMethod = Literal["eap", "eap-ig", "exact"]
CIRCUIT_METHODS: tuple[CircuitMethod, ...] = get_args(CircuitMethod)
CircuitAblation = Literal["counterfactual", "mean"]
CIRCUIT_ABLATIONS: tuple[CircuitAblation, ...] = get_args(CircuitAblation)
#: What a removed head's output becomes (:mod:`bertology.interventions.replacement`).
AblationKind = Literal["zero", "mean", "resample"]
ABLATION_KINDS: tuple[AblationKind, ...] = get_args(AblationKind)
#: Integration rules of self-attention attribution (:mod:`bertology.interventions.attention_attribution`).
IntegrationRule = Literal["riemann", "gauss-legendre"]
INTEGRATION_RULES: tuple[IntegrationRule, ...] = get_args(IntegrationRule)
#: How the surface statistics average (:mod:`bertology.stats.surface`).
Convention = Literal["bertology", "clark"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)
#: Corpus file formats (:mod:`bertology.corpus.segments`).
CorpusFormat = Literal["text", "jsonl", "conllu"]
FORMATS: tuple[CorpusFormat, ...] = get_args(CorpusFormat)

#: Where a model runs (:mod:`bertology.models.devices`): ``auto`` (a CUDA GPU when there is one, else an Apple
#: GPU through MPS, else the CPU), ``cpu``, ``cuda`` (the current CUDA device), ``cuda:N`` or ``mps``.
DEVICE_FORMS = "auto|cpu|cuda|cuda:N|mps"
DEVICE_FORM = re.compile(r"auto|cpu|cuda(:\d+)?|mps")
DEFAULT_DEVICE = "auto"
#: The floating-point type of a model's weights and computation (statistics accumulate in float64 whatever
#: it is; :mod:`bertology.models.devices`).
Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
DEFAULT_DTYPE: Dtype = "float32"


def is_device_name(name: str) -> bool:
    """Whether ``name`` has one of the forms of :data:`DEVICE_FORMS` (not whether that device is there)."""
    return DEVICE_FORM.fullmatch(name) is not None


#: Segments per forward pass of ``analyze`` and ``compare``.
BATCH_SIZE = 32
#: Query tokens sampled per segment for the heads' Jensen-Shannon divergences.
JS_TOKENS_PER_SEGMENT = 4
#: Top example segments ``analyze`` stores per head (:mod:`bertology.analysis.examples`).
EXAMPLES_PER_HEAD = 5
#: New tokens an encoder-decoder's greedy output has at most, for a source without a target.
MAX_NEW_TOKENS = 32
#: Longest input attention flow accepts by default (its time grows about as n^4).
FLOW_MAX_TOKENS = 64

#: Largest seed: numpy's and scikit-learn's generators take seeds of 32 bits.
MAX_SEED = 2**32 - 1
#: Largest count a ``--limit``-like option takes (a 64-bit integer, as indexing and ``islice`` need).
MAX_COUNT = 2**63 - 1
#: Most torch threads per process, and workers per Ray run (more threads than that abort OpenMP).
MAX_THREADS = 1024
#: Most reader processes of a corpus run (``--readers``).
MAX_READERS = 256
#: Most quadrature points of integrated gradients (Gauss-Legendre nodes need ``steps**2`` floats).
MAX_IG_STEPS = 1000
#: Most noisy copies SmoothGrad averages (each one a forward and backward pass).
MAX_SMOOTHGRAD_SAMPLES = 10_000
#: SmoothGrad's defaults: the noise level of AllenNLP Interpret (a word embedding's components spread far
#: less than their range, so the 10 to 20% Smilkov et al. found for images would drown the input) and the
#: paper's 50 samples.
SMOOTHGRAD_NOISE, SMOOTHGRAD_SAMPLES = 0.01, 50
#: Integrated gradients' points and SmoothGrad's samples by convention: bertology's 50 Gauss-Legendre
#: points and 50 samples, AllenNLP Interpret's ``steps = 10`` and ``self.num_samples = 10``.
IG_STEPS: dict[InterpretConvention, int] = {"bertology": 50, "allennlp": 10}
SAMPLES: dict[InterpretConvention, int] = {"bertology": SMOOTHGRAD_SAMPLES, "allennlp": 10}

#: The host of a Ray address: a name, an IPv4 address or an IPv6 address (its brackets taken off).
RAY_HOST = re.compile(r"[\w.:-]+")


def ray_address_problem(address: str) -> str | None:
    """Why ``address`` is not a Ray address bertology takes (``local``, ``auto``, ``HOST:PORT`` or
    ``ray://HOST:PORT`` with a port from 1 to 65535), or ``None`` when it is one."""
    if address in ("local", "auto"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if RAY_HOST.fullmatch(host.strip("[]")) and port.isdigit() and 1 <= int(port) <= 65535:
        return None
    return f"'{address}' is not a Ray address; use local, auto, HOST:PORT or ray://HOST:PORT."

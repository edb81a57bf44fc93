"""Devices and precision: the names ``--device`` takes, a clear error for a device that is not there, the
dtype reaching the weights, every model-running command passing both on, float64 accumulators whatever
the model's precision, and bfloat16 / float16 analyses within the README's documented tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.cli import run_command
from typer.testing import CliRunner

import bertology
from bertology.analysis.analyze import CorpusAccumulators, analyze_corpus, corpus_batches
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.corpus.segments import sample_corpus
from bertology.errors import BertologyError
from bertology.files.run_files import JS_DIVERGENCE_FILE
from bertology.models.devices import float64_home, resolve_device, resolve_dtype
from bertology.models.loading import LoadedModel, load_model
from bertology.training import FinetuneSettings, finetune

#: The README's documented tolerance ("Devices and precision"): the largest absolute difference from a
#: float32 analysis of a statistic that is an attention weight or mass (and of a pattern score), of an
#: entropy (nats), and of the mean JS divergence between heads (nats).
TOLERANCE = {
    "bfloat16": {"weights": 0.01, "entropy": 0.05, "js": 0.005},
    "float16": {"weights": 0.001, "entropy": 0.005, "js": 0.0005},
}
ENTROPIES = ("entropy", "entropy_uniform", "cls_entropy", "cls_entropy_uniform")


# --- Device names ------------------------------------------------------------------------------------


def test_auto_and_cpu_resolve_to_the_cpu_on_a_machine_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_auto_prefers_cuda_then_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("mps")
    assert resolve_device("mps") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("name", ["gpu", "CPU", "cuda:", "cuda:-1", "cuda:0:1", "cuda1", "mps:0", ""])
def test_a_name_of_no_known_form_is_refused(name: str) -> None:
    with pytest.raises(BertologyError, match=r"is not a device; use one of auto\|cpu\|cuda\|cuda:N\|mps\."):
        resolve_device(name)


def test_a_device_that_is_not_there_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(BertologyError, match=r"^cuda is not available: this machine has no CUDA device\.$"):
        resolve_device("cuda")
    with pytest.raises(BertologyError, match=r"^cuda:1 is not available: this machine has no CUDA device\.$"):
        resolve_device("cuda:1")
    with pytest.raises(BertologyError, match=r"^mps is not available"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BertologyError, match=r"^cuda:1 is not available: this machine has 1 CUDA device "):
        resolve_device("cuda:1")


def test_precision_names_and_where_float64_sums_run() -> None:
    assert [resolve_dtype(name) for name in ("float32", "bfloat16", "float16", None)] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]
    with pytest.raises(BertologyError, match="'float64' is not a precision"):
        resolve_dtype("float64")  # type: ignore[arg-type]
    assert float64_home(torch.device("mps")) == torch.device("cpu")
    assert float64_home(torch.device("cuda", 1)) == torch.device("cuda", 1)


# --- Loading ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_dtype_reaches_every_weight_and_the_captured_attention(
    tiny_model_dirs: dict[str, Path], dtype: str
) -> None:
    loaded = load_model(tiny_model_dirs["bert"], device="cpu", dtype=dtype)  # type: ignore[arg-type]
    expected = resolve_dtype(dtype)  # type: ignore[arg-type]
    assert loaded.dtype == expected and loaded.device == torch.device("cpu")
    assert {parameter.dtype for parameter in loaded.model.parameters()} == {expected}
    batch = bertology.capture_batch(["a short text", "and another one here"], model=loaded)
    assert batch.probs.dtype == expected
    attention = batch[1]  # handed to views on the host, as float32 numpy
    assert attention.probs.dtype == np.float32
    # bfloat16 and float16 rows: 8 (bfloat16) bits of mantissa, 2^-8 = 0.004 per weight, summed over a
    # dozen keys: 0.02
    np.testing.assert_allclose(attention.probs.sum(-1), 1.0, atol=0.02)
    classifier = load_model(tiny_model_dirs["bert"], dtype=dtype, classifier=True, labels=["a", "b"])  # type: ignore[arg-type]
    assert {parameter.dtype for parameter in classifier.model.parameters()} == {expected}


def test_the_default_is_float32_on_auto(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs["bert"])
    assert loaded.dtype == torch.float32 and loaded.device == resolve_device("auto")


# --- Every model-running command passes --device and --dtype on --------------------------------------


class _Stopped(BertologyError):
    """Raised by the spies below once they have seen what a command passed on."""


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """What the command passed to ``load_model`` (or, for finetune, in its settings): spies that record the
    device and dtype and stop the command there. The torch thread count (which ``serve`` sets) is restored."""
    record: dict[str, object] = {}

    def spy_load(*args: object, **options: object) -> LoadedModel:
        record.update(device=options.get("device"), dtype=options.get("dtype"))
        raise _Stopped("stopped")

    def spy_finetune(task: object, run: object, settings: FinetuneSettings, **options: object) -> None:
        record.update(device=settings.device, dtype=settings.dtype)
        raise _Stopped("stopped")

    homes = [import_module(f"bertology.{name}") for name in ("models.loading", "server.app", "training.loop")]
    for module in homes:
        monkeypatch.setattr(module, "load_model", spy_load)
    monkeypatch.setattr(homes[-1], "finetune", spy_finetune)
    threads = torch.get_num_threads()
    yield record
    torch.set_num_threads(threads)


def _commands(shared_data: Path, tmp: Path) -> dict[str, list[str]]:
    conllu = str(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu")
    sst2 = str(shared_data / "glue" / "SST-2")
    out = str(tmp / "out")
    return {
        "view": ["view", "hi", "-o", str(tmp / "v.html")],
        "relevance": ["relevance", "hi", "-o", str(tmp / "r.html")],
        "analyze": ["analyze", str(sample_corpus()), "-o", out],
        "compare": ["compare", "default", "default", "-o", out],
        "probe deps": ["probe", "deps", conllu, "-o", out],
        "probe parser": ["probe", "parser", "--train", conllu, "--eval", conllu, "-o", out],
        "probe coref": ["probe", "coref", conllu, "-o", out],
        "probe gap": ["probe", "gap", conllu, "-o", out],
        "finetune": ["finetune", sst2, "-o", out],
        "ablate": ["ablate", "default", "--task", sst2, "-o", out],
        "explain": ["explain", "default", "hi", "-o", str(tmp / "e.html")],
        "serve": ["serve", "--port", "0"],
        "index": ["index", conllu, "-o", out],
    }


COMMANDS = [
    "view", "relevance", "analyze", "compare", "probe deps", "probe parser", "probe coref", "probe gap",
    "finetune", "ablate", "explain", "serve", "index",
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_every_model_running_command_passes_device_and_dtype_on(
    command: str, seen: dict[str, object], shared_data: Path, tmp_path: Path
) -> None:
    args = _commands(shared_data, tmp_path)[command]
    result = CliRunner().invoke(app, [*args, "--device", "cuda:3", "--dtype", "float16"])
    assert isinstance(result.exception, _Stopped), result.output
    assert seen == {"device": "cuda:3", "dtype": "float16"}
    default = CliRunner().invoke(app, args)
    assert isinstance(default.exception, _Stopped), default.output
    assert seen == {"device": "auto", "dtype": "float32"}


def test_a_device_name_of_no_known_form_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bertology", "view", "hi", "--device", "gpu0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'gpu0' is not a device; use one of auto|cpu|cuda|cuda:N|mps." in result.stderr


# --- Statistics in float64, bfloat16 and float16 within the documented tolerance -----------------------


def test_accumulators_are_float64_after_a_bfloat16_batch(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs["bert"], device="cpu", dtype="bfloat16")
    accumulators = CorpusAccumulators(loaded, AnalysisSettings(max_length=32, js_tokens_per_segment=None))
    batch = next(corpus_batches(sample_corpus(), loaded.tokenizer, max_length=32, batch_size=4))
    accumulators.update(batch)
    accumulators.add_captured(batch)
    assert accumulators.surface.means.sums is not None and accumulators.patterns.means.sums is not None
    assert accumulators.surface.means.sums.dtype == torch.float64
    assert accumulators.patterns.means.sums.dtype == torch.float64
    assert (
        accumulators.patterns.best_score is not None and accumulators.patterns.best_score.dtype == np.float64
    )
    assert accumulators.distances.js_sum is not None and accumulators.distances.js_sum.dtype == torch.float64
    result = accumulators.result()
    assert {values.dtype for values in result.surface.columns.values()} == {np.dtype(np.float64)}


@pytest.fixture(scope="module")
def float32_analysis(default_model: LoadedModel, sample_corpus_head: Callable[[int], Path]) -> object:
    return analyze_corpus(sample_corpus_head(40), default_model)


def _column_differences(ours: pd.DataFrame, theirs: pd.DataFrame) -> dict[str, float]:
    """Largest absolute difference of each float column defined for some head (a statistic no head of an
    encoder has, e.g. the decoders' sink, is NaN in both: checked, then left out)."""
    found = {}
    for name in [name for name in ours.columns if pd.api.types.is_float_dtype(ours[name])]:
        assert (ours[name].isna() == theirs[name].isna()).all(), name
        if ours[name].notna().any():
            found[name] = float(np.nanmax(np.abs(ours[name].to_numpy() - theirs[name].to_numpy())))
    return found


def _largest_differences(reference: object, folder: Path) -> dict[str, float]:
    """Largest absolute difference of each numeric heads.csv column and of the JS divergence file."""
    found = _column_differences(reference.heads_frame(), pd.read_csv(folder / "heads.csv"))  # type: ignore[attr-defined]
    js = pd.read_csv(folder / JS_DIVERGENCE_FILE, index_col=0).to_numpy()
    found["js"] = float(np.abs(reference.distances.distance - js).max())  # type: ignore[attr-defined]
    return found


@pytest.mark.slow
def test_bertology_analyze_in_bfloat16_stays_within_the_documented_tolerance(
    float32_analysis: object,
    sample_corpus_head: Callable[[int], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command as a user runs it, in this process (it needs no process of its own)."""
    corpus = sample_corpus_head(40)
    result = run_command(
        ["analyze", str(corpus), "-o", str(tmp_path / "bf16"), "--device", "cpu", "--dtype", "bfloat16"],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "bf16" / "summary.json").read_text())["dtype"] == "bfloat16"
    found = _largest_differences(float32_analysis, tmp_path / "bf16")
    limits = TOLERANCE["bfloat16"]
    for name, difference in found.items():
        limit = (
            limits["js"] if name == "js" else limits["entropy"] if name in ENTROPIES else limits["weights"]
        )
        assert difference <= limit, (name, difference)
    assert max(found.values()) > 1e-4  # it did run in bfloat16: not float32's numbers


def test_float16_analysis_stays_within_the_documented_tolerance(
    float32_analysis: object, sample_corpus_head: Callable[[int], Path]
) -> None:
    reference = float32_analysis
    half = analyze_corpus(sample_corpus_head(40), load_model(device="cpu", dtype="float16"))
    limits = TOLERANCE["float16"]
    found = _column_differences(reference.heads_frame(), half.heads_frame())  # type: ignore[attr-defined]
    for name, difference in found.items():
        limit = limits["entropy"] if name in ENTROPIES else limits["weights"]
        assert difference <= limit, (name, difference)
    js = np.abs(reference.distances.distance - half.distances.distance).max()  # type: ignore[attr-defined]
    assert 0 < js <= limits["js"]


def test_finetune_in_bfloat16_keeps_float32_weights(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    task = tmp_path / "task"
    task.mkdir()
    rows = ["sentence\tlabel", *[f"{word} film .\t{label}" for word, label in [("good", 1), ("bad", 0)] * 8]]
    for name in ("train.tsv", "dev.tsv"):
        (task / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    options = dict(model=str(tiny_model_dirs["bert"]), max_train=None, batch_size=8, max_length=16,
                   eval_every=None, log_every=1, watch_every=0, threads=1, device="cpu")  # fmt: skip
    plain = finetune(task, tmp_path / "float32", FinetuneSettings(**options))  # type: ignore[arg-type]
    mixed = finetune(task, tmp_path / "bfloat16", FinetuneSettings(**options, dtype="bfloat16"))  # type: ignore[arg-type]
    run = json.loads((mixed.run_dir / "run.json").read_text())
    assert run["status"] == "finished" and run["device"] == "cpu" and run["settings"]["dtype"] == "bfloat16"
    saved = load_model(mixed.run_dir, classifier=True)
    assert {parameter.dtype for parameter in saved.model.parameters()} == {torch.float32}
    losses = [
        pd.read_csv(result.run_dir / "metrics.csv").query("split == 'train'")["loss"]
        for result in (plain, mixed)
    ]
    assert not losses[0].equals(losses[1])  # the forward passes did run in bfloat16
    # forward passes in bfloat16 (relative error 2^-8 per operation) on a loss of about 0.7: 0.05 is what
    # a few such roundings through 6 layers give, and far below what a broken run's loss would change
    np.testing.assert_allclose(losses[0], losses[1], atol=0.05)

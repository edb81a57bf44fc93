"""Benchmark bertology on the machine's accelerator (CUDA) or its CPU: every command against the plain forward
pass it needs, on the same inputs, in one run (the table of the GPU issue).

Models are random-weight, built from configs with the default model's tokenizer: ``bertbase`` (12 x 12,
hidden 768), ``modernbert`` (ModernBERT-base size, 8,192 positions) and ``tiny`` (12 x 12, hidden 96: a
near-free model, so its analysis time is the host's and the statistics' overhead). Data: UD EWT, GUM, GAP
and SST-2 from ``$BERTOLOGY_DATA`` or ``../shared/data``.

Steps (``--steps``, comma-separated):

- ``capture``: capture of a pair equals transformers' eager ``output_attentions`` (max difference), and a
  2,048-token capture's rows equal eager's;
- ``agree``: ``analyze`` on the device (float32, bfloat16) against the CPU, ``--agree-segments`` segments;
- ``throughput``: ``analyze_corpus`` of ``--segments`` EWT train segments against the sdpa forward pass of
  the same batches, float32 and (on CUDA) bfloat16, batches of 32 and 256; ratio = forward / analysis;
- ``overhead``: the same with the tiny model: the analysis's cost per segment beyond its forward pass;
- ``long``: an 8,192-token input: plain forward, capture, the three views' build times and sizes;
- ``index``: ``build_index`` of EWT train against the forward passes it needs;
- ``cli``: the probes, fine-tuning, ablation and explanation commands, timed end to end.

Results: ``RESULT name: value`` lines and ``--out``/results.json, with the device named. On a CPU, use
``--size tiny`` (the big models' steps are skipped) for the host's figures in minutes.

Run: ``.venv/bin/python benchmarks/bench_gpu.py --out benchmarks/out/gpu --steps throughput,overhead``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import TruncationWarning

DATA = Path(os.environ.get("BERTOLOGY_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
EWT_DEV = DATA / "ud_ewt" / "en_ewt-ud-dev.conllu"
EWT_TRAIN = DATA / "ud_ewt" / "en_ewt-ud-train.conllu"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RESULTS: dict[str, object] = {}


def note(key: str, value: object) -> None:
    RESULTS[key] = value
    print(f"RESULT {key}: {value}", flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step(name: str, work: Callable[[], None]) -> None:
    """Run one step; an error is noted and the next step still runs."""
    start = time.perf_counter()
    print(f"\n=== {name}", flush=True)
    try:
        work()
    except Exception as error:  # one broken path must not hide the others
        note(f"{name}.error", f"{type(error).__name__}: {str(error)[:400]}")
        traceback.print_exc()
    print(f"=== {name} done in {time.perf_counter() - start:.1f} s", flush=True)


def build_models(folder: Path, names: list[str]) -> dict[str, Path]:
    """Random-weight models saved under ``folder`` with the default model's tokenizer."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from bertology.models.loading import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    special = {"pad_token_id": tokenizer.pad_token_id, "vocab_size": tokenizer.vocab_size}
    ends = {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    specs: dict[str, tuple[str, dict[str, Any]]] = {
        "bertbase": ("bert", {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}),
        "tiny": ("bert", {"hidden_size": 96, "num_hidden_layers": 12, "num_attention_heads": 12,
                          "intermediate_size": 64}),
        "modernbert": ("modernbert", {"max_position_embeddings": 8192, "cls_token_id": tokenizer.cls_token_id,
                                      "sep_token_id": tokenizer.sep_token_id, **ends}),
    }  # fmt: skip
    paths = {}
    for name in names:
        kind, config = specs[name]
        torch.manual_seed(0)
        model = AutoModel.from_config(AutoConfig.for_model(kind, **config, **special))
        target = folder / name
        model.save_pretrained(target)
        tokenizer.model_max_length = 8192 if name == "modernbert" else 512
        tokenizer.save_pretrained(target)
        paths[name] = target
    return paths


def capture_equality(paths: dict[str, Path]) -> None:
    from transformers import AutoModel

    import bertology

    text_a, text_b = (
        "The quick brown fox jumps over the lazy dog.",
        "It was tired after a long day in the sun.",
    )
    for name in ("bertbase", "modernbert"):
        loaded = bertology.load_model(str(paths[name]), device=DEVICE)
        attention = bertology.capture(text_a, text_b, model=loaded)
        reference = AutoModel.from_pretrained(paths[name], attn_implementation="eager").to(DEVICE).eval()
        inputs = loaded.tokenizer(text_a, text_b, return_tensors="pt").to(DEVICE)
        with torch.no_grad():
            expected = torch.stack(reference(**inputs, output_attentions=True).attentions)[:, 0].float().cpu()
        difference = (torch.as_tensor(np.asarray(attention.probs)) - expected).abs().max()
        note(f"capture.{name}.maxdiff_vs_output_attentions", float(difference))


def analyze_agreement(paths: dict[str, Path], segments: int) -> None:
    import bertology
    from bertology.analysis.analyze import analyze_corpus
    from bertology.analysis.settings import AnalysisSettings

    settings = AnalysisSettings(limit=segments, corpus_format="conllu")
    frames = {}
    for device, dtype in (("cpu", "float32"), (DEVICE, "float32"), (DEVICE, "bfloat16")):
        loaded = bertology.load_model(str(paths["bertbase"]), device=device, dtype=dtype)
        frames[(device, dtype)] = analyze_corpus(EWT_DEV, loaded, settings).heads_frame()
    reference = frames[("cpu", "float32")]
    numbers = reference.select_dtypes("number").columns
    for key in ((DEVICE, "float32"), (DEVICE, "bfloat16")):
        difference = (frames[key][numbers] - reference[numbers]).abs().max().max()
        note(f"agree.{key[0]}.{key[1]}.maxdiff_vs_cpu", float(f"{difference:.2e}"))


def throughput(paths: dict[str, Path], name: str, segments: int) -> None:
    """``analyze_corpus`` against the sdpa forward pass of the same batches (encoded beforehand)."""
    from transformers import AutoModel

    import bertology
    from bertology.analysis.analyze import PAD_MULTIPLE, analyze_corpus, batch_texts, corpus_batches
    from bertology.analysis.settings import AnalysisSettings
    from bertology.corpus.encoding import encode

    dtypes = ("float32", "bfloat16") if DEVICE == "cuda" else ("float32",)
    for dtype in dtypes:
        for batch_size in (32, 256):
            loaded = bertology.load_model(str(paths[name]), device=DEVICE, dtype=dtype)
            plain = AutoModel.from_pretrained(
                paths[name], attn_implementation="sdpa", dtype=getattr(torch, dtype)
            )
            plain = plain.to(DEVICE).eval()
            read = corpus_batches(
                EWT_TRAIN, loaded.tokenizer, limit=segments, batch_size=batch_size, corpus_format="conllu"
            )
            encoded = (
                encode(loaded.tokenizer, *batch_texts(batch), max_length=128, pad_to_multiple_of=PAD_MULTIPLE)
                for batch in read
            )
            batches = [
                {key: value.to(DEVICE) for key, value in each.model_inputs.items()} for each in encoded
            ]
            settings = AnalysisSettings(limit=segments, batch_size=batch_size, corpus_format="conllu")
            with torch.inference_mode():
                for batch in batches[:3]:
                    plain(**batch)
            analyze_corpus(EWT_TRAIN, loaded, AnalysisSettings(limit=64, corpus_format="conllu"))  # warm-up
            forward, analysis = [], []
            for _ in range(2):
                sync()
                start = time.perf_counter()
                with torch.inference_mode():
                    for batch in batches:
                        plain(**batch)
                sync()
                forward.append(time.perf_counter() - start)
                start = time.perf_counter()
                analyze_corpus(EWT_TRAIN, loaded, settings)
                sync()
                analysis.append(time.perf_counter() - start)
            tag = f"{name}.{dtype}.batch{batch_size}"
            note(f"{tag}.forward_s", [round(value, 2) for value in forward])
            note(f"{tag}.analysis_s", [round(value, 2) for value in analysis])
            note(f"{tag}.ratio_forward_over_analysis", round(min(forward) / min(analysis), 3))
            overhead = (min(analysis) - min(forward)) / segments
            note(f"{tag}.overhead_ms_per_segment", round(1000 * overhead, 3))


def long_inputs(paths: dict[str, Path]) -> None:
    from transformers import AutoModel

    import bertology

    loaded = bertology.load_model(str(paths["modernbert"]), device=DEVICE)
    raw = " ".join(
        line.split("\n")[0] for line in EWT_TRAIN.read_text(encoding="utf-8").split("# text = ")[1:3000]
    )
    ids = loaded.tokenizer(raw, truncation=True, max_length=8192)["input_ids"]
    text = loaded.tokenizer.decode(ids[1:-1])
    plain = AutoModel.from_pretrained(paths["modernbert"], attn_implementation="sdpa").to(DEVICE).eval()
    inputs = loaded.tokenizer(text, return_tensors="pt", truncation=True, max_length=8192).to(DEVICE)
    note("long.tokens", int(inputs["input_ids"].shape[1]))
    with torch.inference_mode():
        plain(**inputs)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        plain(**inputs)
    sync()
    note("long.plain_forward_s", round(time.perf_counter() - start, 3))
    start = time.perf_counter()
    attention = bertology.capture(text, model=loaded)
    sync()
    note("long.capture_s", round(time.perf_counter() - start, 3))
    for view in ("model", "head", "neuron"):
        start = time.perf_counter()
        options = {"layer": 3, "head": 2} if view == "neuron" else {}
        page = getattr(bertology, f"{view}_view")(attention, **options)
        note(f"long.{view}_view_build_s", round(time.perf_counter() - start, 2))
        note(f"long.{view}_view_MB", round(len(page.html.encode()) / 1e6, 2))


def index(paths: dict[str, Path], folder: Path) -> None:
    import bertology
    from bertology.corpus.batching import length_sorted_batches
    from bertology.index.token_index import build_index, encode_segment, read_indexed_segments

    loaded = bertology.load_model(str(paths["bertbase"]), device=DEVICE)

    def plain() -> float:
        start = time.perf_counter()
        segments = enumerate(read_indexed_segments(EWT_TRAIN, loaded.tokenizer, 128))
        for batch in length_sorted_batches(segments, lambda item: len(item[1].words), batch_size=32):
            inputs = [encode_segment(loaded.tokenizer, segment, 128)[0] for _, segment in batch]
            padded = loaded.tokenizer.pad(inputs, return_tensors="pt", pad_to_multiple_of=8).to(DEVICE)
            with torch.inference_mode():
                loaded.model(**padded)
        sync()
        return time.perf_counter() - start

    plain()
    forward = plain()
    start = time.perf_counter()
    build_index(EWT_TRAIN, folder / "index", model=loaded)
    built = time.perf_counter() - start
    note("index.plain_forward_s", round(forward, 2))
    note("index.build_s", round(built, 2))
    note("index.ratio_build_over_forward", round(built / forward, 2))


def command(arguments: list[str], folder: Path, log: str) -> float:
    """Seconds ``bertology ARGUMENTS`` took (its output in ``folder/log.log``)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bertology", *arguments], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (folder / f"{log}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode:
        note(f"cli.{log}.failed", (done.stdout + done.stderr)[-600:])
    return round(seconds, 2)


def commands(paths: dict[str, Path], folder: Path) -> None:
    model, gum, device = str(paths["bertbase"]), DATA / "gum_v5.1_sd", ["--device", DEVICE]
    deps = ["probe", "deps", str(gum / "dep_stanford"), "--model", model, *device, "-o", str(folder / "deps")]
    note("cli.probe_deps_gum_s", command(deps, folder, "deps"))
    coref = [
        "probe",
        "coref",
        str(gum / "coref_conll"),
        "--treebank",
        str(gum / "dep_stanford"),
        "--model",
        model,
    ]
    note("cli.probe_coref_gum_s", command([*coref, *device, "-o", str(folder / "coref")], folder, "coref"))
    gap = [
        "probe",
        "gap",
        str(DATA / "gap" / "gap-development.tsv"),
        "--no-syntax",
        "--model",
        model,
        *device,
    ]
    note("cli.probe_gap_dev_s", command([*gap, "-o", str(folder / "gap")], folder, "gap"))
    sst2 = str(DATA / "glue" / "SST-2")
    train = ["finetune", sst2, "--model", model, *device, "--max-train", "8000", "--max-dev", "300"]
    note("cli.finetune_s", command([*train, "-o", str(folder / "ft")], folder, "finetune"))
    ablate = [
        "ablate",
        str(folder / "ft"),
        "--task",
        sst2,
        "--max-dev",
        "300",
        *device,
        "-o",
        str(folder / "abl"),
    ]
    note("cli.ablate_s", command(ablate, folder, "ablate"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="capture,agree,throughput,overhead,long,index,cli")
    parser.add_argument("--segments", type=int, default=4000)
    parser.add_argument("--agree-segments", type=int, default=300)
    parser.add_argument("--size", choices=["full", "tiny"], default="full", help="tiny: the tiny model only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore", TruncationWarning)  # the analysis counts its cuts; a script may say so
    steps = args.steps.split(",")
    big = args.size == "full"
    names = ["tiny", *(["bertbase", "modernbert"] if big else [])]
    paths = build_models(args.out / "models", names)
    note(
        "device",
        torch.cuda.get_device_name() if DEVICE == "cuda" else f"CPU, {torch.get_num_threads()} threads",
    )
    work: dict[str, Callable[[], None]] = {
        "capture": lambda: capture_equality(paths),
        "agree": lambda: analyze_agreement(paths, args.agree_segments),
        "throughput": lambda: throughput(paths, "bertbase", args.segments),
        "overhead": lambda: throughput(paths, "tiny", args.segments),
        "long": lambda: long_inputs(paths),
        "index": lambda: index(paths, args.out),
        "cli": lambda: commands(paths, args.out),
    }
    for name in steps:
        if big or name == "overhead":
            step(name, work[name])
    (args.out / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()

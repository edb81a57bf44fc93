"""Benchmark long inputs captured by queries and keys (``bertology.attention.long_capture``) against the full
capture of every layer's probabilities, on a randomly initialised ModernBERT-base-sized model (22 layers x 12
heads, hidden 768, global attention every third layer and windows of 128 tokens elsewhere; transformers'
``ModernBertConfig`` defaults) with the default model's WordPiece tokenizer.

Each measurement runs in a fresh process: the model is built and the input encoded, the peak resident
memory is reset (``/proc/self/clear_refs``), then the capture runs, and the process reports the peak
above the model (``VmHWM`` minus the resident memory before the capture) and the time:

- ``qk``: ``capture(text, mode="qk")`` (sdpa forward pass, queries and keys kept in float32), then
  ``block`` (a 256-row window of every head of the last layer, what a head view draws) and
  ``layer`` (every row of one layer, chunk by chunk, max-pooled to 100 x 100 thumbnails); the bytes of
  the queries and keys kept (``queries_keys_mib``) beside the resident memory, which also holds what the
  allocator keeps of the forward pass's freed buffers;
- ``qk16``: the same with ``qk_dtype=torch.float16``;
- ``probs``: ``capture(text, mode="probs")``, today's full capture (eager, every layer's ``[12, n, n]``
  probabilities), where it fits in memory;
- ``views``: the pages of a long input (:mod:`bertology.views.long`) from the ``qk16`` capture: build
  time and size of the head view (every layer's top-k weights per row and minimap, one pass over each
  layer's rows), the model view (a 256-token window of every layer, thumbnails of the whole input) and
  the neuron view (one head's queries and keys), and the head
  view's time to first paint in Debian's headless Chromium (``window.bertology.firstPaintMs``, from
  the script's start, and ``load_ms``, from navigation to the first paint);
- ``analyze-qk`` / ``analyze-probs``: the corpus statistics of one segment of that many tokens
  (``CorpusAccumulators.update``: row statistics and pattern scores of every row, JS divergences of 4
  sampled rows), from queries and keys in blocks of 64 MiB, or streamed from each layer's probabilities.

Run: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_long.py --lengths 2048 4096 8192 --probs 2048
--half --analyze 2048 4096 --views 2048 4096 8192``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

WINDOW_ROWS = 256
THUMBNAIL = 100


def _resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _model() -> object:
    """The ModernBERT-base-sized random model, wrapped as ``load_model`` wraps models."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    from bertology.models.loading import default_model_path, wrap_model

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path(), model_max_length=8192)
    config = ModernBertConfig(
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        attn_implementation="eager",
    )
    return wrap_model(ModernBertModel(config), tokenizer, "modernbert-base-random")


def _text(loaded: object, tokens: int) -> str:
    """Sample-corpus text of exactly ``tokens`` tokens with [CLS] and [SEP]."""
    from bertology.corpus.segments import sample_corpus

    words = sample_corpus().read_text(encoding="utf-8").split()
    tokenizer = loaded.tokenizer  # type: ignore[attr-defined]
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[: tokens - 2])


def analyze_one(loaded: object, text: str, mode: str, tokens: int) -> dict[str, float | int | str]:
    """The statistics of one segment (see the module docstring), measured from the current peak reset."""
    from bertology.analysis.analyze import CorpusAccumulators
    from bertology.analysis.settings import AnalysisSettings
    from bertology.corpus.segments import Segment

    settings = AnalysisSettings(max_length=tokens, mode=mode.removeprefix("analyze-"))  # type: ignore[arg-type]
    accumulators = CorpusAccumulators(loaded, settings)
    before = _resident_kib("VmRSS")
    start = time.perf_counter()
    encoded = accumulators.update([Segment(text, None, "bench")])
    return {
        "mode": mode,
        "tokens": int(encoded.lengths[0]),
        "analyze_s": round(time.perf_counter() - start, 2),
        "analyze_peak_mib": round((_resident_kib("VmHWM") - before) / 1024),
    }


def first_paint(page: Path) -> dict[str, float]:
    """Open ``page`` in Debian's headless Chromium; the page's own first-paint time and the time from
    navigation until it is drawn (ms)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium")
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        view = context.new_page()
        start = time.perf_counter()
        view.goto(page.resolve().as_uri())
        view.wait_for_function("() => window.bertology && window.bertology.ready", timeout=60_000)
        load_ms = (time.perf_counter() - start) * 1000
        paint_ms = view.evaluate("window.bertology.firstPaintMs")
        browser.close()
    return {"first_paint_ms": round(paint_ms), "load_ms": round(load_ms)}


def views_one(attention: object, tokens: int) -> dict[str, float | int | str]:
    """Build time and size of the three pages of a long input, and the head view's first paint."""
    import tempfile

    from bertology.views import head_view, model_view, neuron_view

    result: dict[str, float | int | str] = {"mode": "views", "tokens": tokens}
    folder = Path(tempfile.mkdtemp())
    builders = {"head": head_view, "model": model_view, "neuron": neuron_view}
    for kind, build in builders.items():
        start = time.perf_counter()
        html = build(attention, query=tokens - 10).html
        result[f"{kind}_build_s"] = round(time.perf_counter() - start, 2)
        result[f"{kind}_mb"] = round(len(html.encode("utf-8")) / 1e6, 2)
        (folder / f"{kind}.html").write_text(html, encoding="utf-8")
    result.update(first_paint(folder / "head.html"))
    return result


def one(mode: str, tokens: int) -> dict[str, float | int | str]:
    """One measurement in this process (see the module docstring)."""
    from bertology.attention.capturing import capture

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    loaded = _model()
    text = _text(loaded, tokens)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident memory starts again from here
    if mode.startswith("analyze"):
        return analyze_one(loaded, text, mode, tokens)
    before = _resident_kib("VmRSS")
    start = time.perf_counter()
    dtype = torch.float16 if mode in ("qk16", "views") else None
    attention = capture(text, model=loaded, mode="probs" if mode == "probs" else "qk", qk_dtype=dtype)
    seconds = time.perf_counter() - start
    if mode == "views":
        return views_one(attention, tokens)
    result: dict[str, float | int | str] = {
        "mode": mode,
        "tokens": len(attention.tokens),
        "capture_s": round(seconds, 2),
        "capture_peak_mib": round((_resident_kib("VmHWM") - before) / 1024),
        "kept_mib": round((_resident_kib("VmRSS") - before) / 1024),
    }
    if mode != "probs":
        kept = sum(layer.query.nbytes + layer.key.nbytes for layer in attention.layers)
        result["queries_keys_mib"] = round(kept / 2**20)
        last = attention.num_layers - 1
        start = time.perf_counter()
        window = attention.block(last, rows=slice(tokens // 2, tokens // 2 + WINDOW_ROWS))
        result["block_s"] = round(time.perf_counter() - start, 3)
        assert window.shape == (12, WINDOW_ROWS, tokens)
        start = time.perf_counter()
        attention.thumbnails(THUMBNAIL, layers=[last])
        result["layer_s"] = round(time.perf_counter() - start, 2)
        result["peak_mib"] = round((_resident_kib("VmHWM") - before) / 1024)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="*", default=[2048, 4096, 8192])
    parser.add_argument("--probs", type=int, nargs="*", default=[2048], help="lengths for the full capture")
    parser.add_argument("--half", action="store_true", help="also queries and keys in float16")
    parser.add_argument("--analyze", type=int, nargs="*", default=[], help="lengths for the statistics")
    parser.add_argument("--views", type=int, nargs="*", default=[], help="lengths for the view pages")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "TOKENS"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        print(json.dumps(one(options.one[0], int(options.one[1]))))
        return
    runs = [("qk", n) for n in options.lengths]
    runs += [("qk16", n) for n in options.lengths if options.half]
    runs += [("probs", n) for n in options.probs]
    runs += [(mode, n) for n in options.analyze for mode in ("analyze-qk", "analyze-probs")]
    runs += [("views", n) for n in options.views]
    for mode, tokens in runs:
        done = subprocess.run(
            [sys.executable, __file__, "--one", mode, str(tokens)],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        print(
            lines[-1] if done.returncode == 0 and lines else f"{mode} {tokens}: failed\n{done.stderr[-2000:]}"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Benchmark: model-view page size, build time and paint time, against a BertViz-style JSON baseline.

For a 12-layer x 12-head model of BERT-base shape (random weights) at 128 and 512 tokens:
- ours: ``model_view(attention)`` -> HTML (8-bit codes, deflated, base64, embedded once);
- baseline: the same weights as full-precision JSON (``json.dumps(probs.tolist())``) embedded twice,
  the way BertViz's pages carry them;
- paint: time from navigation start until the page reports its first paint done, in headless Chromium.
Random weights give near-uniform attention, which compresses very well; an "incompressible" row with
uniformly random 8-bit codes shows the worst case for size and paint time.

Run: ``.venv/bin/python benchmarks/bench_views.py [--lengths 128 512] [--no-baseline]``
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import BertConfig, BertModel

import bertology
from bertology.attention.capturing import Attention
from bertology.models.loading import default_model_path, wrap_model

OUT = Path(__file__).parent / "out"
CHROMIUM = "/usr/bin/chromium"


def bert_base_random() -> bertology.LoadedModel:
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    model = BertModel(BertConfig(attn_implementation="eager"))  # 12 layers, 12 heads, 768 wide
    return wrap_model(model, AutoTokenizer.from_pretrained(default_model_path()), "BERT-base shape, random")


def attention_of_length(loaded: bertology.LoadedModel, n: int) -> Attention:
    words = " ".join(f"word{i % 97}" for i in range(4 * n))
    ids = loaded.tokenizer(words, add_special_tokens=False)["input_ids"][: n - 2]
    text = loaded.tokenizer.decode(ids)
    attention = bertology.capture(text, model=loaded)
    assert len(attention.tokens) == n, len(attention.tokens)
    return attention


def baseline_html(attention: Attention) -> str:
    """BertViz-style page: full-precision JSON of every weight, embedded twice."""
    payload = json.dumps(
        {"attn": attention.probs.tolist(), "left_text": attention.tokens, "right_text": attention.tokens}
    )
    script = f"<script>window.params = {payload};</script>"
    return f"<html><body>{script}<div data-params='{payload}'></div></body></html>"


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


@contextmanager
def ready_page(page_path: Path, timeout_s: float, width: int) -> Iterator[Any]:
    """The view page at ``page_path`` in headless Chromium (``width`` x 900), once it reports
    ``window.bertology.ready``; navigation waits only for the first bytes, so its timing starts there."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
        )
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(page_path.resolve().as_uri(), wait_until="commit", timeout=timeout_s * 1000)
        page.wait_for_function(
            "() => window.bertology && window.bertology.ready === true", timeout=timeout_s * 1000
        )
        try:
            yield page
        finally:
            browser.close()


def paint_seconds(page_path: Path, timeout_s: float = 60.0) -> float:
    """Seconds from navigation start to ``window.bertology.ready`` in headless Chromium."""
    with ready_page(page_path, timeout_s, 1400) as page:
        return page.evaluate("() => performance.now()") / 1000.0


def head_view_draw_ms(page_path: Path, timeout_s: float = 60.0) -> tuple[float, float]:
    """A head view's (redraw of another layer, a hovered token's lines) in milliseconds, each with its
    rasterisation (reading a pixel back waits for it), in headless Chromium."""
    with ready_page(page_path, timeout_s, 1280) as page:
        redraw = page.evaluate(
            """() => {
              const start = performance.now();
              window.bertology.setLayer(1);
              document.getElementById("bt-canvas").getContext("2d").getImageData(0, 0, 1, 1);
              return performance.now() - start;
            }"""
        )
        page.hover('.bt-token[data-side="left"][data-index="3"]')
        hovered = page.evaluate("window.bertology.lastDrawMs")
    return redraw, hovered


def head_view_table(loaded: bertology.LoadedModel, n: int) -> None:
    """The head view at ``n`` tokens with faint lines (every weight of at least 1/255 a line, far more than
    the page's line budget): redraw and hover times; targets (issue 2): 700 ms and 300 ms."""
    page = bertology.head_view(attention_of_length(loaded, n), faint_lines=True).html
    path = OUT / f"head_view_{n}.html"
    path.write_text(page, encoding="utf-8")
    redraw, hovered = head_view_draw_ms(path)
    print(f"| {n} | head view, faint lines | {redraw:.0f} ms | {hovered:.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--no-baseline", action="store_true", help="skip the slow JSON baseline")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    loaded = bert_base_random()
    print(
        f"machine: {platform.machine()}, {torch.get_num_threads()} threads, "
        f"python {platform.python_version()}"
    )
    print(
        "| tokens | case | HTML size | build time | baseline size | baseline build "
        "| size ratio | build ratio | painted in |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        attention = attention_of_length(loaded, n)
        worst = Attention(
            **{
                **attention.__dict__,
                "probs": np.random.default_rng(0).integers(0, 256, attention.probs.shape) / 255.0,
            }
        )
        baseline = None
        if not args.no_baseline:
            text, seconds = timed(baseline_html, attention)
            baseline = (len(text.encode()), seconds)
            del text
        for case, source in (("random weights", attention), ("incompressible codes", worst)):
            page, build_s = timed(lambda a: bertology.model_view(a).html, source)
            path = OUT / f"model_view_{n}_{case.split()[0]}.html"
            path.write_text(page, encoding="utf-8")
            size = path.stat().st_size
            painted = paint_seconds(path)
            if baseline:
                ratios = (
                    f"{baseline[0] / 1e6:.0f} MB | {baseline[1]:.1f} s | {baseline[0] / size:.0f}x | "
                    f"{baseline[1] / build_s:.0f}x"
                )
            else:
                ratios = "- | - | - | -"
            print(
                f"| {n} | {case} | {size / 1e6:.2f} MB | {build_s:.2f} s | {ratios} | {painted:.2f} s |",
                flush=True,
            )
    print("\n| tokens | view | redraw of another layer | one token's lines (hover) |\n|---|---|---|---|")
    for n in args.lengths:
        head_view_table(loaded, n)


if __name__ == "__main__":
    main()

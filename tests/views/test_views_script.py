"""The view pages' script, joined from the modules in ``views/static/views/``: every page is byte for byte
the page built before the script was split into modules, and every module is joined, once, and small."""

from __future__ import annotations

import glob
import hashlib
import tomllib
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
import torch
from support.ci_rules import REPOSITORY

from bertology.attention.capturing import Attention
from bertology.attention.long_capture import LayerQueriesKeys, LongAttention
from bertology.views import View, render_view
from bertology.views.build import attention_set_entry, attention_sets_data
from bertology.views.page import SCRIPT_MODULES, view_script

STATIC = Path(str(files("bertology.views").joinpath("static")))

SPECIAL = ("[CLS]", "[SEP]")
SINGLE = ["[CLS]", "the", "cat", "sat", "on", "warm", "mats", "[SEP]"]
PAIR = (["[CLS]", "i", "went", "home", "[SEP]", "at", "the", "store", "[SEP]"], [0] * 5 + [1] * 4)


def _roles(tokens: list[str], segments: list[int]) -> dict:
    """The :class:`~bertology.corpus.encoding.InputDescription` fields of BERT-style ``tokens`` (its
    words: the tokens that are not special)."""
    special = np.array([token in SPECIAL for token in tokens])
    word_ids = np.where(special, -1, np.cumsum(~special) - 1)
    return {
        "tokens": tokens,
        "segment_ids": np.array(segments),
        "special": special,
        "word_ids": word_ids,
        "words": [token for token in tokens if token not in SPECIAL],
        "word_segments": np.array(
            [segment for segment, is_special in zip(segments, special, strict=True) if not is_special]
        ),
        "truncated": 0,
        "model_name": "constructed",
    }


def _attention(
    tokens: list[str], segments: list[int], layers: int = 2, heads: int = 3, head_dim: int = 4
) -> Attention:
    """Constructed attention: ``probs [layers, heads, n, n]`` rows of weights 1..13 by a fixed pattern, and
    queries and keys ``[layers, heads, n, head_dim]`` in quarters (exact in float16)."""
    n = len(tokens)
    layer, head, query, key = np.indices((layers, heads, n, n))
    weights = (1 + (3 * layer + 5 * head + 7 * query + 11 * key) % 13).astype(np.float32)
    vectors = ((np.arange(layers * heads * n * head_dim) * 7 % 9) - 4).reshape(layers, heads, n, head_dim) / 4
    return Attention(
        **_roles(tokens, segments),
        probs=weights / weights.sum(axis=-1, keepdims=True),
        queries=vectors.astype(np.float32),
        keys=vectors[..., ::-1].astype(np.float32),
        scaling=np.full(layers, 0.5),
    )


def _long_attention(n: int = 12, layers: int = 2, heads: int = 2, head_dim: int = 4) -> LongAttention:
    """A constructed long input: integer queries and keys ``[1, heads, n, head_dim]`` per layer (every
    key seen)."""
    tokens = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
    values = torch.arange(layers * heads * n * head_dim).reshape(layers, 1, heads, n, head_dim)
    queries, keys = (values * 5 % 7 - 3).float(), (values * 3 % 5 - 2).float()
    return LongAttention(
        **_roles(tokens, [0] * n),
        layers=[
            LayerQueriesKeys(query=q, key=k, scaling=0.25, rule=None, batch=torch.zeros(1, dtype=torch.long))
            for q, k in zip(queries, keys, strict=True)
        ],
    )


def _sets_view() -> View:
    """An encoder-decoder's head view: encoder, decoder and cross attention sets of constructed attention."""
    source, target = _attention(SINGLE, [0] * len(SINGLE)), _attention(PAIR[0], [0] * len(PAIR[0]), heads=2)
    cross = np.full((2, 2, len(PAIR[0]), len(SINGLE)), 1 / len(SINGLE), dtype=np.float32)
    entries = [
        attention_set_entry("encoder", source.probs[:, :2], SINGLE, causal=False),
        attention_set_entry("decoder", np.tril(target.probs), PAIR[0], causal=True),
        attention_set_entry("cross", cross, PAIR[0], SINGLE, causal=False),
    ]
    return View("head", attention_sets_data("head", "constructed", entries, first="cross"))


def _page(name: str) -> str:
    single = _attention(SINGLE, [0] * len(SINGLE))
    pages = {
        "head": lambda: render_view(single, kind="head", layer=1),
        "model": lambda: render_view(single, kind="model", theme="dark"),
        # the neuron and long model views in the theme they were recorded in (dark by default since issue 43)
        "neuron": lambda: render_view(single, kind="neuron", head=2, query=3, theme="light"),
        "pair": lambda: render_view(_attention(*PAIR), kind="head", faint_lines=True),
        "long-head": lambda: render_view(_long_attention(), kind="head", window=(2, 6)),
        "long-model": lambda: render_view(_long_attention(), kind="model", window=(3, 5), theme="light"),
        "sets": _sets_view,
    }
    return pages[name]().html


# SHA-256 of each page, recorded from the pages built at commit 9e91401, before views.js was split into the
# modules of views/static/views/ (the split must not change a byte). When the views deliberately change
# (views.css, template.html, a module, the page data), record the new hashes: run this test and take the
# hashes it reports, after checking the pages in a browser (tests/views, marked browser). The arrays
# travel deflated (zlib level 1, bertology.views.payload), so the hashes also assume zlib's deflate.
PAGE_HASHES = {
    "head": "427343d12bea0f3a4b90497333f8a862f4c4446ea4d5822b26a074eba4ec4ddc",
    "model": "b90a44a70efb2d4bf768693e19635f5de0f1a1031857d0585d124a3b04a25e33",
    "neuron": "1a20954a621a07a7cab899eaaef036d1fe9abd82f5fdbc81c83070ed853face2",
    "pair": "4d8114c9f790534d75f37e28d866f3ae0fffcc437dcb623c052d88dd7af95566",
    "long-head": "311bc876f984fda672f788e6291fbe660dca2496a2b603f274defb09ad6082bf",
    "long-model": "fe8492f211e0d4f06ba60ea93b1240b54d9c29b3432977df0eb769bb168793c2",
    "sets": "06c66e8e4660668bf9f7a6cef6079062478d21e9142f8cd74d6a3439e3f82fe2",
}
#: SHA-256 of views.js at commit 9e91401, the script before the split (it changes with the views, as above).
SCRIPT_HASH = "4d14b6c76342f3c884c1144630cb603d1ad871dee67856f5e4205d5b8528cc12"


@pytest.mark.parametrize("name", list(PAGE_HASHES))
def test_page_bytes_are_those_built_before_the_split(name: str) -> None:
    page = _page(name)
    assert hashlib.sha256(page.encode("utf-8")).hexdigest() == PAGE_HASHES[name]


def test_the_joined_script_is_views_js_before_the_split() -> None:
    assert hashlib.sha256(view_script().encode("utf-8")).hexdigest() == SCRIPT_HASH


def test_every_module_is_joined_once() -> None:
    modules = sorted(path.name for path in (STATIC / "views").glob("*.js"))
    assert sorted(SCRIPT_MODULES) == modules  # none forgotten, none that is not there, none twice
    assert len(modules) >= 10


def test_no_script_is_over_600_lines() -> None:
    scripts = list(STATIC.rglob("*.js"))
    assert {path.name for path in scripts} == set(SCRIPT_MODULES)
    for path in scripts:
        lines = path.read_text(encoding="utf-8").count("\n")
        assert lines <= 600, f"{path.name} has {lines} lines"


@pytest.mark.parametrize("name", SCRIPT_MODULES)
def test_each_module_starts_with_its_note(name: str) -> None:
    """Its job and the names it uses, in leading ``//`` lines, which the page leaves out."""
    module = (STATIC / "views" / name).read_text(encoding="utf-8")
    note = module.split("\n")[0]
    assert note.startswith(f"// {name}: ") and "\n// Uses" in module
    assert note not in view_script()


def test_every_module_is_in_the_package() -> None:
    """pyproject.toml's package data takes in every module (globbed as setuptools does: ``*`` stays
    in its folder)."""
    with (REPOSITORY / "pyproject.toml").open("rb") as file:
        patterns = tomllib.load(file)["tool"]["setuptools"]["package-data"]["bertology"]
    package = STATIC.parent.parent
    shipped = {Path(match) for pattern in patterns for match in glob.glob(pattern, root_dir=package)}
    assert {Path("views", "static", "views", name) for name in SCRIPT_MODULES} <= shipped

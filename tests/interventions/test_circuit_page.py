"""A circuit run's page (``circuit.html``) from constructed ``edges.csv``, ``faithfulness.csv`` and
``summary.json``: the tables read as MIB names them, the attention it embeds, and in headless Chromium the
circuit drawn at each size of the slider and a clicked head's attention, with hostile text kept as text."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.circuit_runs import HEADS, LAYERS, PERCENTS, write_run
from support.tiny_models import tiny_language_model

from bertology.attention.capturing import Attention, capture
from bertology.errors import BertologyError
from bertology.interventions.circuit_attention import PairAttention, circuit_attention
from bertology.interventions.circuit_edges import head_edges, key_value_groups, read_edges
from bertology.interventions.patching_pairs import PatchPair
from bertology.models.loading import LoadedModel
from bertology.report import circuit
from bertology.report.circuit import finish_circuit_run, graph_data, write_circuit_page
from bertology.views.bertviz import prettify

WAIT_MS = 30_000


def test_read_edges_sorts_by_size_and_splits_the_head_inputs(tmp_path: Path) -> None:
    path = tmp_path / "edges.csv"
    path.write_text(
        "upstream,downstream,score\ninput,a0.h1<k>,0.1\na0.h1,logits,-2.0\ninput,m0,0.5\nm0,a1.h0<v>,-0.5\n"
    )
    edges = read_edges(str(path))
    assert edges.to_dict("list") == {
        "upstream": ["a0.h1", "input", "m0", "input"],
        "downstream": ["logits", "m0", "a1.h0", "a0.h1"],
        "kind": ["", "", "v", "k"],
        "score": [-2.0, 0.5, -0.5, 0.1],  # by size, the file's order among equal sizes
    }


@pytest.mark.parametrize(
    ("row", "named"),
    [
        ("logits,a0.h0<q>,1.0", "upstream 'logits'"),
        ("input,a0.h0<x>,1.0", "downstream 'a0.h0<x>'"),
        ("input,m0<q>,1.0", "downstream 'm0<q>'"),
        ("<b>,m0,1.0", "upstream '<b>'"),
        ("input,m0,nan", "score 'nan'"),
    ],
)
def test_a_bad_edge_is_named_in_one_sentence(tmp_path: Path, row: str, named: str) -> None:
    path = tmp_path / "edges.csv"
    path.write_text(f"upstream,downstream,score\ninput,m0,1.0\n{row}\n")
    with pytest.raises(BertologyError) as caught:
        read_edges(str(path), "run/edges.csv")
    message = str(caught.value)
    assert message.startswith("run/edges.csv row 2 has ") and named in message and "\n" not in message


def test_head_edges_are_the_strongest_into_and_out_of_the_head(tmp_path: Path) -> None:
    ranked = write_run(tmp_path / "run")
    edges = read_edges(str(tmp_path / "run" / "edges.csv"))
    listed = head_edges(edges, 0, 1, count=3)  # layer 0: its edges out reach the next layer's q, k and v
    into = [(rank + 1, up, down) for rank, (up, down, _) in enumerate(ranked) if down.startswith("a0.h1<")]
    out = [(rank + 1, down) for rank, (up, down, _) in enumerate(ranked) if up == "a0.h1"]
    assert [(e["rank"], e["node"], f"a0.h1<{e['kind']}>") for e in listed["into"]] == into[:3]
    assert [(e["rank"], e["node"] + (f"<{e['kind']}>" if e["kind"] else "")) for e in listed["out"]] == out[
        :3
    ]
    assert [e["score"] for e in listed["out"]] == [ranked[rank - 1][2] for rank, _ in out[:3]]


def test_a_heads_edges_under_grouped_query_attention_take_its_key_value_heads_inputs(tmp_path: Path) -> None:
    """4 heads sharing 2 key/value heads: ``a1.h1<k>`` is key/value head 1, read by heads 2 and 3, so head
    3's in-edges are those into ``a1.h3<q>``, ``a1.h1<k>`` and ``a1.h1<v>``, head 1's into ``a1.h1<q>`` and
    key/value head 0's inputs."""
    ranked = write_run(tmp_path / "run", heads=4, key_value_heads=2)
    edges = read_edges(str(tmp_path / "run" / "edges.csv"))
    assert key_value_groups(edges) == 2
    write_run(tmp_path / "plain")  # every head its own keys and values
    assert key_value_groups(read_edges(str(tmp_path / "plain" / "edges.csv"))) == 1
    reads = {3: ("a1.h3<q>", "a1.h1<k>", "a1.h1<v>"), 1: ("a1.h1<q>", "a1.h0<k>", "a1.h0<v>")}
    for head, inputs in reads.items():
        listed = head_edges(edges, 1, head, count=len(ranked))
        expected = [(rank + 1, up) for rank, (up, down, _) in enumerate(ranked) if down in inputs]
        assert [(edge["rank"], edge["node"]) for edge in listed["into"]] == expected


def test_the_page_keeps_tiny_scores(tmp_path: Path) -> None:
    path = tmp_path / "edges.csv"
    path.write_text("upstream,downstream,score\ninput,m0,3.25e-9\nm0,logits,-1.5e-12\n")
    assert graph_data(read_edges(str(path)))["scores"] == [3.25e-9, -1.5e-12]  # EAP's can be this small


def test_circuit_attention_is_each_text_captured_alone(loaded_types: Callable[[str], LoadedModel]) -> None:
    model = loaded_types("llama")
    pair = circuit_attention(model, "the cat sat on the mat", "a dog")
    for attention, text in ((pair.clean, "the cat sat on the mat"), (pair.corrupted, "a dog")):
        alone = capture(text, model=model)
        assert attention.tokens == alone.tokens
        np.testing.assert_allclose(attention.probs, alone.probs, atol=1e-5)


def test_with_prepend_bos_the_page_shows_the_attention_on_the_runs_tokens(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    # `bertology circuit --prepend-bos` runs the texts with BOS first: the heads drawn must attend over
    # those tokens, BOS included, as the model's own attention on the run's ids (computed here) says.
    # GPT-2's tokenizer adds no BOS of its own (the tiny Llama's does, so the option would change nothing).
    model = tiny_language_model(tiny_model_dirs["gpt2"])
    tokenizer, bos = model.tokenizer, model.tokenizer.bos_token_id
    pair = PatchPair("the cat sat on the mat", "a dog sat", None, None, None, None, line=1)
    write_run(tmp_path / "run")
    page = finish_circuit_run(tmp_path / "run", model, pair, prepend_bos=True).read_text(encoding="utf-8")
    data = json.loads(page.split('id="circuit-data">')[1].split("</script>")[0])
    for run, text in (("clean", pair.clean), ("corrupted", pair.corrupted)):
        ids = [bos, *tokenizer(text)["input_ids"]]
        assert ids[1] != bos  # the tokenizer adds no BOS of its own: the option changes the tokens
        with torch.no_grad():
            found = model.model(torch.tensor([ids]), output_attentions=True).attentions
        expected = np.round(torch.cat(found).numpy() * 255)
        shown = data["attention"][run]
        assert shown["tokens"] == [prettify(token) for token in tokenizer.convert_ids_to_tokens(ids)]
        codes = np.frombuffer(base64.b64decode(shown["codes"]), dtype=np.uint8).reshape(shown["shape"])
        assert codes.shape == expected.shape and np.abs(codes - expected).max() <= 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("eap-ig,10,1.5,0.2", "row 1 has edges 1.5, which is not a whole number."),
        ("eap-ig,10,1,", "row 1 has faithfulness 'nan', which is not a finite number."),
    ],
)
def test_a_bad_size_is_named_in_one_sentence(tmp_path: Path, row: str, message: str) -> None:
    write_run(tmp_path / "run")
    (tmp_path / "run" / "faithfulness.csv").write_text(f"method,percent_edges,edges,faithfulness\n{row}\n")
    with pytest.raises(BertologyError) as caught:
        write_circuit_page(tmp_path / "run")
    assert str(caught.value) == f"{tmp_path / 'run' / 'faithfulness.csv'} {message}"


def test_a_run_without_the_methods_sizes_is_one_sentence(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (tmp_path / "run" / "summary.json").write_text(json.dumps({**summary, "method": "eap"}))
    with pytest.raises(BertologyError, match=r"faithfulness\.csv has no sizes of the method 'eap'\.$"):
        write_circuit_page(tmp_path / "run")


# --- In Chromium ---------------------------------------------------------------------------------------

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"


def open_page(chromium_browser: Any, path: Path) -> tuple[Any, Any, list[str]]:
    """The page at ``path`` opened from the file, with its errors (scripts', console's, CSP's) collected."""
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
    page.goto(path.as_uri())
    page.wait_for_selector("#circuit[data-state=ready]", timeout=WAIT_MS)
    return context, page, errors


# The red channel at the centre of every cell of a heatmap, row by row.
CELL_REDS_JS = """([which, n]) => {
  const canvas = document.querySelector(`#attention-box figure[data-input=${which}] canvas`);
  const cell = canvas.width / n;
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const reds = [];
  for (let q = 0; q < n; q += 1)
    for (let k = 0; k < n; k += 1)
      reds.push(pixels[(Math.floor((q + 0.5) * cell) * canvas.width + Math.floor((k + 0.5) * cell)) * 4]);
  return reds;
}"""


@pytest.mark.browser
def test_the_slider_draws_the_top_edges_and_a_head_shows_its_attention(
    chromium_browser: Any, loaded_types: Callable[[str], LoadedModel], tmp_path: Path
) -> None:
    # A tiny model of the test graph's shape (2 layers; its 4 heads hold the graph's 3), its attention on
    # a pair: the heatmap of the head clicked is checked cell by cell.
    model = loaded_types("llama")
    folder = tmp_path / "run"
    ranked = write_run(folder)
    pair = PatchPair("the cat sat on the mat", "a dog sat", None, None, None, None, line=1)
    page_path = finish_circuit_run(folder, model, pair)  # the command line's last step
    context, page, errors = open_page(chromium_browser, page_path)
    root = page.locator("#circuit")
    sizes = [int(percent / 100 * len(ranked)) for percent in PERCENTS]
    assert root.get_attribute("data-percent") == "10"  # the first size of at least 5 %
    page.focus("#size")
    page.keyboard.press("Home")  # every size, as a keyboard user moves the slider
    for percent, count in zip(PERCENTS, sizes, strict=True):
        page.wait_for_selector(f"#circuit[data-percent='{percent:g}']", timeout=WAIT_MS)
        assert root.get_attribute("data-drawn-edges") == str(count)
        touched = {name.split("<")[0] for up, down, _ in ranked[:count] for name in (up, down)}
        shown = page.eval_on_selector_all("#graph .node:not(.out)", "nodes => nodes.map(n => n.dataset.node)")
        assert set(shown) == touched
        faithfulness = page.inner_text("#faithfulness")
        step = PERCENTS.index(percent)
        assert (
            f"{0.5 + 0.2 * step:.3f} (eap-ig)" in faithfulness and f"{0.1 + 0.2 * step:.3f}" in faithfulness
        )
        page.keyboard.press("ArrowRight")

    page.keyboard.press("End")  # the circuit of half the edges: the head's edges in it only
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector("#circuit[data-percent='50']", timeout=WAIT_MS)
    page.click("#graph .node[data-node='a1.h2']")
    page.wait_for_selector("#circuit[data-selected='a1.h2'][data-attention=shown]", timeout=WAIT_MS)
    cells = "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    listed = [[*row[:2], float(row[2]), *row[3:]] for row in page.eval_on_selector_all("#edges-in tr", cells)]
    into = [
        [
            up,
            {"q": "query", "k": "key", "v": "value"}[down[-2]],
            pytest.approx(score, rel=1e-3),
            str(rank + 1),
        ]
        for rank, (up, down, score) in enumerate(ranked[: sizes[2]])
        if down.startswith("a1.h2<")
    ][:5]
    assert listed == into and into
    listed_out = page.eval_on_selector_all("#edges-out tr", cells)
    out = [
        [
            down,
            "",
            pytest.approx(score, rel=1e-3),
            str(rank + 1),
        ]  # a head of the last layer sends only to m1 and logits
        for rank, (up, down, score) in enumerate(ranked[: sizes[2]])
        if up == "a1.h2"
    ][:5]
    assert [row if len(row) == 1 else [*row[:2], float(row[2]), row[3]] for row in listed_out] == (
        out or [["none in the circuit at this size"]]
    )  # none at seed 0: that row
    for which, text in (("clean", pair.clean), ("corrupted", pair.corrupted)):
        captured = capture(text, model=model)
        n = len(captured.tokens)
        reds = np.array(page.evaluate(CELL_REDS_JS, [which, n]))
        codes = np.rint(captured.probs[1, 2] * 255) / 255
        np.testing.assert_allclose(reds, 255 - (255 - 26) * codes.ravel(), atol=2)
        tokens = page.eval_on_selector_all(
            f"#attention-box figure[data-input={which}] li", "items => items.map(i => i.textContent)"
        )
        assert tokens == [prettify(token) for token in captured.tokens]
    assert errors == []
    context.close()


@pytest.mark.browser
def test_a_shared_key_or_value_is_listed_with_the_heads_that_read_it(
    chromium_browser: Any, tmp_path: Path
) -> None:
    """4 heads sharing 2 key/value heads, every edge in the circuit: head a1.h3's in-edges are its query's
    and key/value head 1's keys and values, each of those named with the heads that read it."""
    ranked = write_run(tmp_path / "run", heads=4, key_value_heads=2)
    context, page, errors = open_page(chromium_browser, write_circuit_page(tmp_path / "run"))
    page.focus("#size")
    page.keyboard.press("End")
    page.wait_for_selector("#circuit[data-percent='100']", timeout=WAIT_MS)
    page.click("#graph .node[data-node='a1.h3']")
    page.wait_for_selector("#circuit[data-selected='a1.h3']", timeout=WAIT_MS)
    cells = "rows => rows.map(r => [...r.cells].slice(0, 2).map(c => c.textContent))"
    kinds = {
        "a1.h3<q>": "query",
        "a1.h1<k>": "key (a1.h1<k>, read by a1.h2, a1.h3)",
        "a1.h1<v>": "value (a1.h1<v>, read by a1.h2, a1.h3)",
    }
    expected = [[up, kinds[down]] for up, down, _ in ranked if down in kinds][:5]
    assert page.eval_on_selector_all("#edges-in tr", cells) == expected
    assert {kind for _, kind in expected} != {"query"} and errors == []
    context.close()


@pytest.mark.browser
def test_a_circuit_larger_than_the_page_draws_shows_its_strongest_edges(
    chromium_browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(circuit, "MOST_DRAWN_EDGES", 3)
    ranked = write_run(tmp_path / "run")
    context, page, errors = open_page(chromium_browser, write_circuit_page(tmp_path / "run"))
    count = int(PERCENTS[1] / 100 * len(ranked))  # the 10 % the page opens on: 7 edges
    assert page.get_attribute("#circuit", "data-drawn-edges") == "3"
    assert page.inner_text("#size-text").endswith(
        f"the {count} of {len(ranked)} of largest |score| (the strongest 3 drawn)"
    )
    # the nodes shown as in the circuit are those of all its edges, not only of the 3 drawn
    touched = {name.split("<")[0] for up, down, _ in ranked[:count] for name in (up, down)}
    assert touched != {name.split("<")[0] for up, down, _ in ranked[:3] for name in (up, down)}
    shown = page.eval_on_selector_all("#graph .node:not(.out)", "nodes => nodes.map(n => n.dataset.node)")
    assert set(shown) == touched
    assert errors == []
    context.close()


@pytest.mark.browser
def test_hostile_names_and_tokens_stay_text(chromium_browser: Any, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_run(folder, model=f"</script><script>document.title='pwned'</script>{HOSTILE}")
    layers_heads_n = (LAYERS, HEADS + 1, 2)
    probs = np.full((*layers_heads_n, 2), 0.5, dtype=np.float32)
    roles = {
        "tokens": [HOSTILE, "</script>"],
        "segment_ids": np.zeros(2, dtype=np.int64),
        "special": np.zeros(2, dtype=bool),
        "word_ids": np.arange(2),
        "words": [HOSTILE, "</script>"],
        "word_segments": np.zeros(2, dtype=np.int64),
    }
    hostile = Attention(
        **roles,
        truncated=0,
        model_name="tiny",
        probs=probs,
        queries=None,
        keys=None,
        scaling=np.ones(LAYERS),
    )
    page_path = write_circuit_page(folder, PairAttention(hostile, dataclasses.replace(hostile)))
    context, page, errors = open_page(chromium_browser, page_path)
    assert HOSTILE in page.inner_text("h1")
    page.click("#graph .node[data-node='a0.h0']")
    page.wait_for_selector("#circuit[data-attention=shown]", timeout=WAIT_MS)
    tokens = page.eval_on_selector_all("#attention-box li", "items => items.map(i => i.textContent)")
    assert tokens == [HOSTILE, "</script>"] * 2
    assert page.locator("img").count() == 0 and page.title() != "pwned"
    assert errors == []
    context.close()


# Pixels of the edges' canvas with any ink.
INKED_PIXELS_JS = """() => {
  const canvas = document.getElementById("edges");
  const alpha = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < alpha.length; i += 4) if (alpha[i] > 0) inked += 1;
  return inked;
}"""


@pytest.mark.browser
def test_what_the_page_shows_follows_the_slider_and_a_clicked_head(
    chromium_browser: Any, loaded_types: Callable[[str], LoadedModel], tmp_path: Path
) -> None:
    """As a reader sees it: the slider's text and the drawn edges grow with the size (none at 1 %, 0 of 75
    edges), and a click on a head shows a panel named after it with its attention on the clean and the
    corrupted input, the tokens listed as text."""
    from playwright.sync_api import expect

    folder = tmp_path / "run"
    ranked = write_run(folder)
    pair = PatchPair("the cat sat on the mat", "a dog sat", None, None, None, None, line=1)
    model = loaded_types("llama")
    context, page, errors = open_page(chromium_browser, finish_circuit_run(folder, model, pair))
    text = page.locator("#size-text")
    page.focus("#size")
    inked, tops = [], set()
    for key, percent in zip(("Home", "ArrowRight", "ArrowRight", "End"), PERCENTS, strict=True):
        page.keyboard.press(key)
        count = int(percent / 100 * len(ranked))
        expect(text).to_have_text(
            f"{percent:g}% of the edges: the {count} of {len(ranked)} of largest |score|"
        )
        inked.append(page.evaluate(INKED_PIXELS_JS))
        tops.add(text.bounding_box()["y"])  # type: ignore[index]
    assert inked[0] == 0 and inked[1] < inked[2] < inked[3], inked
    assert len(tops) == 1  # the text stays beside the slider: the page does not jump as it moves
    box = page.locator("#node-box")
    assert not box.is_visible()
    page.locator("#graph .node[data-node='a1.h2']").click()
    expect(box.locator("h2")).to_have_text("a1.h2")
    # every row as tall as its text in both lists, however many each has (at 100 %: 5 in, 2 out)
    rows = box.locator("tbody tr").all()
    heights = {round(row.bounding_box()["height"]) for row in rows}  # type: ignore[index]
    assert len(box.locator("#edges-out tr").all()) == 2 and len(heights) == 1, heights
    for which, words in (("clean", pair.clean), ("corrupted", pair.corrupted)):
        figure = box.locator(f"figure[data-input={which}]")
        assert figure.is_visible() and figure.locator("canvas").is_visible()
        assert figure.inner_text().startswith(f"{which.capitalize()} input, head a1.h2")
        tokens = [prettify(token) for token in capture(words, model=model).tokens]
        assert figure.locator("li").all_text_contents() == tokens
    assert errors == []
    context.close()

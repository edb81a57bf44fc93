"""``bertology patch``: the files a patching run writes, path patching, the web app's listing of the folder,
bad inputs answered in one sentence, the IOI prompts on SmolLM2-135M and README's SST-2 minimal pairs on a
small fine-tuned classifier (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.cli import invoke as invoke_command
from support.tiny_models import tiny_language_model

from bertology.interventions.patching_pairs import ioi_pairs, sst2_pairs
from bertology.interventions.path_patching import Receiver, path_patch
from bertology.server.runs import RunsFolder

PAIRS = [
    {
        "clean": "The quick brown fox jumps over the lazy",
        "corrupted": "The quick brown dog jumps over the lazy",
        "answer": " the",
        "wrong": " dog",
    },
    {
        "clean": "She said that the committee would publish its findings",
        "corrupted": "She said that the findings would publish its committee",
        "answer": " the",
        "wrong": " dog",
    },
]


def write_pairs(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def invoke(*arguments: str) -> tuple[int, str]:
    """``bertology patch ARGUMENTS``: :func:`support.cli.invoke`'s exit code and output or message."""
    return invoke_command("patch", *arguments)


def test_patch_writes_head_effects_both_methods_and_is_listed_as_a_patching_run(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    runs = tmp_path / "runs"
    output = runs / "patching"
    code, text = invoke(str(tiny_model_dirs["llama"]), str(pairs), "-o", str(output), "--method", "both")
    assert code == 0, text
    assert "Mean LD clean" in text and "on 2 pairs" in text
    effects = pd.read_csv(output / "head_effects.csv")
    assert list(effects.columns) == ["layer", "head", "effect", "attribution"]
    # one name for a head, layer-head 0-based, in the CSV's numbers, the command's output, the summary and
    # the report: here the head of the largest effect by size
    largest = effects.loc[effects["effect"].abs().idxmax()]
    name = f"{int(largest['layer'])}-{int(largest['head'])}"
    assert f"{name} {largest['effect']:+.3f}" in " ".join(text.split())
    assert len(effects) == 2 * 4 and effects["layer"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["methods"] == ["exact", "attribution"] and summary["pairs"] == 2
    assert summary["pair_details"][0]["clean"] == PAIRS[0]["clean"] and summary["agreement"]["top_k"] == 8
    per_pair = pd.read_csv(output / "pair_effects.csv")
    assert len(per_pair) == 2 * 8 * 2
    # the head effect is the pairs' mean LD normalised: recomputed here from the per-pair LDs
    exact = per_pair[per_pair["method"] == "exact"]
    mean_patched = exact.groupby(["layer", "head"])["ld_patched"].mean().to_numpy()
    clean = np.mean([pair["ld_clean"] for pair in summary["pair_details"]])
    corrupted = np.mean([pair["ld_corrupted"] for pair in summary["pair_details"]])
    # the same float64 means and ratio (written with all their digits) added in another order: 1e-9
    np.testing.assert_allclose(effects["effect"], (mean_patched - corrupted) / (clean - corrupted), atol=1e-9)
    assert (output / "plots" / "effects_exact.png").read_bytes()[:4] == b"\x89PNG"
    assert summary["top"]["exact"][0]["name"] == name
    report = (output / "report.html").read_text()
    assert PAIRS[1]["corrupted"] in report and "Agreement" in report
    assert f"<td>{name}</td>" in report
    assert [(run.path, run.kind) for run in RunsFolder(runs).runs()] == [("patching", "patching")]
    # effects.csv: the grid's axes and the same effects
    grid = pd.read_csv(output / "effects.csv")
    pd.testing.assert_frame_equal(grid, effects)


def test_patch_a_whole_site_per_layer_writes_effects_csv(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:1])
    output = tmp_path / "mlp"
    arguments = ["--site", "mlp_out", "--granularity", "layer", "--direction", "noising"]
    code, text = invoke(str(tiny_model_dirs["llama"]), str(pairs), "-o", str(output), *arguments)
    assert code == 0, text
    effects = pd.read_csv(output / "effects.csv")
    assert list(effects.columns) == ["layer", "effect"] and effects["layer"].tolist() == [0, 1]
    assert not (output / "head_effects.csv").exists() and not (output / "position_effects.csv").exists()
    summary = json.loads((output / "summary.json").read_text())
    assert (summary["site"], summary["granularity"]) == ("mlp_out", "layer")
    # noising: the effect is (LD_patched - LD_clean) / (LD_clean - LD_corrupted), from the per-pair LDs
    per_pair = pd.read_csv(output / "pair_effects.csv")
    clean, corrupted = summary["ld_clean"], summary["ld_corrupted"]
    expected = (per_pair["ld_patched"] - clean) / (clean - corrupted)
    # the same float64 numbers written with all their digits: 1e-9
    np.testing.assert_allclose(effects["effect"], expected, atol=1e-9)
    assert summary["top"]["exact"][0]["layer"] == int(effects["effect"].abs().idxmax())


def test_patch_the_logits_per_position_restores_the_answer_at_the_last_position_only(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The logits are read at the texts' last position: patched there they are the clean run's, effect 1;
    elsewhere never read, 0 (up to float32 batching: 1e-4 in effect on this pair's gap)."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:1])
    output = tmp_path / "logits"
    arguments = ["--site", "logits", "--granularity", "position"]
    code, text = invoke(str(tiny_model_dirs["llama"]), str(pairs), "-o", str(output), *arguments)
    assert code == 0, text
    effects = pd.read_csv(output / "effects.csv")
    assert list(effects.columns) == ["layer", "position", "effect"] and set(effects["layer"]) == {0}
    expected = np.zeros(len(effects))
    expected[-1] = 1.0
    np.testing.assert_allclose(effects["effect"], expected, atol=1e-4)
    assert "logits" in (output / "report.html").read_text()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--site", "mlp"], "There is no site 'mlp' to patch"),
        (["--site", "logits", "--granularity", "head"], "The site 'logits' has no head axis"),
        (["--site", "attn_out", "--granularity", "head"], "The site 'attn_out' has no head axis"),
        (["--site", "pattern"], "The 'pattern' site can be recorded but not patched"),
    ],
)
def test_a_site_the_granularity_does_not_fit_is_refused_before_the_model_loads(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:1])
    code, text = invoke("no-such-model-is-loaded", str(pairs), "-o", str(tmp_path / "out"), *arguments)
    assert code == 1 and text.startswith(message) and text.count(".") <= 3, text


def test_patch_residual_writes_the_per_position_table(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:1])
    output = tmp_path / "residual"
    code, text = invoke(
        str(tiny_model_dirs["llama"]),
        str(pairs),
        "-o",
        str(output),
        "--site",
        "resid_pre",
        "--granularity",
        "position",
    )
    assert code == 0, text
    positions = pd.read_csv(output / "position_effects.csv")
    assert not positions["clean_token"].str.contains("▁").any()  # shown as the views show it (issue 43)
    assert list(positions.columns) == ["layer", "position", "clean_token", "effect"]
    fox = positions.loc[(positions["layer"] == 0) & (positions["clean_token"] == " fox"), "position"].item()
    # the residual stream entering layer 0 at the one differing token is the whole difference
    per_pair = pd.read_csv(output / "pair_effects.csv")
    patched = per_pair.loc[(per_pair["layer"] == 0) & (per_pair["position"] == fox), "ld_patched"].item()
    ld_clean = json.loads((output / "summary.json").read_text())["ld_clean"]
    # clean into clean at the differing token restores the clean LD: the same float32 pass, 1e-5
    assert patched == pytest.approx(ld_clean, abs=1e-5)


def test_mean_ablation_ablates_the_clean_run_and_says_so(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """``--ablation mean``: noising by default (the clean run loses each head's information), and the
    summary, the report's caption and the command's output say which ablation ran."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    output = tmp_path / "mean"
    code, text = invoke(str(tiny_model_dirs["llama"]), str(pairs), "-o", str(output), "--ablation", "mean")
    assert code == 0, text
    assert "(z, exact, noising, mean ablation;" in text
    summary = json.loads((output / "summary.json").read_text())
    assert (summary["ablation"], summary["direction"]) == ("mean", "noising")
    assert summary["ablation_description"] == (
        "mean: the site's activation in the corrupted run averaged over every pair and every position of "
        "its texts, in place of the site's activation in the clean run"
    )
    html = " ".join((output / "report.html").read_text().split())
    assert "Blue: mean-ablating the site in the clean run removes the answer (-1: all of it)" in html
    assert "putting the corrupted activation" not in html
    # the effect is noising's, from the per-pair LDs (the numbers: test_patching.py's hooked reference)
    per_pair = pd.read_csv(output / "pair_effects.csv")
    clean, corrupted = summary["ld_clean"], summary["ld_corrupted"]
    mean_patched = per_pair.groupby(["layer", "head"])["ld_patched"].mean().to_numpy()
    effects = pd.read_csv(output / "head_effects.csv")
    np.testing.assert_allclose(effects["effect"], (mean_patched - clean) / (clean - corrupted), atol=1e-9)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--ablation", "zero", "--senders", "0-1", "--receivers", "1-0:q"],
            "path patching takes its senders' outputs from the other run; --ablation is for activation",
        ),
        (["--ablation", "resample"], "'resample' is not one of 'counterfactual', 'zero', 'mean'"),
    ],
)
def test_an_ablation_that_does_not_fit_is_refused_before_the_model_loads(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS[:1])
    code, text = invoke("no-such-model-is-loaded", str(pairs), "-o", str(tmp_path / "out"), *arguments)
    assert code != 0 and message in " ".join(text.replace("│", " ").split()), text


def test_path_patching_from_the_command_line(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    output = tmp_path / "path"
    code, text = invoke(
        str(tiny_model_dirs["llama"]),
        str(pairs),
        "-o",
        str(output),
        "--senders",
        "0-1",
        "--receivers",
        "1-0:q,1.2:v",  # the older L.H is read too
    )
    assert code == 0, text
    written = json.loads((output / "path_patching.json").read_text())
    assert written["senders"] == ["0-1"] and written["receivers"] == ["1-0:q", "1-2:v"]
    assert written["frozen"] == "corrupted" and "the corrupted run frozen" in " ".join(text.split())
    assert "frozen at the corrupted run" in (output / "report.html").read_text()
    assert len(written["ld_patched"]) == 2 and "Path patching effect" in text


def seeded_invoke(*arguments: str) -> tuple[int, str]:
    """:func:`invoke` with the random state :func:`tiny_language_model` loads under (the tiny llama's
    language-modelling head is not saved: loading draws it), restored afterwards. That function also
    scales the head by 30, which scales every ``LD`` and leaves the normalised effects as they are."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return invoke(*arguments)


def test_path_patching_each_sender_writes_a_grid_from_the_command_line(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """``--senders each`` with a receiver at the last position (``@-1``): one row per layer-0 head, each the
    effect ``path_patch`` gives that head alone as the sender; the frozen run stated; ``--sweep`` of a list
    gives those heads' rows."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    output = tmp_path / "each"
    model = str(tiny_model_dirs["llama"])
    arguments = [model, str(pairs), "--receivers", "1-0:q@-1,1-2:v", "--direction", "noising"]
    code, text = seeded_invoke(*arguments, "-o", str(output), "--senders", "each")
    assert code == 0, text
    effects = pd.read_csv(output / "path_effects.csv")
    assert list(effects.columns) == ["layer", "head", "effect"]
    assert list(zip(effects["layer"], effects["head"], strict=True)) == [(0, head) for head in range(4)]
    loaded = tiny_language_model(tiny_model_dirs["llama"])
    receivers = [Receiver(1, 0, "q", -1), Receiver(1, 2, "v")]
    for head in (0, 3):  # the first and the last of the 4 senders run side by side
        alone = path_patch(loaded, str(pairs), [(0, head)], receivers, direction="noising")
        # the same float32 passes, batched differently (4 senders side by side or 1): 1e-5
        assert effects["effect"][head] == pytest.approx(alone.effect, abs=1e-5)
    written = json.loads((output / "path_patching.json").read_text())
    assert written["receivers"] == ["1-0:q@-1", "1-2:v"] and written["frozen"] == "clean"
    assert written["top"][0]["effect"] == max(effects["effect"], key=abs)
    assert "frozen at the clean run" in (output / "report.html").read_text()
    assert (output / "plots" / "path_effects.png").stat().st_size > 0
    assert "the clean run frozen and patched" in " ".join(text.split())
    listed = tmp_path / "listed"
    code, text = seeded_invoke(*arguments, "-o", str(listed), "--senders", "0-3,0-1", "--sweep")
    assert code == 0, text
    swept = pd.read_csv(listed / "path_effects.csv")
    assert list(swept["head"]) == [3, 1]
    np.testing.assert_allclose(swept["effect"], effects["effect"][[3, 1]], atol=1e-5)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "has no pairs"),
        (
            ['{"clean": "a b", "corrupted": "a c", "answer": " a", "wrong": " b"}', "{oops"],
            "line 2 is not valid JSON",
        ),
    ],
)
def test_bad_pair_files_answer_in_one_sentence_before_the_model_loads(
    lines: list[str], message: str, tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(lines), encoding="utf-8")
    code, text = invoke("no-such-model-is-loaded", str(pairs), "-o", str(tmp_path / "out"))
    assert code != 0 and message in text


def test_answers_for_a_classifier_and_a_bad_receiver_are_refused(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    code, text = invoke(str(tiny_model_dirs["bert"]), str(pairs), "-o", str(tmp_path / "out"))
    assert code != 0 and "is an encoder model, patched as a classifier" in text, text
    code, text = invoke(
        str(tiny_model_dirs["llama"]),
        str(pairs),
        "-o",
        str(tmp_path / "o"),
        "--senders",
        "0-1",
        "--receivers",
        "1-0",
    )
    assert code != 0 and "is not a receiver written L-H:q" in text
    code, text = invoke(
        "no-such-model-is-loaded",
        str(pairs),
        "-o",
        str(tmp_path / "p"),
        "--senders",
        "1-0",
        "--receivers",
        "0-1:q",
    )
    assert code != 0 and "Receiver 0-1:q is in layer 0, not after every sender" in text


@pytest.mark.slow
def test_ioi_on_smollm2_restores_the_indirect_object(tmp_path: Path) -> None:
    """The 18 IOI pairs: SmolLM2-135M prefers the indirect object (mean LD above 3), the ABC corruption
    leaves it near indifferent, and attribution patching writes every head's effect."""
    output = tmp_path / "ioi"
    code, text = invoke("smollm2-135m", str(ioi_pairs()), "-o", str(output), "--method", "attribution")
    assert code == 0, text
    summary = json.loads((output / "summary.json").read_text())
    assert summary["pairs"] == 18 and summary["ld_clean"] > 3 and abs(summary["ld_corrupted"]) < 1.5
    effects = pd.read_csv(output / "head_effects.csv")
    assert len(effects) == 30 * 9 and effects["effect"].abs().max() > 0.2


@pytest.mark.slow
def test_the_sst2_pairs_on_a_small_sst2_classifier_give_the_readme_pictures(
    shared_data: Path, tmp_path: Path
) -> None:
    """README's SST-2 examples as it runs them: the default model fine-tuned for 60 steps on 1,920 SST-2
    sentences (in a child process: `finetune --threads 1` sets its process's threads), then the 12 shipped
    minimal pairs patched by both methods. The swapped word flips the sentiment on average (clean LD above
    1, swapped below 0), a few heads restore much of it (the best above 0.2, none against it by more than
    0.05), and attribution patching agrees with exact patching (Pearson above 0.9). Then `bertology
    circuit` on the same pairs (EAP-IG): CPR near README's 0.983 and CMD near its 0.016 (a random ranking
    near 0.255 and 0.744), 1 % of the edges restoring about 70 %, 5 % above 90 %, and the six heads README
    names as carrying the most of the top 5 % of the edges among the eight that carry most."""
    run = tmp_path / "sst2-small"
    sst2 = shared_data / "glue" / "SST-2"
    command = [sys.executable, "-m", "bertology", "finetune", str(sst2), "-o", str(run)]
    command += ["--max-train", "1920", "--max-dev", "400", "--lr", "1e-4", "--eval-every", "0"]
    command += ["--watch-every", "0", "--rules", "none", "--threads", "1"]
    trained = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=os.environ)
    assert trained.returncode == 0, trained.stderr
    output = tmp_path / "sst2-patch"
    code, text = invoke(str(run), str(sst2_pairs()), "-o", str(output), "--method", "both")
    assert code == 0, text
    summary = json.loads((output / "summary.json").read_text())
    assert summary["pairs"] == 12 and summary["ld_clean"] > 1 and summary["ld_corrupted"] < 0
    effects = pd.read_csv(output / "head_effects.csv")
    assert len(effects) == 6 * 12
    assert effects["effect"].max() > 0.2 and effects["effect"].min() > -0.05
    assert np.corrcoef(effects["effect"], effects["attribution"])[0, 1] > 0.9

    circuit = tmp_path / "sst2-circuit"
    code, text = invoke_command("circuit", str(run), str(sst2_pairs()), "-o", str(circuit))
    assert code == 0, text
    summary = json.loads((circuit / "summary.json").read_text())
    assert summary["cpr"]["eap-ig"] > 0.95 and summary["cmd"]["eap-ig"] < 0.05
    assert 0.2 < summary["cpr"]["random"] < 0.35 and summary["cmd"]["random"] > 0.65
    curve = pd.read_csv(circuit / "faithfulness.csv").set_index(["method", "percent_edges"])["faithfulness"]
    assert 0.5 < curve["eap-ig", 1.0] < 0.9 and curve["eap-ig", 5.0] > 0.9
    edges = pd.read_csv(circuit / "edges.csv")
    top = edges.head(int(0.05 * len(edges)))
    size = top["score"].abs().to_numpy()
    ends = [top["upstream"], top["downstream"].str.split("<").str[0]]  # a head's in- and out-edges
    carried = pd.concat([pd.Series(size, index=end.to_numpy()) for end in ends]).groupby(level=0).sum()
    heads = carried[carried.index.str.startswith("a")].nlargest(8).index
    assert {"a2.h1", "a3.h9", "a5.h9", "a5.h10", "a5.h1", "a5.h6"} <= set(heads)


#: The tiny BART's pairs: sources of 9 tokens that differ at the fourth, one target prefix read by both
#: runs' decoder, one-token answers after it.
SEQ2SEQ_PAIRS = [
    {"clean": "the cat sat", "corrupted": "the cot sat", "target": "it is", "answer": " the", "wrong": " in"},
    {"clean": "the cat ran", "corrupted": "the cot ran", "target": "it is", "answer": " he", "wrong": " in"},
]


def test_patch_on_an_encoder_decoder_writes_its_stacked_sites_effects(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The tiny BART patched at cross-attention's head outputs by head and target position, by both
    methods: effects.csv starts with the stack, its positions are the target prefix's (the decoder start
    token and "it is", 4), the effects and estimates are the per-pair LDs' normalised means, and the
    summary's agreement is theirs (Pearson over the 32 patches, the top 10 by size of each)."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", SEQ2SEQ_PAIRS)
    output = tmp_path / "bart"
    arguments = ["--site", "cross:z", "--granularity", "head-position", "--method", "both"]
    code, text = invoke(str(tiny_model_dirs["bart"]), str(pairs), "-o", str(output), *arguments)
    assert code == 0, text
    effects = pd.read_csv(output / "effects.csv")
    assert list(effects.columns) == ["stack", "layer", "head", "position", "effect", "attribution"]
    assert set(effects["stack"]) == {"cross"} and len(effects) == 2 * 4 * 4
    summary = json.loads((output / "summary.json").read_text())
    assert (summary["site"], summary["granularity"]) == ("cross:z", "head-position")
    assert summary["methods"] == ["exact", "attribution"]
    assert summary["pair_details"][1]["target"] == "it is"
    per_pair = pd.read_csv(output / "pair_effects.csv")
    clean, corrupted = summary["ld_clean"], summary["ld_corrupted"]
    for method, column in (("exact", "effect"), ("attribution", "attribution")):
        chosen = per_pair[per_pair["method"] == method]
        mean_patched = chosen.groupby(["layer", "head", "position"])["ld_patched"].mean().to_numpy()
        # the same float64 numbers written with all their digits: 1e-9
        expected = (mean_patched - corrupted) / (clean - corrupted)
        np.testing.assert_allclose(effects[column], expected, atol=1e-9)
    agreement = summary["agreement"]
    exact, estimate = effects["effect"].to_numpy(), effects["attribution"].to_numpy()
    assert agreement["pearson"] == pytest.approx(np.corrcoef(exact, estimate)[0, 1], abs=1e-9)
    shown, found = (set(np.argsort(-np.abs(values), kind="stable")[:10]) for values in (exact, estimate))
    assert agreement["top_k"] == 10 and agreement["top_k_agreement"] == len(shown & found) / 10
    assert "<th>target</th>" in (output / "report.html").read_text()
    assert (output / "plots" / "effects_exact.png").exists()


@pytest.mark.parametrize(
    ("command", "model", "records", "message"),
    [
        (
            "circuit",
            "bart",
            SEQ2SEQ_PAIRS,
            "is an encoder-decoder; circuits are found in encoder and decoder",
        ),
        (
            "patch",
            "llama",
            SEQ2SEQ_PAIRS,
            "Line 1 gives a 'target', the target prefix of an encoder-decoder's",
        ),
        (
            "patch",
            "bart",
            [{"clean": "a", "corrupted": "b"}],
            "is an encoder-decoder: give 'answer' and 'wrong'",
        ),
        ("patch", "bart", [{"clean": "a", "corrupted": "b", "target": "c"}], "gives a 'target' (an encoder-"),
    ],
)
def test_pairs_an_encoder_decoder_cannot_take_are_refused_in_one_sentence_before_it_loads(
    command: str,
    model: str,
    records: list[dict[str, str]],
    message: str,
    tiny_model_dirs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Circuits of an encoder-decoder, a target prefix for a decoder, an encoder-decoder's pairs without
    answers, a target without answers."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", records)
    output = tmp_path / "out"
    code, text = invoke_command(command, str(tiny_model_dirs[model]), str(pairs), "-o", str(output))
    assert code == 1 and message in text, text
    assert text.count(". ") == 0 and not output.exists()

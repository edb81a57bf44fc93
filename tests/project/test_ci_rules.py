"""The test suite's own rules: real data through one fixture, and no skips under $CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.ci_rules import REPOSITORY

SUITE = """
import pytest

def test_needs_data(shared_data):
    assert shared_data.is_dir()

def test_skips():
    pytest.skip("no reason to run")
"""


#: A module that skips itself while it is collected, beside a test that passes.
SKIPPED_MODULE = """
import pytest

pytest.importorskip("no_such_module")

def test_never_collected():
    pass
"""


def _run(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ci: bool | str,
    data: Path,
    suite: str = SUITE,
) -> pytest.RunResult:
    """Run ``suite`` under the plugin with $CI set to ``ci`` (True: "true", False: unset)."""
    if ci is False:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", "true" if ci is True else ci)
    monkeypatch.setenv("BERTOLOGY_DATA", str(data))
    pytester.makepyfile(test_suite=suite, test_passing="def test_passes():\n    pass\n")
    return pytester.runpytest("-p", "support.ci_rules", "-q")


def test_under_ci_a_skip_and_missing_data_fail(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, ci=True, data=pytester.path / "absent")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*skipped in CI, which must run every test*no reason to run*"])
    result.stdout.fnmatch_lines(["*shared data folder*absent*CI must run every real-data test*"])


def test_outside_ci_they_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    absent = pytester.path / "absent"
    _run(pytester, monkeypatch, ci=False, data=absent).assert_outcomes(passed=1, skipped=2)


@pytest.mark.parametrize("value", ["false", "False", "0", "no", "off", ""])
def test_ci_values_that_mean_false_are_not_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    absent = pytester.path / "absent"
    _run(pytester, monkeypatch, ci=value, data=absent).assert_outcomes(passed=1, skipped=2)


@pytest.mark.parametrize("value", ["true", "1", "yes", "github-actions"])
def test_a_module_skipped_at_collection_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    result = _run(pytester, monkeypatch, ci=value, data=pytester.path, suite=SKIPPED_MODULE)
    result.assert_outcomes(errors=1)  # a collection error stops the run before any test
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped in CI, which must run every test*no_such_module*"])


def test_a_module_skipped_at_collection_skips_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, ci=False, data=pytester.path, suite=SKIPPED_MODULE)
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == 0


def test_bertology_data_names_the_folder(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pytester.mkdir("data")
    _run(pytester, monkeypatch, ci=True, data=data).assert_outcomes(passed=2, failed=1)


#: A string literal naming the data folder by one machine's absolute path to a ``shared/data``.
SHARED_DATA_PATH = re.compile(r"[\"'][/\\][^\"']*shared[/\\]data")


def test_only_the_fixture_knows_where_the_data_is() -> None:
    """Tests find the data through the ``shared_data`` fixture (tests/support/ci_rules.py) only."""
    tests = REPOSITORY / "tests"
    for path in sorted(set(tests.rglob("*.py")) - {tests / "support" / "ci_rules.py", Path(__file__)}):
        text = path.read_text(encoding="utf-8")
        assert SHARED_DATA_PATH.search(text) is None and '"shared" / "data"' not in text, path


#: An import of another test module (``from test_x import ...``, ``import test_x``).
TEST_MODULE_IMPORT = re.compile(r"^\s*(from|import)\s+test_\w+", re.M)


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in tests/support, shared fixtures in tests/conftest.py; test modules import
    neither each other nor anything from one another."""
    for path in sorted((REPOSITORY / "tests").rglob("test_*.py")):
        assert TEST_MODULE_IMPORT.search(path.read_text(encoding="utf-8")) is None, path

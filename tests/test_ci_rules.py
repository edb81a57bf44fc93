"""The test suite's own rules: real data through one fixture, and no skips under $CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SUITE = """
import pytest

def test_needs_data(shared_data):
    assert shared_data.is_dir()

def test_skips():
    pytest.skip("no reason to run")
"""


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool, data: Path
) -> pytest.RunResult:
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("BERTOLOGY_DATA", str(data))
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest("-p", "ci_rules", "-q")


def test_under_ci_a_skip_and_missing_data_fail(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, ci=True, data=pytester.path / "absent")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["*skipped in CI, which must run every test*no reason to run*"])
    result.stdout.fnmatch_lines(["*shared data folder*absent*CI must run every real-data test*"])


def test_outside_ci_they_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(pytester, monkeypatch, ci=False, data=pytester.path / "absent").assert_outcomes(skipped=2)


def test_bertology_data_names_the_folder(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pytester.mkdir("data")
    _run(pytester, monkeypatch, ci=True, data=data).assert_outcomes(passed=1, failed=1)


#: A string literal naming the data folder by one machine's absolute path to a ``shared/data``.
SHARED_DATA_PATH = re.compile(r"[\"'][/\\][^\"']*shared[/\\]data")


def test_only_the_fixture_knows_where_the_data_is() -> None:
    """Tests find the data through the ``shared_data`` fixture (tests/ci_rules.py) only."""
    here = Path(__file__).parent
    for path in sorted(set(here.glob("*.py")) - {here / "ci_rules.py", Path(__file__)}):
        text = path.read_text(encoding="utf-8")
        assert SHARED_DATA_PATH.search(text) is None and '"shared" / "data"' not in text, path

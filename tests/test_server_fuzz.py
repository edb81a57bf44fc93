"""A bounded fuzz of the JSON API from its own OpenAPI schema (schemathesis): valid and invalid requests
alike never get a 5xx, and every answer matches the schema's status codes, content types and bodies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, given, settings
from schemathesis import BaseSchema, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_explorer import write_analysis

from bertology.models import LoadedModel
from bertology.server import Limits, create_app
from bertology.token_index import build_index

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 40}


@pytest.fixture(scope="module")
def api_schema(
    default_model: LoadedModel, sample_corpus_head: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseSchema]:
    runs = tmp_path_factory.mktemp("fuzz_runs")
    write_analysis(sample_corpus_head(6), default_model, runs)  # the runs folder itself: run "" explores it
    (runs / "probe").mkdir()
    (runs / "probe" / "report.html").write_text("<!DOCTYPE html><title>probe</title>")
    # Short inputs keep each model call cheap; the limits themselves are part of what is fuzzed.
    index = build_index(sample_corpus_head(4), runs / "index", model=default_model, layers=[5], threads=1)
    app = create_app(
        [default_model], runs=runs, limits=Limits(max_tokens=32, max_body_bytes=4096), index=index.folder
    )
    # One intra-op thread, as `bertology serve` gives each computation on a small machine: the fuzz's
    # tiny forward passes are slower with threads competing for two busy cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_api_never_fails_on_any_request(api_schema: BaseSchema, mode: GenerationMode) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 14
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not operation.body:
            continue  # no body to make invalid (a path is any string: the positive cases cover it)

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=EXAMPLES[mode], deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def call(case: schemathesis.Case) -> None:
            case.call_and_validate(checks=CHECKS)

        call()

"""/v1/openapi.json matches the endpoints; schemathesis finds no server error in any operation."""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from django.urls import URLPattern, URLResolver, get_resolver
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from accounts.services import api_key_create
from api.openapi import build_document

pytestmark = pytest.mark.real_engine  # runs against the shared uvicorn server


def v1_routes() -> set[str]:
    """Every URL pattern under /v1/, written the OpenAPI way ({name} for converters)."""
    import re

    routes = set()

    def walk(patterns, prefix):
        for p in patterns:
            text = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, text)
            elif isinstance(p, URLPattern) and text.startswith("v1/"):
                routes.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text))

    walk(get_resolver().url_patterns, "")
    return routes


def test_every_v1_route_is_documented():
    documented = set(build_document()["paths"])
    assert v1_routes() == documented


def test_every_documented_operation_names_its_methods_as_the_view_allows():
    from django.urls import resolve

    for path, item in build_document()["paths"].items():
        sample = (
            path.replace("{conversation_id}", "00000000-0000-0000-0000-000000000001")
            .replace("{turn_id}", "00000000-0000-0000-0000-000000000002")
            .replace("{user_id}", "1")
            .replace("{project_id}", "00000000-0000-0000-0000-000000000003")
            .replace("{file_id}", "00000000-0000-0000-0000-000000000004")
        )
        view = resolve(sample).func
        methods = {m.upper() for m in item if m != "parameters"}
        allowed = set(getattr(view, "api_methods", ("GET",)))
        assert methods == allowed, path


def test_the_document_is_served(live):
    import httpx

    response = httpx.get(f"{live.url}/v1/openapi.json")
    assert response.status_code == 200
    assert response.json()["paths"].keys() == build_document()["paths"].keys()


OPERATIONS = [
    (path, method)
    for path, item in build_document()["paths"].items()
    for method in item
    if method != "parameters"
]


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m.upper()} {p}" for p, m in OPERATIONS])
def test_no_operation_ever_answers_5xx(live, engine_double, make_user, path, method):
    """schemathesis, 50 generated requests (valid and invalid) per operation, none excluded:
    never a 5xx, only documented status codes and content types. The engine double answers
    valid turns quickly: this is about input handling, not the model."""
    engine_double.default_script = ["ok"]
    key = api_key_create(user=make_user("schemathesis"), name="schemathesis").raw
    operation = schemathesis.openapi.from_dict(build_document())[path][method]

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(
        max_examples=50,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        database=None,
    )
    def run(case):
        case.call_and_validate(
            base_url=live.url,
            headers={"Authorization": f"Bearer {key}"},
            checks=[not_a_server_error, status_code_conformance, content_type_conformance],
            timeout=30,
        )

    run()

"""The API's OpenAPI schema is whole: every ``$ref`` names a component it holds, and the ingest body is described."""

from __future__ import annotations

from typing import Any


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for k, v in node.items() if k != "$ref"))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_every_ref_resolves_and_the_ingest_body_is_a_batch_of_documents(app_client) -> None:  # type: ignore[no-untyped-def]
    schema = app_client().get("/api/v1/openapi.json").json()
    components = schema["components"]["schemas"]
    missing = sorted(r for r in _refs(schema) if r.split("/")[-1] not in components)
    assert missing == [], missing
    body = schema["paths"]["/api/v1/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    ingest = components[body["$ref"].split("/")[-1]]
    assert ingest["required"] == ["documents"]
    item = ingest["properties"]["documents"]["items"]["$ref"].split("/")[-1]
    assert {"run_id", "jobs", "environment", "created_at"} <= set(components[item]["properties"])

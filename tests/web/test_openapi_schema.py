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


def test_open_reads_declare_a_token_optional_and_writes_required(app_client) -> None:  # type: ignore[no-untyped-def]
    """Reads are open by default: their security lists ``{}`` (no token) beside the bearer token; writes need one.
    With read tokens required, reads need one too."""
    bearer = {"HTTPBearer": []}
    paths = app_client().get("/api/v1/openapi.json").json()["paths"]
    reads = [(p, m) for p, ops in paths.items() for m in ops if m == "get" and not p.endswith("/docs")]
    writes = [(p, m) for p, ops in paths.items() for m in ops if m in ("post", "delete")]
    assert len(reads) >= 10 and len(writes) >= 5
    assert all(paths[p][m]["security"] == [{}, bearer] for p, m in reads), reads
    assert all(paths[p][m]["security"] == [bearer] for p, m in writes), writes
    closed = app_client(read_token_required=True).get("/api/v1/openapi.json", headers={})
    if closed.status_code == 200:  # the schema itself may be a read that needs a token
        assert all(closed.json()["paths"][p][m]["security"] == [bearer] for p, m in reads)

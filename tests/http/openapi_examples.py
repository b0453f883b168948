"""Requests built from /openapi.json alone: what a client generated from the document sends.
The dialects read their fields by hand (from the query, a JSON or a form body alike), so their
fields are documented by hand; the tests that use this check the document against the
behaviour."""

from __future__ import annotations

from typing import Any


def documented(spec: dict, operation_id: str) -> tuple[str, str, dict]:
    """(method, path template, operation) of the operation with this operationId."""
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if operation.get("operationId") == operation_id:
                return method.upper(), path, operation
    raise AssertionError(f"{operation_id} is not in /openapi.json")


def example_of(schema: dict, file: Any = None) -> Any:
    """A value built from the documented examples: an object of its required fields; `file`
    where a file is asked for (a binary string)."""
    if "example" in schema:
        return schema["example"]
    if schema.get("format") == "binary" and file is not None:
        return file
    if schema["type"] == "array":
        return [example_of(schema["items"], file)]
    if schema["type"] == "object":
        return {name: example_of(schema["properties"][name], file) for name in schema["required"]}
    raise AssertionError(f"no example documented in {schema}")


def body_schema(operation: dict, content_type: str) -> dict:
    return operation["requestBody"]["content"][content_type]["schema"]


def query_parameters(operation: dict) -> list[dict]:
    return [p for p in operation.get("parameters", []) if p["in"] == "query"]


def operation_at(spec: dict, method: str, path: str) -> dict:
    return spec["paths"][path][method.lower()]

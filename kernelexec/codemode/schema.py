"""A tool call's arguments checked against the tool's input schema, before they leave the server.

The broker checks every call a cell makes (the kernel is untrusted); jsonschema's validators are cached per
schema here, a malformed schema left to its server. Its own module: pure logic, tested without a server.
"""

from __future__ import annotations

import json
from typing import Any

_validators: dict[str, Any] = {}  # a tool's schema (as JSON) -> its checked validator, or None (malformed)


def schema_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` fail the tool's input schema (jsonschema), or None."""
    if not isinstance(arguments, dict):
        return "arguments must be an object"
    import jsonschema

    key = json.dumps(schema, sort_keys=True)
    if key not in _validators:
        if len(_validators) > 4096:
            _validators.clear()
        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            _validators[key] = cls(schema)
        except jsonschema.SchemaError:
            _validators[key] = None  # a server's malformed schema is its own business: the server checks
    validator = _validators[key]
    if validator is None:
        return None
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(map(str, error.absolute_path))
    return f"{where + ': ' if where else ''}{error.message[:300]}"

"""``LeanModel``: a pydantic model whose JSON schema is lean, for the tools' structured results.

The SDK's client validates every answer against its tool's output schema, and every tools/list carries the
schemas, so they say only what a client validates or a reader needs: pydantic's ``title`` (the field's own
name re-cased) and ``default`` (never applies: every answer sends every field) are left out, and ``null``
comes first in a nullable ``anyOf`` (most fields are null in most answers: the first branch matches, instead
of a failed branch and its error first). Every field, type, description, enum and ``required`` is kept.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

_NOISE = ("title", "default")
_NULL = {"type": "null"}


def lean_node(node: Any) -> Any:
    """``node`` (a JSON schema or a part of one), lean."""
    if isinstance(node, list):
        return [lean_node(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _NOISE:
            continue
        if key in ("properties", "$defs"):  # names to schemas: the names are not keywords
            out[key] = {name: lean_node(sub) for name, sub in value.items()}
        else:
            out[key] = lean_node(value)
    branches = out.get("anyOf")
    if isinstance(branches, list) and _NULL in branches:
        out["anyOf"] = [_NULL, *(b for b in branches if b != _NULL)]
    return out


def _lean(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """The models' schema hook: each model's own schema made lean in place (nested models have their own)."""
    lean = lean_node(schema)
    schema.clear()
    schema.update(lean)


class LeanModel(BaseModel):
    """A model whose JSON schema is lean (see the module docstring)."""

    model_config = ConfigDict(json_schema_extra=_lean)

"""What ``kernelexec lab`` lets through from a session's kernel to the browser, and how it shows notebooks.

A kernel holds its session key, so it can send any message on any channel; JupyterLab trusts the
outputs of cells the user runs there, so a ``text/html`` ``<script>`` or an ``application/javascript``
output would run in the Lab origin (which holds the token and the ``_xsrf`` cookie). Everything here is
applied on the server, at the kernel websocket and in the contents API, before the browser sees it:

* messages: a fixed list of types per channel; anything else (``comm_*``, ``debug_*``, unknown types,
  binary buffers) is dropped;
* MIME bundles (``display_data``, ``execute_result``, ``update_display_data``, ``inspect_reply``, pager
  payloads): only ``text/plain``, ``image/png`` and ``image/jpeg`` are kept; every other type (HTML,
  JavaScript, SVG, Markdown, LaTeX, widget views, …) is withheld, and a bundle left with nothing to show
  gets a ``text/plain`` note naming what was withheld;
* ``kernel_info_reply``: no help links (they become menu entries), no debugger;
* notebooks read through the contents API: the same output filter, Markdown cells shown as text (their
  HTML escaped), no attachments, no widget state, and the kernelspec of the session they belong to.

Pure functions on dicts: ``lab/server.py`` and ``lab/kernels.py`` wire them into Jupyter Server.
"""

from __future__ import annotations

import html
import re
from typing import Any

PLAIN_MIME = ("text/plain", "image/png", "image/jpeg")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")

# Kernel → browser, per channel. Replies the websocket client asked for, and the iopub broadcasts that
# show a cell's progress and output.
OUTGOING: dict[str, frozenset[str]] = {
    "iopub": frozenset({"status", "stream", "display_data", "update_display_data", "execute_input",
                        "execute_result", "error", "clear_output"}),
    "shell": frozenset({"execute_reply", "inspect_reply", "complete_reply", "history_reply", "is_complete_reply",
                        "kernel_info_reply", "comm_info_reply"}),
    "control": frozenset({"kernel_info_reply", "interrupt_reply"}),
    "stdin": frozenset({"input_request"}),
}

# Browser → kernel: what inspecting needs. No comm messages (widgets), no debugger, no shutdown (the
# kernel is the session's).
INCOMING = ["execute_request", "inspect_request", "complete_request", "history_request", "is_complete_request",
            "kernel_info_request", "comm_info_request", "interrupt_request", "input_reply"]


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # nbformat's multiline strings
        return "".join(value)
    return None


def mime_bundle(data: Any, metadata: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plain renderings of a MIME bundle and their (numeric size) metadata."""
    data = data if isinstance(data, dict) else {}
    metadata = metadata if isinstance(metadata, dict) else {}
    kept: dict[str, Any] = {}
    withheld: list[str] = []
    for mime, value in data.items():
        text = _text(value)
        if mime in PLAIN_MIME and text is not None and (mime == "text/plain" or _BASE64.fullmatch(text)):
            kept[mime] = text
        else:
            withheld.append(str(mime)[:100])
    if "text/plain" not in kept and withheld:
        kept["text/plain"] = f"[{', '.join(sorted(withheld))} output withheld by kernelexec lab; plain renderings only]"
    meta: dict[str, Any] = {}
    for mime in ("image/png", "image/jpeg"):
        if mime in kept and isinstance(metadata.get(mime), dict):
            size = {k: v for k, v in metadata[mime].items() if k in ("width", "height") and type(v) in (int, float)}
            if size:
                meta[mime] = size
    return kept, meta


def _transient(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and isinstance(value.get("display_id"), str):
        return {"display_id": value["display_id"]}
    return {}


def content_for(msg_type: str, content: dict[str, Any]) -> dict[str, Any] | None:
    """The content of one kernel message as the browser may see it, or None to drop the message."""
    c = dict(content)
    if msg_type in ("display_data", "execute_result", "update_display_data"):
        c["data"], c["metadata"] = mime_bundle(c.get("data"), c.get("metadata"))
        c["transient"] = _transient(c.get("transient"))
    elif msg_type == "inspect_reply":
        c["data"], c["metadata"] = mime_bundle(c.get("data"), c.get("metadata"))
    elif msg_type == "execute_reply":
        pages = []
        for p in c.get("payload") or []:
            if isinstance(p, dict) and p.get("source") == "page":
                data, _ = mime_bundle(p.get("data"))
                pages.append({"source": "page", "data": data, "start": p.get("start", 0) if type(p.get("start")) is int else 0})
        c["payload"] = pages
        c.pop("user_expressions", None)
    elif msg_type == "kernel_info_reply":
        c["help_links"] = []
        c["debugger"] = False
        features = c.get("supported_features")
        c["supported_features"] = [f for f in features if isinstance(f, str) and f != "debugger"] if isinstance(features, list) else []
    elif msg_type == "comm_info_reply":
        c["comms"] = {}
    elif msg_type == "stream":
        if _text(c.get("text")) is None:
            return None
        c["text"] = _text(c["text"])
        c["name"] = "stderr" if c.get("name") == "stderr" else "stdout"
    elif msg_type == "status":
        if not isinstance(c.get("execution_state"), str):
            return None
    return c


def outgoing(channel: str | None, msg: dict[str, Any]) -> dict[str, Any] | None:
    """A deserialized kernel message (``header``, ``parent_header``, ``metadata``, ``content``) made safe
    for the browser, or None to drop it."""
    header = msg.get("header")
    content = msg.get("content")
    if channel not in OUTGOING or not isinstance(header, dict) or not isinstance(content, dict):
        return None
    msg_type = header.get("msg_type")
    if msg_type not in OUTGOING[channel]:
        return None
    safe = content_for(msg_type, content)
    if safe is None:
        return None
    parent = msg.get("parent_header")
    return {
        "header": header,
        "msg_id": header.get("msg_id"),
        "msg_type": msg_type,
        "parent_header": parent if isinstance(parent, dict) else {},
        "metadata": {},
        "content": safe,
        "buffers": [],
    }


# -- notebooks as the contents API serves them ------------------------------------------------------

def _output(out: Any) -> dict[str, Any] | None:
    if not isinstance(out, dict):
        return None
    kind = out.get("output_type")
    if kind in ("display_data", "execute_result"):
        data, meta = mime_bundle(out.get("data"), out.get("metadata"))
        safe: dict[str, Any] = {"output_type": kind, "data": data, "metadata": meta}
        if kind == "execute_result":
            safe["execution_count"] = out.get("execution_count") if type(out.get("execution_count")) is int else None
        return safe
    if kind == "stream":
        text = _text(out.get("text"))
        return None if text is None else {"output_type": "stream", "name": "stderr" if out.get("name") == "stderr" else "stdout", "text": text}
    if kind == "error":
        tb = out.get("traceback")
        return {"output_type": "error", "ename": str(out.get("ename", "")), "evalue": str(out.get("evalue", "")),
                "traceback": [str(t) for t in tb] if isinstance(tb, list) else []}
    return None


def sanitize_notebook(nb: dict[str, Any], kernelspec: dict[str, str] | None) -> dict[str, Any]:
    """A notebook (nbformat 4 dict) with nothing the browser would execute, whether or not it is trusted."""
    cells = []
    for cell in nb.get("cells") or []:
        if not isinstance(cell, dict):
            continue
        kind = cell.get("cell_type")
        source = _text(cell.get("source")) or ""
        meta = cell["metadata"] if isinstance(cell.get("metadata"), dict) else {}
        meta = {k: v for k, v in meta.items() if k in ("kernelexec", "tags", "collapsed", "scrolled")}
        safe: dict[str, Any] = {"cell_type": kind, "metadata": meta, "source": source}
        if "id" in cell and isinstance(cell["id"], str):
            safe["id"] = cell["id"]
        if kind == "code":
            safe["execution_count"] = cell.get("execution_count") if type(cell.get("execution_count")) is int else None
            safe["outputs"] = [o for o in map(_output, cell.get("outputs") or []) if o is not None]
        elif kind == "markdown":
            safe["source"] = html.escape(source, quote=False)  # shown as text, never as HTML
        else:
            safe["cell_type"] = "raw"  # no raw_mimetype: nothing renders it
        cells.append(safe)
    old = nb["metadata"] if isinstance(nb.get("metadata"), dict) else {}
    metadata: dict[str, Any] = {k: v for k, v in old.items() if k in ("kernelexec", "language_info")}
    if kernelspec:
        metadata["kernelspec"] = dict(kernelspec)
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": min(int(nb.get("nbformat_minor") or 5), 5)
            if isinstance(nb.get("nbformat_minor"), int) else 5}

"""``lab_guard``: what a hostile kernel's messages and notebooks become before JupyterLab sees them.

The end-to-end paths (a real kernel through real Jupyter Server's websocket, a real browser) are in
test_lab.py and test_lab_browser.py; these feed the filter what a kernel holding its session key can
send, message by message, including shapes ipykernel never produces.
"""

from __future__ import annotations

import json

from kernelexec.lab import guard as lab_guard

SCRIPT = "<script>fetch('/api/terminals',{method:'POST'})</script>"


def msg(msg_type: str, content: object, **extra: object) -> dict:
    return {"header": {"msg_id": "m", "msg_type": msg_type, "session": "s"}, "parent_header": {"msg_id": "p"},
            "metadata": {"evil": SCRIPT}, "content": content, "buffers": [b"x"], **extra}


def test_a_display_keeps_plain_renderings_and_names_what_it_withheld() -> None:
    out = lab_guard.outgoing("iopub", msg("display_data", {
        "data": {"text/html": SCRIPT, "application/javascript": "alert(1)", "image/svg+xml": f"<svg>{SCRIPT}</svg>",
                 "application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/markdown": SCRIPT,
                 "image/png": "iVBORw0KGgo=", "image/jpeg": "not base64 <script>"},
        "metadata": {"image/png": {"width": 10, "height": "<script>"}, "isolated": True},
        "transient": {"display_id": "d", "x": SCRIPT}}))
    assert out is not None
    assert out["content"]["data"] == {"image/png": "iVBORw0KGgo=",
                                      "text/plain": out["content"]["data"]["text/plain"]}
    assert "withheld" in out["content"]["data"]["text/plain"]
    assert out["content"]["metadata"] == {"image/png": {"width": 10}}
    assert out["content"]["transient"] == {"display_id": "d"}
    assert out["metadata"] == {} and out["buffers"] == []
    assert "<script" not in json.dumps(out)


def test_a_text_plain_rendering_is_kept_as_is() -> None:
    out = lab_guard.outgoing("iopub", msg("execute_result", {"data": {"text/plain": SCRIPT}, "metadata": {}, "execution_count": 1}))
    assert out is not None and out["content"]["data"] == {"text/plain": SCRIPT}  # Lab shows text/plain as text


def test_message_types_lab_would_act_on_are_dropped() -> None:
    for channel, msg_type in [("iopub", "comm_open"), ("iopub", "comm_msg"), ("iopub", "comm_close"),
                              ("iopub", "debug_event"), ("iopub", "made_up"), ("shell", "debug_reply"),
                              ("control", "debug_reply"), ("shell", "comm_open"), ("nowhere", "status"),
                              ("stdin", "execute_result")]:
        assert lab_guard.outgoing(channel, msg(msg_type, {"data": {"text/html": SCRIPT}})) is None, (channel, msg_type)


def test_malformed_messages_are_dropped() -> None:
    assert lab_guard.outgoing("iopub", {"header": "x", "content": {}}) is None
    assert lab_guard.outgoing("iopub", msg("stream", {"name": "stdout", "text": {"html": SCRIPT}})) is None
    assert lab_guard.outgoing("iopub", msg("status", {"execution_state": ["busy"]})) is None
    assert lab_guard.outgoing("iopub", msg("display_data", ["not", "a", "dict"])) is None


def test_replies_lose_what_lab_would_render_or_offer() -> None:
    info = lab_guard.outgoing("shell", msg("kernel_info_reply", {
        "protocol_version": "5.3", "help_links": [{"text": "x", "url": "javascript:alert(1)"}], "debugger": True,
        "supported_features": ["debugger", "kernel subshells"]}))
    assert info is not None and info["content"]["help_links"] == [] and info["content"]["debugger"] is False
    assert info["content"]["supported_features"] == ["kernel subshells"]
    inspect = lab_guard.outgoing("shell", msg("inspect_reply", {"status": "ok", "found": True, "data": {"text/html": SCRIPT}}))
    assert inspect is not None and set(inspect["content"]["data"]) == {"text/plain"}
    reply = lab_guard.outgoing("shell", msg("execute_reply", {"status": "ok", "payload": [
        {"source": "page", "data": {"text/html": SCRIPT, "text/plain": "doc"}, "start": 0},
        {"source": "set_next_input", "text": "import os; os.system('x')", "replace": True}]}))
    assert reply is not None and reply["content"]["payload"] == [{"source": "page", "data": {"text/plain": "doc"}, "start": 0}]
    comms = lab_guard.outgoing("shell", msg("comm_info_reply", {"status": "ok", "comms": {"c": {"target_name": "jupyter.widget"}}}))
    assert comms is not None and comms["content"]["comms"] == {}


def test_what_lab_may_send_to_a_session_kernel() -> None:
    assert "execute_request" in lab_guard.INCOMING and "interrupt_request" in lab_guard.INCOMING
    for refused in ("comm_open", "comm_msg", "comm_close", "debug_request", "shutdown_request"):
        assert refused not in lab_guard.INCOMING


def test_a_notebook_is_served_with_nothing_that_runs_even_when_trusted() -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3"}, "widgets": {"application/vnd.jupyter.widget-state+json": SCRIPT}},
          "cells": [
              {"cell_type": "code", "id": "a", "source": ["x = 1\n", "x"], "metadata": {"trusted": True}, "execution_count": 1,
               "outputs": [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                            "data": {"text/html": [SCRIPT], "text/plain": ["1"]}},
                           {"output_type": "display_data", "data": {"application/javascript": "alert(1)"}, "metadata": {}},
                           {"output_type": "stream", "name": "stdout", "text": ["ok\n"]},
                           {"output_type": "weird", "data": SCRIPT}]},
              {"cell_type": "markdown", "id": "b", "source": f"**restarted** {SCRIPT}", "metadata": {},
               "attachments": {"x.png": {"image/svg+xml": SCRIPT}}},
              {"cell_type": "raw", "id": "c", "source": SCRIPT, "metadata": {"format": "text/html", "raw_mimetype": "text/html"}},
          ]}
    clean = lab_guard.sanitize_notebook(nb, {"name": "kernelexec-abcdefgh", "display_name": "kernelexec session abcdefgh",
                                             "language": "python"})
    assert clean["metadata"]["kernelspec"]["name"] == "kernelexec-abcdefgh" and "widgets" not in clean["metadata"]
    code, markdown, raw = clean["cells"]
    assert code["source"] == "x = 1\nx" and code["metadata"] == {}
    assert [o["output_type"] for o in code["outputs"]] == ["execute_result", "display_data", "stream"]
    assert code["outputs"][0]["data"] == {"text/plain": "1"}
    assert "withheld" in code["outputs"][1]["data"]["text/plain"]
    assert "<script" not in markdown["source"] and "&lt;script&gt;" in markdown["source"] and "attachments" not in markdown
    assert raw["metadata"] == {} and raw["cell_type"] == "raw"
    assert "<script" not in json.dumps([code["outputs"], markdown, clean["metadata"]])

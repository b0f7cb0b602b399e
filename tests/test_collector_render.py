"""Collector and Renderer as tables: scripted IOPub messages in, an ``Execution`` and an answer out.

No kernel and no server: each row is a list of messages in the shape jupyter_client hands them over
(after nbclient's scripted-message tests), fed to ``Collector.handle`` in order; the rows then go
through ``Renderer.render``. The whole module runs in milliseconds.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from mcp_types import EmbeddedResource, ImageContent, ResourceLink, TextContent

from kernelexec.kernel.collector import STREAM_TAIL, Caps, Collector
from kernelexec.kernel.execution import CellError, CellResult, Execution
from kernelexec.kernel.report import read_result
from kernelexec.server.render import MODEL_EMBED_BUDGET, Renderer

# --- scripted messages -----------------------------------------------------------------------------


def msg(kind: str, **content: Any) -> dict[str, Any]:
    return {"header": {"msg_type": kind, "msg_id": f"k-{kind}"}, "parent_header": {"msg_id": "req"}, "msg_type": kind,
            "metadata": {}, "content": content}


def out(name: str, text: str | list[str]) -> dict[str, Any]:
    return msg("stream", name=name, text=text)


def display(data: dict[str, Any], display_id: str | None = None, metadata: dict[str, Any] | None = None,
            kind: str = "display_data") -> dict[str, Any]:
    return msg(kind, data=data, metadata=metadata or {}, transient={"display_id": display_id} if display_id else {})


def update(data: dict[str, Any], display_id: str) -> dict[str, Any]:
    return display(data, display_id, kind="update_display_data")


def result(data: dict[str, Any], count: int) -> dict[str, Any]:
    return msg("execute_result", data=data, metadata={}, execution_count=count)


def error(ename: str = "ZeroDivisionError", evalue: str = "division by zero", traceback: Any = None) -> dict[str, Any]:
    return msg("error", ename=ename, evalue=evalue, traceback=["\x1b[0;31mTraceback\x1b[0m", "1/0"] if traceback is None else traceback)


def clear(wait: bool = False) -> dict[str, Any]:
    return msg("clear_output", wait=wait)


BUSY, IDLE = msg("status", execution_state="busy"), msg("status", execution_state="idle")
TEXT = {"text/plain": "1"}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-a-picture").decode()


def collect(messages: list[Any], caps: Caps | None = None, spill_dir: Path | None = None) -> tuple[Execution, Collector]:
    ex = Execution(code="cell")
    collector = Collector(ex, caps, spill_dir)
    for m in [BUSY, *messages, IDLE]:
        collector.handle(m)
    assert collector.idle
    collector.finish()
    return ex, collector


def stream_out(name: str, text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text}


def rich(data: dict[str, Any], metadata: dict[str, Any] | None = None, kind: str = "display_data", **extra: Any) -> dict[str, Any]:
    return {"output_type": kind, "data": data, "metadata": metadata or {}, **extra}


ERROR_OUT = {"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": ["Traceback", "1/0"]}


# --- Collector: what a cell's outputs become --------------------------------------------------------------

OUTPUT_TABLE = [
    # (id, messages, outputs, stdout, stderr)
    ("consecutive chunks of one stream merge", [out("stdout", "a"), out("stdout", "b\n")], [stream_out("stdout", "ab\n")], "ab\n", ""),
    ("another stream in between splits them", [out("stdout", "a"), out("stderr", "e"), out("stdout", "b")],
     [stream_out("stdout", "a"), stream_out("stderr", "e"), stream_out("stdout", "b")], "ab", "e"),
    ("a rich output in between splits them", [out("stdout", "a"), display(TEXT), out("stdout", "b")],
     [stream_out("stdout", "a"), rich(TEXT), stream_out("stdout", "b")], "ab", ""),
    ("stream text as a list of strings is joined", [out("stdout", ["a", "b"])], [stream_out("stdout", "ab")], "ab", ""),
    ("display_data keeps data and metadata", [display({"image/png": PNG, "text/plain": "<Figure>"}, metadata={"image/png": {"width": 3}})],
     [rich({"image/png": PNG, "text/plain": "<Figure>"}, {"image/png": {"width": 3}})], "", ""),
    ("a list-valued MIME entry is joined; JSON MIME data stays structured",
     [display({"text/html": ["<b>", "x</b>"], "application/vnd.x+json": {"a": [1]}})],
     [rich({"text/html": "<b>x</b>", "application/vnd.x+json": {"a": [1]}})], "", ""),
    ("update_display_data replaces every output with that display_id",
     [display(TEXT, "d1"), display({"text/plain": "other"}, "d2"), display(TEXT, "d1"), update({"text/plain": "2"}, "d1")],
     [rich({"text/plain": "2"}), rich({"text/plain": "other"}), rich({"text/plain": "2"})], "", ""),
    ("an update for an unknown display_id changes nothing", [display(TEXT, "d1"), update({"text/plain": "2"}, "nope")], [rich(TEXT)], "", ""),
    ("execute_result keeps its execution_count", [result(TEXT, 7)], [rich(TEXT, kind="execute_result", execution_count=7)], "", ""),
    ("error: the traceback without colour codes", [out("stdout", "x"), error()], [stream_out("stdout", "x"), ERROR_OUT], "x", ""),
    ("clear_output clears what came before; the stream fields keep all text",
     [out("stdout", "a"), display(TEXT), clear(), out("stdout", "b")], [stream_out("stdout", "b")], "ab", ""),
    ("clear_output keeps an error", [error(), clear()], [ERROR_OUT], "", ""),
    ("clear_output(wait) clears only when the next output comes",
     [out("stdout", "1"), clear(wait=True), out("stdout", "2"), clear(wait=True), display(TEXT)], [rich(TEXT)], "12", ""),
    ("clear_output(wait) with nothing after it clears nothing", [out("stdout", "1"), clear(wait=True)], [stream_out("stdout", "1")], "1", ""),
    ("clear_output(wait) then an update clears, and the cleared display is no longer updated",
     [display(TEXT, "d1"), clear(wait=True), update({"text/plain": "2"}, "d1")], [], "", ""),
    ("a display after a clear is updated by its own display_id",
     [display(TEXT, "d1"), clear(), display(TEXT, "d1"), update({"text/plain": "2"}, "d1")], [rich({"text/plain": "2"})], "", ""),
    ("messages of other kinds are ignored", [msg("comm_open", comm_id="c", target_name="t", data={}), msg("kernelexec_custom")], [], "", ""),
]


@pytest.mark.parametrize(("messages", "outputs", "stdout", "stderr"), [row[1:] for row in OUTPUT_TABLE], ids=[row[0] for row in OUTPUT_TABLE])
def test_collector_turns_messages_into_outputs(messages: list[Any], outputs: list[dict[str, Any]], stdout: str, stderr: str) -> None:
    ex, _ = collect(messages)
    assert ex.outputs == outputs
    assert (ex.stdout, ex.stderr) == (stdout, stderr)
    assert ex.notes == []


def test_collector_takes_the_count_from_execute_input_and_execute_result() -> None:
    assert collect([msg("execute_input", code="x", execution_count=3)])[0].execution_count == 3
    assert collect([msg("execute_input", code="x", execution_count=3), result(TEXT, 4)])[0].execution_count == 4
    assert collect([msg("execute_input", code="x", execution_count=True)])[0].execution_count is None  # a bool is no count


def test_collector_keeps_the_error_as_data() -> None:
    ex, _ = collect([error()])
    assert ex.error == CellError("ZeroDivisionError", "division by zero", ["Traceback", "1/0"])
    assert not ex.success


def test_collector_hands_back_the_stream_text_for_progress() -> None:
    collector = Collector(Execution(code=""))
    assert collector.handle(out("stderr", "tick")) == "tick"
    assert collector.handle(display(TEXT)) is None
    assert collector.began and not collector.idle


# --- Collector: what a hostile or broken kernel sends -------------------------------------------------------

INVALID_TABLE = [
    # (id, message, the note's text)
    ("not an object", ["stream"], "the server dropped a malformed ? message (not an object)"),
    ("content not an object", {"msg_type": "stream", "content": "x"}, "the server dropped a malformed stream message (content is not an object)"),
    ("a stream that is neither stdout nor stderr", out("stdin", "x"), "the server dropped a malformed stream message (stream name is not stdout or stderr)"),
    ("stream text that is not text", out("stdout", 5), "the server dropped a malformed stream message (text is not text)"),
    ("data not an object", msg("display_data", data=[1]), "the server dropped a malformed display_data message (data is not an object)"),
    ("a data key that is not a MIME type", display({"not a mime": "x"}),
     "the server dropped a malformed display_data message (data has a key that is not a MIME type: 'not a mime')"),
    ("a MIME value that is not text", result({"text/plain": 1}, 1),
     "the server dropped a malformed execute_result message (data['text/plain'] is not text)"),
    ("an unhashable display_id", msg("display_data", data=TEXT, transient={"display_id": ["x"]}),
     "the server dropped a malformed display_data message (display_id is not a string)"),
    ("transient not an object", msg("update_display_data", data=TEXT, transient=1),
     "the server dropped a malformed update_display_data message (transient is not an object)"),
    ("an ename that is not a string", error(ename=None), "the server dropped a malformed error message (ename or evalue is not a string)"),
    ("a traceback that is not a list of strings", error(traceback=[1]), "the server dropped a malformed error message (traceback is not a list of strings)"),
    ("JSON MIME data that is not JSON", display({"application/json": {1, 2}}), "the server dropped a unreadable display_data message (TypeError)"),
]


@pytest.mark.parametrize(("message", "note"), [row[1:] for row in INVALID_TABLE], ids=[row[0] for row in INVALID_TABLE])
def test_collector_drops_an_invalid_message_and_says_so(message: Any, note: str) -> None:
    ex, _ = collect([out("stdout", "before"), message, out("stdout", "after")])
    assert ex.outputs == [stream_out("stdout", "beforeafter")]
    assert ex.error is None
    assert ex.notes == [note]


def test_collector_counts_repeated_drops_in_one_note() -> None:
    ex, _ = collect([out("stdin", "x"), out("stdin", "y"), out("stdin", "z")])
    assert ex.notes == ["the server dropped 3 malformed stream message (stream name is not stdout or stderr)"]


def test_metadata_that_is_not_an_object_is_left_out() -> None:
    ex, _ = collect([msg("display_data", data=TEXT, metadata="x")])
    assert ex.outputs == [rich(TEXT)] and ex.notes == []


# --- Collector: the per-cell caps ------------------------------------------------------------------------------

def test_rich_outputs_beyond_the_count_cap_are_dropped_and_counted() -> None:
    ex, _ = collect([display({"text/plain": str(i)}) for i in range(5)], Caps(max_outputs=3))
    assert [o["data"]["text/plain"] for o in ex.outputs] == ["0", "1", "2"]
    assert ex.notes == ["the server dropped 2 rich output beyond 3 per cell"]


def test_the_default_count_cap_is_a_thousand_and_an_error_counts() -> None:
    ex, _ = collect([display(TEXT)] * 1_000 + [error(), display(TEXT)])
    assert len(ex.outputs) == 1_000 and ex.error is None
    assert ex.notes == ["the server dropped 2 rich output beyond 1,000 per cell"]


def test_streams_taking_turns_make_a_bounded_number_of_outputs() -> None:
    """stdout and stderr alternating one character at a time (a cell flushing both in turn, or one sending stream
    messages itself) made a stream output object per character: within the per-stream head cap (1,100,000
    characters each) that was ~2.2 million objects for one cell, ~780 MB in the server before the notebook and
    the journal held them again (200,000 messages: 160 MB of server memory, a 10 MB notebook). The text is all
    kept; past the cap it joins each stream's last output."""
    turns = 20_000  # twenty times the cap: one object per message would be 20,000
    messages = [out("stdout" if i % 2 else "stderr", "o" if i % 2 else "e") for i in range(turns)]
    ex, _ = collect(messages)
    assert len(ex.outputs) <= 1_002, f"{len(ex.outputs):,} outputs for one cell"
    assert (ex.stdout, ex.stderr) == ("o" * (turns // 2), "e" * (turns // 2))
    assert "".join(o["text"] for o in ex.outputs if o["name"] == "stdout") == ex.stdout
    assert any("took turns past 1,000 stream outputs" in n for n in ex.notes), ex.notes


def test_past_the_stream_output_cap_text_joins_its_stream_and_a_clear_starts_over() -> None:
    caps = Caps(max_stream_outputs=4)
    ex, _ = collect([out("stdout", "a"), out("stderr", "b")] * 3, caps)
    assert ex.outputs == [stream_out("stdout", "a"), stream_out("stderr", "b"), stream_out("stdout", "aa"), stream_out("stderr", "bb")]
    # the cap counts the stream outputs the cell holds: clear_output empties them (a progress loop goes on as before)
    ex, _ = collect([out("stdout", "a"), out("stderr", "b")] * 4 + [clear(), out("stdout", "c"), out("stderr", "d"), out("stdout", "e")], caps)
    assert ex.outputs == [stream_out("stdout", "c"), stream_out("stderr", "d"), stream_out("stdout", "e")]


def test_one_rich_output_over_the_size_cap_is_dropped() -> None:
    ex, _ = collect([display({"text/plain": "x" * 11}), display({"text/plain": "x" * 10})], Caps(max_output_bytes=10))
    assert ex.outputs == [rich({"text/plain": "x" * 10})]
    assert ex.notes == ["the server dropped a rich output over 10 characters"]


def test_metadata_counts_against_the_size_cap() -> None:
    ex, _ = collect([display({"text/plain": "x"}, metadata={"k": "v" * 10})], Caps(max_output_bytes=10))
    assert ex.outputs == []


def test_rich_outputs_past_the_cells_total_are_dropped() -> None:
    ex, _ = collect([display({"text/plain": "x" * 6})] * 3, Caps(max_total_bytes=12))
    assert len(ex.outputs) == 2
    assert ex.notes == ["the server dropped a rich outputs beyond 12 characters per cell"]


def test_a_display_update_past_the_size_cap_is_dropped_and_the_output_kept() -> None:
    ex, _ = collect([display(TEXT, "d"), update({"text/plain": "y" * 20}, "d")], Caps(max_output_bytes=10))
    assert ex.outputs == [rich(TEXT)]
    assert ex.notes == ["the server dropped a display update over the per-cell size cap"]


def test_a_stream_past_its_cap_keeps_head_and_tail_and_spills_the_whole(tmp_path: Path) -> None:
    chunks = [f"{i:03d}" * 4 + "\n" for i in range(10)]  # 13 characters each
    ex, _ = collect([out("stdout", c) for c in chunks], Caps(stream_keep=20), tmp_path)
    whole = "".join(chunks)
    spill = Path(ex.stream_files["stdout"])
    assert spill.parent == tmp_path and spill.read_text() == whole
    head, rest = ex.stdout[:20], ex.stdout[20:]
    assert head == whole[:20]
    assert rest.startswith(f"\n[kernelexec: {len(whole) - 20} more characters of stdout than the server keeps per cell; their last {len(whole) - 20} follow;"
                           f" the whole stream is in {spill}]\n")
    assert rest.endswith(whole[20:])
    assert ex.outputs == [stream_out("stdout", head), stream_out("stdout", rest)]
    assert ex.notes == [f"stdout: {len(whole)} characters came from the kernel, past the server's per-cell cap; it kept the first 20 "
                        f"and the last {len(whole) - 20}, and {len(whole)} in {spill}"]
    assert "stderr" not in ex.stream_files and ex.stderr == ""


def test_a_capped_stream_keeps_only_its_last_stream_tail_characters() -> None:
    ex, _ = collect([out("stderr", "h" * 10), *[out("stderr", str(i % 10) * 1_000) for i in range(60)]], Caps(stream_keep=10))
    assert ex.stderr.startswith("h" * 10 + "\n[kernelexec: 60,000 more characters of stderr")
    assert f"their last {STREAM_TAIL:,} follow]" in ex.stderr  # no spill directory: no file named
    assert ex.stderr.endswith("".join(str(i % 10) * 1_000 for i in range(10, 60)))
    assert ex.stream_files == {}


def test_the_spill_file_stops_at_its_cap(tmp_path: Path) -> None:
    ex, _ = collect([out("stdout", "a" * 30), out("stdout", "b" * 30)], Caps(stream_keep=10, spill_cap=40), tmp_path)
    assert Path(ex.stream_files["stdout"]).read_text() == "a" * 30 + "b" * 10
    assert ex.notes[0].endswith(f"and 40 in {ex.stream_files['stdout']}")


# --- the result report (kernel/report.read_result: the runtime's JSON, checked) ------------------------------------------

RESULT_TABLE = [
    ("JSON text stays JSON", {"kind": "value", "format": "json", "text": '{"a": [1, 2]}'}, CellResult('{"a": [1, 2]}', "json", value={"a": [1, 2]})),
    ("text that claims JSON but is not becomes text", {"kind": "value", "format": "json", "text": "{nope"}, CellResult("{nope", "text")),
    ("a repr", {"kind": "value", "format": "text", "text": "<object>"}, CellResult("<object>")),
    ("no result", {"kind": "none", "text": ""}, None),
    ("text that is not a string", {"kind": "value", "format": "json", "text": 1}, None),
    ("a spill file the server accepts", {"kind": "value", "format": "text", "text": "x", "file": "/ok"}, CellResult("x", "text", "/ok")),
    ("a spill file the server refuses", {"kind": "value", "format": "text", "text": "x", "file": "/etc/passwd"}, CellResult("x")),
]


@pytest.mark.parametrize(("payload", "expected"), [row[1:] for row in RESULT_TABLE], ids=[row[0] for row in RESULT_TABLE])
def test_the_result_report_is_read_in_the_runtimes_shape(payload: dict[str, Any], expected: CellResult | None) -> None:
    assert read_result(payload, lambda path: path == "/ok") == expected


# --- Renderer ---------------------------------------------------------------------------------------------


def renderer(tmp_path: Path, result_chars: int = 1_000, stream_chars: int = 1_000) -> Renderer:
    return Renderer("s1", tmp_path / "outputs", result_chars=result_chars, stream_chars=stream_chars, profile="standard")


def render(ex: Execution, tmp_path: Path, **kwargs: Any) -> tuple[dict[str, Any], list[Any]]:
    rendered = renderer(tmp_path, **kwargs).render(ex, notebook="/nb.ipynb", layers=["env", "guard"])
    return rendered.structured.model_dump(), rendered.content


def text_of(content: list[Any]) -> str:
    assert isinstance(content[0], TextContent)
    return content[0].text


RESULT_RENDER_TABLE = [
    ("JSON result decoded", CellResult('{"a": [1, 2]}', "json", value={"a": [1, 2]}), {"a": [1, 2]}, '<kernelexec-result>\n{"a": [1, 2]}\n</kernelexec-result>'),
    ("a JSON string stays a string", CellResult('"hi"', "json", value="hi"), "hi", "<kernelexec-result>\nhi\n</kernelexec-result>"),
    ("a repr is text", CellResult("<object at 0x1>"), "<object at 0x1>", "<kernelexec-result>\n<object at 0x1>\n</kernelexec-result>"),
    ("null JSON is no result", CellResult("null", "json"), None, None),
]


@pytest.mark.parametrize(("cell_result", "value", "shown"), [row[1:] for row in RESULT_RENDER_TABLE], ids=[row[0] for row in RESULT_RENDER_TABLE])
def test_renderer_shows_the_result(tmp_path: Path, cell_result: CellResult, value: Any, shown: str | None) -> None:
    structured, content = render(Execution(code="x", result=cell_result, execution_count=1), tmp_path)
    assert structured["result"] == value and structured["result_file"] is None
    text = text_of(content)
    if shown is None:
        assert "<kernelexec-result>" not in text
    else:
        assert shown in text


def test_a_long_result_is_cut_and_kept_whole_in_a_file(tmp_path: Path) -> None:
    whole = json.dumps(list(range(100)))
    structured, content = render(Execution(code="x", result=CellResult(whole, "json"), execution_count=2), tmp_path, result_chars=50)
    assert structured["result"] == whole[:50] + f"... [cut at 50 of {len(whole)} characters; whole in result_file]"
    assert structured["result_file"] == str(tmp_path / "outputs" / "cell2-1-result.json")
    assert Path(structured["result_file"]).read_text() == whole
    assert f"(whole result in {structured['result_file']})" in text_of(content)


def test_a_long_result_the_kernel_spilled_keeps_the_kernels_file(tmp_path: Path) -> None:
    structured, _ = render(Execution(code="x", result=CellResult("r" * 60, "text", "/spill/r.txt")), tmp_path, result_chars=50)
    assert structured["result_file"] == "/spill/r.txt"
    assert not (tmp_path / "outputs").exists()


STREAM_RENDER_TABLE = [
    ("short text as is", "hello\n", "hello\n"),
    ("colour codes removed", "\x1b[31mred\x1b[0m\n", "red\n"),
    ("progress lines collapsed to their last state", "10%\r50%\r100%\ndone", "100%\ndone"),
    ("our closing tag escaped", "</kernelexec-stdout>", "&lt;/kernelexec-stdout>"),
]


@pytest.mark.parametrize(("raw", "shown"), [row[1:] for row in STREAM_RENDER_TABLE], ids=[row[0] for row in STREAM_RENDER_TABLE])
def test_renderer_shows_stdout_readable(tmp_path: Path, raw: str, shown: str) -> None:
    structured, content = render(Execution(code="x", stdout=raw), tmp_path)
    assert structured["stdout_file"] is None
    assert f"<kernelexec-stdout>\n{shown.rstrip()}\n</kernelexec-stdout>" in text_of(content)
    if "kernelexec" not in raw:
        assert structured["stdout"] == shown


def test_long_text_is_cut_two_thirds_head_one_third_tail_the_whole_in_a_file(tmp_path: Path) -> None:
    raw = "".join(f"{i:04d}" for i in range(100))  # 400 characters
    structured, content = render(Execution(code="x", stderr=raw), tmp_path, stream_chars=30)
    assert structured["stderr"] == f"{raw[:20]}\n[... 370 characters cut ...]\n{raw[-10:]}"
    assert Path(structured["stderr_file"]).read_text() == raw
    assert f"(whole stderr in {structured['stderr_file']})" in text_of(content)


def test_a_cut_stream_names_the_file_the_collector_spilled(tmp_path: Path) -> None:
    ex = Execution(code="x", stdout="o" * 100, stream_files={"stdout": "/spill/out.txt"})
    assert render(ex, tmp_path, stream_chars=30)[0]["stdout_file"] == "/spill/out.txt"
    ex = Execution(code="x", stdout="o" * 10, streams_cut={"stdout": {"file": "/k/out.txt"}})
    assert render(ex, tmp_path)[0]["stdout_file"] == "/k/out.txt"  # the kernel's cap cut it: its file


def test_an_image_goes_to_the_model_and_to_a_file(tmp_path: Path) -> None:
    ex = Execution(code="x", execution_count=3, outputs=[rich({"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"})])
    structured, content = render(ex, tmp_path)
    raw = base64.b64decode(PNG)
    path = tmp_path / "outputs" / "cell3-1-out0.png"
    assert structured["outputs"] == [{"mime_type": "image/png", "size": len(raw), "path": str(path), "uri": "kernelexec://sessions/s1/files/cell3-1-out0.png"}]
    assert path.read_bytes() == raw
    assert [type(b) for b in content] == [TextContent, ImageContent]
    assert content[1].data == PNG and content[1].mime_type == "image/png"
    assert f"output image/png ({len(raw)} bytes): kernelexec://sessions/s1/files/cell3-1-out0.png" in text_of(content)
    assert "<kernelexec-display>" not in text_of(content)  # the image is the output's form


def test_the_same_figure_twice_is_shown_once(tmp_path: Path) -> None:
    ex = Execution(code="fig", outputs=[rich({"image/png": PNG}), rich({"image/png": PNG}, kind="execute_result", execution_count=1)])
    structured, content = render(ex, tmp_path)
    assert len(structured["outputs"]) == 1 and len(content) == 2


def test_a_rich_form_that_is_the_only_form_is_embedded(tmp_path: Path) -> None:
    html = "<table><tr><td>1</td></tr></table>"
    structured, content = render(Execution(code="x", outputs=[rich({"text/html": html, "text/plain": "<IPython.core.display.HTML object>"})]), tmp_path)
    assert isinstance(content[1], EmbeddedResource)
    assert content[1].resource.text == html and content[1].resource.mime_type == "text/html"
    assert structured["outputs"][0]["mime_type"] == "text/html"


def test_a_rich_form_with_a_text_form_is_linked_and_its_text_shown(tmp_path: Path) -> None:
    ex = Execution(code="x", outputs=[rich({"text/html": "<b>df</b>", "text/plain": "   a\n0  1"})])
    _, content = render(ex, tmp_path)
    assert isinstance(content[1], ResourceLink) and content[1].mime_type == "text/html"
    assert text_of(content).endswith("<kernelexec-display>\n   a\n0  1\n</kernelexec-display>")


def test_an_execute_results_text_is_not_shown_twice(tmp_path: Path) -> None:
    ex = Execution(code="x", outputs=[rich({"text/html": "<b>df</b>", "text/plain": "df"}, kind="execute_result", execution_count=1)])
    assert "<kernelexec-display>" not in text_of(render(ex, tmp_path)[1])


def test_embedding_stops_at_the_answers_budget(tmp_path: Path) -> None:
    big = "<p>" + "x" * (MODEL_EMBED_BUDGET - 100) + "</p>"
    ex = Execution(code="x", outputs=[rich({"text/html": big}), rich({"text/html": big + " "})])
    _, content = render(ex, tmp_path)
    assert [type(b) for b in content] == [TextContent, EmbeddedResource, ResourceLink]


def test_json_mime_data_is_written_as_json(tmp_path: Path) -> None:
    structured, _ = render(Execution(code="x", outputs=[rich({"application/json": {"a": 1}, "text/plain": "{'a': 1}"})]), tmp_path)
    assert json.loads(Path(structured["outputs"][0]["path"]).read_text()) == {"a": 1}


def test_binary_data_that_is_not_base64_is_dropped_with_a_note(tmp_path: Path) -> None:
    structured, content = render(Execution(code="x", outputs=[rich({"image/png": "abc"})]), tmp_path)
    assert structured["outputs"] == [] and len(content) == 1
    assert structured["notes"] == ["the server dropped a image/png output that was not valid base64"]
    assert "NOTE: the server dropped a image/png output" in text_of(content)


def test_the_structured_content_holds_no_base64(tmp_path: Path) -> None:
    structured, _ = render(Execution(code="x", outputs=[rich({"image/png": PNG})]), tmp_path)
    assert PNG not in json.dumps(structured)


# --- Renderer: the header and errors --------------------------------------------------------------------------

HEADER_TABLE = [
    # (id, execution, the header line, the error field, error_type)
    ("ok", Execution(code="x", execution_count=4, duration_ms=12.4),
     "[ok] session=s1 cell=4 12 ms profile=standard layers=env+guard", None, None),
    ("the code raised", Execution(code="x", execution_count=5, error=CellError("ValueError", "bad\nmore", ["Traceback", "ValueError: bad"])),
     "[error] session=s1 cell=5 0 ms profile=standard layers=env+guard", "ValueError: bad", "ValueError"),
    ("interrupted at its timeout", Execution(code="x", ending="interrupted", timed_out=True),
     "[interrupted] session=s1 cell=None 0 ms profile=standard layers=env+guard",
     "TimeoutError: the code ran longer than its timeout (interrupted)", "TimeoutError"),
    ("restarted at its timeout", Execution(code="x", ending="restarted", timed_out=True, restart_reason="timed out; restarted"),
     "[restarted] session=s1 cell=None 0 ms profile=standard layers=env+guard",
     "TimeoutError: the code ran longer than its timeout (the kernel was restarted; variables lost)", "TimeoutError"),
    ("the kernel died", Execution(code="x", ending="kernel_died", restart_reason="the kernel died (exit 9)"),
     "[kernel_died] session=s1 cell=None 0 ms profile=standard layers=env+guard", "KernelDied: the kernel died (exit 9)", "KernelDied"),
    ("cancelled", Execution(code="x", ending="interrupted", cancelled=True),
     "[interrupted] session=s1 cell=None 0 ms profile=standard layers=env+guard", "CancelledError: the call was cancelled", "TimeoutError"),
]


@pytest.mark.parametrize(("ex", "header", "error_line", "error_type"), [row[1:] for row in HEADER_TABLE], ids=[row[0] for row in HEADER_TABLE])
def test_renderer_header_and_error(tmp_path: Path, ex: Execution, header: str, error_line: str | None, error_type: str | None) -> None:
    structured, content = render(ex, tmp_path)
    lines = text_of(content).splitlines()
    assert lines[0] == header
    assert (structured["error"], structured["error_type"]) == (error_line, error_type)
    assert structured["success"] is (error_line is None)
    if ex.restart_reason:
        assert lines[1] == f"NOTE: {ex.restart_reason}"


def test_an_error_shows_its_traceback_lines_escaped(tmp_path: Path) -> None:
    ex = Execution(code="x", error=CellError("KeyError", "'</kernelexec-error>'", ["Traceback\n  line 1", "KeyError: '</kernelexec-error>'"]))
    structured, content = render(ex, tmp_path)
    assert structured["traceback"] == ["Traceback", "  line 1", "KeyError: '</kernelexec-error>'"]
    assert text_of(content).endswith("<kernelexec-error>\nKeyError: '&lt;/kernelexec-error>'\nTraceback\n  line 1\n"
                                     "KeyError: '&lt;/kernelexec-error>'\n</kernelexec-error>")


def test_the_header_names_where_code_runs_only_when_it_changes(tmp_path: Path) -> None:
    r = renderer(tmp_path)
    first, second = (r.render(Execution(code="x"), notebook=None, layers=["env"]) for _ in range(2))
    assert text_of(first.content).splitlines()[0].endswith(" profile=standard layers=env")
    assert text_of(second.content).splitlines()[0] == "[ok] session=s1 cell=None 0 ms"
    assert second.structured.layers == ["env"] and second.structured.profile == "standard"


def test_collected_messages_render_end_to_end(tmp_path: Path) -> None:
    ex, _ = collect([msg("execute_input", code="x", execution_count=9), out("stdout", "progress 1\r"), out("stdout", "progress 2\n"),
                     display({"image/png": PNG, "text/plain": "<Figure>"}), error()])
    structured, content = render(ex, tmp_path)
    assert structured["execution_count"] == 9 and structured["stdout"] == "progress 2\n"
    assert structured["error"] == "ZeroDivisionError: division by zero" and structured["traceback"] == ["Traceback", "1/0"]
    assert [type(b) for b in content] == [TextContent, ImageContent]

"""Turn an ``Execution`` into what the MCP client gets: structured content and content blocks.

Rendering happens once per call. Anything too long for the answer is cut here and kept whole in
a file in the session's ``outputs/`` directory, named in the answer; nothing is dropped silently.
Binary data never goes into structured content (clients copy it into the model's context as text).

Content blocks are lean for the model, whose context is the scarce resource: the text summary and
PNG/JPEG images go in whole; an SVG, HTML, JSON or other rich form goes in as a ``resource_link``
(URI, MIME type, size) whenever the same output also has a text or image form, and is embedded only
when it is the output's only form, within ``MODEL_EMBED_BUDGET`` characters per answer. The
structured content keeps every output (``outputs``), for apps and scripts; the run view (view.py)
reads the files through their URIs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_types import Annotations, ContentBlock, EmbeddedResource, ImageContent, ResourceLink, TextContent, TextResourceContents

from kernelexec import tracing
from kernelexec.display import display
from kernelexec.kernel.collector import strip_ansi
from kernelexec.kernel.execution import CellError, Execution
from kernelexec.longtext import cut
from kernelexec.server.results import ExecuteResult, OutputRef, Restored
from kernelexec.session.restore import RestoreReport

EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/svg+xml": "svg",
    "text/html": "html",
    "text/markdown": "md",
    "text/latex": "tex",
    "application/json": "json",
    "application/pdf": "pdf",
    "application/javascript": "js",
}
TEXT_EXTENSIONS = {"svg", "html", "md", "tex", "json", "js", "txt"}
BINARY = {"image/png", "image/jpeg", "image/gif", "application/pdf"}
MODEL_IMAGES = {"image/png", "image/jpeg"}
MODEL_EMBED_BUDGET = 8_000  # characters of rich text one answer embeds, for outputs that have no other form
DISPLAY_TEXT_CHARS = 2_000  # a linked display output's text/plain form, shown in the summary up to this long
# IPython's default repr, e.g. "<IPython.core.display.HTML object>": not a text form of anything
PLACEHOLDER = re.compile(r"^<[\w.]+ object( at 0x[0-9a-fA-F]+)?>$")
FOR_BOTH = Annotations(audience=["user", "assistant"])
FOR_USER = Annotations(audience=["user"], priority=0.3)  # the summary names the same URI for the model


def session_file_uri(session: str, name: str) -> str:
    return f"kernelexec://sessions/{session}/files/{name}"


def readable(text: str) -> str:
    """What a terminal would show: ANSI codes removed and ``\\r`` progress lines collapsed."""
    text = strip_ansi(text)
    if "\r" not in text:
        return text
    lines = []
    for line in text.split("\n"):
        parts = [p for p in line.split("\r") if p]
        lines.append(parts[-1] if parts else "")
    return "\n".join(lines)


@dataclass
class Rendered:
    structured: ExecuteResult
    content: list[ContentBlock]


class Renderer:
    """Renders executions for one session; owns the naming of its spill files."""

    def __init__(self, session: str, outputs_dir: Path, *, result_chars: int, stream_chars: int, profile: str,
                 environment: dict[str, Any] | None = None) -> None:
        self.session = session
        self.environment = environment  # environments.Environment.summary() of the session's interpreter
        self.outputs_dir = outputs_dir
        self.result_chars = result_chars
        self.stream_chars = stream_chars
        self.profile = profile
        self._seq = 0
        self._context_told: str | None = None  # the header's profile/python/layers, as last shown

    def _write(self, stem: str, ext: str, data: bytes) -> tuple[Path, str]:
        self.outputs_dir.mkdir(parents=True, exist_ok=True)
        name = f"{stem}.{ext}"
        path = self.outputs_dir / name
        path.write_bytes(data)
        return path, session_file_uri(self.session, name)

    def render(self, ex: Execution, *, notebook: str | None, layers: list[str] | None = None,
               hint: str | None = None, restored: RestoreReport | None = None) -> Rendered:
        """``hint``: a line added to the error's traceback for the model (how to install a missing module)."""
        with tracing.span("kernelexec.render", **{"kernelexec.session": self.session}):
            return self._render(ex, notebook=notebook, layers=layers, hint=hint, restored=restored)

    def _render(self, ex: Execution, *, notebook: str | None, layers: list[str] | None, hint: str | None,
                restored: RestoreReport | None) -> Rendered:
        self._seq += 1
        stem = f"cell{ex.execution_count if ex.execution_count is not None else 'x'}-{self._seq}"
        result_value, result_file = self._result(ex, stem)
        streams = self._streams(ex, stem)
        refs, blocks, shown_text = self._rich_outputs(ex, stem)
        error = ex.error
        structured = ExecuteResult(
            success=ex.success,
            result=result_value,
            result_file=result_file,
            error=_one_line(ex, error),
            error_type=error.ename if error is not None else (None if ex.success else _ending_type(ex)),
            traceback=[line for t in (error.traceback if error is not None else []) for line in t.split("\n")]
                      + ([hint] if hint is not None and error is not None else []),
            session=self.session,
            execution_count=ex.execution_count,
            outputs=refs,
            duration_ms=ex.duration_ms,
            cpu_seconds=ex.cpu_seconds,
            peak_memory_mb=None if ex.peak_memory is None else round(ex.peak_memory / 2**20, 1),
            timed_out=ex.timed_out,
            ending=ex.ending,
            restart_reason=ex.restart_reason,
            notebook=notebook,
            profile=self.profile,
            layers=layers or [],
            environment=self.environment,
            notes=list(ex.notes),
            restored=Restored.of(restored),
            **streams,
        )
        # the header's profile/python/layers once per session: in the first answer and when one changes
        context = header_context(structured)
        text = summary_text(structured, context=context != self._context_told)
        self._context_told = context
        if shown_text:
            text += "".join(f"\n<kernelexec-display>\n{escape_tags(t.rstrip())}\n</kernelexec-display>" for t in shown_text)
        return Rendered(structured, [TextContent(type="text", text=display(text, None), annotations=FOR_BOTH), *blocks])

    def _result(self, ex: Execution, stem: str) -> tuple[Any, str | None]:
        """The result's value, cut past ``result_chars`` with the whole kept in its file."""
        if ex.result is None:
            return None, None
        text, result_file = ex.result.text, ex.result.file
        if len(text) > self.result_chars:
            if result_file is None:
                ext = "json" if ex.result.format == "json" else "txt"
                result_file = str(self._write(f"{stem}-result", ext, text.encode())[0])
            return text[: self.result_chars] + f"... [cut at {self.result_chars:,} of {len(text):,} characters; whole in result_file]", result_file
        return (ex.result.value if ex.result.format == "json" else text), result_file

    def _streams(self, ex: Execution, stem: str) -> dict[str, Any]:
        """stdout and stderr: readable, cut head + tail, the whole kept in a file."""
        fields: dict[str, Any] = {}
        for name in ("stdout", "stderr"):
            raw = getattr(ex, name)
            shown, was_cut = cut(readable(raw), self.stream_chars)
            path = ex.stream_files.get(name) or ex.streams_cut.get(name, {}).get("file")
            if was_cut and path is None:
                path = str(self._write(f"{stem}-{name}", "txt", raw.encode(errors="replace"))[0])
            fields[name] = shown
            fields[f"{name}_file"] = path
        return fields

    def _rich_outputs(self, ex: Execution, stem: str) -> tuple[list[OutputRef], list[ContentBlock], list[str]]:
        """Every non-text output kept as a file; images for the model, the rest as resources (embedded
        when it is an output's only form, within the budget). Also the text forms of linked displays."""
        refs: list[OutputRef] = []
        blocks: list[ContentBlock] = []
        shown_text: list[str] = []
        budget = [MODEL_EMBED_BUDGET]
        seen: set[str] = set()
        for index, out in enumerate(ex.outputs):
            data = out.get("data")
            if not data:
                continue
            # A cell ending in `fig` shows the figure twice (its repr, then the inline backend's
            # flush); the PNG bytes are identical though the SVGs differ in ids, so key on the PNG.
            key = hashlib.sha1(json.dumps(data.get("image/png") or data, sort_keys=True).encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            plain = _plain_text(data.get("text/plain"))
            has_image = any(m in MODEL_IMAGES for m in data)
            linked = False
            for mime, value in data.items():
                if mime == "text/plain" or mime not in EXTENSIONS and not mime.startswith("image/"):
                    continue
                block = self._one_form(ex, f"{stem}-out{index}", mime, value, refs, budget,
                                       embeddable=not plain and not has_image)
                if block is not None:
                    linked = linked or isinstance(block, ResourceLink)
                    blocks.append(block)
            if linked and plain and not has_image and out.get("output_type") != "execute_result":
                shown_text.append(cut(plain, DISPLAY_TEXT_CHARS)[0])  # an execute_result's text is the result already
        return refs, blocks, shown_text

    def _one_form(self, ex: Execution, name: str, mime: str, value: Any, refs: list[OutputRef], budget: list[int], *,
                  embeddable: bool) -> ContentBlock | None:
        """One MIME form of an output: written to its file, named in ``refs``, and its content block."""
        try:
            raw = _as_bytes(mime, value)
        except ValueError:  # not base64 where the MIME type says binary: a kernel's forgery
            ex.notes.append(f"the server dropped a {mime} output that was not valid base64")
            return None
        ext = EXTENSIONS.get(mime, mime.rsplit("/", 1)[-1].split("+")[0])
        path, uri = self._write(f"{name}", ext, raw)
        refs.append(OutputRef(mime_type=mime, size=len(raw), path=str(path), uri=uri))
        if mime in MODEL_IMAGES:
            return ImageContent(type="image", data=base64.b64encode(raw).decode(), mime_type=mime, annotations=FOR_BOTH)
        if mime not in BINARY and embeddable and len(raw) <= budget[0]:
            budget[0] -= len(raw)  # the rich form is all this output has: the model gets it, within budget
            return EmbeddedResource(type="resource", annotations=FOR_BOTH,
                                    resource=TextResourceContents(uri=uri, mime_type=mime, text=raw.decode(errors="replace")))
        return ResourceLink(type="resource_link", uri=uri, name=path.name, mime_type=mime, size=len(raw), annotations=FOR_USER)


def _plain_text(value: Any) -> str:
    """An output's text/plain form, or "" when it has none worth reading (IPython's default repr)."""
    text = "".join(value) if isinstance(value, list) else value if isinstance(value, str) else ""
    return "" if PLACEHOLDER.match(text.strip()) else text


def _as_bytes(mime: str, value: Any) -> bytes:
    if mime in BINARY:
        return base64.b64decode(value if isinstance(value, str) else "".join(value), validate=False)
    if isinstance(value, (dict, list)) and not mime.startswith("text/") and mime != "image/svg+xml":
        return json.dumps(value, indent=1).encode()
    if isinstance(value, list):
        value = "".join(value)
    return str(value).encode()


def _ending_type(ex: Execution) -> str:
    if ex.ending == "restarted" and not ex.timed_out:  # a hung kernel, or one that never read its answers
        return "KernelRestarted"
    return {"interrupted": "TimeoutError", "restarted": "TimeoutError", "kernel_died": "KernelDied"}.get(ex.ending, "Error")


def _one_line(ex: Execution, error: CellError | None) -> str | None:
    if error is not None and ex.ending == "completed":
        return error.one_line()
    if ex.ending == "completed":
        return None
    if ex.timed_out:
        how = {"interrupted": "interrupted", "restarted": "the kernel was restarted; variables lost"}.get(ex.ending, ex.ending)
        return f"TimeoutError: the code ran longer than its timeout ({how})"
    if ex.cancelled:
        return "CancelledError: the call was cancelled"
    if ex.ending == "restarted":  # not by its timeout: the cell's own error first, else why
        return error.one_line() if error is not None else f"KernelRestarted: {ex.restart_reason}"
    if ex.ending == "kernel_died":
        return f"KernelDied: {ex.restart_reason}"
    return f"{ex.ending}"


_TAG = re.compile(r"</?(kernelexec-[a-z]+)>")


def escape_tags(text: str) -> str:
    """Kernel text cannot close or open our own ``<kernelexec-*>`` tags."""
    return _TAG.sub(lambda m: m.group(0).replace("<", "&lt;"), text)


def header_context(r: ExecuteResult) -> str:
    """The header's description of where code runs: `` profile=… python=… layers=…``."""
    python = ""
    if r.environment is not None:
        python = f" python={r.environment.version}" + ("" if r.environment.source == "own" else f"({r.environment.source})")
    layers = "+".join(r.layers) or "none"
    return f" profile={r.profile}{python} layers={layers}"


COST_CPU_SHOWN = 0.1  # CPU seconds from which the header says what a cell cost (below: the structured result only)
COST_PEAK_SHOWN = 256.0  # the kernel's peak MB from which the header says it


def cost_text(r: ExecuteResult) -> str:
    """The header's `` cpu=0.52s peak=653MB``: what the cell cost, said where it is worth the model's reading (a
    quick `x = 1` keeps its short header); the structured result always has both."""
    cpu = "" if r.cpu_seconds is None or r.cpu_seconds < COST_CPU_SHOWN else f" cpu={r.cpu_seconds:.2f}s"
    peak = "" if r.peak_memory_mb is None or r.peak_memory_mb < COST_PEAK_SHOWN else f" peak={r.peak_memory_mb:.0f}MB"
    return cpu + peak


def summary_text(r: ExecuteResult, *, context: bool = True) -> str:
    """One text block for the model: what happened, result, output, error. Tags escaped, no base64.
    ``context``: whether the header says where the code runs (profile, python, layers); the
    structured content always does."""
    esc = escape_tags

    status = "ok" if r.success else ("error" if r.ending == "completed" else r.ending)
    where = header_context(r) if context else ""
    parts = [f"[{status}] session={r.session} cell={r.execution_count} {r.duration_ms:.0f} ms{cost_text(r)}{where}"]
    if r.restart_reason:
        parts.append(f"NOTE: {r.restart_reason}")
    parts.extend(f"NOTE: {note}" for note in r.notes)
    if r.result is not None:
        shown = r.result if isinstance(r.result, str) else json.dumps(r.result)
        parts.append(f"<kernelexec-result>\n{esc(shown)}\n</kernelexec-result>")
        if r.result_file:
            parts.append(f"(whole result in {r.result_file})")
    for name in ("stdout", "stderr"):
        text = getattr(r, name)
        if text:
            parts.append(f"<kernelexec-{name}>\n{esc(text.rstrip())}\n</kernelexec-{name}>")
            path = getattr(r, f"{name}_file")
            if path:
                parts.append(f"(whole {name} in {path})")
    if r.error:
        tb = "\n".join(r.traceback[-30:]) if r.traceback else ""
        parts.append(f"<kernelexec-error>\n{esc(r.error)}\n{esc(tb)}\n</kernelexec-error>".replace("\n\n</", "\n</"))
    for ref in r.outputs:
        parts.append(f"output {ref.mime_type} ({ref.size:,} bytes): {ref.uri}")
    return "\n".join(parts)

"""No call does work proportional to what a kernel can create.

A session's code fills its working directory with 200,000 files; ``resources/list`` through a real
MCP client must stay bounded, must not hold the event loop (another session's ``1+1`` answers
meanwhile), and must say the listing is partial.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from .conftest import make_settings, serving
from .support import http_server
from .test_hostile_kernel import SENDER
from .test_tasks import Raw

pytestmark = pytest.mark.anyio

FILES = 200_000
FILL = f"""
import os
here = os.open(".", os.O_RDONLY)
for i in range({FILES}):
    os.close(os.open(f"f{{i:06d}}.txt", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=here))
os.symlink("f000000.txt", "zz-link.txt")
os.mkdir("zz-dir.txt")
result = len(os.listdir("."))
"""


async def test_listing_a_working_directory_of_200k_files_is_bounded_and_off_the_loop(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp)) as h:
        crowded = await h.new_session()
        other = await h.new_session()
        t0 = time.monotonic()
        filled = await h.run(FILL, session=crowded, timeout=600)
        while filled["ending"] == "running":  # past the call's yield (40 s): an aged ext4 creates 200k files slowly
            filled = (await h.call("get_run", run_id=filled["run_id"], wait_s=60)).structured_content
        print(f"fill {time.monotonic() - t0:.1f} s")
        assert filled["success"], (filled["error"], filled["traceback"][-5:])
        assert int(filled["result"]) >= FILES
        await h.run("1+1", session=other)  # warm

        # the loop's longest stall while the listing runs, and another session's call meanwhile
        stalls: list[float] = []  # the current round's
        longest: list[float] = []  # each round's longest stall
        timings: dict[str, float] = {}
        listed: list[object] = []
        done = anyio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await anyio.sleep(0.01)
                now = time.monotonic()
                stalls.append(now - last)
                last = now

        async def listing() -> None:
            start = time.monotonic()
            answer = (await h.client.list_resources()).resources
            listed[:] = answer
            timings["list"] = time.monotonic() - start

        async def quick() -> None:
            start = time.monotonic()
            answer = await h.run("1+1", session=other)
            timings["quick"] = time.monotonic() - start
            assert answer["result"] == 2

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(3):  # a few rounds: one may land before or after the other
                async with anyio.create_task_group() as pair:
                    pair.start_soon(listing)
                    await anyio.sleep(0.02)
                    pair.start_soon(quick)
                assert timings["list"] < 2.0, timings  # bounded work (was ~1.7 s of lstat on 200k entries, unbounded)
                assert timings["quick"] < 1.5, timings
                longest.append(max(stalls, default=0.0))
                stalls.clear()
            done.set()
        print(f"timings {timings}, each round's longest loop stall {longest}")
        # a listing that holds the loop stalls it in every round (~1.7 s each, before); a machine busy with other
        # tests' processes may not run this one for a moment once in a while (1.23 s once in a full CI pass): the
        # middle round of the three is the listing's
        assert sorted(longest)[1] < 0.5, f"event loop stalled {longest} s"

        uris = [str(r.uri) for r in listed]
        work = [u for u in uris if f"/sessions/{crowded}/work/" in u]
        assert 0 < len(work) <= 200
        assert not any("zz-link" in u or "zz-dir" in u for u in uris)  # links and directories never listed
        notebook = next(r for r in listed if str(r.uri) == f"kernelexec://sessions/{crowded}/notebook.ipynb")
        assert "more than 5,000 entries" in (notebook.description or ""), notebook.description
        crowded_file = next(r for r in listed if f"/sessions/{crowded}/work/" in str(r.uri))
        assert "newest 200" in (crowded_file.description or "")
        # the other session's listing says nothing of the sort
        quiet = next(r for r in listed if str(r.uri) == f"kernelexec://sessions/{other}/notebook.ipynb")
        assert "entries" not in (quiet.description or "")
        # a listed file is readable, and so is one that was not listed, by name
        assert (await h.client.read_resource(work[0])).contents is not None
        unlisted = next(f"f{i:06d}.txt" for i in range(FILES) if f"kernelexec://sessions/{crowded}/work/f{i:06d}.txt" not in uris)
        assert (await h.client.read_resource(f"kernelexec://sessions/{crowded}/work/{unlisted}")).contents is not None


async def test_a_small_directory_lists_newest_first_and_says_when_it_cut(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp)) as h:
        s = await h.new_session()
        made = await h.run(
            "import os, time\n"
            "for i in range(250):\n"
            "    open(f'n{i:03d}.csv', 'w').close()\n"
            "    os.utime(f'n{i:03d}.csv', (1_000_000 + i, 1_000_000 + i))\n"
            "open('.hidden', 'w').close()\n",
            session=s,
        )
        assert made["success"], made
        listed = (await h.client.list_resources()).resources
        work = [r for r in listed if f"/sessions/{s}/work/" in str(r.uri)]
        assert [r.name for r in work] == [f"n{i:03d}.csv" for i in range(249, 49, -1)]  # the newest 200, newest first
        assert all("newest 200 of its 250 files" in (r.description or "") for r in work)
        assert work[0].size == 0 and work[0].mime_type == "text/csv"


async def test_list_variables_of_a_namespace_of_200k_names_is_bounded(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp)) as h:
        s = await h.new_session()
        await h.run("globals().update({f'v{i:06d}': i for i in range(200_000)})\nlast = 'x'", session=s)
        start = time.monotonic()
        result = await h.call("list_variables", session=s)
        took = time.monotonic() - start
        assert not result.is_error, result.content
        variables = result.structured_content["variables"]
        assert len(variables) == 1000 and (variables[0]["name"], variables[0]["type"], variables[0]["repr"]) == ("v000000", "int", "0")
        assert "the first 1,000 of 200,001 variables" in result.content[0].text
        assert took < 20, took
        small = await h.new_session()
        await h.run("a = [1, 2]", session=small)
        plain = await h.call("list_variables", session=small)
        assert [v["name"] for v in plain.structured_content["variables"]] == ["a"] and "first" not in plain.content[0].text


READ_ONE = r"""
import sys, httpx2
url, token, uri = sys.argv[1:4]
meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "reader", "version": "0"}}
body = {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": uri, "_meta": meta}}
headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "resources/read", "Mcp-Name": uri}
with httpx2.Client(timeout=120) as http:
    reply = http.post(url, json=body, headers=headers)
    print(reply.status_code, len(reply.content), reply.text[:400])
"""


@pytest.mark.slow
async def test_reading_a_big_output_file_as_a_resource_does_not_hold_other_sessions(short_tmp: Path) -> None:
    """A cell sends 70 MiB of stdout past its answer's cap in a second; the server keeps the stream whole in
    outputs/…-stdout.txt, a files/ resource. Eight reads of it at once (eight reader processes, one token) held the
    server's event loop while their answers were encoded: another session's `1 + 1` took 4.4–5.6 s (0.05 s before)
    and the server grew ~585 MB. A files/ resource is capped as a work/ one is (10 MiB), with a clear refusal; judged
    from outside, by the other session's latency (found by a red-team pass)."""
    token = "scale-token-0123456789abcdef"
    (short_tmp / "scale-tokens").write_text(token + "\n")
    with http_server(short_tmp / "scale-big", "--auth-token-file", str(short_tmp / "scale-tokens")) as url:
        client = Raw(url, token, tasks=False, elicitation=False)
        other = (await client.call("new_session"))["structuredContent"]["session"]
        await client.call("execute_code", code="1", session=other)
        hostile = (await client.call("new_session"))["structuredContent"]["session"]
        await client.call("execute_code", code=SENDER, session=hostile)
        flood = ("chunk = 'x' * (1 << 20)\nfor i in range(70):\n    _k.session.send(_k.iopub_socket, 'stream', "
                 "{'name': 'stdout', 'text': chunk}, parent=_k.get_parent('shell'))\nprint('end')")
        flooded = (await client.call("execute_code", code=flood, session=hostile, timeout=300))["structuredContent"]
        assert Path(flooded["stdout_file"]).stat().st_size > 60_000_000, flooded["stdout_file"]  # kept up to 64 MB
        uri = f"kernelexec://sessions/{hostile}/files/{Path(flooded['stdout_file']).name}"
        readers = [subprocess.Popen([sys.executable, "-c", READ_ONE, url, token, uri], stdout=subprocess.PIPE, text=True)
                   for _ in range(8)]
        latencies: list[float] = []
        try:
            while any(r.poll() is None for r in readers):
                started = time.monotonic()
                assert (await client.call("execute_code", code="1 + 1", session=other))["structuredContent"]["result"] == 2
                latencies.append(time.monotonic() - started)
        finally:
            said = [r.communicate(timeout=120)[0] for r in readers]
        assert latencies and max(latencies) < 2.0, f"another session's 1 + 1 took {max(latencies):.1f} s during the reads"
        assert all("resources serve at most 10,485,760" in s for s in said), said[0]

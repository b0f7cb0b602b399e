"""Installing a small wheel into a session: cold (nothing cached) and again from the shared cache.

    python -m benchmarks --only packages [--quick]      (or: python -m benchmarks.packages [--quick])

A real PEP 503 index on 127.0.0.1 (``tests.support.package_index``) serves a ~200 KB pure-Python
wheel under a new name each round, so the cold install really downloads it; the cached install
asks for the same wheel in another session (its overlay is its own, the download cache is shared).
Both go through the ``install_packages`` tool in memory, pip running outside the sandbox, and end
with the package importable in the live kernel. pip's own configuration is switched off.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # ``python benchmarks/packages.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from benchmarks.common import call, in_memory, log, make_settings, short_tmp
from benchmarks.stats import Measurement, table


async def bench_packages(plan: object, base: Path, out: list[Measurement]) -> None:
    from tests.support import build_wheel, package_index

    rounds = 3 if getattr(plan, "quick", False) else 8
    log(f"[packages] install a ~200 KB wheel: {rounds} cold, {rounds} from the shared cache")
    os.environ["PIP_CONFIG_FILE"] = os.devnull
    body = "DATA = " + repr("x" * 200_000) + "\n"
    wheels = Path(tempfile.mkdtemp(prefix="kxbw", dir=base))
    files = [build_wheel(wheels, f"kxbench{i}", "1.0", body) for i in range(rounds)]
    cold, cached = [], []
    with package_index(wheels / "root", files) as url:
        async with in_memory(make_settings(base, index_url=url, pool_size=0)) as (client, _):
            for i in range(rounds):
                first = (await call(client, "new_session"))["session"]
                second = (await call(client, "new_session"))["session"]
                for handle, into in ((first, cold), (second, cached)):
                    answer = await call(client, "install_packages", packages=[f"kxbench{i}"], session=handle)
                    into.append(answer["duration_ms"])
                    check = await call(client, "execute_code", code=f"import kxbench{i}\nlen(kxbench{i}.DATA)", session=handle)
                    assert check["result"] == 200_000, check
                for handle in (first, second):
                    await call(client, "close_session", session=handle)
    out.append(Measurement("install: a 200 KB wheel, cold (downloaded)", "ms", cold))
    out.append(Measurement("install: the same wheel in another session (shared cache)", "ms", cached,
                           baseline="install: a 200 KB wheel, cold (downloaded)"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.packages")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    async def run() -> list[Measurement]:
        out: list[Measurement] = []
        with short_tmp() as base:
            await bench_packages(args, base, out)
        return out

    print(table(anyio.run(run)))


if __name__ == "__main__":
    main()

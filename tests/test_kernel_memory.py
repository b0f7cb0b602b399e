"""What a kernel loads at start that no client can use: ipykernel's debugger (debugpy, ~130 modules, ~7 MB PSS)
is kept out while ipykernel starts, in every profile; a trusted cell may still import debugpy itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import make_settings, serving

pytestmark = pytest.mark.anyio

PROBE = """\
import sys
loaded = sorted(m for m, mod in list(sys.modules.items()) if mod is not None and m.split(".")[0] in ("debugpy", "_pydevd_bundle", "pydevd"))
result = {"loaded": loaded, "debugger": bool(getattr(get_ipython().kernel, "debugger", None))}
"""


@pytest.mark.parametrize("profile", ["trusted", "standard"])
async def test_no_debugger_is_loaded_at_start_and_trusted_may_import_debugpy(short_tmp: Path, profile: str) -> None:
    async with serving(make_settings(short_tmp, pool_size=0, warm_imports=[], profile=profile)) as h:
        r = await h.run(PROBE)
        assert r["success"], r
        assert r["result"] == {"loaded": [], "debugger": False}, r["result"]
        r = await h.run("import debugpy\nresult = debugpy.__name__")
        if profile == "trusted":
            assert r["success"] and r["result"] == "debugpy", r
        else:
            assert r["error_type"] == "ImportError", r

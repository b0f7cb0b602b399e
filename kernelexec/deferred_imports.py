"""Third-party import-time work kernelexec's processes defer until something needs it.

``jsonschema`` (imported by nbformat, the MCP SDK and jupyter_events) imports ``rfc3987_syntax`` for its ``iri``
format checker as it loads, and that package compiles ~35 Earley grammars at import: 1.3-1.8 s of CPU in every
server, CLI and JupyterLab process here, for a format none of their schemas uses (python-jsonschema/jsonschema#1428;
rfc3987-syntax 1.1.0 is the last release). It is installed wherever ``jsonschema[format-nongpl]`` is (JupyterLab's
jupyter_events asks for it). A stand-in module takes its place until its checker is first called, then the real one
is imported and answers: the ``iri`` checks behave as before, only their grammar is built when first used. (One
difference: a broken install of it, which jsonschema's import used to skip quietly, now fails the first iri check.)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

IRI_MODULE = "rfc3987_syntax"


def defer_iri_grammar() -> None:
    """Put the stand-in in ``sys.modules`` when the real module is installed and not yet imported."""
    if IRI_MODULE in sys.modules:
        return  # already paid for
    spec = importlib.util.find_spec(IRI_MODULE)
    if spec is None:
        return  # not installed: jsonschema registers no iri checker, as before
    stand_in = _StandIn(IRI_MODULE)
    # what is known without running it: find_spec(name) answers from sys.modules, a submodule's import needs __path__
    stand_in.__spec__ = spec
    stand_in.__file__ = spec.origin
    if spec.submodule_search_locations is not None:
        stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules[IRI_MODULE] = stand_in


class _StandIn(types.ModuleType):
    """Imports the real module at the first use of any of its names and hands that use to it."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "stands in for the real module until first use (kernelexec.deferred_imports)")
        self._lock = threading.Lock()
        self._real: types.ModuleType | None = None

    def real(self) -> types.ModuleType:
        with self._lock:
            if self._real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                try:
                    self._real = importlib.import_module(self.__name__)
                except BaseException:
                    sys.modules.setdefault(self.__name__, self)  # the next use tries again
                    raise
            return self._real

    def is_valid_syntax(self, term: str, value: str) -> Any:
        """The one name jsonschema imports (``from rfc3987_syntax import is_valid_syntax``)."""
        return self.real().is_valid_syntax(term, value)

    def __getattr__(self, name: str) -> Any:
        if name == "__all__":  # ``from rfc3987_syntax import *``: the real module's public names (it has no __all__)
            real = self.real()
            return getattr(real, "__all__", [n for n in dir(real) if not n.startswith("_")])
        if name.startswith("__") and name.endswith("__") and name != "__version__":
            raise AttributeError(name)  # probes (inspect, importlib, copy) do not load the module
        return getattr(self.real(), name)

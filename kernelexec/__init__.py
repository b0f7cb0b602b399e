"""kernelexec: a stateful, sandboxed Jupyter-kernel code executor served over MCP."""

from kernelexec.deferred_imports import defer_iri_grammar

__version__ = "0.1.0"

defer_iri_grammar()  # before anything imports jsonschema: 1.3-1.8 s of CPU off every kernelexec process's start

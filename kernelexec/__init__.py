"""kernelexec: a stateful, sandboxed Jupyter-kernel code executor served over MCP."""

__version__ = "0.1.0"

"""kernelexec benchmarks: ``python -m benchmarks`` (latency/memory table) and ``python -m benchmarks.soak``."""

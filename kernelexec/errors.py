"""kernelexec's exceptions.

    KernelexecError
    ├── SessionError          unknown, closed or over-limit session handles
    ├── InvalidRequest        bad tool input (oversized code, NUL bytes, timeout out of range, bad paths)
    ├── KernelError           the kernel could not be started or kept alive
    │   ├── KernelStartError
    │   └── KernelDied        the kernel process went away while a reply was awaited
    └── SandboxUnavailable    the profile's OS boundary cannot be built on this machine

User code raising is not an error of ours: it is a normal result (``Execution.error``).
The MCP layer turns these into tool errors the model can act on.
"""

from __future__ import annotations


class KernelexecError(Exception):
    """Base class for failures the model can understand and often fix."""


class SessionError(KernelexecError):
    """A session handle is unknown or closed, or no more sessions may be opened."""

    @classmethod
    def unknown(cls, handle: str) -> SessionError:
        return cls(f"unknown session {handle!r}: it was never opened here or has been closed; "
                   "omit `session` to use the default session, or call new_session")

    @classmethod
    def limit(cls, limit: int) -> SessionError:
        return cls(f"session limit reached ({limit} live sessions); close one with close_session or wait for idle ones to be reaped")


class SessionBusy(SessionError):
    """The session's lock was not free within the wait a caller allows (an upload's): nothing was done."""


class InvalidRequest(KernelexecError, ValueError):
    """The tool was called with input we refuse before touching a kernel."""


class KernelError(KernelexecError):
    """The kernel failed in a way that is not the user's code raising."""


class KernelStartError(KernelError):
    """A kernel did not start, or started without its policy installed."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\nkernel log:\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail

    def __reduce__(self):  # keep picklable with the extra attribute
        return (type(self), (self.args[0].split("\nkernel log:")[0], self.log_tail))


class SandboxUnavailable(KernelexecError):
    """strict/standard asked for, but neither Landlock nor bubblewrap works here."""


class KernelDied(KernelError):
    """The kernel process is gone while a reply was awaited; the message says how it ended."""

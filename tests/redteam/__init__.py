"""Red team: escape attempts through ``execute_code``, judged by their side effects, not by error messages.

Written as an attacker would: every payload runs in the ``standard`` and the ``strict`` profile, from two
attacker sessions at once (see runner.py):

* **guard** mode: the payload as a cell, behind the in-kernel guard. Under strict too it reaches modules
  the attacker's way (``().__class__.__base__.__subclasses__()`` -> ``os._wrap_close`` globals -> ``sys``;
  ``sys.modules``; the real ``__import__`` out of the guard's own closure).
* **os** mode: first switches the guard off (ctypes.memmove over the audit hook's closure cells, found
  through a refusal's traceback frame -> ``f_frame->f_func``; and the guard module's event sets, reachable
  as ``sys.modules['_kernelexec_guard']``), then runs the payload in a sub-interpreter (no audit hooks at
  all), or in the main interpreter for fork/zmq/IPython payloads. This is the OS layers alone.

The outside world is watched from the host (world.py): canary files under /tmp and /var/tmp with inotify
(any open/read/write/create by any process), a ``--read-dirs`` canary that must never change,
TCP/TCP6/UDP/DNS(127.0.0.1:53 and 127.0.0.53:53)/pathname-unix/abstract-unix listeners that must receive nothing, signal
handlers in this process (= the server, in-memory harness), secrets in the server's environment and
memory and in session B (its file, its variable, its HMAC key) that must appear in no answer, a marker a
spawned process would write in the attacker's own directory, the kernels' /proc status/limits/namespaces
and cgroup files, the host's hostname.

Layout: one ``test_<category>.py`` per category of attack; common.py (the attacked servers, one attack and
its judgement), conftest.py (the ``world`` and ``targets`` fixtures, one of each for the whole package),
runner.py (how a payload becomes a cell), world.py (the watched outside world). The tally of payloads,
attempts and escapes per category is in docs/security.md ("Red-team tally"), nowhere else.
"""

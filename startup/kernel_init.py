"""Runs first in every kernelexec kernel, before any user code (``IPKernelApp.exec_files``).

ipykernel runs this file again after every restart. It reads the session policy from the
``KERNELEXEC_POLICY`` environment variable (then removes it), installs the guard and the
runtime, and fails closed: if anything here raises, the kernel exits and the server reports it.
"""


def _kernelexec_boot() -> None:
    """The kernel's boot, in order: policy, runtime, guard, then what may come only after the guard.

    Any exception in any step ends the kernel (exit code 70): every step runs inside the one ``try``
    below. This file runs with the user namespace as its globals (``__name__ == '__main__'``), so once
    the guard is installed an ``import`` here would be judged as a cell's: modules are imported here,
    before the guard, and passed to the steps. The steps are deleted with this function; their
    annotations are strings, so defining them evaluates nothing outside the ``try``.
    """
    import builtins
    import importlib.util
    import json
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    names = vars(builtins)  # where cells find kernelexec's helpers (_kernelexec_report, ...)

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"_kernelexec_{name}", os.path.join(here, f"{name}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"kernelexec startup: cannot load {name}.py from {here}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        # a module without a file, for what reads loaded modules' sources (IPython's %autoreload reads every
        # one's when loaded: the guard refuses this directory to cells, and each refusal was a traceback on stderr)
        module.__file__ = None
        return module

    try:
        policy = json.loads(os.environ.pop("KERNELEXEC_POLICY"))
        for name in json.loads(os.environ.pop("KERNELEXEC_LIFT_BLOCKED", "[]")):  # kernel_main.BOOT_ONLY_BLOCKED
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821 - provided by IPython in exec_files
        guard = load("guard")
        runtime_mod = load("runtime")
        tools = load("mcp_tools")  # code mode: the user's other MCP servers, called through the server (any profile)
        sys.modules["mcp_tools"] = tools
        vars(builtins)["_kernelexec_tools_catalog"] = tools._install_catalog
        _kernelexec_link_font_cache(policy, os)  # noqa: F821 - a step below, deleted after boot
        runtime = _kernelexec_install_runtime(shell, policy, runtime_mod, names, os, sys)  # noqa: F821 - a step below, deleted after boot
        import tempfile

        tempfile.gettempdir()  # probes by writing a file: cache it before writes may be refused
        checkpoint_mod = load("checkpoint")
        checkpoints = checkpoint_mod.Checkpointer(shell, policy, bypass=None)
        checkpoints.secrets = runtime.secrets  # getpass() answers: a value holding one is never saved
        protected = load("protected")  # the old safe executor's tools, which run_python's cells keep
        runtime.keep_tools(protected)
        names[protected.REFUSE] = protected.InterpreterError
        names[protected.STAR] = protected.star_keeper(shell)
        runtime.bypass = checkpoints.bypass = guard.install(policy)
        # the checkpoint's stop of a save in progress first (never waited for), then the runtime's start of this cell
        checkpoints.watch_answers(getattr(shell, "kernel", None))  # saves start once a cell's idle status is sent
        shell.events.unregister("pre_run_cell", runtime.pre_run_cell)
        shell.events.register("pre_run_cell", checkpoints.pre_run_cell)
        shell.events.register("pre_run_cell", runtime.pre_run_cell)
        shell.events.register("post_run_cell", checkpoints.post_run_cell)  # after the runtime's: the answer first
        names["_kernelexec_checkpoint_restore"] = lambda only=None: runtime_mod._Report(checkpoints.restore(only))
        names["_kernelexec_checkpoint_reset"] = lambda: runtime_mod._Report(checkpoints.reset())
        names["_kernelexec_checkpoint_status"] = lambda: runtime_mod._Report(checkpoints.status())
        names["_kernelexec_checkpoint_pause"] = lambda: runtime_mod._Report(checkpoints.pause())
        names["_kernelexec_checkpoint_resume"] = lambda: runtime_mod._Report(checkpoints.resume())
        names["_kernelexec_checkpoint_export"] = lambda: runtime_mod._Report(checkpoints.export())
        relay_comms = getattr(getattr(shell, "kernel", None), "comm_manager", None)
        if relay_comms is not None:  # a fork's relay: the bytes as binary buffers over comm messages
            relay_comms.register_target(checkpoint_mod.COMM_TARGET, checkpoints.serve_relay)
        names["_kernelexec_checkpoint_received"] = lambda n: runtime_mod._Report(checkpoints.received(n))
        _kernelexec_after_guard(shell, policy, guard, json, os, sys)  # noqa: F821 - a step below, deleted after boot
        link_fonts = _kernelexec_link_font_cache  # noqa: F821 - a step below, deleted after boot
        _kernelexec_install_warm(policy, names, sys, lambda: link_fonts(policy, os))  # noqa: F821 - a step below, deleted after boot
        _kernelexec_install_packages(policy, runtime, runtime_mod, names, importlib, os, sys)  # noqa: F821 - a step below, deleted after boot
        names["_kernelexec_policy"] = lambda: runtime_mod._Report({"profile": policy["profile"], "active": True})
    except BaseException as exc:  # fail closed: no kernel without its policy
        if sys.__stderr__ is not None:
            sys.__stderr__.write(f"kernelexec startup failed: {exc!r}\n")
            sys.__stderr__.flush()
        os._exit(70)


def _kernelexec_link_font_cache(policy: "dict", os) -> None:
    """matplotlib's font list, prepared once by the server (read-only here), linked into this kernel's
    MPLCONFIGDIR: its first ``import matplotlib`` reads it instead of scanning the fonts. A list of another
    version is never read by this matplotlib, which then builds its own, as without one. Never fatal."""
    source, target = policy.get("font_cache"), os.environ.get("MPLCONFIGDIR")
    if not source or not target:
        return
    try:
        names = [n for n in os.listdir(source) if n.startswith("fontlist-v") and n.endswith(".json")]
        os.makedirs(target, exist_ok=True)
        for name in names:
            link = os.path.join(target, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(source, name), link)
    except OSError:  # not reachable here (a remote kernel): matplotlib builds its own
        pass


def _kernelexec_install_runtime(shell, policy: "dict", runtime_mod, names: "dict", os, sys):
    """Before the guard: figure formats, the runtime's hooks (stream caps, cell events, AST transformer,
    traceback trimming) and its builtins. Returns the runtime, whose ``bypass`` the guard sets next."""
    formats = policy.get("figure_formats")
    if formats:
        # a list: the magic line is expanded first, and braces would be read as {expression}
        shell.run_line_magic("config", f"InlineBackend.figure_formats = {list(formats)!r}")
    runtime = runtime_mod.Runtime(shell, policy, bypass=None)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "pub_thread"):
            runtime.cap_stream(stream)
    shell.events.register("pre_run_cell", runtime.pre_run_cell)
    shell.events.register("post_run_cell", runtime.post_run_cell)
    names["_kernelexec_report"] = runtime.report
    names["_kernelexec_note"] = runtime.note
    names["_kernelexec_if"] = runtime.note_if
    shell.ast_transformers.append(runtime.transformer)
    runtime_mod.hide_own_frames(shell.InteractiveTB)
    runtime_mod.format_reports_directly(shell.display_formatter)
    names["_kernelexec_variables"] = runtime.variables
    names["_kernelexec_chdir"] = os.chdir
    runtime.secrets = _kernelexec_install_getpass(shell)  # noqa: F821 - a step below, deleted after boot
    return runtime


def _kernelexec_install_getpass(shell) -> "list":
    """getpass() refused by the server (kernel/stdin.py REFUSED_MARK: no way to ask this client for a secret
    without it passing through the model) raises EOFError with the server's reason, instead of returning it.
    ipykernel puts ``kernel.getpass`` in place of ``getpass.getpass`` for each cell: wrapped on the kernel.
    Returns the list of the answers it gave (the checkpoint never writes a value holding one to disk)."""
    answers: list = []
    kernel = getattr(shell, "kernel", None)
    asked = getattr(kernel, "getpass", None)
    if asked is None:
        return answers
    mark = "\x04kernelexec-refused:"

    def getpass(prompt: str = "Password: ", stream: object = None) -> str:
        value = asked(prompt, stream) if stream is not None else asked(prompt)
        if isinstance(value, str) and value.startswith(mark):
            raise EOFError(value[len(mark):])
        if isinstance(value, str) and len(value) >= 4:
            answers.append(value.encode("utf-8", "surrogatepass"))
            del answers[:-64]  # the last 64 secrets of this kernel
        return value

    kernel.getpass = getpass  # type: ignore[union-attr]
    return answers


def _kernelexec_after_guard(shell, policy: "dict", guard, json, os, sys) -> None:
    """Right after the guard: shell commands refused, the deferred ``sys.path`` entries a cell could have
    written (only now), and ``open`` refused in the user namespace for profiles without file I/O."""
    if policy.get("deny_process"):
        # `!cmd` and %system open a pty before they start anything: say the guard's words, not "out of pty devices"
        def no_shell(cmd: object) -> None:
            raise guard.PolicyError(f"running shell commands (!{str(cmd)[:60]}) is not allowed in the "
                                    f"{policy['profile']!r} profile (kernelexec policy)")

        shell.system = shell.system_piped = shell.system_raw = no_shell
        shell.getoutput = no_shell
    # what a cell could have written is importable only now, after the guard (kernel_main.setup_path),
    # and the working directory ('' on sys.path) where IPython would have put it (ignore_cwd deferred it)
    sys.path.extend(p for p in json.loads(os.environ.pop("KERNELEXEC_LATE_PATH", "[]")) if p not in sys.path)
    if "" not in sys.path:
        at = next((i for i, p in enumerate(sys.path) if os.path.basename(p) in ("site-packages", "dist-packages")), 0)
        sys.path.insert(at, "")
    if policy.get("file_io") == "none":
        def deny_open(info: object) -> None:
            guard.deny_open_in(shell.user_ns, policy["profile"])

        deny_open(None)
        shell.events.register("pre_run_cell", deny_open)


def _kernelexec_install_warm(policy: "dict", names: "dict", sys, link_fonts) -> None:
    """``_kernelexec_warm``: warm kernels import the data stack ahead, through the guard like a cell. The font
    list is linked again first: a pooled kernel of a new install may have booted before the server had built it."""
    def warm() -> list:
        """Import the data stack ahead (warm kernels: pool, spares); whatever is missing is skipped."""
        link_fonts()
        done = []
        for name in policy.get("warm_imports", ()):
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - not installed, or refused by the profile
                continue
            done.append(name)
        if "matplotlib.pyplot" in done:
            try:  # the font cache, the renderers and the inline formatters: a first figure, formatted as a cell's is
                first_figure(sys.modules["matplotlib.pyplot"], sys.modules.get("pandas"))
            except Exception:  # noqa: BLE001
                pass
        return done

    def first_figure(plt, pandas) -> None:
        """A user's first plot is mostly a DataFrame's: its first ``DataFrame.plot`` imports pandas' plotting
        backend (and importlib.metadata, for its entry points), and the inline backend formats a figure with
        ``bbox_inches='tight'`` through IPython's display formatter: both done here once, then closed."""
        if pandas is not None:
            fig = pandas.DataFrame({"x": [0, 1], "y": [0, 1]}).plot(x="x", y="y").figure
        else:
            fig = plt.figure(figsize=(1, 1))
            fig.gca().plot([0, 1])
        try:  # every figure format, with the inline backend's own arguments
            sys.modules["IPython"].get_ipython().display_formatter.format(fig)
        finally:
            plt.close(fig)

    names["_kernelexec_warm"] = warm


def _kernelexec_install_packages(policy: "dict", runtime, runtime_mod, names: "dict", importlib, os, sys) -> None:
    """``_kernelexec_packages_added``: the session's package overlay made importable, run once now
    (after the guard, whose ``allow_more`` it takes out of the policy) and again after each install."""
    packages = policy.get("packages_dir")
    allow_more = policy.pop("_allow_more", None)

    def packages_added():
        """The server installed into the session's overlay (read-only here): make it importable now."""
        with runtime.bypass():  # our own look at a server-written directory, under any profile
            entries = os.listdir(packages) if packages and os.path.isdir(packages) else None
        if entries is None:
            return runtime_mod._Report({"modules": []})
        if packages not in sys.path:
            sys.path.append(packages)  # after the environment's own site-packages: the environment wins
        names = []
        for entry in entries:
            if entry.startswith((".", "_")) or entry.endswith((".dist-info", ".data", ".egg-info")) or entry == "bin":
                continue
            name = entry.split(".")[0]
            if name.isidentifier():
                names.append(name)
        if allow_more is not None:
            allow_more(names)
        importlib.invalidate_caches()
        return runtime_mod._Report({"modules": sorted(set(names))})

    packages_added()
    names["_kernelexec_packages_added"] = packages_added


_kernelexec_boot()
del _kernelexec_boot, _kernelexec_link_font_cache, _kernelexec_install_runtime, _kernelexec_install_getpass, _kernelexec_after_guard, _kernelexec_install_warm
del _kernelexec_install_packages

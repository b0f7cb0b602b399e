"""The ``kernelexec`` command: serve, exec, config.

Every setting in ``config.Settings`` is also a flag here, generated from the model, so ``--help``
always shows the real defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator, Set
from typing import TYPE_CHECKING, Any

from kernelexec import __version__
from kernelexec.errors import KernelexecError
from kernelexec.terminal import install_excepthook, install_logging, safe

if TYPE_CHECKING:  # imported where used: `kernelexec hook` runs on every tool call and needs no settings (~0.18 s)
    from kernelexec.config import Settings

# Settings that belong to one command only.
_SERVE_ONLY = {"transport", "host", "port", "metrics_port"}


def _add_settings_flags(parser: argparse.ArgumentParser, skip: Set[str] = frozenset()) -> None:
    from kernelexec.config import Settings

    group = parser.add_argument_group("settings (also KERNELEXEC_<NAME> environment variables or a TOML file)")
    defaults = Settings.model_construct()
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        aliases = {"read_dirs": ["--read-dir"], "work_roots": ["--work-root"]}.get(name, [])
        default = getattr(defaults, name, None) if field.default_factory is None else field.default_factory()  # type: ignore[call-arg]
        shown: Any
        if isinstance(default, list):
            shown = ",".join(map(str, default)) or "none"
        else:
            shown = default
        help_text = f"{field.description} (default: {shown})"
        choices = getattr(field.annotation, "__args__", None)
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        if choices and all(isinstance(c, str) for c in choices):
            kwargs["choices"] = list(choices)
        if field.annotation in (bool, bool | None):
            kwargs["action"] = argparse.BooleanOptionalAction
        if name == "secret":  # --secret A=@a --secret B=@b
            kwargs["action"] = "append"
            kwargs["metavar"] = "NAME=@FILE"
        group.add_argument(flag, *aliases, **kwargs)


def _settings(args: argparse.Namespace) -> Settings:
    from kernelexec.config import Settings, load_settings

    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        return load_settings(**overrides)
    except Exception as exc:  # pydantic ValidationError: say which setting is wrong, no traceback
        sys.exit(safe(f"kernelexec: invalid configuration: {exc}"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelexec",
        description="A stateful, sandboxed Jupyter-kernel Python executor served over MCP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kernelexec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve MCP over stdio (default) or streamable HTTP at /mcp")
    _add_settings_flags(serve)

    execute = sub.add_parser("exec", help="run code once through the same session path; print execute_code's JSON")
    execute.add_argument("code", help="Python code, or - to read it from stdin")
    execute.add_argument("--timeout", dest="call_timeout", type=float, default=None, help="per-call timeout in seconds (default: --default-timeout)")
    execute.add_argument("--cwd", dest="call_working_dir", default=None, help="working_dir for the call (default: the session's)")
    _add_settings_flags(execute, skip=_SERVE_ONLY)

    config = sub.add_parser("config", help="print the effective configuration as JSON")
    _add_settings_flags(config)

    doctor = sub.add_parser("doctor", help="show which isolation layers this machine supports and each profile uses")
    _add_settings_flags(doctor)

    replay = sub.add_parser("replay", help="run a recorded notebook again in a fresh kernel under its profile; compare outputs (exit 1 if any differ)")
    replay.add_argument("notebook", help="a notebook, or a session directory (rebuilt from its journal when needed)")
    replay.add_argument("--output", "-o", default=None, help="write the replayed notebook here")
    replay.add_argument("--install", action="store_true",
                        help="redo the installs the notebook records (its %%pip lines and install markers), from your "
                        "index and within --install-policy; without it they are listed, not done: a cell with pip lines "
                        "is skipped (a notebook from elsewhere must not make your pip ask your index for names it chose)")
    replay.add_argument("--ask", action="store_true",
                        help="ask a cell's input()/getpass() on this terminal instead of answering it from the "
                        "notebook's recorded answers (a password is recorded as *** and is never replayed)")
    replay.add_argument("--live-tools", action="store_true",
                        help="code mode: call the live MCP servers (--tools-config) for a cell's mcp_tools calls instead of "
                        "serving the notebook's recorded results; a differing result shows in the comparison")
    _add_settings_flags(replay, skip=_SERVE_ONLY)  # --profile: default the one the notebook was recorded under

    lab = sub.add_parser("lab", help="JupyterLab (or Jupyter Server) on 127.0.0.1 with the live session kernels attached")
    lab.add_argument("--port", dest="lab_port", type=int, default=None, help="port (default: the first free one from 8888)")
    lab.add_argument("--no-browser", dest="open_browser", action="store_false", help="do not open a browser")
    _add_settings_flags(lab, skip=_SERVE_ONLY)

    from kernelexec import hook as _hook  # stdlib only

    hook = sub.add_parser("hook", help="Claude Code hook of the kernelexec-code-only plugin: denies every tool but "
                          "kernelexec's (reads the event JSON on stdin)")
    _hook.add_arguments(hook)
    return parser


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except BrokenPipeError:  # `kernelexec config | head`: the reader left; no traceback (Python's own advice)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush of stdout must not fail again
        sys.exit(1)


def _main(argv: list[str] | None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["hook"]:  # the hook runs on every tool call: no settings, no heavy imports
        from kernelexec import hook
        hook_parser = argparse.ArgumentParser(prog="kernelexec hook")
        hook.add_arguments(hook_parser)
        sys.exit(hook.run(hook_parser.parse_args(args_in[1:])))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        sys.exit(2)
    if args.command == "hook":  # before settings: a bad KERNELEXEC_* variable must not stop the hook
        from kernelexec.hook import run as run_hook

        sys.exit(run_hook(args))
    settings = _settings(args)
    raise_open_files_limit()
    install_excepthook()
    install_logging(logging.WARNING, sys.stderr)  # every log line escaped: kernels and notebooks write into them
    if settings.tools_config:  # code mode: every brokered tool call is a log line (server, tool, arguments, outcome, time)
        logging.getLogger("kernelexec.codemode.broker").setLevel(logging.INFO)
    if args.command == "config":
        print(json.dumps(settings.model_dump(mode="json"), indent=2))
        return
    if args.command == "lab":
        try:
            from kernelexec.lab.app import lab_command
        except ImportError as exc:
            sys.exit(safe(f"kernelexec lab needs Jupyter Server ({exc}): pip install 'kernelexec[lab]'"))
        sys.exit(lab_command(settings, port=args.lab_port, open_browser=args.open_browser))
    from kernelexec.doctor import preflight, report

    if args.command == "doctor":
        print(safe(report(settings)))
        return
    if args.command in ("serve", "exec") and settings.secret:  # read once, now: a missing file stops the start
        from kernelexec.config import secret_env

        try:
            secret_env(settings)
        except ValueError as exc:
            sys.exit(safe(f"kernelexec: {exc}"))
    try:
        for warning in preflight(settings):
            logging.getLogger("kernelexec").warning(warning)
        if settings.tools_config and args.command in ("serve", "exec"):
            from kernelexec.codemode.broker import from_settings

            from_settings(settings)  # a tools config a kernel could have written is refused before anything starts
    except KernelexecError as exc:
        sys.exit(safe(f"kernelexec: {exc}"))
    if args.command == "serve":
        from kernelexec.config import state_keys

        try:
            state_keys(settings)  # a fleet's key file: refused in one line before anything starts
        except ValueError as exc:
            sys.exit(safe(f"kernelexec: {exc}"))
    if args.command == "serve" and settings.transport == "http":
        from kernelexec.server.auth import LOOPBACK, load_tokens

        try:
            tokens = load_tokens(settings)
        except KernelexecError as exc:
            sys.exit(safe(f"kernelexec: {exc}"))
        if settings.host not in LOOPBACK and not tokens:
            sys.exit(safe(f"kernelexec: refusing to listen on {settings.host} without authentication; "
                     "set --auth-token / KERNELEXEC_AUTH_TOKEN or --auth-token-file, or bind 127.0.0.1"))
    if args.command == "serve":
        listens = [(settings.host, settings.port, "--port")] if settings.transport == "http" else []
        if settings.metrics_port is not None:
            listens.append(("127.0.0.1", settings.metrics_port, "--metrics-port"))
        for host, port, flag in listens:
            problem = _cannot_listen(host, port)
            if problem:  # else uvicorn logs it, exits with SystemExit(3) inside the task groups: a 70-line traceback
                sys.exit(safe(f"kernelexec: cannot listen on {host}:{port}: {problem} (another server on that port? "
                              f"choose another {flag})"))
    import anyio

    from kernelexec.session.fleet import FleetRefused
    from kernelexec.store import StoreError

    try:  # a store that cannot be opened, or a fleet that refuses this server: one line saying why, no traceback
        if args.command == "serve":
            anyio.run(_serve, settings)
        elif args.command == "exec":
            code = sys.stdin.read() if args.code == "-" else args.code
            sys.exit(anyio.run(_exec, settings, code, args.call_timeout, args.call_working_dir))
        elif args.command == "replay":
            from kernelexec.session.replay_cli import replay_command

            sys.exit(anyio.run(lambda: replay_command(settings, args.notebook, output=args.output, profile=args.profile,
                                                         install=args.install, ask=args.ask, live_tools=args.live_tools)))
    except (StoreError, FleetRefused) as exc:
        sys.exit(safe(f"kernelexec: {exc}"))


def _cannot_listen(host: str, port: int) -> str | None:
    """Why a listener on ``host:port`` cannot be opened now (a port in use, a host not of this machine), or None: a
    trial bind with the options uvicorn's own uses, before any kernel starts. A name that does not resolve is left to
    uvicorn to report."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def raise_open_files_limit() -> int:
    """Lift this process's soft limit of open files to its hard limit (as servers do; the sandbox gives each
    kernel its own ``--max-open-files``); returns the limit now in force. A server holds about 15 descriptors
    per session (its kernel's sockets, log and record; docs/operator.md): the common soft limit of 1,024 would
    turn some 65th session into ``EMFILE``."""
    import resource

    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == infinity or (hard != infinity and soft >= hard):
        return soft
    wanted = hard if hard != infinity else max(soft, 1 << 20)  # Linux's fs.nr_open is 1,048,576 by default
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return wanted


async def _serve(settings: Settings) -> None:

    from kernelexec.sandbox.plan import describe_layers, plan_for
    from kernelexec.session.manager import SessionManager

    layers = plan_for(settings, settings.effective_profile, session_dir=settings.sessions_dir, rw=[], ro=[],
                      cwd=settings.sessions_dir, key="serve").layers
    print(safe(f"kernelexec {__version__}: profile {settings.effective_profile}, layers {describe_layers(layers)} "
               "(kernelexec doctor for details)"), file=sys.stderr)
    from kernelexec import tracing

    if tracing.configure():  # the OTEL_* variables ask for OTLP traces (docs/metrics.md: Traces)
        print(safe("kernelexec: traces exported over OTLP/HTTP (OTEL_* variables)"), file=sys.stderr)
    sessions = SessionManager(settings)
    try:
        await _serve_with(settings, sessions)
    finally:
        tracing.shutdown()


async def _serve_with(settings: Settings, sessions: Any) -> None:
    import anyio

    from kernelexec.server.build import build_server
    from kernelexec.server.drain import Drain

    async with sessions.running(), anyio.create_task_group() as tg:
        from kernelexec.server.metrics import Metrics

        metrics = Metrics()
        drain = Drain(notice=settings.drain_notice, timeout=settings.drain_timeout)
        server = build_server(settings, sessions, metrics=metrics, drain=drain)
        metrics_server = _metrics_server(metrics, settings.metrics_port) if settings.metrics_port is not None else None
        if metrics_server is not None:
            tg.start_soon(metrics_server.serve)
        if settings.transport == "stdio":
            from kernelexec.server.stdio_pipes import run_stdio

            if sys.stdin.isatty():  # started by hand in a terminal: say what it waits for
                print(safe("kernelexec: an MCP server over stdio, waiting for a client on standard input (an MCP client "
                           "starts it; to try it by hand: kernelexec exec \"print(1)\"); Ctrl-C stops it"), file=sys.stderr)
            await run_stdio(server)
        else:
            print(safe(f"kernelexec: MCP over streamable HTTP at http://{settings.host}:{settings.port}/mcp"), file=sys.stderr)
            security = None
            if settings.host not in ("127.0.0.1", "localhost", "::1"):
                # DNS-rebinding protection stays on beyond loopback: only this host name is accepted
                from mcp.server.transport_security import TransportSecuritySettings

                security = TransportSecuritySettings(allowed_hosts=[f"{settings.host}:*"],
                                                     allowed_origins=[f"http://{settings.host}:*", f"https://{settings.host}:*"])
            await _serve_streamable_http(server, settings, security, drain, lambda: len(sessions.runs.unfinished()))
        if metrics_server is not None:
            metrics_server.should_exit = True  # the MCP transport ended: so does the metrics port


async def _serve_streamable_http(server: Any, settings: Settings, security: Any, drain: Any, unfinished: Any) -> None:
    """The SDK's ``run_streamable_http_async``, with its app wrapped so the Session header's check knows whether a
    request sent the header (server/session_header.py), and a SIGTERM draining the server (server/drain.py)."""
    import uvicorn

    from kernelexec.server.drain import draining_server
    from kernelexec.server.session_header import SessionHeaderSeen

    app = server.streamable_http_app(transport_security=security, host=settings.host)
    config = uvicorn.Config(SessionHeaderSeen(app), host=settings.host, port=settings.port,
                            log_level=server.settings.log_level.lower())
    await draining_server(config, drain, unfinished).serve()


def _metrics_server(metrics: Any, port: int) -> Any:
    """``--metrics-port``: a uvicorn server of /metrics on 127.0.0.1 alone, without a token."""
    import contextlib

    import uvicorn

    from kernelexec.server.metrics import loopback_app

    class Quiet(uvicorn.Server):
        """Leaves the signals to the MCP transport's server (one handler each: a second would take them)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    print(safe(f"kernelexec: Prometheus metrics at http://127.0.0.1:{port}/metrics"), file=sys.stderr)
    return Quiet(uvicorn.Config(loopback_app(metrics), host="127.0.0.1", port=port, log_level="warning", lifespan="off"))


async def _exec(settings: Settings, code: str, timeout: float | None, working_dir: str | None) -> int:
    """Run one call through a real in-memory MCP client, exactly as a client would, and print its JSON."""
    from mcp import Client

    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager

    settings = settings.model_copy(update={"pool_size": 0, "restart_spares": 0})  # one call: a pooled or spare kernel would be wasted work
    sessions = SessionManager(settings)
    async with sessions.running():
        server = build_server(settings, sessions)
        tool = "run_python" if settings.preset == "safe-executor" else "execute_code"
        arguments: dict[str, Any] = {"code": code}
        if tool == "execute_code":
            arguments |= {k: v for k, v in {"timeout": timeout, "working_dir": working_dir}.items() if v is not None}
        async with Client(server) as client:
            result = await client.call_tool(tool, arguments)
        if result.structured_content is not None:
            print(json.dumps(result.structured_content, indent=2))
            ok = result.structured_content.get("success", not result.is_error)
        else:
            print(json.dumps({"error": "".join(getattr(c, "text", "") for c in result.content)}, indent=2))
            ok = False
        return 0 if ok and not result.is_error else 1




if __name__ == "__main__":  # pragma: no cover
    main()

__all__ = ["main", "build_parser"]

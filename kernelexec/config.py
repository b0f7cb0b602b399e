"""One typed settings model for the whole server.

Precedence, highest first: command-line flags, ``KERNELEXEC_*`` environment variables, the TOML
file named by ``--config`` / ``KERNELEXEC_CONFIG``, then the defaults below.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

Profile = Literal["strict", "standard", "trusted"]
Preset = Literal["all", "plugin", "safe-executor"]
Transport = Literal["stdio", "http"]
InstallPolicy = Literal["auto", "off", "allowlist", "any"]
FigureFormat = Literal["png", "retina", "jpeg", "svg", "pdf"]

_toml_file: ContextVar[str | None] = ContextVar("kernelexec_toml_file", default=None)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelexec"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "kernelexec"


class Settings(BaseSettings):
    """Everything a deployment can set. Each field is also a ``--flag`` and a ``KERNELEXEC_`` variable."""

    model_config = SettingsConfigDict(env_prefix="KERNELEXEC_", extra="forbid", validate_default=True)

    profile: Profile = Field(
        "standard",
        description="In-kernel policy: strict (short stdlib list, no files), standard (stdlib + data stack, "
        "files in the session's directories, no subprocess/network), trusted (no guards).",
    )
    preset: Preset = Field(
        "all",
        description="Which tools to expose: all, plugin (only execute_code, like the old Claude Code plugin), "
        "safe-executor (only run_python under the strict profile).",
    )
    state_dir: Path = Field(default_factory=default_state_dir, description="Where session directories live.")
    python: str = Field(
        "auto",
        description="The kernels' Python: an executable, or a venv/conda prefix directory. auto: a .venv/venv in the "
        "working directory or its project root (pyproject.toml, setup.py, .git), then the server's VIRTUAL_ENV or "
        "CONDA_PREFIX, else kernelexec's own interpreter. Python 3.10+; the environment is never modified.",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where kernelexec keeps what it builds once, such as the ipykernel overlay for environments without ipykernel.",
    )
    warm_imports: list[str] = Field(
        default_factory=lambda: ["numpy", "pandas", "matplotlib.pyplot"],
        description="Modules warm kernels (the pool and restart spares) import ahead when installed and allowed, "
        "so a session's first plot does not pay for them; empty = none.",
    )
    figure_formats: list[FigureFormat] = Field(
        default_factory=lambda: list[FigureFormat](["png"]),
        description="The forms of each inline matplotlib figure (IPython's InlineBackend.figure_formats): png, as "
        "Jupyter gives; add svg (png,svg) for a vector form too. A cell may change it (set_matplotlib_formats).",
    )
    work_roots: list[Path] = Field(
        default_factory=list,
        description="Directories a call's working_dir may lie in (and, in standard, where files may be written). "
        "The session's own directory is always allowed.",
    )
    working_dir: Path | None = Field(
        None,
        description="Default working directory of new sessions (default: the session's own work dir; "
        "the plugin preset uses the directory the server was started in).",
    )
    read_dirs: list[Path] = Field(default_factory=list, description="Extra read-only data directories.")
    secret: list[str] = Field(
        default_factory=list,
        description="NAME=@file (repeatable): the file's contents, read once when the server starts (one trailing "
        "newline dropped), given to every local kernel of this server as the environment variable NAME: a secret the "
        "code can use and the model never sees (getpass() asks only on a page, where the client declares URL-mode "
        "elicitation). Only the name and the path are shown; the value is never printed.",
    )
    protect: list[str] = Field(
        default_factory=list,
        description="More names (glob patterns) at the top of a writable working directory that kernels may read but "
        "never change, beside the built-in ones (.git, .claude, .vscode, .idea, .mcp.json, .envrc, .venv, shell files).",
    )
    allow_imports: list[str] = Field(
        default_factory=list, description="Extra top-level modules to allow in strict/standard."
    )
    default_timeout: float = Field(
        900.0, gt=0, description="Seconds a cell may run when the call gives no timeout (execute_code; run_python waits "
        "at most 60). A foreground call answers after --yield-after seconds anyway and the cell goes on.")
    yield_after: float = Field(
        40.0, ge=0, description="Seconds a foreground execute_code waits before answering with the output so far and a "
        "run_id (get_run gets the rest; the cell is never cut for it); below the ~60 s that Claude Desktop waits. 0 = wait to the end.")
    drain_timeout: float = Field(
        30.0, ge=0, description="On SIGTERM (a deploy), seconds the server keeps going while cells of its own still run "
        "(yielded calls, background runs, tasks); calls are served meanwhile. What still runs then is recorded as lost.")
    drain_notice: float = Field(
        3.0, ge=0, description="On SIGTERM, seconds /healthz fails before the listener closes, while calls are still "
        "served: the balancer's health checks must see it by then (deploy/haproxy.cfg: 2.5 s). Only when something "
        "has checked /healthz.")
    max_timeout: float = Field(3600.0, gt=0, description="Largest timeout a call may ask for, in seconds.")
    interrupt_grace: float = Field(3.0, gt=0, description="Seconds to wait after an interrupt before restarting.")
    startup_timeout: float = Field(60.0, gt=0, description="Seconds a kernel may take to start.")
    result_chars: int = Field(5000, ge=100, description="A result longer than this is cut; the whole is written to result_file.")
    stream_chars: int = Field(20000, ge=100, description="stdout/stderr longer than this are cut head+tail in the answer; the whole is kept in a file.")
    kernel_stream_cap: int = Field(1_000_000, ge=1000, description="Characters per stream per cell the kernel forwards; the rest goes to a file.")
    kernel_disk_cap: int = Field(64_000_000, ge=0, description="Characters per stream per cell kept on disk beyond the forwarded part.")
    checkpoint_mb: float = Field(
        1024.0, ge=0, description="Megabytes of pickled variables a session's kernel keeps in its checkpoint (restored when "
        "its kernel is replaced); what would exceed it is left out and named. 0 = no checkpoints.")
    max_code_bytes: int = Field(1_000_000, ge=1, description="Largest code a call may send.")
    max_sessions: int = Field(16, ge=1, description="Most live sessions (kernels) at once.")
    idle_timeout: float = Field(3600.0, ge=0, description="Shut down a session's kernel after this many idle seconds (0 = never).")
    env_pass: list[str] = Field(
        default_factory=lambda: ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"],
        description="Environment variables passed to kernels; everything else is scrubbed.",
    )
    sandbox: Literal["auto", "off"] = Field(
        "auto", description="OS layers around each kernel: auto (every layer this machine supports) or off."
    )
    disable_layers: list[Literal["landlock", "seccomp", "bubblewrap", "netns", "cgroup"]] = Field(
        default_factory=list, description="OS layers not to use even when this machine supports them."
    )
    kernel_uids: bool = Field(
        True, description="When the server runs as root with bubblewrap, run each kernel under its own unprivileged uid "
        "(not when --work-roots must stay writable; then capabilities are dropped instead).",
    )
    allow_degraded: bool = Field(
        False, description="Start strict/standard even when neither Landlock nor bubblewrap is available (loud warning)."
    )
    network: bool | None = Field(None, description="Let kernels use the network (default: only in the trusted profile).")
    memory_mb: int = Field(2048, ge=0, description="Memory per kernel in MiB (RLIMIT_DATA gives MemoryError; "
                           "a cgroup, where available, kills at +512). 0 = no limit.")
    max_open_files: int = Field(1024, ge=64, description="Open files per kernel (RLIMIT_NOFILE).")
    max_file_mb: int = Field(256, ge=1, description="Largest file a kernel may write, in MiB (RLIMIT_FSIZE).")
    max_processes: int = Field(256, ge=0, description="Processes+threads per kernel (cgroup pids.max, or RLIMIT_NPROC when not root). 0 = no limit.")
    cpu_seconds: int = Field(0, ge=0, description="CPU seconds over a kernel's whole life (RLIMIT_CPU); 0 = no limit.")
    kernel_gateway: str | None = Field(
        None, description="Run kernels on a Jupyter Kernel Gateway / Jupyter Server at this URL instead of locally."
    )
    kernel_gateway_token: str | None = Field(None, description="Auth token for --kernel-gateway.")
    kernel_spec: str | None = Field(
        None, description="Run kernels from this installed Jupyter kernelspec, launched by the provisioner it names "
        "(gateway-provisioners: Kubernetes, Docker, YARN, SSH hosts) instead of locally in kernelexec's sandbox.",
    )
    auth_token: SecretStr | None = Field(None, description="Bearer token HTTP clients must send (at least 16 characters).")
    auth_token_file: Path | None = Field(None, description="File of bearer tokens, one per line; each is its own principal.")
    max_sessions_per_token: int = Field(8, ge=1, description="Most live sessions one HTTP token may hold.")
    max_upload_urls_per_token: int = Field(
        16, ge=1, description="Most upload URLs (upload_url, files/authorizeUpload) one HTTP token may hold unused and "
        "unexpired, or with their upload still under way, at once; more are refused until one is used or expires.")
    max_upload_spool_mb: int = Field(
        1024, ge=1, description="Most MiB of upload bodies the server receives at once, over all tokens (spooled in "
        "--state-dir before they go to the kernel); an upload that would pass it is refused (HTTP 503), nothing kept.")
    max_queued_runs_per_session: int = Field(
        16, ge=1, description="Most runs (execute_code cells, background or foreground) one session may have queued or "
        "running at once; more are refused until one finishes.")
    max_queued_runs_per_token: int = Field(
        32, ge=1, description="Most runs queued or running at once over all sessions of one HTTP token.")
    max_queued_runs: int = Field(
        128, ge=1, description="Most runs queued or running at once in the whole server (each holds its code: at most "
        "this many times --max-code-bytes).")
    store: SecretStr | None = Field(
        None,
        description="The session store, where runs and tasks outlive a restart: a postgresql://user:password@host/db URL "
        "(the [postgres] extra; prefer KERNELEXEC_STORE to a flag, which other local users can read). "
        "Default: SQLite at <state dir>/kernelexec.db. Never printed.",
    )
    pool_size: int = Field(1, ge=0, description="Kernels kept started (inside their sandbox) for new sessions; 0 = no pool.")
    restart_spares: int = Field(
        1, ge=0, description="Sessions (the most recently used) that keep a warm spare kernel, started inside their own "
        "sandbox, for their next restart (restart_session, timeout, death); 0 = none.",
    )
    install_policy: InstallPolicy = Field(
        "auto", description="Who may install packages for a session (install_packages, pip install lines in a cell): off, "
        "allowlist (--install-allow), any; auto = off in strict, any in standard and trusted. The server installs "
        "wheels only; the kernel never gets the network.",
    )
    install_allow: list[str] = Field(default_factory=list, description="Package names --install-policy allowlist permits.")
    index_url: str | None = Field(None, description="Package index installs use (default: pip's own configuration).")
    find_links: Path | None = Field(None, description="A directory of wheels (an offline wheelhouse) installs may use; "
                                    "without --index-url, the only source.")
    install_timeout: float = Field(300.0, gt=0, description="Longest an install may take, in seconds.")
    install_connect_timeout: float = Field(5.0, gt=0, description="Seconds before an unreachable index fails an install "
                                           "(no retries).")
    tools_config: str | None = Field(
        None, description="Code mode: a JSON file of MCP servers (the mcpServers shape of .mcp.json) that cells call as "
        "mcp_tools.<server>.<tool>(...) through the server's broker; auto = the project's .mcp.json and the user's Claude "
        "Code config. Read only from a file no kernel can write. Off when unset.")
    tools_allow: list[str] = Field(default_factory=lambda: ["*"], description="Code mode: glob patterns on server.tool "
                                   "that cells may call (default: every configured tool).")
    tools_approve: list[str] = Field(default_factory=list, description="Code mode: glob patterns on server.tool whose "
                                     "every call needs the user's yes (MCP elicitation; refused when the client cannot ask).")
    tools_call_timeout: float = Field(60.0, gt=0, description="Code mode: seconds one brokered tool call may take.")
    tools_max_calls_per_cell: int = Field(100, ge=1, description="Code mode: most brokered tool calls one cell may make.")
    tools_max_result_chars: int = Field(200_000, ge=100, description="Code mode: largest result of one tool call, in "
                                        "characters of JSON.")
    state_key_file: Path | None = Field(
        None, description="A fleet's shared request-state keys: one key per line (each at least 32 bytes), the first seals "
        "and every one opens, so an input() or approval retry sealed by one replica opens on any (docs/fleet.md). "
        "Default: a key of this process alone.")
    shared_dir: Path | None = Field(
        None, description="A directory every replica of a fleet mounts: session directories (notebooks, plots, cut text) "
        "live under it, so any replica reads any session's files (docs/fleet.md). Default: under --state-dir.")
    transport: Transport = Field("stdio", description="MCP transport.")
    host: str = Field("127.0.0.1", description="HTTP bind address.")
    port: int = Field(8765, ge=0, le=65535, description="HTTP port.")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Also serve Prometheus metrics at http://127.0.0.1:<port>/metrics, without a token "
        "(loopback only; either transport). Over HTTP they are at /metrics on the MCP port too, behind the bearer token.")
    config: Path | None = Field(None, description="A TOML file with any of these settings.")

    @field_validator("secret")
    @classmethod
    def _secret_specs(cls, value: list[str]) -> list[str]:
        for spec in value:
            parse_secret(spec)
        return value

    @field_validator("allow_imports", "env_pass", "secret", "work_roots", "read_dirs", "protect", "disable_layers", "install_allow", "warm_imports",
                     "tools_allow", "tools_approve", "figure_formats", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = _toml_file.get() or os.environ.get("KERNELEXEC_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file:
            if not os.path.isfile(toml_file):  # pydantic-settings reads a missing file as empty: every setting its default
                raise ValueError(f"the config file {toml_file} does not exist (--config / KERNELEXEC_CONFIG)")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)

    @model_validator(mode="after")
    def _apply_preset(self) -> Settings:
        """The plugin preset behaves like the old plugin: trusted, working in the start directory."""
        if self.preset == "plugin":
            if "profile" not in self.model_fields_set:
                self.profile = "trusted"
            if self.working_dir is None:
                self.working_dir = Path.cwd()
            if "yield_after" not in self.model_fields_set:
                self.yield_after = 0  # only execute_code is exposed (no get_run); heartbeats keep Claude Code waiting
        if self.transport == "http" and self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError("--metrics-port must differ from --port (over HTTP, /metrics is on the MCP port already)")
        if self.kernel_gateway and self.kernel_spec:
            raise ValueError("--kernel-gateway and --kernel-spec both say where kernels run; give one")
        if self.working_dir is not None:
            self.working_dir = self.working_dir.expanduser().resolve()
            if self.working_dir not in self.work_roots:
                self.work_roots = [*self.work_roots, self.working_dir]
        return self

    @property
    def effective_profile(self) -> Profile:
        """The safe-executor preset always runs strict."""
        return "strict" if self.preset == "safe-executor" else self.profile

    def effective_install_policy(self, profile: Profile) -> InstallPolicy:
        if self.install_policy != "auto":
            return self.install_policy
        return "off" if profile == "strict" else "any"

    @property
    def sessions_dir(self) -> Path:
        return (self.shared_dir if self.shared_dir is not None else self.state_dir) / "sessions"


MIN_STATE_KEY_BYTES = 32


def _check_private(path: Path, st: os.stat_result) -> None:
    """A key file must be the server's alone: a regular file of its uid, unreadable by group and others (0600),
    so no other user (nor a kernel of another uid) could have read or planted the keys."""
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"--state-key-file {path}: not a regular file")
    if st.st_uid != os.getuid():
        raise ValueError(f"--state-key-file {path}: owned by uid {st.st_uid}, not this server's ({os.getuid()})")
    if st.st_mode & 0o077:
        raise ValueError(f"--state-key-file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets group or others at it; "
                         f"chmod 600 {path}")


def state_keys(settings: Settings) -> list[bytes] | None:
    """``--state-key-file``'s keys, first the one that seals; None without the file. A ValueError (one line, never a
    key) when it is unreadable, empty, or holds a key shorter than ``MIN_STATE_KEY_BYTES``."""
    path = settings.state_key_file
    if path is None:
        return None
    path = path.expanduser()
    try:
        with open(path, "rb") as fh:
            _check_private(path, os.fstat(fh.fileno()))
            data = fh.read(1 << 20)
    except OSError as exc:
        raise ValueError(f"--state-key-file {path}: cannot read it: {exc.strerror or exc}") from None
    keys = [line.strip() for line in data.splitlines() if line.strip()]
    if not keys:
        raise ValueError(f"--state-key-file {path}: holds no key (one key per line, each at least "
                         f"{MIN_STATE_KEY_BYTES} bytes: e.g. `openssl rand -hex 32`)")
    for number, key in enumerate(keys, 1):
        if len(key) < MIN_STATE_KEY_BYTES:
            raise ValueError(f"--state-key-file {path}: key {number} is {len(key)} bytes, shorter than "
                             f"{MIN_STATE_KEY_BYTES} (e.g. `openssl rand -hex 32` makes one)")
    return keys


SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# names the kernel's launch sets itself, or that change how its Python or loader starts: not a --secret's
RESERVED_ENV = ("PATH", "HOME", "TMPDIR", "IPYTHONDIR", "MPLCONFIGDIR", "MPLBACKEND", "MALLOC_ARENA_MAX",
                "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
RESERVED_PREFIXES = ("KERNELEXEC_", "PYTHON", "LD_", "JPY_", "JUPYTER_", "PYDEVD_")
MAX_SECRET_BYTES = 64 * 1024


def parse_secret(spec: str) -> tuple[str, Path]:
    """``NAME=@file`` → (NAME, file); a ValueError saying what is wrong (never a value: there is none here)."""
    name, sep, at = spec.partition("=")
    if not sep or not at.startswith("@") or len(at) < 2:
        raise ValueError(f"--secret takes NAME=@file (the value is read from the file, never given on the command "
                         f"line); got {spec.split('=')[0][:60]!r}{'=…' if sep else ''}")
    if not SECRET_NAME.fullmatch(name) or name.upper() in RESERVED_ENV or name.upper().startswith(RESERVED_PREFIXES):
        raise ValueError(f"--secret {name[:60]!r}: the name must be an environment variable name (letters, digits, _), "
                         f"and not one the kernel's launch sets ({', '.join(RESERVED_ENV)}, {'*, '.join(RESERVED_PREFIXES)}*)")
    return name, Path(at[1:]).expanduser()


@functools.cache
def _read_secrets(specs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    values = []
    for spec in specs:
        name, path = parse_secret(spec)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--secret {name}: cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > MAX_SECRET_BYTES:
            raise ValueError(f"--secret {name}: {path} is over {MAX_SECRET_BYTES // 1024} KiB")
        text = data.decode("utf-8", "surrogateescape")
        text = text[:-1] if text.endswith("\n") else text
        text = text[:-1] if text.endswith("\r") else text
        if "\x00" in text:
            raise ValueError(f"--secret {name}: {path} holds a NUL byte, which an environment variable cannot")
        values.append((name, text))
    return tuple(values)


def secret_env(settings: Settings) -> dict[str, str]:
    """The --secret values by name, read from their files once per process (the first call: the server's start)."""
    return dict(_read_secrets(tuple(settings.secret)))


def load_settings(**overrides: Any) -> Settings:
    """Build settings from flags (``overrides``), the environment and the optional TOML file."""
    config = overrides.get("config")
    token = _toml_file.set(str(config) if config is not None else None)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    finally:
        _toml_file.reset(token)

"""Runtime inference: from the uploaded files and the request's settings to a ``BuildPlan``.

Explicit ``installCommand`` / ``buildCommand`` / ``runCommand`` always win. With ``useBuildAI`` (the
default) the rest is inferred:

- **Node** (``package.json``): ``npm ci`` with a lockfile, else ``npm install`` — only when there are
  dependencies; ``npm run build`` when a build script exists; ``npm start`` when a start script exists,
  else ``node <main|index.js|server.js|app.js>``, else the ``buildDir`` served as static files.
- **Python** (``requirements.txt``, ``pyproject.toml`` or a conventional entry ``app.py`` / ``main.py`` /
  ``server.py`` / ``manage.py``): a virtualenv with the requirements when there are any; FastAPI apps run
  under uvicorn, Flask apps under ``flask run``, Django under ``manage.py runserver``, anything else as
  ``python <entry>``.
- **Static** (``index.html``): served with ``python3 -m http.server``.
- **Dockerfile** (``hasDockerfile: true``, or a ``Dockerfile`` and nothing else to run): the platform
  builds a template from the ``Dockerfile`` at the root (of ``directoryPath`` when set), with that
  directory's files as the build context, and the sandbox boots from it. The app is started with
  ``runCommand`` when set, else the Dockerfile's ``ENTRYPOINT``/``CMD`` combined as Docker does; the
  image's ``ENV``, ``WORKDIR`` and ``USER`` apply. ``installCommand``/``buildCommand`` are not run (the
  Dockerfile is the build) and ``buildVars`` do not reach it (templates take no build arguments).

Every process gets ``PORT`` and ``HOST=0.0.0.0``. ``buildVars`` reach install and build, ``runEnvs``
reach the running app.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from paddock_gateway.adapters.hosting import DeployOptions, UploadedFile

NO_DOCKERFILE = "hasDockerfile is set but the upload has no Dockerfile at {where}"
NO_COMMAND = "the Dockerfile has no CMD or ENTRYPOINT: add one, or set settings.runCommand"
PYTHON_ENTRIES = ("app.py", "main.py", "server.py", "wsgi.py", "asgi.py")
NODE_ENTRIES = ("index.js", "server.js", "app.js", "main.js")


class PlanError(Exception):
    """The upload cannot be built or run; the message is the deployment's failure reason."""


@dataclass(frozen=True)
class BuildPlan:
    kind: str  # node | python | static | custom | dockerfile
    workdir: str  # relative to the upload root ("" for the root)
    install: str | None
    build: str | None
    run: str
    port: int
    build_env: dict[str, str]
    run_env: dict[str, str]
    #: ``dockerfile`` plans: the template the platform builds from the upload (set once submitted).
    template: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> BuildPlan:
        return cls(**data)  # type: ignore[arg-type]


def _with_flag(command: str | None, flag: str | None) -> str | None:
    if command and flag:
        return f"{command} {flag}"
    return command


def _static(directory: str, port: int) -> str:
    return f"python3 -m http.server {port} --bind 0.0.0.0 --directory {shlex.quote(directory or '.')}"


def _node(files: dict[str, bytes], options: DeployOptions) -> tuple[str | None, str | None, str | None]:
    try:
        package = json.loads(files["package.json"] or b"{}")
    except ValueError as exc:
        raise PlanError("package.json is not valid JSON") from exc
    if not isinstance(package, dict):
        raise PlanError("package.json is not a JSON object")
    scripts = package.get("scripts") or {}
    has_deps = bool(package.get("dependencies") or package.get("devDependencies"))
    install = None
    if has_deps:
        install = "npm ci" if "package-lock.json" in files else "npm install"
    build = "npm run build" if isinstance(scripts, dict) and scripts.get("build") else None
    run = None
    if isinstance(scripts, dict) and scripts.get("start"):
        run = "npm start"
    else:
        main = package.get("main")
        candidates = [main] if isinstance(main, str) else []
        for entry in [*candidates, *NODE_ENTRIES]:
            if posixpath.normpath(entry) in files:
                run = f"node {shlex.quote(posixpath.normpath(entry))}"
                break
    if run is None and options.build_dir:
        run = _static(options.build_dir, options.port)
    return install, build, run


def _python(files: dict[str, bytes], options: DeployOptions) -> tuple[str | None, str | None, str | None]:
    requirements = files.get("requirements.txt", b"").decode("utf-8", "replace")
    wanted = [line.split("#")[0].strip() for line in requirements.splitlines()]
    wanted = [line for line in wanted if line]
    install = None
    python = "python3"
    if wanted:
        install = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt"
        python = ".venv/bin/python"
    elif "pyproject.toml" in files:
        install = "python3 -m venv .venv && .venv/bin/pip install ."
        python = ".venv/bin/python"
    deps = (
        " ".join(wanted).lower() + " " + files.get("pyproject.toml", b"").decode("utf-8", "replace").lower()
    )
    framework = (options.framework or "").lower()
    port = options.port
    if "manage.py" in files and (framework == "django" or "django" in deps):
        return install, None, f"{python} manage.py runserver 0.0.0.0:{port}"
    entry = next((name for name in PYTHON_ENTRIES if name in files), None)
    if entry is None:
        return install, None, None
    module = entry.removesuffix(".py")
    if framework == "fastapi" or "fastapi" in deps or "uvicorn" in deps:
        return install, None, f"{python} -m uvicorn {module}:app --host 0.0.0.0 --port {port}"
    if framework == "flask" or "flask" in deps:
        return install, None, f"{python} -m flask --app {module} run --host 0.0.0.0 --port {port}"
    return install, None, f"{python} {entry}"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction: comments dropped, ``\\`` continuations joined."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not pending and not stripped):
            continue
        pending.append(stripped.removesuffix("\\").strip())
        if not stripped.endswith("\\"):
            keyword, _, arguments = " ".join(pending).partition(" ")
            out.append((keyword.upper(), arguments.strip()))
            pending = []
    return out


def _argv(arguments: str) -> list[str] | None:
    """The exec form's argv (``["a", "b"]``), or None for the shell form."""
    if arguments.startswith("["):
        with contextlib.suppress(ValueError):
            parsed = json.loads(arguments)
            if isinstance(parsed, list) and all(isinstance(part, str) for part in parsed):
                return parsed
    return None


def dockerfile_command(text: str) -> str | None:
    """What ``docker run`` would start, as one shell command: the last ENTRYPOINT and CMD combined as
    Docker does (an exec-form ENTRYPOINT takes CMD as arguments; a shell-form one ignores CMD)."""
    entrypoint: str | None = None
    cmd: str | None = None
    for keyword, arguments in _instructions(text):
        if keyword == "ENTRYPOINT":
            entrypoint, cmd = arguments, None  # Docker: a later ENTRYPOINT resets an earlier CMD
        elif keyword == "CMD":
            cmd = arguments
    if entrypoint:
        entry_argv = _argv(entrypoint)
        if entry_argv is None:
            return entrypoint
        cmd_argv = (_argv(cmd) or ["/bin/sh", "-c", cmd]) if cmd else []
        return shlex.join(entry_argv + cmd_argv) if entry_argv + cmd_argv else None
    if cmd:
        exec_form = _argv(cmd)
        return cmd if exec_form is None else (shlex.join(exec_form) if exec_form else None)
    return None


def _dockerfile_plan(files: dict[str, bytes], options: DeployOptions, workdir: str) -> BuildPlan:
    if "Dockerfile" not in files:
        raise PlanError(NO_DOCKERFILE.format(where=f"{workdir}/" if workdir else "the upload root"))
    run = options.run_command or dockerfile_command(files["Dockerfile"].decode("utf-8", "replace"))
    if not run:
        raise PlanError(NO_COMMAND)
    base_env = {"PORT": str(options.port), "HOST": "0.0.0.0"}
    return BuildPlan(
        kind="dockerfile",
        workdir=workdir,
        install=None,
        build=None,
        run=_with_flag(run, options.run_flag) or run,
        port=options.port,
        build_env={**base_env, **options.build_vars},
        run_env={**base_env, **options.run_envs},
    )


def infer_plan(uploaded: Sequence[UploadedFile], options: DeployOptions) -> BuildPlan:
    """The commands for this upload; raises ``PlanError`` with a user-facing reason."""
    workdir = (options.directory_path or "").strip("/")
    prefix = f"{workdir}/" if workdir else ""
    files = {f.path[len(prefix) :]: f.data for f in uploaded if f.path.startswith(prefix)}
    if options.has_dockerfile:
        return _dockerfile_plan(files, options, workdir)
    install, build, run, kind = None, None, None, "custom"
    if options.use_build_ai:
        if "package.json" in files:
            kind = "node"
            install, build, run = _node(files, options)
        elif (
            "requirements.txt" in files
            or "pyproject.toml" in files
            or any(e in files for e in PYTHON_ENTRIES)
        ):
            kind = "python"
            install, build, run = _python(files, options)
    if run is None and "index.html" in files:
        kind, run = "static", _static(".", options.port)
    install = options.install_command or install
    build = _with_flag(options.build_command or build, options.build_flag)
    run = _with_flag(options.run_command or run, options.run_flag)
    if not run and "Dockerfile" in files:
        return _dockerfile_plan(files, options, workdir)
    if not run:
        raise PlanError(
            "cannot tell how to run this upload: add a start script to package.json, a Python entry "
            "(app.py, main.py, server.py), an index.html, or set settings.runCommand"
        )
    base_env = {"PORT": str(options.port), "HOST": "0.0.0.0"}
    return BuildPlan(
        kind=kind,
        workdir=workdir,
        install=install,
        build=build,
        run=run,
        port=options.port,
        build_env={**base_env, **options.build_vars},
        run_env={**base_env, **options.run_envs},
    )

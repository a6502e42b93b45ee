"""``paddock sandbox …``: create, list, inspect, run commands and code in, copy files to and from, pause,
resume, fork and destroy sandboxes through the SDK. A sandbox is named by its id (``sb-…``) or name."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import (
    JSON_OPTION,
    ExitCode,
    api_errors,
    client,
    emit,
    fail,
    key_values,
    print_fields,
    print_table,
)
from paddock_cli.shell import run_shell

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["sandbox"].help)

# The control plane's states.TERMINAL, restated: the CLI talks to the API through the SDK and imports no
# server package at module level (the wire strings are the contract's, so they cannot drift apart).
TERMINAL = ("destroyed", "failed")


def resolve(sdk: Any, ref: str) -> Any:
    """A handle for ``ref``: an id when it starts with ``sb-``, otherwise a live sandbox's name."""
    return sdk.sandboxes.get(ref)  # by name too, for a sandbox access token as for a key


def show(info: Any) -> None:
    print_fields(
        [
            ("id", info.id),
            ("name", info.name),
            ("status", info.status),
            ("shape", info.shape),
            ("rootfs", info.rootfs),
            ("ip", info.ip),
            ("disk_mib", info.disk_mib),
            ("created_at", info.created_at),
            ("forked_from", info.forked_from),
            ("envs", info.envs),
            ("egress", info.egress),
            ("networks", [f"{n['id']} ({n.get('ip') or n.get('status')})" for n in info.networks or []]),
            ("ingress", info.ingress_url_template),
            ("ingress_host_header", info.ingress_host_header),
            ("ingress_https_ports", [str(port) for port in info.ingress_https_ports]),
        ]
    )


@app.command()
def create(
    shape: str = typer.Option("s-1vcpu-1gb", "--shape", "-s", help="A shape id (`GET /v1/shapes`)."),
    name: str = typer.Option(None, "--name", "-n", help="Unique among your live sandboxes."),
    rootfs: str = typer.Option(None, "--rootfs", help="A catalog image or one of your templates."),
    disk_mib: int = typer.Option(None, "--disk-mib", help="Overlay disk size (default: the shape's)."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE, injected into every command."),
    egress: list[str] = typer.Option([], "--egress", help="Allowlist rule (repeat); none allows all."),
    ssh_key: list[str] = typer.Option([], "--ssh-key", help="An OpenSSH public key (repeat)."),
    ingress: bool = typer.Option(False, "--ingress", help="Give the sandbox an HTTPS ingress URL."),
    ingress_host_header: str = typer.Option(
        None, "--ingress-host-header", help="The Host its apps get through the ingress (${PORT}: the port)."
    ),
    ingress_https_port: list[int] = typer.Option(
        [], "--ingress-https-port", help="A port whose app serves HTTPS itself (repeat)."
    ),
    auto_pause: int = typer.Option(None, "--auto-pause", help="Pause after this many idle seconds."),
    on_idle: str = typer.Option(
        None, "--on-idle", help="What --auto-pause does: pause (frozen, default) or hibernate."
    ),
    start_paused: bool = typer.Option(False, "--start-paused", help="Boot straight into paused."),
    timeout: int = typer.Option(None, "--timeout", help="Lifetime in seconds: then destroyed (or paused)."),
    on_timeout: str = typer.Option(
        None, "--on-timeout", help="destroy (default), pause (frozen) or hibernate (only the disk kept)."
    ),
    metadata: list[str] = typer.Option([], "--metadata", "-m", help="KEY=VALUE label (repeat)."),
    network: list[str] = typer.Option([], "--network", help="Join this network (id or name; repeat)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Create a sandbox and wait until it runs; prints only its id, for `id=$(paddock sandbox create)`
    (everything with --json)."""
    fields = {
        "name": name,
        "rootfs": rootfs,
        "disk_mib": disk_mib,
        "envs": key_values(env, "--env") or None,
        "egress": egress or None,
        "ssh_pubkeys": ssh_key or None,
        "ingress_enabled": ingress or None,
        "ingress_host_header": ingress_host_header,
        "ingress_https_ports": ingress_https_port or None,
        "auto_pause_after_seconds": auto_pause,
        "start_paused": start_paused or None,
        "timeout_s": timeout,
        "on_timeout": on_timeout,
        "on_idle": on_idle,
        "metadata": key_values(metadata, "--metadata") or None,
    }
    with api_errors(), client() as sdk:
        if network:
            from paddock_cli.network import find  # network.py imports this module

            fields["networks"] = [{"id": find(sdk, ref).id} for ref in network]
        sandbox = sdk.sandboxes.create(shape, **fields)
    emit(sandbox.info, json_out, lambda info: typer.echo(info.id))


@app.command("ls")
def list_sandboxes(
    status: str = typer.Option(None, "--status", help="Only this status (running, paused, destroyed …)."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include destroyed and failed sandboxes."),
    metadata: list[str] = typer.Option(
        [], "--metadata", "-m", help="Only those labelled KEY=VALUE (repeat)."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """List your sandboxes, oldest first (live ones only unless --all or --status); ids are never cut."""
    labels = key_values(metadata, "--metadata") or None
    with api_errors(), client() as sdk:
        rows = [
            s
            for s in sdk.sandboxes.iter(status, metadata=labels)
            if status or all_ or s.status not in TERMINAL
        ]
    emit(
        rows,
        json_out,
        lambda items: print_table(
            ["ID", "NAME", "STATUS", "SHAPE", "IP", "CREATED"],
            [[s.id, s.name, s.status, s.shape, s.ip, s.created_at] for s in items],
        ),
    )


@app.command("timeout")
def set_timeout(
    ref: str,
    seconds: int = typer.Argument(..., help="The new lifetime from now; 0 removes it."),
    on_timeout: str = typer.Option(None, "--on-timeout", help="destroy, pause or hibernate."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Extend or shorten a sandbox's lifetime (from now)."""
    with api_errors(), client() as sdk:
        info = resolve(sdk, ref).set_timeout(seconds, on_timeout=on_timeout)
    emit(info, json_out, lambda i: typer.echo(i.end_at or "no lifetime"))


@app.command()
def get(ref: str, json_out: bool = JSON_OPTION) -> None:
    """Show one sandbox."""
    with api_errors(), client() as sdk:
        info = resolve(sdk, ref).info
    emit(info, json_out, show)


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_command(
    ref: str,
    command: list[str] = typer.Argument(
        ...,
        metavar="[--] COMMAND [ARG]...",
        help="The executable (found on PATH; no shell) and its arguments.",
    ),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE override of a declared env key."),
    stdin: bool = typer.Option(False, "--stdin", "-i", help="Send this terminal's stdin to the command."),
    json_out: bool = typer.Option(
        False, "--json", help="Wait, then print {stdout, stderr, exit_code, error, exec_ms} as JSON."
    ),
    user: str | None = typer.Option(
        None, "--user", "-u", help="Run as this user of the sandbox (a name or a uid), as `docker exec -u`."
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        "-d",
        help="Start it as a managed process and print its id, as `docker exec -d` (see ps, logs, wait, kill).",
    ),
) -> None:
    """Run a command; its output streams here and `paddock` exits with the command's exit code.

    Everything after SANDBOX is the command, flags included, as with `docker exec`:
    `paddock sandbox exec my-box ls -la`. As with `kubectl exec`, a `--` may separate them, and this
    command's own options may stand before SANDBOX or between it and `--`:
    `paddock sandbox exec my-box -e K=V -- sh -c 'echo $K'`.
    """
    import paddock

    options, cmd, args = split_command(command)
    env = [*env, *options.env]
    stdin = stdin or options.stdin
    json_out = json_out or options.json_out
    user = options.user if options.user is not None else user
    detach = detach or options.detach
    overrides = key_values(env, "--env") or None
    if detach and stdin:
        raise fail("--detach runs the command in the background: it reads no stdin here", ExitCode.USAGE)
    text = sys.stdin.read() if stdin else None
    with api_errors(), client() as sdk:
        sandbox = resolve(sdk, ref)
        if detach:
            started = sandbox.processes.start(cmd, args, env=overrides, user=user)
            emit(started, json_out, lambda process: typer.echo(process.process_id))
            return
        if json_out:
            try:
                result = sandbox.run(cmd, args, env=overrides, stdin=text, user=user)
            except paddock.CommandStartError as exc:  # exits 127, as a shell does
                result = paddock.ExecResult(stdout="", stderr="", exit_code=-1, exec_ms=0.0, error=str(exc))
            emit(result, True, print)
            raise typer.Exit(exit_status(result.exit_code, result.error))
        code, error = -1, None
        for frame in sandbox.stream(cmd, args, env=overrides, stdin=text, user=user):
            if frame.get("stdout"):
                sys.stdout.write(frame["stdout"])
                sys.stdout.flush()
            if frame.get("stderr"):
                sys.stderr.write(frame["stderr"])
                sys.stderr.flush()
            if frame.get("error"):
                error = frame["error"]
                typer.echo(f"error: {error}", err=True)
            if "exit_code" in frame:
                code = int(frame["exit_code"])
    raise typer.Exit(exit_status(code, error))


@dataclass
class ExecOptions:
    """``exec``'s own options when written between SANDBOX and ``--`` (kubectl's place for them)."""

    env: list[str] = field(default_factory=list)
    stdin: bool = False
    json_out: bool = False
    user: str | None = None
    detach: bool = False


def split_command(tokens: list[str]) -> tuple[ExecOptions, str, list[str]]:
    """``[opts…] -- cmd args…`` or ``cmd args…`` → (opts, cmd, args).

    Click stops parsing options at SANDBOX, so it hands over the ``--`` and anything before it. A ``--``
    is the separator when it comes first or after options only (a command never starts with ``-``);
    after a command word it is that command's argument (``echo -- x`` prints ``-- x``, as in a shell).
    """
    options = ExecOptions()
    if "--" in tokens:
        split = tokens.index("--")
        head = tokens[:split]
        if not head or head[0].startswith("-"):
            parse_exec_options(head, options)
            tokens = tokens[split + 1 :]
    if not tokens:
        raise fail("a command is required after SANDBOX (e.g. `-- ls -la`)", ExitCode.USAGE)
    return options, tokens[0], tokens[1:]


def parse_exec_options(head: list[str], options: ExecOptions) -> None:
    rest = list(head)
    while rest:
        token = rest.pop(0)
        name, sep, value = token.partition("=")
        if name in ("-i", "--stdin") and not sep:
            options.stdin = True
        elif name == "--json" and not sep:
            options.json_out = True
        elif name in ("-d", "--detach") and not sep:
            options.detach = True
        elif name in ("-e", "--env"):
            if not sep:
                if not rest:
                    raise fail(f"{name} takes KEY=VALUE", ExitCode.USAGE)
                value = rest.pop(0)
            options.env.append(value)
        elif name in ("-u", "--user"):
            if not sep:
                if not rest:
                    raise fail(f"{name} takes a user name or uid", ExitCode.USAGE)
                value = rest.pop(0)
            options.user = value
        else:
            raise fail(f"unknown exec option {token!r} before `--`", ExitCode.USAGE)


def exit_status(code: int, error: str | None) -> int:
    if error is not None or code < 0:
        return int(ExitCode.COMMAND_ERROR)
    return code if code <= 255 else 255


@app.command()
def shell(
    ref: str,
    command: str = typer.Option(
        None, "--command", "-c", help="Run this under bash -lc instead of a login shell."
    ),
) -> None:
    """Open an interactive terminal (a login shell on a PTY) in the sandbox; exits with the shell's code.

    Keystrokes go to the sandbox as typed (raw mode), the window size follows this terminal, and the
    shell ends when you leave it (exit or Ctrl-D).
    """
    with api_errors(), client() as sdk:
        code = run_shell(resolve(sdk, ref), command)
    raise typer.Exit(code)


@app.command()
def cp(
    source: str = typer.Argument(..., help="A local path, `-` for stdin, or SANDBOX:/path."),
    dest: str = typer.Argument(..., help="A local path, `-` for stdout, or SANDBOX:/path."),
    recursive: bool = typer.Option(False, "--recursive", "-r", help="Copy a directory (one tar stream)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON (the paths copied and the bytes) for scripts; not with `-` out."
    ),
) -> None:
    """Copy a file (or with -r a directory) into or out of a sandbox, streamed, as `cp` does: a
    destination that is a directory (or ends in `/`) receives the source under its own name
    (e.g. `cp ./data.csv my-box:/root/`, `cp -r ./src my-box:/root/app`)."""
    import paddock

    src_ref, src_path = split_remote(source)
    dst_ref, dst_path = split_remote(dest)
    if (src_ref is None) == (dst_ref is None):
        raise fail("exactly one side must be SANDBOX:/path", ExitCode.USAGE)
    if recursive and "-" in (src_path, dst_path):
        raise fail("-r copies a directory; `-` is one file's stream", ExitCode.USAGE)
    if json_out and dst_ref is None and dst_path == "-":
        raise fail("--json prints to stdout, where `-` writes the file: use one", ExitCode.USAGE)
    with api_errors(), client() as sdk:
        if dst_ref is not None:
            sandbox = resolve(sdk, dst_ref)
            if src_path == "-":
                size = sandbox.files.write(dst_path, sys.stdin.buffer)
                copied(f"{sandbox.id}:{dst_path}", size, json_out, source="-")
                return
            local = Path(src_path)
            if recursive != local.is_dir() or not local.exists():
                wanted = "directory" if recursive else "file (use -r for a directory)"
                raise fail(f"{src_path}: no such {wanted}", ExitCode.USAGE)
            into = dst_path.endswith("/")
            if not into:
                try:
                    into = sandbox.files.stat(dst_path).type == "dir"
                except paddock.NotFoundError:
                    into = False
            if into:
                dst_path = dst_path.rstrip("/") + "/" + local.resolve().name
            if recursive:
                size = sandbox.files.upload_dir(local, dst_path)
            else:
                size = sandbox.files.upload(local, dst_path)
            destination = f"{sandbox.id}:{dst_path}"
        else:
            sandbox = resolve(sdk, src_ref or "")
            if dst_path == "-":
                size = sandbox.files.download(src_path, sys.stdout.buffer)
                sys.stdout.flush()
                return
            target = Path(dst_path)
            if target.is_dir():
                target = target / Path(src_path.rstrip("/")).name
            if recursive:
                size = sandbox.files.download_dir(src_path, target)
            else:
                size = sandbox.files.download(src_path, target)
            destination = str(target)
    copied(destination, size, json_out, source=source)


def copied(destination: str, size: int, json_out: bool, *, source: str) -> None:
    """What ``cp`` tells: the byte count on stderr, or with --json the paths (the destination as the
    file was written: into a directory, under the source's name) and the bytes on stdout."""
    result = {"source": source, "destination": destination, "bytes": size}
    emit(result, json_out, lambda r: typer.echo(f"{r['bytes']} bytes", err=True))


def split_remote(spec: str) -> tuple[str | None, str]:
    """``name:/path`` → (name, /path); anything else is a local path."""
    ref, sep, path = spec.partition(":")
    if sep and ref and path.startswith("/") and "/" not in ref:
        return ref, path
    return None, spec


def _each(refs: list[str], json_out: bool, action: Any) -> None:
    results = []
    with api_errors(), client() as sdk:
        for ref in refs:
            results.append(action(resolve(sdk, ref)))
    emit(results, json_out, print_states)


def print_states(items: list[dict[str, str]]) -> None:
    for item in items:
        typer.echo(f"{item['id']}  {item['status']}")


@app.command()
def pause(
    refs: list[str],
    hibernate: bool = typer.Option(
        False, "--hibernate", help="Free the host: keep only the disk; a resume restarts its processes."
    ),
    hibernate_after: int = typer.Option(
        None, "--hibernate-after", help="Freeze now, hibernate if still paused after this many seconds."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Pause (freeze, stop billing compute); waits until paused. --hibernate frees its memory and slot."""

    def one(sb: Any) -> dict[str, Any]:
        info = sb.pause(keep_memory=not hibernate, hibernate_after_seconds=hibernate_after)
        answer: dict[str, Any] = {"id": sb.id, "status": info.status}
        if info.hibernated:
            answer["hibernated"] = True
        return answer

    _each(refs, json_out, one)


@app.command()
def resume(refs: list[str], json_out: bool = JSON_OPTION) -> None:
    """Resume paused sandboxes; waits until running."""
    _each(refs, json_out, lambda sb: {"id": sb.id, "status": sb.resume().status})


@app.command()
def fork(
    ref: str,
    start_paused: bool = typer.Option(False, "--start-paused", help="Leave the child paused."),
    include_volumes: bool = typer.Option(
        False, "--include-volumes", help="Give the child its own copy of each local volume the source holds."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Fork a running or paused sandbox; waits for the child and prints only its id (all with --json)."""
    with api_errors(), client() as sdk:
        child = resolve(sdk, ref).fork(
            start_paused=start_paused or None, include_volumes=include_volumes or None
        )
    emit(child.info, json_out, lambda info: typer.echo(info.id))


@app.command()
def snapshot(
    ref: str,
    name: str = typer.Option(None, "--name", help="A name `--rootfs` may use instead of the id."),
    include_volumes: bool = typer.Option(
        False,
        "--include-volumes",
        help="Keep a copy of each local volume it holds; each sandbox booted from it gets its own.",
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Snapshot a running or paused sandbox's disk; waits until ready and prints only its id (all with
    --json). Boot from it with `paddock sandbox create --rootfs SNAPSHOT`."""
    with api_errors(), client() as sdk:
        made = resolve(sdk, ref).snapshot(name=name, include_volumes=include_volumes or None)
    emit(made, json_out, lambda snap: typer.echo(snap.id))


@app.command()
def rm(
    refs: list[str],
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait until each is destroyed."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Destroy sandboxes (idempotent)."""
    _each(refs, json_out, lambda sb: {"id": sb.id, "status": sb.destroy(wait=wait)})


@app.command("run-code")
def run_code(
    ref: str,
    source: str = typer.Argument(..., help="A Python file, or `-` for stdin."),
    context: str = typer.Option("default", "--context", "-c", help="The kernel to run in (state is kept)."),
    timeout_s: float = typer.Option(300.0, "--timeout", help="Interrupt the cell after this many seconds."),
    images: Path = typer.Option(None, "--images", help="Save PNG results (charts) into this directory."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole Execution as JSON."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for this cell alone."),
) -> None:
    """Run Python in the sandbox's Jupyter kernel (rootfs code-interpreter:1), as a notebook cell.

    Output streams here; the last expression's value is printed after it, an exception's traceback
    goes to stderr and the exit code is 1 (2 for a bad file, 5 when the cell timed out).
    """
    if source == "-":
        code = sys.stdin.read()
    elif Path(source).is_file():
        code = Path(source).read_text()
    else:
        raise fail(f"{source}: no such file", ExitCode.USAGE)

    def echo(stream: Any) -> Any:
        def write(text: str) -> None:
            stream.write(text)
            stream.flush()

        return None if json_out else write

    envs = key_values(env, "--env") or None
    with api_errors(), client() as sdk:
        try:
            execution = resolve(sdk, ref).run_code(
                code,
                context=context,
                timeout_s=timeout_s,
                on_stdout=echo(sys.stdout),
                on_stderr=echo(sys.stderr),
                envs=envs,
            )
        except ValueError as exc:  # the SDK's checks of the arguments, made before any request
            raise fail(str(exc), ExitCode.USAGE) from None
    saved = save_images(execution, images) if images else []
    if json_out:
        emit(execution, True, print)
    else:
        if execution.text is not None:
            typer.echo(execution.text)
        for path in saved:
            typer.echo(f"saved {path}", err=True)
        if execution.error is not None:
            error = execution.error
            # IPython's traceback already ends with "Name: value"; a timeout's has no such line.
            if error.traceback:
                typer.echo(error.traceback_text, err=True)
            if not error.traceback or error.name == "TimeoutError":
                typer.echo(f"{error.name}: {error.value}", err=True)
    if execution.timed_out:
        raise typer.Exit(int(ExitCode.FAILED))
    raise typer.Exit(0 if execution.error is None else 1)


def save_images(execution: Any, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    saved = []
    for index, result in enumerate(execution.results, start=1):
        if result.png is not None:
            path = directory / f"result-{execution.execution_count or 0}-{index}.png"
            path.write_bytes(result.png)
            saved.append(path)
    return saved


@app.command()
def screenshot(
    ref: str,
    out: Path = typer.Argument(..., help="Where to write the PNG (`-` for stdout)."),
    screen: str = typer.Option(None, "--screen", help="screen-0 … screen-7 (default screen-0)."),
    window: str = typer.Option(None, "--window", help="Only this window (an id from the windows list)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Save a PNG screenshot of a desktop sandbox (rootfs desktop:1)."""
    if json_out and str(out) == "-":
        raise fail("--json prints to stdout, where `-` writes the PNG: use one", ExitCode.USAGE)
    with api_errors(), client() as sdk:
        png = resolve(sdk, ref).computer.screenshot(screen_id=screen, window_id=window)
    if str(out) == "-":
        sys.stdout.buffer.write(png)
        sys.stdout.buffer.flush()
        return
    out.write_bytes(png)
    emit({"path": str(out), "bytes": len(png)}, json_out, lambda saved: typer.echo(saved["path"]))


@app.command()
def view(
    ref: str,
    screen: str = typer.Option("screen-0", "--screen", help="screen-0 … screen-7."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Print a short-lived link to watch and drive a desktop sandbox's screen in a browser (noVNC)."""
    with api_errors(), client() as sdk:
        live = resolve(sdk, ref).computer.connect(screen)
    emit(live, json_out, lambda shown: typer.echo(shown.url))


token_app = typer.Typer(
    no_args_is_help=True,
    help="A sandbox's delegated access token: used as PADDOCK_API_KEY, it acts on that sandbox only.",
)
app.add_typer(token_app, name="token")
EXPIRES_IN_OPTION = typer.Option(
    None, "--expires-in", min=1, help="Seconds until the token stops working (default: never)."
)


def show_token(token: Any) -> None:
    print_fields(
        [
            ("enabled", str(token.enabled).lower()),
            ("token_hint", token.token_hint),
            ("created_at", token.created_at),
            ("rotated_at", token.rotated_at),
            ("expires_at", token.expires_at),
        ]
    )


@token_app.command("create")
def token_create(ref: str, expires_in: int = EXPIRES_IN_OPTION, json_out: bool = JSON_OPTION) -> None:
    """Issue the sandbox's token. Prints only the token, which is shown this once, for
    `token=$(paddock sandbox token create NAME)` (everything with --json)."""
    with api_errors(), client() as sdk:
        issued = resolve(sdk, ref).create_access_token(expires_in_seconds=expires_in)
    emit(issued, json_out, lambda token: typer.echo(token.token))


@token_app.command("rotate")
def token_rotate(ref: str, expires_in: int = EXPIRES_IN_OPTION, json_out: bool = JSON_OPTION) -> None:
    """Replace the token (the old one stops working at once); prints only the new one."""
    with api_errors(), client() as sdk:
        issued = resolve(sdk, ref).rotate_access_token(expires_in_seconds=expires_in)
    emit(issued, json_out, lambda token: typer.echo(token.token))


@token_app.command("show")
def token_show(ref: str, json_out: bool = JSON_OPTION) -> None:
    """Whether the sandbox has an enabled token, its hint and times (never the token itself)."""
    with api_errors(), client() as sdk:
        shown = resolve(sdk, ref).access_token()
    emit(shown, json_out, show_token)


@token_app.command("disable")
def token_disable(ref: str, json_out: bool = JSON_OPTION) -> None:
    """Revoke the token at once (idempotent)."""
    with api_errors(), client() as sdk:
        shown = resolve(sdk, ref).disable_access_token()
    emit(shown, json_out, show_token)

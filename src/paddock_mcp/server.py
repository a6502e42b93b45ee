"""The MCP server: one tool per thing an agent does with a sandbox, each a thin call into the async SDK.

Tools answer with text a model can read (and, for ``run_code``, PNG images). A failure is a tool error
(``is_error``) whose text says what failed and what to try, never a stack trace: SDK errors are mapped
in one place, ``tool_errors``. The server holds one ``paddock.AsyncClient`` for its whole life,
configured like every Paddock client by ``PADDOCK_BASE_URL`` and ``PADDOCK_API_KEY``; over streamable
HTTP every MCP session shares it, so whoever reaches the port acts with that key (it listens on
127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import anyio
import anyio.abc
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

import paddock

#: A tool's text answer keeps at most this much of each output (the model's context is the budget).
MAX_TEXT_CHARS = 50_000
#: A progress notification carries at most this much of a chunk of command output.
MAX_PROGRESS_CHARS = 4_000
DEFAULT_SHAPE = "s-1vcpu-1gb"
#: Statuses list_sandboxes leaves out unless asked: the sandbox is gone or going.
GONE = ("destroying", "destroyed", "failed")

INSTRUCTIONS = """\
Paddock sandboxes are isolated Linux machines (Debian 13) you can create, run commands and code in,
read and write files in, pause, resume, fork and destroy. Create one with create_sandbox (rootfs
'code-interpreter:1' for run_code with Python, numpy, pandas and matplotlib; 'devbox:1' for Python,
Node.js, git and build tools; 'debian:13' for a minimal shell) and pass its id to the other tools.
run_code keeps variables between calls in the same context. Destroy sandboxes you no longer need."""

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


@contextmanager
def tool_errors() -> Iterator[None]:
    """The SDK's exceptions (and bad arguments) as a ToolError the model reads: what failed and why.
    The mcp SDK puts "Error executing tool <name>: " before the text, so it does not name the tool."""
    try:
        yield
    except paddock.NotFoundError as exc:
        raise ToolError(f"{exc.message} (list_sandboxes shows your sandboxes)") from exc
    except paddock.APIError as exc:
        details = "; ".join(f"{name}: {problem}" for name, problem in exc.fields.items())
        suffix = f" ({details})" if details else ""
        raise ToolError(f"{exc.status} {exc.code or ''} {exc.message}{suffix}") from exc
    except paddock.TransportError as exc:
        raise ToolError(f"cannot reach the Paddock control plane ({exc})") from exc
    except (paddock.PaddockError, ValueError) as exc:
        raise ToolError(str(exc)) from exc


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def describe(info: paddock.SandboxInfo) -> str:
    fields = {
        "id": info.id,
        "status": info.status,
        "name": info.name,
        "rootfs": info.rootfs,
        "shape": info.shape,
        "ip": info.ip,
        "created_at": info.created_at,
        "forked_from": info.forked_from,
        "ingress_url_template": info.ingress_url_template,
    }
    return "\n".join(f"{key}: {value}" for key, value in fields.items() if value not in (None, ""))


def describe_execution(execution: paddock.Execution) -> str:
    """A cell's outcome as text: output, each result's text forms, the error with its traceback."""
    parts: list[str] = []
    if execution.stdout:
        parts.append(f"[stdout]\n{clip(execution.stdout)}")
    if execution.stderr:
        parts.append(f"[stderr]\n{clip(execution.stderr)}")
    for index, result in enumerate(execution.results):
        label = "result" if result.is_main_result else "display"
        forms = ", ".join(result.formats)
        body = result.text or ""
        if result.html:
            body += f"\n[text/html]\n{clip(result.html, MAX_TEXT_CHARS // 5)}"
        if result.png is not None:
            body += f"\n[image/png attached, image {index + 1}]"
        parts.append(f"[{label} {index + 1}: {forms}]\n{body}".rstrip())
    if execution.error is not None:
        error = execution.error
        parts.append(f"[error] {error.name}: {error.value}\n{clip(error.traceback_text)}")
    if execution.kernel_started:
        parts.append("[note] a new kernel was started for this context: earlier variables are gone")
    return "\n\n".join(parts) or "(no output)"


TOOL_NAMES = (
    "create_sandbox",
    "list_sandboxes",
    "get_sandbox",
    "destroy_sandbox",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "pause_sandbox",
    "resume_sandbox",
    "fork_sandbox",
    "expose_port",
    "run_code",
)


def build_server(client: paddock.AsyncClient) -> MCPServer:
    """The MCP server with Paddock's tools, each acting through ``client``."""
    # WARNING: over stdio the log goes to the client's stderr, where one INFO line per SDK request is noise.
    server = MCPServer("paddock", instructions=INSTRUCTIONS, version=paddock.__version__, log_level="WARNING")

    async def sandbox(sandbox_id: str) -> paddock.AsyncSandbox:
        return await client.sandboxes.get(sandbox_id)

    @server.tool(annotations=CHANGES)
    async def create_sandbox(
        rootfs: str | None = None, shape: str = DEFAULT_SHAPE, name: str | None = None, ingress: bool = False
    ) -> str:
        """Create a sandbox and wait until it runs; returns its id and details.

        rootfs: 'code-interpreter:1' (Python with a Jupyter kernel, numpy, pandas, matplotlib: for
        run_code), 'devbox:1' (Python, Node.js, git, gcc), 'debian:13' (minimal); default: the
        server's. shape: CPU and memory, e.g. 's-1vcpu-1gb'. ingress: give it public URLs (see
        expose_port)."""
        with tool_errors():
            created = await client.sandboxes.create(
                shape, rootfs=rootfs, name=name, ingress_enabled=ingress or None
            )
        return describe(created.info)

    @server.tool(annotations=READ_ONLY)
    async def list_sandboxes(include_destroyed: bool = False) -> str:
        """List your sandboxes (id, status, name, rootfs), oldest first; live ones unless asked."""
        with tool_errors():
            rows = [
                info async for info in client.sandboxes.iter() if include_destroyed or info.status not in GONE
            ]
        lines = [f"{info.id}  {info.status}  {info.name or '-'}  {info.rootfs or '-'}" for info in rows]
        return "\n".join(lines) or "no sandboxes"

    @server.tool(annotations=READ_ONLY)
    async def get_sandbox(sandbox_id: str) -> str:
        """Show one sandbox: status, image, shape, IP, ingress URL template."""
        with tool_errors():
            return describe((await sandbox(sandbox_id)).info)

    @server.tool(annotations=DESTRUCTIVE)
    async def destroy_sandbox(sandbox_id: str) -> str:
        """Destroy a sandbox and everything in it (idempotent)."""
        with tool_errors():
            status = await (await sandbox(sandbox_id)).destroy()
        return f"{sandbox_id}: {status}"

    @server.tool(annotations=CHANGES)
    async def run_command(sandbox_id: str, command: str, ctx: Context, timeout_s: float = 300) -> str:
        """Run a shell command (sh -c) in the sandbox and return its exit code, stdout and stderr.

        Output is also sent as progress notifications while the command runs, when the client asks
        for progress. A command still running after timeout_s is killed."""
        stdout: list[str] = []
        stderr: list[str] = []
        exit_code: int | None = None
        error: str | None = None
        chunks = 0
        with tool_errors():
            target = await sandbox(sandbox_id)
            with anyio.move_on_after(timeout_s) as scope:
                # Leaving this loop early closes the stream, which kills the command in the sandbox.
                async for frame in target.stream("sh", ["-c", command]):
                    for key, sink in (("stdout", stdout), ("stderr", stderr)):
                        if frame.get(key):
                            sink.append(frame[key])
                            chunks += 1
                            message = f"{key}: {frame[key][-MAX_PROGRESS_CHARS:]}"
                            await ctx.report_progress(chunks, None, message)
                    if frame.get("error"):
                        error = str(frame["error"])
                    if "exit_code" in frame:
                        exit_code = int(frame["exit_code"])
        if scope.cancelled_caught:
            status = f"killed after the {timeout_s}s timeout"
        elif error is not None:
            status = f"could not run: {error}"
        else:
            status = f"exit code {exit_code}"
        return f"{status}\n[stdout]\n{clip(''.join(stdout))}\n[stderr]\n{clip(''.join(stderr))}"

    @server.tool(annotations=READ_ONLY)
    async def read_file(sandbox_id: str, path: str) -> str:
        """Read a file from the sandbox (absolute path); text comes back as is, binary as a note."""
        with tool_errors():
            data = await (await sandbox(sandbox_id)).files.read(path)
        try:
            return clip(data.decode())
        except UnicodeDecodeError:
            return f"{path} is binary ({len(data)} bytes); use run_command (e.g. xxd, file) to inspect it"

    @server.tool(annotations=CHANGES)
    async def write_file(sandbox_id: str, path: str, content: str) -> str:
        """Create or replace a text file (absolute path, UTF-8) in the sandbox; parent directories
        are created."""
        with tool_errors():
            target = await sandbox(sandbox_id)
            parent = posixpath.dirname(path)
            if path.startswith("/") and parent != "/":
                made = await target.run("mkdir", ["-p", "--", parent])
                if not made.ok:
                    raise ToolError(f"cannot create {parent}: {made.stderr or made.error}")
            size = await target.files.write(path, content)
        return f"wrote {size} bytes to {path}"

    @server.tool(annotations=READ_ONLY)
    async def list_files(sandbox_id: str, path: str = "/root") -> str:
        """List a directory in the sandbox (ls -la): names, sizes, permissions, times."""
        with tool_errors():
            listing = await (await sandbox(sandbox_id)).run("ls", ["-la", "--", path])
        if not listing.ok:
            raise ToolError(f"{(listing.stderr or listing.error or '').strip()}")
        return clip(listing.stdout)

    @server.tool(annotations=CHANGES)
    async def pause_sandbox(sandbox_id: str) -> str:
        """Pause a sandbox: its processes are frozen (run_code kernels included) until resume_sandbox."""
        with tool_errors():
            info = await (await sandbox(sandbox_id)).pause()
        return f"{sandbox_id}: {info.status}"

    @server.tool(annotations=CHANGES)
    async def resume_sandbox(sandbox_id: str) -> str:
        """Resume a paused sandbox; returns once it runs."""
        with tool_errors():
            info = await (await sandbox(sandbox_id)).resume()
        return f"{sandbox_id}: {info.status}"

    @server.tool(annotations=CHANGES)
    async def fork_sandbox(sandbox_id: str) -> str:
        """Fork a running or paused sandbox into a new one with a copy of its disk; returns the child."""
        with tool_errors():
            child = await (await sandbox(sandbox_id)).fork()
        return describe(child.info)

    @server.tool(annotations=CHANGES)
    async def expose_port(sandbox_id: str, port: int) -> str:
        """Turn on ingress for the sandbox and return the public URL of a port. The server in the
        sandbox must listen on 0.0.0.0:<port>."""
        with tool_errors():
            target = await sandbox(sandbox_id)
            if not target.info.ingress_enabled or not target.info.ingress_url_template:
                await target.patch(ingress_enabled=True)
            url = target.info.ingress_url(port)
        return url

    @server.tool(annotations=CHANGES)
    async def run_code(
        sandbox_id: str,
        code: str,
        ctx: Context,
        context: str = "default",
        timeout_s: float = 60,
        envs: dict[str, str] | None = None,
    ) -> list[str | Image]:
        """Run Python in the sandbox's Jupyter kernel (rootfs code-interpreter:1). Variables, imports
        and functions persist between calls with the same context; other contexts are separate
        kernels. Returns stdout, stderr, the last expression's value, HTML tables, matplotlib charts
        as images, and exceptions with their traceback. A cell running past timeout_s is
        interrupted; the kernel keeps its state. envs are environment variables for this cell alone
        (os.environ and the processes it starts). Printed output is also sent as progress
        notifications while the cell runs, when the client asks for progress."""
        chunks = 0

        def progress(tasks: anyio.abc.TaskGroup, stream: str) -> Callable[[str], None]:
            # The SDK calls this synchronously as output arrives; the notification is sent by a task
            # of the group, which the tool waits for before it answers.
            def report(text: str) -> None:
                nonlocal chunks
                chunks += 1
                tasks.start_soon(ctx.report_progress, chunks, None, f"{stream}: {text[-MAX_PROGRESS_CHARS:]}")

            return report

        with tool_errors():
            target = await sandbox(sandbox_id)
            async with anyio.create_task_group() as tasks:
                execution = await target.run_code(
                    code,
                    context=context,
                    timeout_s=timeout_s,
                    on_stdout=progress(tasks, "stdout"),
                    on_stderr=progress(tasks, "stderr"),
                    envs=envs,
                )
        images: list[str | Image] = [
            Image(data=result.png, format="png") for result in execution.results if result.png is not None
        ]
        return [describe_execution(execution), *images]

    return server


async def serve(
    client: paddock.AsyncClient,
    transport: Literal["stdio", "http"],
    host: str = "127.0.0.1",
    port: int = 8765,
) -> None:
    server = build_server(client)
    if transport == "stdio":
        await server.run_stdio_async()
    else:
        await server.run_streamable_http_async(host=host, port=port, streamable_http_path="/mcp")


def run(
    transport: Literal["stdio", "http"],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    base_url: str | None = None,
    api_key: str | None = None,
) -> None:
    """Serve until stdin closes (stdio) or the process is interrupted (HTTP)."""

    async def main() -> None:
        async with paddock.AsyncClient(base_url, api_key) as client:
            await serve(client, transport, host, port)

    anyio.run(main)

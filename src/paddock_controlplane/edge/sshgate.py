"""The SSH gateway: ``ssh -p 2222 <sandbox id or name>@<host>`` lands in that sandbox.

An asyncssh server inside the control-plane process (like the ingress proxy: it needs the database and
``suspension.resume``). The SSH user name names the sandbox; a client key is accepted when it is one
of *that sandbox's* ``ssh_pubkeys`` (read from the database on every connection, so a key added with
the API works on the next one; never the account's keys), or one added through the sandbox's access
token while that token is enabled (a disabled, rotated or expired token's keys open nothing). Each session is a ``terminals.Terminal``:

- ``ssh host`` with a PTY: a login shell on a PTY; window changes resize it.
- ``ssh host cmd``: ``bash -lc cmd`` with separate stdout/stderr; stdin's EOF closes its stdin; the
  command's exit status is the session's.
- the ``sftp`` subsystem (``sftp``, and ``scp``, which speaks SFTP since OpenSSH 9): OpenSSH's
  ``sftp-server`` run in the sandbox — the image's own, else the gateway machine's copy
  (``LOCAL_SFTP_SERVER``, Debian's openssh-sftp-server, needs only libc) put into the sandbox once.
- ``-L local:target:port``: forwarded from this process to ``<sandbox ip>:port`` (``localhost``,
  ``127.0.0.1``, the sandbox's id or name and its own address all mean the sandbox). As with OpenSSH's
  sshd, the channel is confirmed only once that connection is made: a refused or unanswered one
  (``DIAL_TIMEOUT_S``) fails the channel open, which the client reports ("open failed: connect
  failed: ...") and answers by closing the local connection.

A paused sandbox is resumed by the connection. The host key is generated once (ed25519) into
``ssh_host_key_file``, mode 0600.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR
from asyncssh.sftp import MIN_SFTP_VERSION
from asyncssh.stream import SSHReader, SSHWriter
from sqlalchemy import or_, select

from paddock_controlplane.edge import terminals
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.resources import access_tokens
from paddock_core import errors
from paddock_core.logging import get_logger
from paddock_hostagent.schemas import ProcessPty

log = get_logger(__name__)
LIVE = (SandboxStatus.RUNNING, SandboxStatus.PAUSED, SandboxStatus.RESUMING, SandboxStatus.PAUSING)
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
IMAGE_SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SHIPPED_SFTP_SERVER = "/usr/local/lib/paddock/sftp-server"
LOCAL_SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")


def host_key(path: Path) -> asyncssh.SSHKey:
    """The gateway's host key, generated on first start (0600) so clients see the same key later."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519")
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_bytes(key.export_private_key())
        tmp.replace(path)
    return asyncssh.read_private_key(str(path))


class _Target:
    """The sandbox a connection authenticated into."""

    def __init__(self, sandbox_id: str, user_id: str, name: str) -> None:
        self.sandbox_id = sandbox_id
        self.user_id = user_id
        self.name = name


class GatewayServer(asyncssh.SSHServer):
    def __init__(self, services: Services) -> None:
        self.services = services
        self.target: _Target | None = None
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn

    def begin_auth(self, username: str) -> bool:
        return True  # always ask for a key: an unknown sandbox fails like a wrong key

    def password_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """Is ``key`` one of the keys of the sandbox named ``username`` (id, else name)?"""
        async with self.services.sessions() as session:
            candidates = (
                await session.scalars(
                    select(Sandbox).where(
                        or_(Sandbox.id == username, Sandbox.name == username), Sandbox.status.in_(LIVE)
                    )
                )
            ).all()
            granted = await access_tokens.enabled_ssh_keys(
                session, [c.id for c in candidates], self.services.clock()
            )
        presented = key.public_data
        for sandbox in sorted(candidates, key=lambda s: s.id != username):  # an exact id first
            for line in [*(sandbox.ssh_pubkeys or []), *granted.get(sandbox.id, [])]:
                with contextlib.suppress(asyncssh.KeyImportError, ValueError, TypeError):
                    if asyncssh.import_public_key(str(line)).public_data == presented:
                        self.target = _Target(sandbox.id, sandbox.user_id, sandbox.name)
                        return True
        return False

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]] | bool:
        """``-L``: only into this connection's sandbox, reached at its private address (asyncssh
        confirms the channel once ``_dial`` has connected, and fails its open if that raises)."""
        target = self.target
        if target is None or self.conn is None:
            return False
        if dest_host not in (*LOCAL_NAMES, target.sandbox_id, target.name):
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "only the sandbox itself can be reached"
            )
        return _dial(self.services, self.conn, target, dest_port)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # -R would listen on the gateway's machine: refused

    def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
        return _GatewayProcess(_session, None, MIN_SFTP_VERSION, False)


class _GatewayProcess(asyncssh.SSHServerProcess[bytes]):
    """asyncssh's server process, except that the ``sftp`` subsystem is ours to run (an sftp-server
    in the sandbox), not asyncssh's own SFTP server on this machine's files."""

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        # asyncssh's version sends the sftp subsystem to its own server; every session here, sftp
        # included, goes to ``_session`` (this is the rest of that method).
        stdin = SSHReader[bytes](self, self._chan)
        stdout = SSHWriter[bytes](self, self._chan)
        stderr = SSHWriter[bytes](self, self._chan, EXTENDED_DATA_STDERR)
        assert self._session_factory is not None and self._conn is not None
        handler = self._session_factory(stdin, stdout, stderr)
        if inspect.isawaitable(handler):
            self._conn.create_task(handler, stdin.logger)


#: How long opening a ``-L`` connection to the sandbox may take before the channel open fails. The
#: kernel's own bound is minutes of SYN retries, all that time holding a channel that says nothing.
DIAL_TIMEOUT_S = 10


async def _dial(
    services: Services, conn: asyncssh.SSHServerConnection, target: _Target, port: int
) -> _SandboxTunnel:
    """The connection to ``<sandbox ip>:port`` (a paused sandbox is woken) for one ``-L`` channel,
    made before the channel is confirmed; a failure is the channel open's failure."""
    try:
        sandbox = await terminals.wake(services, target.user_id, target.sandbox_id)
        if not sandbox.ip:
            raise errors.InvalidState("sandbox has no address")
        async with asyncio.timeout(DIAL_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(sandbox.ip, port)
    except (OSError, errors.PaddockError) as exc:
        # The client shows "open failed: connect failed: <reason>" (OpenSSH's words for the code).
        if isinstance(exc, TimeoutError):
            reason = os.strerror(errno.ETIMEDOUT)
        elif isinstance(exc, OSError):  # its str() names the sandbox's private address: not shown
            reason = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        else:
            reason = str(exc)
        log.info("ssh_forward_failed", sandbox_id=target.sandbox_id, port=port, error=reason)
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, reason) from None
    if conn.is_closed():  # the client went away while this dialled: asyncssh drops the session
        writer.close()
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "SSH connection closed")
    return _SandboxTunnel(reader, writer)


class _SandboxTunnel(asyncssh.SSHTCPSession[bytes]):
    """One ``-L`` connection: bytes spliced between the channel and the sandbox's ``reader``/``writer``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.chan: asyncssh.SSHTCPChannel[bytes] | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, chan: asyncssh.SSHTCPChannel[bytes]) -> None:
        self.chan = chan
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        assert self.chan is not None
        try:
            while chunk := await self.reader.read(65536):
                self.chan.write(chunk)
            self.chan.write_eof()
        except (OSError, asyncssh.Error):
            self.chan.close()

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.writer.write(data)

    def eof_received(self) -> bool:
        if self.writer.can_write_eof():
            self.writer.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.writer.close()
        if self.task is not None and not self.task.done():
            self.task.cancel()


async def _session(process: asyncssh.SSHServerProcess[bytes]) -> None:
    server = process.channel.get_connection().get_owner()
    assert isinstance(server, GatewayServer) and server.target is not None
    target = server.target
    if process.subsystem and process.subsystem != "sftp":
        process.stderr.write(f"paddock: subsystem {process.subsystem} is not available\r\n".encode())
        process.exit(1)
        return
    pty = None
    if process.get_terminal_type() and not process.subsystem:
        cols, rows, _, _ = process.get_terminal_size()
        pty = ProcessPty(rows=max(1, min(rows or 24, 10000)), cols=max(1, min(cols or 80, 10000)))
    try:
        argv: tuple[str, list[str]] | None = None
        if process.subsystem:
            argv = (await _sftp_server(server.services, target), [])
        terminal = await terminals.Terminal.open(
            server.services, target.user_id, target.sandbox_id, pty=pty, command=process.command, argv=argv
        )
    except (errors.PaddockError, hostlink.HostError, hostlink.SandboxGoneError, OSError) as exc:
        process.stderr.write(f"paddock: {getattr(exc, 'message', exc)}\r\n".encode())
        process.exit(255)
        return
    feeder = asyncio.create_task(_feed(process, terminal))
    code = 255
    try:
        async for frame in terminal.frames():
            if frame.type == "data":
                sink = process.stderr if frame.stream == "stderr" else process.stdout
                sink.write(terminals.decode(frame))
            elif frame.type == "exit":
                code = frame.exit_code if frame.exit_code is not None else 255
            else:
                process.stderr.write(f"paddock: {frame.error}\r\n".encode())
    except (errors.PaddockError, asyncssh.Error, OSError) as exc:
        log.info("ssh_session_lost", sandbox_id=target.sandbox_id, error=str(exc))
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeder
        await terminal.close()
    process.exit(code)


async def _sftp_server(services: Services, target: _Target) -> str:
    """The path of an sftp-server in the sandbox: the image's, else ours, copied in on first use."""
    sandbox = await terminals.wake(services, target.user_id, target.sandbox_id)
    link = await hostlink.for_host(services, sandbox.host_id)
    probe = f"for p in {IMAGE_SFTP_SERVER} {SHIPPED_SFTP_SERVER}; do test -x $p && echo $p && break; done"
    found = (await link.exec(sandbox.id, "sh", ["-c", probe], {}, None)).get("stdout", "").strip()
    if found:
        return str(found)
    if not LOCAL_SFTP_SERVER.is_file():
        raise errors.InvalidState("no sftp-server in the sandbox, and none on the gateway to copy in")

    async def binary() -> AsyncIterator[bytes]:
        yield LOCAL_SFTP_SERVER.read_bytes()

    await link.upload(sandbox.id, SHIPPED_SFTP_SERVER, binary())
    await link.exec(sandbox.id, "chmod", ["755", SHIPPED_SFTP_SERVER], {}, None)
    return SHIPPED_SFTP_SERVER


async def _feed(process: asyncssh.SSHServerProcess[bytes], terminal: terminals.Terminal) -> None:
    """The client's keystrokes and window changes; EOF closes a command's stdin."""
    while True:
        try:
            data = await process.stdin.read(65536)
        except asyncssh.TerminalSizeChanged as change:
            await terminal.resize(change.height, change.width)
            continue
        except (asyncssh.BreakReceived, asyncssh.SignalReceived):
            continue
        if not data:
            if process.get_terminal_type() is None:
                await terminal.close_stdin()
            return
        await terminal.write(data)


class SshGateway:
    def __init__(self, server: asyncssh.SSHAcceptor) -> None:
        self.server = server

    @property
    def port(self) -> int:
        return int(self.server.get_port())

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


#: How long a connection may take from its opening to a successful login (key exchange and
#: authentication) before it is closed. asyncssh's default is 120 s (OpenSSH's LoginGraceTime), so a
#: client that connected and sent nothing held a descriptor and a task for two minutes (slow-loris).
LOGIN_TIMEOUT_S = 30


async def start(services: Services, host: str, port: int, key_file: Path) -> SshGateway:
    acceptor = await asyncssh.create_server(
        lambda: GatewayServer(services),
        host,
        port,
        server_host_keys=[host_key(key_file)],
        encoding=None,  # bytes both ways: terminals carry any byte
        allow_scp=False,
        sftp_factory=None,
        agent_forwarding=False,
        x11_forwarding=False,
        login_timeout=LOGIN_TIMEOUT_S,
    )
    log.info("ssh_gateway_started", host=host, port=acceptor.get_port())
    return SshGateway(acceptor)

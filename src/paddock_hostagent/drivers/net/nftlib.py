"""nftables commands in process through libnftables (what the ``nft`` tool itself uses), via ctypes.

Spawning ``nft`` costs a fork and exec of the agent's large process (tens of ms on a busy host); the
library runs the same command text in about a millisecond. Commands run in a worker thread under a
lock (one context, not thread-safe). Without the library, ``nft`` is spawned instead.

A batch of only element and quota changes (``nftnetlink.Op``) goes to the kernel as netlink messages
instead (``apply``): libnftables reads every table, chain, set and named object of the namespace before
such a batch, which grew with the sandboxes on the host. Both the library's context and the netlink
socket are opened when the object is made, so they act on the network namespace it was made in.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import threading
from collections.abc import Sequence

from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.net.nftnetlink import NetlinkError, NftNetlink, Op, render
from paddock_hostagent.drivers.system.commands import run

NFT_CTX_OUTPUT_JSON = 1 << 4


class Nft:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._ctx: int | None = None
        self._netlink: NftNetlink | None = None
        with contextlib.suppress(OSError):  # no nfnetlink (not root, a kernel without it): text only
            self._netlink = NftNetlink()
        try:
            lib = ctypes.CDLL("libnftables.so.1")
        except OSError:
            return
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_int
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            return
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        self._lib, self._ctx = lib, ctx

    def _run_in_process(self, commands: str, json_output: bool) -> str:
        assert self._lib is not None
        with self._lock:
            self._lib.nft_ctx_output_set_flags(self._ctx, NFT_CTX_OUTPUT_JSON if json_output else 0)
            code = self._lib.nft_run_cmd_from_buffer(self._ctx, commands.encode())
            output = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
            error = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
        if code != 0:
            raise CommandFailedError(["nft", commands.split("\n", 1)[0]], code, error)
        return output

    async def run(self, commands: str, *, json_output: bool = False) -> str:
        """Runs ``commands`` (nft syntax, one per line) as one atomic batch; returns the output."""
        if self._lib is not None:
            return await asyncio.to_thread(self._run_in_process, commands, json_output)
        argv = ["nft", "-j", *commands.split()] if json_output else ["nft", "-f", "-"]
        return await run(argv, input_text=None if json_output else commands + "\n")

    async def apply(self, table: str, batch: Sequence[Op | str]) -> None:
        """Runs ``batch`` on ``table`` ("ip name") as one atomic batch: as netlink messages when it holds
        only ``Op``s, else as text (each ``Op`` rendered, the strings as they are) through libnftables
        (or ``nft``). A refused batch applies nothing and is a ``CommandFailedError`` either way."""
        if batch:
            await asyncio.to_thread(self.apply_sync, table, batch)

    def apply_sync(self, table: str, batch: Sequence[Op | str]) -> None:
        """``apply``, blocking (for callers already in a worker thread)."""
        ops = [item for item in batch if not isinstance(item, str)]
        if not batch:
            return
        if self._netlink is not None and len(ops) == len(batch):
            try:
                self._netlink.apply(table, ops)
            except NetlinkError as error:
                raise CommandFailedError(["nft", render(table, ops[0])], 1, str(error)) from None
            return
        self.run_sync("\n".join(item if isinstance(item, str) else render(table, item) for item in batch))

    def run_sync(self, commands: str) -> str:
        if self._lib is not None:
            return self._run_in_process(commands, False)
        from paddock_hostagent.drivers.system.commands import run_sync

        return run_sync(["nft", "-f", "-"], input_text=commands + "\n")

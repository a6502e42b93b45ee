"""Element and named-object changes to an nftables table as netlink messages, without libnftables.

libnftables reads the tables, chains, sets and named objects of the whole network namespace before it
runs any command that names a set element (the ruleset's generation changes with every batch, so it
reads them again each time). In the host's namespace the egress table holds a named quota per metered
sandbox, so every create's and destroy's batch read 1,000 of them at 1,000 live (0.3 ms beside one
sandbox, 1.2 ms beside 1,000 in a quiet namespace of their own, 2.2-2.7 ms in a busy agent). The kernel
needs none of that: the batches of a create, a destroy and a quota change are only elements keyed on a
veth name and quota objects, which are sent here as the messages ``nft`` itself would send (compare
``nft --debug=netlink,mnl``), in one atomic nfnetlink batch.

A batch is a list of :data:`Op`; :func:`render` writes any op as ``nft`` text, so a batch that also
holds text (an address, a range, a timeout) runs as text through libnftables, one source either way.
Names come from parsed fields (a veth the agent named, a set or chain of the layout): each is checked
to be what the kernel takes (``IFNAMSIZ`` for an interface, ``NFT_NAME_MAXLEN`` for the rest) before
a message is built, so a bad one is an error here, not a message the kernel reads differently.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import threading
from dataclasses import dataclass

#: netlink and nfnetlink constants (linux/netlink.h, linux/netfilter/nfnetlink.h, nf_tables.h).
NETLINK_NETFILTER = 12
NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE = 0x1, 0x4, 0x400
NLMSG_ERROR = 0x2
NLA_F_NESTED = 0x8000
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NFT_MSG_NEWOBJ, NFT_MSG_DELOBJ = 18, 20
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_OBJREF = 1, 2, 9
NFTA_DATA_VALUE, NFTA_DATA_VERDICT = 1, 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
NFT_GOTO = -4
NFTA_OBJ_TABLE, NFTA_OBJ_NAME, NFTA_OBJ_TYPE, NFTA_OBJ_DATA = 1, 2, 3, 4
NFT_OBJECT_QUOTA = 2
NFTA_QUOTA_BYTES, NFTA_QUOTA_FLAGS, NFTA_QUOTA_CONSUMED = 1, 2, 4
NFT_QUOTA_F_INV = 1  # "over": the quota matches once the bytes are spent
FAMILIES = {"ip": 2, "inet": 1, "ip6": 10}
IFNAMSIZ = 16
NFT_NAME_MAXLEN = 256
#: How long a batch waits for the kernel's answers before it is called failed.
ANSWER_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AddQuota:
    """``add quota``: a named quota that matches once ``over_bytes`` are spent, ``used_bytes`` of them
    already (an existing one of the name is updated, as ``nft`` does)."""

    name: str
    over_bytes: int
    used_bytes: int = 0


@dataclass(frozen=True)
class DeleteQuota:
    name: str


@dataclass(frozen=True)
class AddElement:
    """``add element``: ``key`` (an interface name), or ``key . address`` in a set of ``ifname .
    ipv4_addr``, in ``set``, mapped to a ``goto`` of a chain or to a named object, or to nothing. An
    element already there stays as it is (its counter too)."""

    set: str
    key: str
    goto: str | None = None
    object: str | None = None
    address: str | None = None


@dataclass(frozen=True)
class DeleteElement:
    set: str
    key: str
    address: str | None = None


Op = AddQuota | DeleteQuota | AddElement | DeleteElement


def render(table: str, op: Op) -> str:
    """``op`` as one line of ``nft`` text, on ``table`` ("ip name")."""
    if isinstance(op, AddQuota):
        return f"add quota {table} {op.name} {{ over {op.over_bytes} bytes used {op.used_bytes} bytes }}"
    if isinstance(op, DeleteQuota):
        return f"delete quota {table} {op.name}"
    key = f'"{op.key}"' + (f" . {ipaddress.IPv4Address(op.address)}" if op.address is not None else "")
    if isinstance(op, AddElement):
        value = f" : goto {op.goto}" if op.goto else f' : "{op.object}"' if op.object else ""
        return f"add element {table} {op.set} {{ {key}{value} }}"
    return f"delete element {table} {op.set} {{ {key} }}"


class NetlinkError(OSError):
    """The kernel refused a batch (nothing of it was applied)."""


def _attr(kind: int, payload: bytes) -> bytes:
    header = struct.pack("=HH", 4 + len(payload), kind)
    return header + payload + b"\0" * (-len(payload) % 4)


def _nested(kind: int, *attrs: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, b"".join(attrs))


def _name(text: str, limit: int = NFT_NAME_MAXLEN) -> bytes:
    raw = text.encode()
    if not raw or len(raw) >= limit or b"\0" in raw or not text.isascii() or not text.isprintable():
        raise ValueError(f"not an nftables name: {text!r}")
    return raw + b"\0"


def _ifname_key(name: str) -> bytes:
    """An ``ifname`` key as the kernel holds it: the name, NUL-padded to ``IFNAMSIZ``."""
    return _name(name, IFNAMSIZ).ljust(IFNAMSIZ, b"\0")


def _payload(table: str, op: Op) -> tuple[int, int, bytes]:
    """(message type, flags, attributes) of ``op`` on table ``table`` (a bare name)."""
    if isinstance(op, AddQuota | DeleteQuota):
        head = _attr(NFTA_OBJ_TABLE, _name(table)) + _attr(NFTA_OBJ_NAME, _name(op.name))
        head += _attr(NFTA_OBJ_TYPE, struct.pack(">I", NFT_OBJECT_QUOTA))
        if isinstance(op, DeleteQuota):
            return NFT_MSG_DELOBJ, 0, head
        if op.over_bytes < 0 or op.used_bytes < 0:
            raise ValueError(f"a quota counts bytes from 0: {op!r}")
        data = _nested(
            NFTA_OBJ_DATA,
            _attr(NFTA_QUOTA_BYTES, struct.pack(">Q", op.over_bytes)),
            _attr(NFTA_QUOTA_CONSUMED, struct.pack(">Q", op.used_bytes)),
            _attr(NFTA_QUOTA_FLAGS, struct.pack(">I", NFT_QUOTA_F_INV)),
        )
        return NFT_MSG_NEWOBJ, NLM_F_CREATE, head + data
    key = _ifname_key(op.key)
    if op.address is not None:  # a concatenation: each field in whole 4-byte registers, as the kernel keys it
        key += ipaddress.IPv4Address(op.address).packed
    element = [_nested(NFTA_SET_ELEM_KEY, _attr(NFTA_DATA_VALUE, key))]
    if isinstance(op, AddElement) and op.goto:
        verdict = _nested(
            NFTA_DATA_VERDICT,
            _attr(NFTA_VERDICT_CODE, struct.pack(">i", NFT_GOTO)),
            _attr(NFTA_VERDICT_CHAIN, _name(op.goto)),
        )
        element.append(_nested(NFTA_SET_ELEM_DATA, verdict))
    elif isinstance(op, AddElement) and op.object:
        element.append(_attr(NFTA_SET_ELEM_OBJREF, _name(op.object)))
    body = (
        _attr(NFTA_SET_ELEM_LIST_TABLE, _name(table))
        + _attr(NFTA_SET_ELEM_LIST_SET, _name(op.set))
        + _nested(NFTA_SET_ELEM_LIST_ELEMENTS, _nested(NFTA_LIST_ELEM, *element))
    )
    if isinstance(op, AddElement):
        return NFT_MSG_NEWSETELEM, NLM_F_CREATE, body
    return NFT_MSG_DELSETELEM, 0, body


def _message(kind: int, flags: int, seq: int, family: int, res_id: int, attrs: bytes) -> bytes:
    extra = struct.pack("=BBH", family, 0, socket.htons(res_id))
    return (
        struct.pack("=IHHII", 16 + len(extra) + len(attrs), kind, NLM_F_REQUEST | flags, seq, 0)
        + extra
        + attrs
    )


class NftNetlink:
    """One nfnetlink socket, opened where the object is made (its network namespace for good)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self._sock.bind((0, 0))
        self._sock.settimeout(ANSWER_TIMEOUT_S)
        self._lock = threading.Lock()
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def apply(self, table: str, ops: list[Op]) -> None:
        """Applies ``ops`` to ``table`` ("ip name") in one atomic batch; :class:`NetlinkError` (with the
        first refused op and the kernel's reason) when the kernel refused it, nothing applied then."""
        family_name, _, name = table.partition(" ")
        family = FAMILIES[family_name]
        built = [_payload(name, op) for op in ops]  # a bad name fails before anything is sent
        with self._lock:
            first = self._seq + 1
            self._seq += len(built) + 2
            parts = [_message(NFNL_MSG_BATCH_BEGIN, 0, first, 0, NFNL_SUBSYS_NFTABLES, b"")]
            for index, (kind, flags, attrs) in enumerate(built):
                parts.append(
                    _message(
                        (NFNL_SUBSYS_NFTABLES << 8) | kind,
                        flags | NLM_F_ACK,
                        first + 1 + index,
                        family,
                        0,
                        attrs,
                    )
                )
            parts.append(
                _message(NFNL_MSG_BATCH_END, 0, first + 1 + len(built), 0, NFNL_SUBSYS_NFTABLES, b"")
            )
            waiting = set(range(first + 1, first + 1 + len(built)))
            refused: list[tuple[int, int]] = []  # (seq, errno)
            try:
                self._sock.sendall(b"".join(parts))
            except OSError as error:
                raise NetlinkError(
                    error.errno or errno.EIO, f"sending a batch to nf_tables: {error}"
                ) from None
            while waiting:
                try:
                    data = self._sock.recv(65536)
                except TimeoutError:
                    raise NetlinkError(errno.ETIMEDOUT, "no answer from nf_tables to a batch") from None
                except OSError as error:
                    raise NetlinkError(
                        error.errno or errno.EIO, f"reading nf_tables' answer: {error}"
                    ) from None
                offset = 0
                while offset + 16 <= len(data):
                    length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
                    if kind == NLMSG_ERROR and seq in waiting:
                        (code,) = struct.unpack_from("=i", data, offset + 16)
                        waiting.discard(seq)
                        if code:
                            refused.append((seq, -code))
                    offset += max((length + 3) & ~3, 16)
        if refused:
            seq, code = min(refused)
            op = ops[seq - first - 1]
            raise NetlinkError(code, f"{os.strerror(code)}: {render(table, op)}")

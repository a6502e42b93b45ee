"""Names of this network namespace's links of one kind, asked of the kernel with a filtered dump.

pyroute2 dumps every link and parses each one in Python before filtering: with a veth per sandbox that
is ~0.3 s per call beside 1,000 sandboxes, and the agent asks for its bridges on every heartbeat. The
kernel filters a link dump by ``IFLA_INFO_KIND`` itself (``rtnl_dump_ifinfo``), so this asks for that
kind only and reads nothing but each answer's name (~0.1 ms).
"""

from __future__ import annotations

import socket
import struct

RTM_GETLINK = 18
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 18, 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_ATTR = struct.Struct("=HH")  # nlattr: length, type


def _attribute(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _names(data: bytes, start: int, end: int) -> list[str]:
    names: list[str] = []
    at = start
    while at + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, at)
        if length < _ATTR.size:
            break
        if kind & NLA_TYPE_MASK == IFLA_IFNAME:
            names.append(data[at + _ATTR.size : at + length].rstrip(b"\0").decode())
        at += (length + 3) & ~3
    return names


def links_of_kind(kind: str) -> list[str]:
    """Names of the links whose kind is ``kind`` (``bridge``, ``veth``, ``vxlan`` …), sorted."""
    linkinfo = _attribute(IFLA_INFO_KIND, kind.encode() + b"\0")
    body = _IFINFO.pack(0, 0, 0, 0, 0) + _attribute(IFLA_LINKINFO | NLA_F_NESTED, linkinfo)
    request = _HEADER.pack(_HEADER.size + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body
    names: list[str] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.send(request)
        while True:
            data = sock.recv(1 << 16)
            at = 0
            while at + _HEADER.size <= len(data):
                length, message, _, _, _ = _HEADER.unpack_from(data, at)
                if message == NLMSG_DONE:
                    return sorted(names)
                if message == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", data, at + _HEADER.size)
                    if error:
                        raise OSError(-error, f"netlink link dump of kind {kind!r} failed")
                    return sorted(names)
                names += _names(data, at + _HEADER.size + _IFINFO.size, at + length)
                at += (length + 3) & ~3

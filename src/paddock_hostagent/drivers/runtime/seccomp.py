"""The default seccomp profile for sandboxes: allow by default, refuse what a container has no business
doing.

Docker's default profile is an allow-list of ~350 calls. This one is the inverse, and narrower in what
it lets through: everything Docker refuses without extra capabilities is refused here too (kernel
modules, kexec, reboot, mounting, swap, clock setting, kernel keyrings, BPF, perf, userfaultfd,
io_uring, handle-based opens, quotas), plus tracing other processes (``ptrace``,
``process_vm_readv/writev``) and creating new namespaces (``unshare``, and ``clone`` with namespace
flags). ``clone3`` answers ENOSYS so that libc falls back to ``clone``, whose flags can be inspected.
Denied calls fail with EPERM rather than killing the process, so well-behaved programs degrade.
"""

from __future__ import annotations

import errno
from typing import Any

DENIED_SYSCALLS = (
    # kernel and machine
    "kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
    "create_module", "get_kernel_syms", "query_module", "swapon", "swapoff", "acct", "syslog",
    "iopl", "ioperm", "uselib", "_sysctl", "nfsservctl", "vhangup", "lookup_dcookie",
    # mounts and root switching
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "quotactl", "quotactl_fd",
    # clocks
    "settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64",
    "adjtimex",
    # keyrings, BPF, perf, userfaultfd, io_uring
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # tracing and reaching into other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # handle-based opens bypass path checks
    "open_by_handle_at", "name_to_handle_at",
    # namespaces
    "unshare", "setns",
    # NUMA policy (Docker: CAP_SYS_NICE)
    "mbind", "set_mempolicy", "move_pages", "migrate_pages",
    # 32-bit oddities
    "vm86", "vm86old",
)  # fmt: skip

# CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET
# (CLONE_NEWTIME exists only for clone3, which is refused as a whole.)
_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def default_profile() -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object."""
    syscalls: list[dict[str, Any]] = [
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    # One rule per flag: seccomp can compare a masked argument for equality, not for "any bit set".
    for flag in _NAMESPACE_FLAGS:
        syscalls.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": syscalls,
    }

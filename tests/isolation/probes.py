"""Escape probes: scripts run inside a sandbox, each trying one way out. The catalogue is data so that
every tier runs the same probes (tests/isolation/test_escape_probes.py).

A probe script prints ``ESCAPED <what>`` when the attempt worked and ``DENIED <why>`` when it did not.
A script that prints neither did not really try (a missing tool, a typo), and counts as a failure of the
suite, not as a probe that held: a probe must show that it ran. Some probes are also checked from the
host (a file left unwritten, a process still alive, a listener that accepted nothing).

The image is ``debian:13`` (minbase): bash, coreutils, perl-base, curl. Raw system calls go through
perl's ``syscall`` with x86_64 numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

# x86_64 system call numbers used below.
SYS_PTRACE = 101
SYS_MOUNT = 165
SYS_INIT_MODULE = 175
SYS_FINIT_MODULE = 313
SYS_OPEN_BY_HANDLE_AT = 304
SYS_BPF = 321
PTRACE_ATTACH = 16


@dataclass(frozen=True)
class Probe:
    name: str  # the test id
    what: str  # one line for the report
    script: str  # bash; may use {placeholders} filled by the test (see Targets)


@dataclass(frozen=True)
class Targets:
    """What the probes aim at, made by the test on the host."""

    host_secret_path: str
    host_secret: str
    host_write_path: str
    host_pid: int
    host_marker: str

    @property
    def host_marker_split(self) -> str:
        half = len(self.host_marker) // 2
        return f"{self.host_marker[:half]} {self.host_marker[half:]}"

    victim_ip: str
    victim_port: int
    victim_secret: str
    dial_targets: str  # "ip:port ip:port …": every host address × every host TCP port
    host_root_device: str  # "major minor" of the block device holding the host's /


def _perl(code: str) -> str:
    return "perl -e '" + code.replace("'", "'\\''") + "'"


# Connects to every "ip:port" in $TARGETS at once (non-blocking) and prints OPEN for any that connected
# within 3 s; dropped packets cost no more than the one wait.
_DIAL_ALL = _perl(
    "use Socket; use IO::Socket::INET; use IO::Select;"
    " my $sel = IO::Select->new; my %name;"
    " for my $t (split / /, $ENV{TARGETS}) { my ($h, $p) = split /:/, $t;"
    "   my $s = IO::Socket::INET->new(PeerAddr => $h, PeerPort => $p, Proto => 'tcp', Blocking => 0) or next;"
    "   $name{$s} = $t; $sel->add($s); }"
    " print 'TRIED ', scalar(keys %name), qq{\\n};"
    " my $end = time + 3;"
    " while ($sel->count && time < $end) { for my $s ($sel->can_write(0.2)) {"
    "   my $err = $s->getsockopt(SOL_SOCKET, SO_ERROR); print qq{OPEN $name{$s}\\n} if !$err && $s->connected;"
    "   $sel->remove($s); } }"
)


PROBES: tuple[Probe, ...] = (
    Probe(
        "host-file-read",
        "read a file the host wrote, by path and through /proc/*/root",
        "found=0; for p in {host_secret_path} /proc/[0-9]*/root{host_secret_path}; do"
        " grep -qs '{host_secret}' \"$p\" && found=1; done;"
        " if [ $found = 1 ]; then echo ESCAPED host file; else echo DENIED no host file visible; fi",
    ),
    Probe(
        "host-file-write",
        "write a file at a host path (checked on the host)",
        "for p in {host_write_path} /proc/1/root{host_write_path}; do"
        ' mkdir -p "$(dirname $p)" 2>/dev/null; echo pwned > "$p" 2>/dev/null; done;'
        " echo DENIED the host checks its own path",
    ),
    Probe(
        "host-process-see",
        "find a host process by its command line in /proc",
        # The marker is split so that no command line in the sandbox (this script's) holds it whole.
        "printf '%s%s' {host_marker_split} > /tmp/marker;"
        " if grep -aqsFf /tmp/marker /proc/[0-9]*/cmdline; then echo ESCAPED host process visible;"
        " else echo DENIED no host process visible; fi",
    ),
    Probe(
        "host-process-kill",
        "SIGKILL a host process by its host pid (checked on the host)",
        "kill -9 {host_pid} 2>/dev/null; echo DENIED the host checks its process",
    ),
    Probe(
        "ptrace-outside",
        "ptrace(PTRACE_ATTACH) a host process",
        _perl(
            f"my $r = syscall({SYS_PTRACE}, {PTRACE_ATTACH}, {{host_pid}}, 0, 0);"
            ' print $r == 0 ? "ESCAPED attached\\n" : "DENIED $!\\n";'
        ),
    ),
    Probe(
        "other-sandbox-files",
        "read another sandbox's file through /proc/*/root or where files are usually kept",
        "if grep -rqs '{victim_secret}' /root /tmp /run /var/tmp /mnt /proc/[0-9]*/root/root 2>/dev/null;"
        " then echo ESCAPED other sandbox file; else echo DENIED not visible; fi",
    ),
    Probe(
        "other-sandbox-network",
        "connect to a port another sandbox listens on",
        "TARGETS={victim_ip}:{victim_port} " + _DIAL_ALL + " | grep -q OPEN"
        " && echo ESCAPED reached the other sandbox || echo DENIED not reachable",
    ),
    Probe(
        "host-services",
        "connect to every TCP port the host listens on (agent, control plane, probes' listener …) on every"
        " host IPv4 address",
        "out=$(TARGETS='{dial_targets}' "
        + _DIAL_ALL
        + "); echo \"$out\" | grep '^OPEN' | sed 's/^/ESCAPED /';"
        " echo \"$out\" | grep -q '^TRIED' && ! echo \"$out\" | grep -q '^OPEN' && echo DENIED none answered",
    ),
    Probe(
        "raw-socket",
        "open raw IP and packet sockets",
        _perl(
            "use Socket; my @got;"
            " for my $t ([PF_INET, SOCK_RAW, 255], [17, SOCK_RAW, 768]) {"
            "   push @got, socket(my $s, $t->[0], $t->[1], $t->[2]) ? 'opened' : $!; }"
            ' print grep({ $_ eq "opened" } @got) ? "ESCAPED @got\\n" : "DENIED @got\\n";'
        ),
    ),
    Probe(
        "mount",
        "mount tmpfs, proc and the cgroup v1 hierarchy",
        _perl(
            "my @got; mkdir '/tmp/m';"
            " for my $fs (['none', 'tmpfs'], ['proc', 'proc'], ['cgroup', 'cgroup']) {"
            f"   my ($src, $dst, $type) = ($fs->[0], '/tmp/m', $fs->[1]);"
            f"   push @got, syscall({SYS_MOUNT}, $src, $dst, $type, 0, 0) == 0 ? 'mounted' : $!; }}"
            ' print grep({ $_ eq "mounted" } @got) ? "ESCAPED @got\\n" : "DENIED @got\\n";'
        ),
    ),
    Probe(
        "module-load",
        "load a kernel module (init_module, finit_module)",
        _perl(
            "my $img = 'x' x 64; my $args = ''; open(my $f, '<', '/bin/true');"
            f" my $a = syscall({SYS_INIT_MODULE}, $img, 64, $args); my $ea = $!;"
            f" my $b = syscall({SYS_FINIT_MODULE}, fileno($f), $args, 0); my $eb = $!;"
            ' print(($a == 0 || $b == 0) ? "ESCAPED loaded\\n" : "DENIED $ea / $eb\\n");'
        ),
    ),
    Probe(
        "devices",
        "open the host's root disk, /dev/mem and /dev/kvm, also through fresh device nodes",
        "got=''; mknod /tmp/hd b {host_root_device} 2>/dev/null; mknod /tmp/mem c 1 1 2>/dev/null;"
        " for d in /tmp/hd /tmp/mem /dev/kvm /dev/mem /dev/sda /dev/vda /dev/loop0; do"
        ' if head -c 1 "$d" >/dev/null 2>&1; then got="$got $d"; fi; done;'
        ' if [ -n "$got" ]; then echo ESCAPED read$got; else echo DENIED no device readable; fi',
    ),
    Probe(
        "proc-sys-write",
        "write kernel settings under /proc/sys and /proc/sysrq-trigger",
        "got=''; for k in kernel/hostname vm/drop_caches kernel/sysrq net/ipv4/ip_forward; do"
        ' v=$(cat /proc/sys/$k 2>/dev/null); if (echo "$v" > /proc/sys/$k) 2>/dev/null; then got="$got $k"; fi;'
        ' done; if (echo h > /proc/sysrq-trigger) 2>/dev/null; then got="$got sysrq-trigger"; fi;'
        ' if [ -n "$got" ]; then echo ESCAPED wrote$got; else echo DENIED read-only; fi',
    ),
    Probe(
        "kernel-interfaces",
        "bpf() and open_by_handle_at() (the 'shocker' escape)",
        _perl(
            'my $attr = "\\0" x 128; my $handle = pack(\'LL\', 8, 1) . "\\0" x 8;'
            f" my $a = syscall({SYS_BPF}, 5, $attr, 128); my $ea = $!;"
            f" my $b = syscall({SYS_OPEN_BY_HANDLE_AT}, -100, $handle, 0); my $eb = $!;"
            ' print(($a >= 0 || $b >= 0) ? "ESCAPED bpf=$a handle=$b\\n" : "DENIED $ea / $eb\\n");'
        ),
    ),
)

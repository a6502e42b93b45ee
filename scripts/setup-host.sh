#!/usr/bin/env bash
# Install what Paddock needs on a Debian machine, as root. Idempotent: a second run installs nothing.
#   scripts/setup-host.sh          system packages for running the platform
#   scripts/setup-host.sh --test   plus the servers the test suite talks to (PostgreSQL) and the bench tools
#   scripts/setup-host.sh --bench  plus the benchmark's peer and load tool (podman, wrk)
set -euo pipefail

want=(python3 python3-venv python3-dev gcc libc6-dev make runc crun mmdebstrap nftables iproute2
      e2fsprogs xfsprogs util-linux kmod procps curl ca-certificates fuse3 s3fs
      buildah      # template builds (Dockerfile → image); RUN steps under crun
      runsc        # the gVisor tier (PADDOCK_HOST_RUNTIME=runsc, docs/isolation.md)
      openssh-sftp-server  # the SSH gateway serves sftp/scp with it when an image has none
      qemu-system-x86 qemu-utils busybox-static)  # the VM tier (drivers/vm/qemu.py): QEMU, qcow2, initramfs
if [[ "${1:-}" == "--test" || "${1:-}" == "--bench" ]]; then
  want+=(openssh-client)  # the SSH gateway is tested, and benched, with the real OpenSSH client
fi
if [[ "${1:-}" == "--test" ]]; then
  want+=(postgresql podman wrk)  # the bench smoke run (tests/bench) drives podman and wrk
  want+=(chromium)  # tests/desktop load a desktop's noVNC live view in headless Chromium
  want+=(prometheus)  # tests/observability scrape every service with a real Prometheus server
elif [[ "${1:-}" == "--bench" ]]; then
  want+=(podman wrk)
fi
command -v npm >/dev/null 2>&1 || want+=(nodejs npm)

missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup-host: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's prometheus package enables a server on :9090 that scrapes itself; the tests start their own
# (own config, storage and port) and nothing here should run one.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled -q prometheus.service 2>/dev/null; then
  systemctl disable -q prometheus.service
  systemctl stop prometheus.service 2>/dev/null || true  # no-op where systemd is not running
fi

# The VM tier's guest kernel: Debian's cloud kernel, unpacked (not installed) under /var/lib/paddock/vm-kernel,
# with `current` pointing at the newest one. drivers/vm/vmimage.py builds the initramfs from its modules.
kernel_root=/var/lib/paddock/vm-kernel
kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
if [[ -n "$kernel_pkg" && ! -e "$kernel_root/$kernel_pkg/.unpacked" ]]; then
  echo "setup-host: unpacking $kernel_pkg for the VM tier"
  mkdir -p "$kernel_root/$kernel_pkg"
  (cd "$kernel_root" && rm -f ./"$kernel_pkg"_*.deb && apt-get download -qq -o APT::Sandbox::User=root "$kernel_pkg" \
     && dpkg-deb -x ./"$kernel_pkg"_*.deb "$kernel_pkg" && rm -f ./"$kernel_pkg"_*.deb)
  touch "$kernel_root/$kernel_pkg/.unpacked"
  ln -sfn "$kernel_pkg" "$kernel_root/current"
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Paddock needs Python 3.11 or newer; python3 is {sys.version.split()[0]}")
PY

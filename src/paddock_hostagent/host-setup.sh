#!/usr/bin/env bash
# Prepare a Debian machine to run a Paddock host agent, as root. Idempotent.
# The agent repeats the runtime part of this (prepare_host) every time it starts; this script adds the
# packages, which the agent cannot install itself.
#   src/paddock_hostagent/host-setup.sh [NFT_TABLE]
set -euo pipefail

want=(runc crun nftables iproute2 util-linux e2fsprogs xfsprogs gcc libc6-dev mmdebstrap ca-certificates)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# crun refuses a hybrid cgroup layout whose v2 side lists hugetlb unless the v1 hugetlb hierarchy is mounted.
if [[ -d /sys/fs/cgroup/memory ]] && ! mountpoint -q /sys/fs/cgroup/hugetlb; then
  mkdir -p /sys/fs/cgroup/hugetlb
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb || echo "host-setup: hugetlb not mounted; crun unusable, runc will be used" >&2
fi
grep -qw overlay /proc/filesystems || modprobe overlay
test -e /dev/loop-control || modprobe loop
sysctl -qw net.ipv4.ip_forward=1
# Floors (a higher value is kept): tenants' root shares root's inotify counts on the container tiers.
(( $(sysctl -n fs.inotify.max_user_instances) >= 8192 )) || sysctl -qw fs.inotify.max_user_instances=8192
(( $(sysctl -n fs.inotify.max_user_watches) >= 1048576 )) || sysctl -qw fs.inotify.max_user_watches=1048576
# A ceiling (a shorter interval is kept): XFS's log worker each second, not every 30 s, so a fork finds
# what its source's filesystem logged already home (host.py, hurry_xfs_log_worker). Absent without XFS.
if worker=$(sysctl -n fs.xfs.xfssyncd_centisecs 2>/dev/null) && (( worker > 100 )); then
  sysctl -qw fs.xfs.xfssyncd_centisecs=100
fi
mkdir -p /run/netns
nft add table ip "${1:-paddock}"

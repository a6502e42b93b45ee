#!/usr/bin/env bash
# The suite as `make test` runs it: two passes over the same selection (the arguments are pytest's).
#
# 1. Everything not marked `serial`; with PADDOCK_TEST_WORKERS=N (N > 0), in N worker processes, a whole
#    file to a worker at a time (`--dist loadfile`), so a module's fixtures (a live platform, a control
#    plane) are made once, as in a serial run. Most of the suite waits on sandboxes booting, networks
#    settling and chains mining, not on the CPU. The default is 2 workers (CI must finish in 60 minutes;
#    one process took 75 with a smaller suite). What made two workers fail before was load, not a
#    shared resource: at load 20-30 control planes took over 60 s to become ready, so live platforms
#    now get 180 s (tests/hostagent/conftest.py STARTUP_TIMEOUT_S) and live for their package only.
#    PADDOCK_TEST_WORKERS=0 runs everything in this process.
# 2. The `serial` tests, alone: they read what is machine-wide (the host's free memory or disk, every
#    loop device), which another worker's sandboxes would change under them, or hold a kernel setting
#    that another worker's agent would set at its start (XFS's log worker interval).
#
# Each test's own resources are already private (a state dir, netns, nft table, subnet and port of its
# own, tests/sweep.py's owner locks), which is what makes pass 1 safe.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
workers="${PADDOCK_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != "0" ]; then
  parallel=(-n "$workers" --dist loadfile)
fi

# A marker expression of the caller's (`-m 'not slow'`) is combined with each pass's, not replaced by it.
user_mark=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) user_mark="$2"; shift 2 ;;
    -m*) user_mark="${1#-m}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
with_mark() { if [ -n "$user_mark" ]; then echo "($user_mark) and ($1)"; else echo "$1"; fi; }

# 0. Collect the selection once, and stop at once on a module that does not import: xdist runs every other
#    file first and reports a collection error only at the end, 40 minutes later.
collected="$("$PY" -m pytest -p no:cacheprovider --collect-only -q "${args[@]}" 2>&1)"
code=$?
if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
  grep -v '::' <<< "$collected"
  exit "$code"
fi

status=0
# Exit code 5 is "no test selected": a selection (-k, a path) may hold only serial or only other tests.
"$PY" -m pytest -p no:cacheprovider "${parallel[@]}" -m "$(with_mark 'not serial')" "${args[@]}"
code=$?
[ "$code" -eq 0 ] || [ "$code" -eq 5 ] || status=$code
"$PY" -m pytest -p no:cacheprovider -m "$(with_mark serial)" "${args[@]}"
code=$?
[ "$code" -eq 0 ] || [ "$code" -eq 5 ] || status=$code
exit "$status"

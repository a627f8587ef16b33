# Shared by tests/e2e_*.sh: environment checks that skip with a reason (exit 77), temp dirs.
# CTest sets CASCADIA, CSD_SHARED_DIR, CSD_SOURCE_DIR and CSD_BUILD_DIR.
set -euo pipefail

: "${CASCADIA:?set by ctest}"
: "${CSD_SOURCE_DIR:?set by ctest}"
: "${CSD_SHARED_DIR:=$CSD_SOURCE_DIR/../shared}"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# wait_for SECONDS CMD...: run CMD every 10 ms until it succeeds, for at most SECONDS (a loaded CI
# machine or a sanitizer build is slow: wait for the event itself, not a fixed time). Its status is
# CMD's last one.
wait_for() {
    local tries=$(($1 * 100)); shift
    for _ in $(seq 1 "$tries"); do "$@" && return 0; sleep 0.01; done
    "$@"
}
gone() { ! kill -0 "$1" 2>/dev/null; } # gone PID: the process has exited
# logged_or_gone LOG PATTERN PID: LOG has a line matching PATTERN, or PID has exited (so a start-up
# wait ends as soon as the process dies instead of running out its time)
logged_or_gone() { grep -qs "$2" "$1" || gone "$3"; }

need_shared() { [ -e "$CSD_SHARED_DIR/$1" ] || skip "$CSD_SHARED_DIR/$1 not found (../shared is absent)"; }
need_torch() {
    /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || skip "Debian python3-torch/python3-numpy not installed"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cascadia-e2e.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

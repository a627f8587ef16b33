#!/usr/bin/env bash
# The portable path builds for ARM: every source file outside the x86 kernel tables compiles for
# aarch64 with the project's warnings as errors, and the kernels (scalar table, dispatch) link with
# the core into an aarch64 executable (tools/kern_bench.c). Debian's gcc-aarch64-linux-gnu is the
# cross compiler (scripts/deps test installs it); nothing runs under emulation here.
source "$(dirname "$0")/e2e_lib.sh"
CC_ARM=aarch64-linux-gnu-gcc
command -v "$CC_ARM" >/dev/null || skip "$CC_ARM not installed (Debian gcc-aarch64-linux-gnu)"
cd "$CSD_SOURCE_DIR"
FLAGS=(-std=c11 -O2 -Wall -Wextra -Wpedantic -Wshadow -Werror -D_DEFAULT_SOURCE -D_GNU_SOURCE
       -Wno-format-truncation -Isrc -idirafter /usr/include) # library headers are arch-neutral
n=0
while read -r f; do
    "$CC_ARM" "${FLAGS[@]}" -c "$f" -o "$WORK/o.o" 2>"$WORK/err" || fail "$f does not build for aarch64: $(head -5 "$WORK/err")"
    n=$((n + 1))
done < <(find src -name '*.c' ! -name 'x86_*' | sort)
[ "$n" -ge 50 ] || fail "only $n source files found under src"
echo "ok   $n source files compile for aarch64 with -Werror"
mapfile -t kern < <(find src/kern src/core -name '*.c' ! -name 'x86_*' | sort)
"$CC_ARM" "${FLAGS[@]}" tools/kern_bench.c "${kern[@]}" -lpthread -lm -o "$WORK/kern_bench" 2>"$WORK/err" ||
    fail "the kernels do not link for aarch64: $(head -5 "$WORK/err")"
# ELF header: e_machine (bytes 18-19, little endian) is 183 (0xb7) for AArch64
machine=$(od -An -tu2 -j18 -N2 "$WORK/kern_bench" | tr -d ' ')
[ "$machine" = 183 ] || fail "the linked kern_bench is not an AArch64 ELF (e_machine $machine)"
echo "ok   the kernels and core link into an aarch64 executable"
echo "2 passed, 0 failed"

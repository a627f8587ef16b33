#!/usr/bin/env bash
# The ARM build: every source file outside the x86 kernel tables compiles for aarch64 with the
# project's warnings as errors (arm_neon.c with its own -march, as CMake builds it), the kernels
# and core link into an aarch64 executable (tools/kern_bench.c), and the kernel and pool tests run
# under qemu-aarch64: the NEON table against ref (its default CPU has the dot product), then on a
# Cortex-A53 (no dot product), where dispatch must leave NEON out; last, the whole program and the
# unit tests, cross-built with CMake, generate text and pass under qemu. Debian's gcc-aarch64-linux-gnu cross-compiles;
# qemu-user and the arm64 libraries (multiarch) run the tests (scripts/deps test installs them).
source "$(dirname "$0")/e2e_lib.sh"
# It cross-compiles with aarch64 gcc whatever this build is, so one run (the unsanitized build's)
# does it all; under scripts/test the same checks ran a few minutes earlier.
[ "${CSD_SANITIZE:-OFF}" = ON ] && skip "the sanitized build does not repeat the ARM check: it cross-compiles the same way, and the release build runs it"
[ "${CSD_TSAN:-OFF}" = ON ] && skip "the ThreadSanitizer build does not repeat the ARM check: it cross-compiles the same way, and the release build runs it"
CC_ARM=aarch64-linux-gnu-gcc
command -v "$CC_ARM" >/dev/null || skip "$CC_ARM not installed (Debian gcc-aarch64-linux-gnu)"
cd "$CSD_SOURCE_DIR"
FLAGS=(-std=c11 -O2 -Wall -Wextra -Wpedantic -Wshadow -Werror -D_DEFAULT_SOURCE -D_GNU_SOURCE
       -Wno-format-truncation -Isrc -idirafter /usr/include) # library headers are arch-neutral
NEON_FLAGS=(-march=armv8.2-a+dotprod) # CMakeLists.txt's CSD_FLAGS_neon
isa_flags() { case "$1" in *_neon.c) echo "${NEON_FLAGS[@]}" ;; esac; }

# build_info.c gets what CMake gives it: the generated commit header and three strings.
mkdir -p "$WORK/generated"
cmake -DSOURCE_DIR="$CSD_SOURCE_DIR" -DOUT="$WORK/generated/csd_build_commit.h" \
    -P cmake/build_commit.cmake || fail "cmake/build_commit.cmake failed"
BUILD_INFO_FLAGS=(-I"$WORK/generated" -DCSD_VERSION='"0"' -DCSD_BUILD_TYPE='"Release"'
                  -DCSD_BUILD_ARCH='"aarch64"')

# Every file once; the kernels' and core's objects are kept for the links below.
n=0
objs=()
while read -r f; do
    o="$WORK/$(echo "${f%.c}" | tr / _).o"
    extra=()
    [ "$f" = src/core/build_info.c ] && extra=("${BUILD_INFO_FLAGS[@]}")
    # shellcheck disable=SC2046 # isa_flags prints zero or more flags
    "$CC_ARM" "${FLAGS[@]}" "${extra[@]}" $(isa_flags "$f") -c "$f" -o "$o" 2>"$WORK/err" ||
        fail "$f does not build for aarch64: $(head -5 "$WORK/err")"
    case "$f" in src/kern/* | src/core/*) objs+=("$o") ;; esac
    n=$((n + 1))
done < <(find src -name '*.c' ! -name 'x86_*' | sort)
[ "$n" -ge 50 ] || fail "only $n source files found under src"
echo "ok   $n source files compile for aarch64 with -Werror"

"$CC_ARM" "${FLAGS[@]}" tools/kern_bench.c "${objs[@]}" -lpthread -lm -o "$WORK/kern_bench" 2>"$WORK/err" ||
    fail "the kernels do not link for aarch64: $(head -5 "$WORK/err")"
# ELF header: e_machine (bytes 18-19, little endian) is 183 (0xb7) for AArch64
machine=$(od -An -tu2 -j18 -N2 "$WORK/kern_bench" | tr -d ' ')
[ "$machine" = 183 ] || fail "the linked kern_bench is not an AArch64 ELF (e_machine $machine)"
echo "ok   the kernels and core link into an aarch64 executable"

command -v qemu-aarch64 >/dev/null || skip "qemu-aarch64 not installed (Debian qemu-user): the aarch64 tests did not run"
[ -e /usr/lib/aarch64-linux-gnu/libcmocka.so ] ||
    skip "libcmocka-dev:arm64 not installed (Debian multiarch): the aarch64 tests did not run"
tests=(test_kern_matmul test_kern_quant test_kern_attention test_kern_elementwise test_kern_read test_core_pool)
for t in "${tests[@]}"; do
    "$CC_ARM" "${FLAGS[@]}" -DCSD_SHARED_DIR="\"$CSD_SHARED_DIR\"" "tests/$t.c" "${objs[@]}" \
        -L/usr/lib/aarch64-linux-gnu -lcmocka -lpthread -lm -o "$WORK/$t" 2>"$WORK/err" ||
        fail "tests/$t.c does not build for aarch64: $(head -5 "$WORK/err")"
done
# qemu's default CPU ("max") has the dot product: the NEON table is chosen and compared with ref.
for t in "${tests[@]}"; do
    qemu-aarch64 "$WORK/$t" >"$WORK/$t.out" 2>&1 || { tail -30 "$WORK/$t.out"; fail "$t failed on aarch64 (qemu)"; }
done
out="$WORK/test_kern_matmul.out"
grep -q "table neon not supported" "$out" && fail "qemu's default CPU did not get the NEON table"
grep -q "compared [0-9]* (table" "$out" || fail "test_kern_matmul compared no tables on aarch64"
echo "ok   ${#tests[@]} kernel and pool tests pass on aarch64 under qemu, NEON table against ref"
# A core without the dot product: dispatch leaves NEON out, ref runs, the tests still pass.
qemu-aarch64 -cpu cortex-a53 "$WORK/test_kern_matmul" >"$WORK/out" 2>&1 ||
    { tail -30 "$WORK/out"; fail "test_kern_matmul failed on a Cortex-A53 (qemu)"; }
grep -q "table neon not supported" "$WORK/out" || fail "a Cortex-A53 (no dot product) was given the NEON table"
echo "ok   a Cortex-A53 (no dot product) runs ref"

# The whole program and the unit suite, cross-built with CMake against Debian's arm64 libraries
# (multiarch); CTest runs the tests through qemu (CMAKE_CROSSCOMPILING_EMULATOR).
export PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
for pc in jansson libpcre2-8 libsodium libxxhash libmicrohttpd libcurl cmocka; do
    pkg-config --exists "$pc" || skip "no arm64 $pc (scripts/deps test installs Debian's arm64 libraries): cascadia and the unit tests were not built for aarch64"
done
cmake -S "$CSD_SOURCE_DIR" -B "$WORK/arm" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux \
    -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER="$CC_ARM" \
    -DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64 -DCSD_SHARED_DIR="$CSD_SHARED_DIR" >"$WORK/err" 2>&1 ||
    { tail -20 "$WORK/err"; fail "CMake cannot configure the aarch64 build"; }
cmake --build "$WORK/arm" -j "$(nproc)" >"$WORK/err" 2>&1 ||
    { grep -m5 -E "error|Error" "$WORK/err"; fail "cascadia or its tests do not build for aarch64"; }

# Every unit test of the suite on aarch64: char is unsigned there, and alignment and the kernels'
# dispatch differ from x86.
ctest --test-dir "$WORK/arm" -R '^test_' -j "$(nproc)" --output-on-failure >"$WORK/ctest.out" 2>&1 ||
    { grep -E "Failed|\*\*\*|ERROR|LINE" "$WORK/ctest.out" | head -20
      fail "unit tests fail on aarch64 (qemu)"; }
summary=$(grep -E "tests passed" "$WORK/ctest.out")
n_unit=$(find "$CSD_SOURCE_DIR/tests" -name 'test_*.c' | wc -l)
echo "$summary" | grep -q "out of $n_unit\$" || fail "expected $n_unit unit tests on aarch64: $summary"
if grep -q "Not Run\|Skipped" "$WORK/ctest.out"; then grep "Not Run\|Skipped" "$WORK/ctest.out"; fi
echo "ok   the $n_unit unit tests pass on aarch64 under qemu ($summary)"

# `cascadia version` there names the target and the tables qemu's default CPU runs.
qemu-aarch64 "$WORK/arm/cascadia" version >"$WORK/version" 2>&1 || fail "cascadia version failed on aarch64"
grep -q "^built: .*, aarch64$" "$WORK/version" && grep -q "^kernels:  neon (this CPU runs: ref neon)$" "$WORK/version" ||
    fail "cascadia version on aarch64: $(cat "$WORK/version")"
echo "ok   cascadia version on aarch64 names the target and the NEON table"

# Under qemu the aarch64 cascadia generates stories260K greedily with the NEON table: f32, f16 and
# bf16 weights give golden.json's ids, int8 and int4 give exactly the ids the native binary gives
# (both tables compute the same float sequence in the quantized kernels).
need_shared models/stories260K/golden.json
M="$CSD_SHARED_DIR/models/stories260K"
golden=$(/usr/bin/python3 -c "import json;g=json.load(open('$M/golden.json'));print(' '.join(map(str,g['greedy_ids'][len(g['prompt_ids']):])))")
n=$(echo "$golden" | wc -w)
for p in f32 f16 bf16 int8 int4; do
    got=$(qemu-aarch64 "$WORK/arm/cascadia" run "$M" -p "Once upon a time" -n "$n" --temp 0 --precision $p \
        --print-ids 2>"$WORK/err" | xargs) || { tail -5 "$WORK/err"; fail "cascadia run --precision $p failed on aarch64"; }
    grep -q "kernels neon" "$WORK/err" || fail "the aarch64 run did not use the NEON table: $(head -3 "$WORK/err")"
    case $p in
    f32 | f16 | bf16) want=$golden ;;
    *) want=$("$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 --precision $p --print-ids 2>/dev/null | xargs) ;;
    esac
    [ "$got" = "$want" ] || fail "--precision $p on aarch64: ids '$got', want '$want'"
done
echo "ok   cascadia built for aarch64 generates stories260K under qemu with NEON: f32/f16/bf16 golden, int8/int4 as native"
echo "7 passed, 0 failed"

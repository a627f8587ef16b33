#!/usr/bin/env bash
# The Debug build: CMake's Debug type compiles without optimisation (-O0), where compilers check and
# generate code differently from the Release and sanitized builds the other tests use. GCC at -O0
# rejected an unroll pragma on a loop it could not unroll, and clang 14 at -O0 crashed on a ?: of
# two prefetches (src/kern/kern_internal.h). This builds cascadia (every file under src) as a Debug
# tree with the build's own compiler and warnings as errors, then checks that the unoptimised
# binary generates stories260K's golden continuation with every kernel table this CPU runs.
source "$(dirname "$0")/e2e_lib.sh"
: "${CSD_BUILD_DIR:?set by ctest}"
# The ThreadSanitizer pass uses clang, as the ASan pass does, which already built a clang Debug tree.
[ "${CSD_TSAN:-OFF}" = ON ] && skip "the ThreadSanitizer build does not repeat the Debug build: the clang + ASan pass builds the same clang Debug tree"
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$CSD_BUILD_DIR/CMakeCache.txt")
[ -n "$cc" ] || fail "no CMAKE_C_COMPILER in $CSD_BUILD_DIR/CMakeCache.txt"
D="$WORK/debug"
cmake -S "$CSD_SOURCE_DIR" -B "$D" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER="$cc" \
    -DCSD_SHARED_DIR="$CSD_SHARED_DIR" >"$WORK/err" 2>&1 ||
    { tail -20 "$WORK/err"; fail "CMake cannot configure a Debug build with $cc"; }
# The kernels' flags as CMake passes them: no -O option (CMake's Debug flags are -g alone).
flags=$(cat "$D"/CMakeFiles/csd_kern.dir/flags.make)
echo "$flags" | grep -q -- "-O[1-3sg]" && fail "the Debug build optimises: $(grep C_FLAGS <<<"$flags")"
cmake --build "$D" --target cascadia -j "$(nproc)" >"$WORK/err" 2>&1 ||
    { grep -m8 -E "error|Error|Stack dump|Program arguments" "$WORK/err"; fail "cascadia does not build as Debug with $cc"; }
echo "ok   cascadia builds as a Debug tree (-O0) with $(basename "$cc") and -Werror"

need_shared models/stories260K/golden.json
M="$CSD_SHARED_DIR/models/stories260K"
want=$(/usr/bin/python3 -c "import json;g=json.load(open('$M/golden.json'));print(' '.join(map(str,g['greedy_ids'][len(g['prompt_ids']):])))")
n=$(echo "$want" | wc -w)
tables=$("$D/cascadia" version | sed -n 's/^kernels: .*(this CPU runs: \(.*\))$/\1/p')
[ -n "$tables" ] || fail "cascadia version (Debug) names no kernel table: $("$D/cascadia" version)"
for t in $tables; do
    got=$(CSD_KERN=$t "$D/cascadia" run "$M" -p "Once upon a time" -n "$n" --temp 0 --print-ids \
        2>"$WORK/err" | xargs) || { tail -5 "$WORK/err"; fail "the Debug cascadia run failed (table $t)"; }
    [ "$got" = "$want" ] || fail "the Debug build, table $t: ids '$got', want '$want'"
done
echo "ok   the Debug build generates stories260K's golden ids with each table ($tables)"
echo "2 passed, 0 failed"

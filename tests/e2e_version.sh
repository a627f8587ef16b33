#!/usr/bin/env bash
# `cascadia version` and `--version`: the version is CMakeLists.txt's, the commit is the one the
# source tree is at (when it is a git checkout), the kernel line follows CSD_KERN, --json says the
# same as the text, and a stray argument is a usage error (exit 2).
source "$(dirname "$0")/e2e_lib.sh"

"$CASCADIA" version > "$WORK/text" 2>"$WORK/err" || fail "version: $(cat "$WORK/err")"
"$CASCADIA" --version > "$WORK/text2" 2>&1 || fail "--version failed"
cmp -s "$WORK/text" "$WORK/text2" || fail "--version differs from version: $(cat "$WORK/text2")"

want_version=$(sed -n 's/^project(cascadia VERSION \([0-9.]*\) .*/\1/p' "$CSD_SOURCE_DIR/CMakeLists.txt")
[ -n "$want_version" ] || fail "no VERSION in CMakeLists.txt's project()"
[ "$(head -1 "$WORK/text")" = "cascadia $want_version" ] ||
    fail "first line '$(head -1 "$WORK/text")', want 'cascadia $want_version'"

commit=$(sed -n 's/^commit: *//p' "$WORK/text")
if command -v git >/dev/null && head=$(git -C "$CSD_SOURCE_DIR" rev-parse --short=10 HEAD 2>/dev/null); then
    # "-dirty" is left out of the comparison: a file edited after the build is not the binary's
    [ "${commit%-dirty}" = "$head" ] || fail "commit '$commit', the source tree is at $head"
else
    echo "note: $CSD_SOURCE_DIR is not a git checkout; the commit must read 'unknown'"
    [ "$commit" = unknown ] || fail "commit '$commit' outside a git checkout"
fi

CSD_KERN=ref "$CASCADIA" version > "$WORK/ref" 2>/dev/null || fail "CSD_KERN=ref version failed"
grep -q '^kernels:  ref (this CPU runs: ref' "$WORK/ref" || fail "CSD_KERN=ref: $(cat "$WORK/ref")"
grep -q '^formats:  shard [0-9]*, manifest [0-9]*, wire protocol [0-9]*$' "$WORK/text" ||
    fail "no formats line: $(cat "$WORK/text")"

"$CASCADIA" version --json > "$WORK/json" 2>"$WORK/err" || fail "version --json: $(cat "$WORK/err")"
/usr/bin/python3 - "$WORK/json" "$WORK/text" <<'PY' || fail "version --json: $(cat "$WORK/json")"
import json, sys
j = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read().splitlines()
assert text[0] == "cascadia " + j["version"], (text[0], j)
assert "commit:   " + j["commit"] in text, (j, text)
assert j["kernels"] in j["kernels_available"] and "ref" in j["kernels_available"], j
avail = " ".join(j["kernels_available"])
assert "kernels:  %s (this CPU runs: %s)" % (j["kernels"], avail) in text, (j, text)
f = j["formats"]
assert "formats:  shard %d, manifest %d, wire protocol %d" % (f["shard"], f["manifest"], f["wire"]) in text
assert text[2].startswith("built:    %s, %s, %s" % (j["compiler"], j["build_type"], j["arch"])), text
PY

# The build line says which sanitizer the binary carries, so that a bench result or a bug report
# from an instrumented build shows it, and the sanitized test passes prove they ran instrumented.
built=$(sed -n 's/^built: *//p' "$WORK/text")
case "${CSD_SANITIZE:-OFF},${CSD_TSAN:-OFF}" in
    ON,*) want_suffix="+sanitizers" ;;
    *,ON) want_suffix="+tsan" ;;
    *) want_suffix="" ;;
esac
type=$(echo "$built" | cut -d, -f2 | tr -d ' ')
case "$type" in
    *+sanitizers) got_suffix="+sanitizers" ;;
    *+tsan) got_suffix="+tsan" ;;
    *) got_suffix="" ;;
esac
[ "$got_suffix" = "$want_suffix" ] ||
    fail "built '$built': the build type should end in '${want_suffix:-(nothing)}' for this build"

rc=0
"$CASCADIA" version --bogus > /dev/null 2>"$WORK/err" || rc=$?
[ $rc = 2 ] || fail "version --bogus: exit $rc, want 2"
grep -q "unknown argument '--bogus'" "$WORK/err" || fail "version --bogus: $(cat "$WORK/err")"
echo "PASS: $(head -1 "$WORK/text"), commit $commit"

#!/usr/bin/env bash
# `cascadia tokenize` and `detokenize` as tools: text in, ids out and back; their --batch modes
# (one base64 text per line, used by e2e_tok_parity) keep newlines and control bytes intact, and
# take invalid UTF-8 (as U+FFFD, like the reference);
# bad input (not base64, not an id, an id outside the vocabulary) fails naming the problem; an
# unknown CSD_LOG or CSD_KERN is named on stderr and ignored.
source "$(dirname "$0")/e2e_lib.sh"
[ -x "$CASCADIA" ] || skip "$CASCADIA not built"
command -v base64 >/dev/null || skip "coreutils base64 not installed"

M="$WORK/model"
"$CASCADIA" synth --arch llama --preset tiny --out "$M" 2>/dev/null || fail "synth failed"

# Plain mode: the ids of a text decode back to it.
ids=$(printf 'hello world' | "$CASCADIA" tokenize "$M" --no-special) || fail "tokenize failed"
[ -n "$ids" ] || fail "tokenize printed no ids"
text=$(echo "$ids" | "$CASCADIA" detokenize "$M") || fail "detokenize failed"
[ "$text" = "hello world" ] || fail "round trip gave '$text'"

# Batch mode: bytes that plain text cannot carry, one text per line, and an empty line.
inputs=('line one
line two' $'nul\x01\x7f and tab\t' '' 'caf\xc3\xa9 \xe2\x82\xac')
: > "$WORK/in.b64"
for s in "${inputs[@]}"; do printf '%b' "$s" | base64 -w0 >> "$WORK/in.b64"; echo >> "$WORK/in.b64"; done
"$CASCADIA" tokenize "$M" --batch --no-special < "$WORK/in.b64" > "$WORK/ids" 2>"$WORK/err" ||
    fail "tokenize --batch: $(cat "$WORK/err")"
[ "$(wc -l < "$WORK/ids")" = "${#inputs[@]}" ] || fail "tokenize --batch: $(wc -l < "$WORK/ids") lines"
"$CASCADIA" detokenize "$M" --batch < "$WORK/ids" > "$WORK/out.b64" 2>"$WORK/err" ||
    fail "detokenize --batch: $(cat "$WORK/err")"
i=0
while IFS= read -r line; do
    want=$(printf '%b' "${inputs[$i]}" | od -An -tx1)
    got=$(printf '%s' "$line" | base64 -d | od -An -tx1)
    [ "$got" = "$want" ] || fail "batch text $i came back as [$got], not [$want]"
    i=$((i + 1))
done < "$WORK/out.b64"
[ $i = ${#inputs[@]} ] || fail "detokenize --batch: $i lines"

# Invalid UTF-8 is text too: it reads as U+FFFD.
printf 'a\xffb' | base64 -w0 | "$CASCADIA" tokenize "$M" --batch --no-special > "$WORK/ids" ||
    fail "tokenize --batch refused invalid UTF-8"
got=$("$CASCADIA" detokenize "$M" < "$WORK/ids" | od -An -tx1 | tr -d ' ')
[ "$got" = "61efbfbd62" ] || fail "invalid UTF-8 came back as $got, not a U+FFFD b"

# Bad input fails, saying what is wrong.
expect_error() { # DESCRIPTION EXPECTED_TEXT COMMAND... (stdin: the input)
    local what=$1 want=$2
    shift 2
    if "$@" > /dev/null 2>"$WORK/err"; then fail "$what: accepted"; fi
    grep -qF -- "$want" "$WORK/err" || fail "$what: message lacks '$want': $(cat "$WORK/err")"
}
printf 'aGVsbG8=\nnot*base64\n' | expect_error "bad base64" "line 2 is not base64" \
    "$CASCADIA" tokenize "$M" --batch
printf 'aGVsbG8\n' | expect_error "unpadded base64" "line 1 is not base64" \
    "$CASCADIA" tokenize "$M" --batch
echo "1 x 2" | expect_error "a word among ids" "'x' at byte 2 is not part of an id" \
    "$CASCADIA" detokenize "$M"
echo "99999999" | expect_error "an id outside the vocabulary" "is out of range" \
    "$CASCADIA" detokenize "$M"

# An environment setting the binary does not understand is named on stderr, then ignored.
got=$(printf 'hello world' | CSD_LOG=verbose "$CASCADIA" tokenize "$M" --no-special 2>"$WORK/err") ||
    fail "CSD_LOG=verbose: tokenize failed: $(cat "$WORK/err")"
[ "$got" = "$ids" ] || fail "CSD_LOG=verbose: ids '$got', not '$ids'"
grep -qF "CSD_LOG=verbose" "$WORK/err" || fail "CSD_LOG=verbose not named: $(cat "$WORK/err")"
CSD_KERN=bogus "$CASCADIA" run "$M" -p "hello" -n 2 --temp 0 >/dev/null 2>"$WORK/err" ||
    fail "CSD_KERN=bogus: run failed: $(cat "$WORK/err")"
grep -qF "CSD_KERN=bogus" "$WORK/err" || fail "CSD_KERN=bogus not named: $(cat "$WORK/err")"
echo "PASS"

#!/usr/bin/env bash
# e2e_tok_parity: cascadia's tokenizer against the reference (npm @huggingface/tokenizers) on a
# generated corpus (tools/tok_corpus.py, >= 2000 strings incl. invalid UTF-8) for llama3, qwen3,
# stories260K, llama2 and llama2 re-expressed with a Metaspace pre-tokenizer: ids must be identical with and without special tokens, decoding the
# reference's ids must give the reference's text, and decode(encode(s)) must give s back wherever
# the reference itself round-trips. Exit 77 (skip) when ../shared, node or node_modules is absent.
set -u
: "${CASCADIA:?set CASCADIA to the cascadia binary}"
SRC=${CSD_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
SHARED=${CSD_SHARED_DIR:-$SRC/../shared}
REF=$SRC/tools/ref
if [ ! -d "$SHARED/tokenizers" ]; then echo "SKIP: $SHARED/tokenizers not found (../shared is absent)"; exit 77; fi
if ! command -v node >/dev/null; then echo "SKIP: node not installed (needed for the reference)"; exit 77; fi
if [ ! -d "$REF/node_modules/@huggingface/tokenizers" ]; then
    echo "SKIP: $REF/node_modules absent (run: cd tools/ref && npm ci)"; exit 77
fi
if ! command -v python3 >/dev/null; then echo "SKIP: python3 not installed (corpus generator)"; exit 77; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$SRC/tools/tok_corpus.py" > "$work/corpus.b64" || { echo "FAIL: corpus generator"; exit 1; }
total=$(wc -l < "$work/corpus.b64")
echo "corpus: $total strings"

# compare KIND A B: counts identical lines, prints the first differences with the input line
compare() {
    python3 - "$work/corpus.b64" "$@" <<'PY'
import base64, sys
corpus, kind, a, b = sys.argv[1:5]
rt_mask = sys.argv[5] if len(sys.argv) > 5 else None
A = open(a).read().split("\n")[:-1]
B = open(b).read().split("\n")[:-1]
C = open(corpus).read().split("\n")[:-1]
if len(A) != len(B):
    print(f"  {kind}: line counts differ ({len(A)} vs {len(B)})"); sys.exit(1)
idx = range(len(A))
if rt_mask:
    M = open(rt_mask).read().split("\n")[:-1]
    idx = [i for i in idx if M[i] == "1"]
bad = [i for i in idx if A[i] != B[i]]
# The reference's ByteFallback decoder (a JS TextDecoder without ignoreBOM) drops a U+FEFF that
# starts a run of byte tokens; HF's Rust decoder and ours keep it (docs/tokenizer.md). Lines that
# differ only by that are counted apart, not hidden.
def no_bom(x):
    return base64.b64decode(x).replace("\ufeff".encode(), b"")
bom = [i for i in bad if kind == "decode" and no_bom(A[i]) == no_bom(B[i])]
bad = [i for i in bad if i not in bom]
extra = f" ({len(bom)} more differ only by the reference dropping a leading U+FEFF)" if bom else ""
print(f"  {kind}: {len(idx) - len(bad) - len(bom)}/{len(idx)} identical{extra}")
for i in bad[:5]:
    print(f"    line {i + 1}: input {base64.b64decode(C[i])[:80]!r}")
    print(f"      ref: {A[i][:160]}")
    print(f"      ours: {B[i][:160]}")
sys.exit(1 if bad else 0)
PY
}

status=0
# the command line: usage errors exit 2, bad input exits 1, both with a message on stderr
expect_exit() { # WANT STDIN ARGS...
    local want=$1 input=$2; shift 2
    printf '%s' "$input" | "$CASCADIA" "$@" > /dev/null 2> "$work/err"
    local got=$?
    if [ "$got" != "$want" ] || { [ "$want" != 0 ] && [ ! -s "$work/err" ]; }; then
        echo "FAIL: cascadia $* exited $got (want $want): $(cat "$work/err")"; status=1
    fi
}
stories=$SHARED/models/stories260K
expect_exit 0 "" tokenize --help
expect_exit 2 "" tokenize
expect_exit 2 "" tokenize "$stories" --bogus
expect_exit 2 "" detokenize
expect_exit 1 "x" tokenize /nonexistent-dir
expect_exit 1 "1 x 2" detokenize "$stories"
expect_exit 1 "99999" detokenize "$stories"
expect_exit 1 "-1" detokenize "$stories"
got=$(printf 'Once upon a time' | "$CASCADIA" tokenize "$stories")
[ "$got" = "1 403 407 261 378" ] || { echo "FAIL: stories260K ids '$got'"; status=1; }
got=$(printf '1,403\n407 261 378' | "$CASCADIA" detokenize "$stories" --skip-special)
[ "$got" = "Once upon a time" ] || { echo "FAIL: stories260K text '$got'"; status=1; }
echo "command line: $([ $status = 0 ] && echo ok || echo FAILED)"

# llama2-metaspace: llama2's vocabulary in the newer HF layout (no normalizer; a Metaspace
# pre-tokenizer with prepend_scheme "first"), made here so that path is compared as well
mkdir -p "$work/llama2-metaspace"
python3 - "$SHARED/tokenizers/llama2" "$work/llama2-metaspace" <<'PY' || echo "llama2-metaspace: not made"
import json, shutil, sys
src, dst = sys.argv[1:3]
j = json.load(open(src + "/tokenizer.json"))
j["normalizer"] = None
j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
json.dump(j, open(dst + "/tokenizer.json", "w"))
shutil.copy(src + "/tokenizer_config.json", dst + "/tokenizer_config.json")
PY

for name in llama3 qwen3 stories260K llama2 llama2-metaspace; do
    dir=$SHARED/tokenizers/$name
    [ "$name" = stories260K ] && dir=$SHARED/models/stories260K
    [ "$name" = llama2-metaspace ] && dir=$work/llama2-metaspace
    if [ ! -f "$dir/tokenizer.json" ]; then echo "$name: SKIP ($dir/tokenizer.json absent)"; continue; fi
    echo "$name:"
    for mode in special plain; do
        flag=""; [ $mode = plain ] && flag="--no-special"
        node "$REF/tokenize_ref.mjs" "$dir" "$work/corpus.b64" "$work/ref_$mode" $flag 2>/dev/null ||
            { echo "  FAIL: reference crashed"; status=1; continue; }
        start=$(date +%s.%N)
        "$CASCADIA" tokenize "$dir" --batch $flag < "$work/corpus.b64" > "$work/ours_$mode.ids" 2>"$work/err" ||
            { echo "  FAIL: cascadia tokenize: $(cat "$work/err")"; status=1; continue; }
        end=$(date +%s.%N)
        echo "  encode time ($mode, incl. load): $(awk "BEGIN { printf \"%.2f\", $end - $start }") s"
        compare "ids add_special=$([ $mode = special ] && echo true || echo false)" \
            "$work/ref_$mode.ids" "$work/ours_$mode.ids" || status=1
    done
    # decoding the reference's ids gives the reference's text
    "$CASCADIA" detokenize "$dir" --batch < "$work/ref_special.ids" > "$work/ours.dec" 2>"$work/err" ||
        { echo "  FAIL: cascadia detokenize: $(cat "$work/err")"; status=1; }
    compare "decode" "$work/ref_special.dec" "$work/ours.dec" || status=1
    # round trip: decode(encode(s)) == s (NFC(s) for NFC tokenizers) wherever the reference manages it
    "$CASCADIA" detokenize "$dir" --batch < "$work/ours_plain.ids" > "$work/ours.rt" 2>"$work/err" ||
        { echo "  FAIL: cascadia detokenize: $(cat "$work/err")"; status=1; }
    compare "round trip (where the reference round-trips)" "$work/ref_plain.want" "$work/ours.rt" \
        "$work/ref_plain.rt" || status=1
    echo "  reference round-trips $(grep -c '^1$' "$work/ref_plain.rt")/$total strings," \
        "ours $(paste -d' ' "$work/ref_plain.want" "$work/ours.rt" | awk '$1 == $2' | wc -l)/$total"
done
[ $status = 0 ] && echo "PASS" || echo "FAIL"
exit $status

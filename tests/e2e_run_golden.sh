#!/usr/bin/env bash
# `cascadia run` greedy on stories260K reproduces golden.json: every generated id and the text.
source "$(dirname "$0")/e2e_lib.sh"
need_shared models/stories260K/golden.json
M="$CSD_SHARED_DIR/models/stories260K"
G="$M/golden.json"
want_ids=$(/usr/bin/python3 -c "import json;g=json.load(open('$G'));print(' '.join(map(str,g['greedy_ids'][len(g['prompt_ids']):])))")
n=$(echo "$want_ids" | wc -w)
got_ids=$("$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 --print-ids 2>/dev/null | xargs)
[ "$got_ids" = "$want_ids" ] || fail "ids differ: got '$got_ids' want '$want_ids'"
"$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 > "$WORK/text" 2>/dev/null
/usr/bin/python3 - "$G" "$WORK/text" <<'PY' || fail "text differs from golden.json"
import json, sys
want = json.load(open(sys.argv[1]))["text"]
got = open(sys.argv[2]).read()
if got.rstrip("\n") != want:
    print("got:", repr(got)); print("want:", repr(want)); sys.exit(1)
PY
# Same ids with the prompt fed token by token is covered by test_model_golden; here: int8/f16 runs.
for p in f16 bf16; do
    out=$("$CASCADIA" run "$M" -p "Once upon a time" -n 8 --temp 0 --precision $p --print-ids 2>/dev/null | xargs)
    [ -n "$out" ] || fail "--precision $p produced nothing"
done
# Speculative decoding with a draft model (its int4 self): the same golden ids, and its drafts
# were checked and agreed with. A draft model with another tokenizer is refused by name.
"$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 --print-ids \
    --draft-model "$M" --draft-precision int4 > "$WORK/draft_ids" 2> "$WORK/draft_err" ||
    fail "run --draft-model failed: $(cat "$WORK/draft_err")"
[ "$(xargs < "$WORK/draft_ids")" = "$want_ids" ] || fail "ids differ with --draft-model"
agreed=$(sed -n 's/^speculative decoding: \([0-9]*\) of \([0-9]*\) draft tokens agreed$/\1/p' "$WORK/draft_err")
[ -n "$agreed" ] && [ "$agreed" -gt 0 ] || fail "no draft token agreed: $(cat "$WORK/draft_err")"
echo "run --draft-model: $(grep 'draft tokens agreed' "$WORK/draft_err")"
# a confidence cut-off drafts fewer tokens (those the draft model is unsure of are not
# proposed), and the ids stay the golden ones
"$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 --print-ids --draft-model "$M" \
    --draft-precision int4 --draft-p-min 0.9 > "$WORK/pmin_ids" 2> "$WORK/pmin_err" ||
    fail "run --draft-p-min failed: $(cat "$WORK/pmin_err")"
[ "$(xargs < "$WORK/pmin_ids")" = "$want_ids" ] || fail "ids differ with --draft-p-min 0.9"
drafted() { sed -n 's/^speculative decoding: [0-9]* of \([0-9]*\) draft tokens agreed$/\1/p' "$1"; }
d_all=$(drafted "$WORK/draft_err") d_cut=$(drafted "$WORK/pmin_err")
[ -n "$d_cut" ] && [ "$d_cut" -lt "$d_all" ] ||
    fail "--draft-p-min 0.9 drafted ${d_cut:-?} tokens, not fewer than $d_all: $(cat "$WORK/pmin_err")"
echo "run --draft-p-min 0.9: $(grep 'draft tokens agreed' "$WORK/pmin_err")"
"$CASCADIA" synth --arch llama --preset tiny --out "$WORK/other" > /dev/null 2>&1 || fail "synth failed"
if "$CASCADIA" run "$M" -p "Once" -n 4 --draft-model "$WORK/other" > /dev/null 2> "$WORK/other_err"; then
    fail "a draft model with another tokenizer was accepted"
fi
grep -q "its tokenizer differs from the served model's" "$WORK/other_err" ||
    fail "unclear refusal: $(cat "$WORK/other_err")"
# flags that cannot work together are refused before anything loads (exit 2), a missing draft
# directory by name (exit 1)
refused() { # expected-exit message-part args...: run with args must exit so, saying that
    local want=$1 part=$2; shift 2
    local rc=0
    "$CASCADIA" run "$M" -p "Once" -n 4 "$@" > /dev/null 2> "$WORK/refused" || rc=$?
    [ "$rc" = "$want" ] || fail "run $*: exit $rc, want $want: $(cat "$WORK/refused")"
    grep -q -- "$part" "$WORK/refused" || fail "run $*: unclear refusal: $(cat "$WORK/refused")"
}
refused 2 "--spec-draft 0 turns speculative decoding off" --spec-draft 0 --draft-model "$M"
refused 2 "--draft-precision needs --draft-model" --draft-precision int8
refused 2 "--draft-precision must be" --draft-model "$M" --draft-precision int3
refused 2 "--draft-p-min needs --draft-model" --draft-p-min 0.5
refused 2 "--draft-p-min expects a number in \[0, 1\]" --draft-model "$M" --draft-p-min 1.5
refused 1 "--draft-model: its tokenizer: " --draft-model "$WORK/no-such-model"
# a draft model trained on a shorter context drafts within it only: the same ids
mkdir -p "$WORK/short"
cp "$M"/tokenizer.json "$M"/tokenizer_config.json "$M"/model.safetensors "$WORK/short/"
/usr/bin/python3 -c "
import json, sys
c = json.load(open(sys.argv[1])); c['max_position_embeddings'] = 32
json.dump(c, open(sys.argv[2], 'w'))" "$M/config.json" "$WORK/short/config.json"
"$CASCADIA" run "$M" -p "Once upon a time" -n "$n" --temp 0 --print-ids \
    --draft-model "$WORK/short" > "$WORK/short_ids" 2> "$WORK/short_err" ||
    fail "run with a short-context draft failed: $(cat "$WORK/short_err")"
[ "$(xargs < "$WORK/short_ids")" = "$want_ids" ] || fail "ids differ with a short-context draft"
grep -q "^draft model .*, context 32, " "$WORK/short_err" ||
    fail "the draft's context is not its trained 32: $(cat "$WORK/short_err")"
echo "4 passed, 0 failed"

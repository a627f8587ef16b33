#!/usr/bin/env bash
# The command line refuses what it would otherwise ignore or misread, naming the problem, with a
# non-zero exit: a flag missing its value, fleet flags without a fleet, a bench of nothing, an
# empty --api-key, a port past 65535, a directory where a file is read, a --precision other than
# a fleet export's, an export into the model's own directory; a failed write of the output exits
# 1; `logits --top` beyond the vocabulary lists every id; a context past the trained one warns.
source "$(dirname "$0")/e2e_lib.sh"
[ -x "$CASCADIA" ] || skip "$CASCADIA not built"

# a model whose vocabulary (40 tokens) is smaller than logits' --top limit of 64
T="$WORK/tok40"
mkdir -p "$T"
/usr/bin/python3 - "$T" <<'PY'
import json, sys
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for c in "abcdefghijklmnopqrstuvwxyz .,!?\u2581":
    vocab[c] = len(vocab)
added = [{"id": i, "content": t, "special": True, "normalized": False, "lstrip": False,
          "rstrip": False, "single_word": False} for t, i in list(vocab.items())[:3]]
tok = {"added_tokens": added, "normalizer": None, "pre_tokenizer": None, "post_processor": None,
       "decoder": None, "model": {"type": "BPE", "unk_token": "<unk>", "vocab": vocab, "merges": []}}
json.dump(tok, open(sys.argv[1] + "/tokenizer.json", "w"))
json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True},
          open(sys.argv[1] + "/tokenizer_config.json", "w"))
PY
M="$WORK/model"
"$CASCADIA" synth --arch llama --preset tiny --tokenizer "$T" --out "$M" >/dev/null 2>&1 ||
    fail "synth failed"
X="$WORK/x2" # a fleet export, f32
"$CASCADIA" export "$M" --stages 2 --precision f32 --out "$X" >/dev/null 2>&1 || fail "export"

# refused CODE PATTERN CMD...: CMD exits with CODE and says PATTERN on stderr
refused() {
    local code=$1 pattern=$2; shift 2
    local rc=0
    "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    [ "$rc" -eq "$code" ] || fail "$* exited $rc, not $code: $(head -c 300 "$WORK/err")"
    grep -q -- "$pattern" "$WORK/err" || fail "$*: no '$pattern' in: $(head -c 300 "$WORK/err")"
}

refused 2 "-p needs a value" "$CASCADIA" run "$M" -p Once -p
refused 2 "--ids needs a value" "$CASCADIA" logits "$M" --ids
refused 2 "--out needs a value" "$CASCADIA" logits "$M" --ids 1,2 --out
# --out to a FIFO (as to a device) writes into it, and does not replace it with a file; a
# symbolic link is replaced, its target left alone (file_map.h: outputs never write through links)
echo old >"$WORK/target"
ln -s "$WORK/target" "$WORK/link"
"$CASCADIA" logits "$M" --ids 1,2 --top 0 --out "$WORK/link" 2>"$WORK/err" || fail "logits --out LINK: $(cat "$WORK/err")"
[ ! -L "$WORK/link" ] && [ "$(cat "$WORK/target")" = old ] || fail "logits --out wrote through a link"
mkfifo "$WORK/fifo"
timeout 20 cat "$WORK/fifo" >"$WORK/fifo.out" &
reader=$!
"$CASCADIA" logits "$M" --ids 1,2 --top 0 --out "$WORK/fifo" 2>"$WORK/err" || fail "logits --out FIFO: $(cat "$WORK/err")"
wait "$reader" || fail "nothing was written into the FIFO"
[ -p "$WORK/fifo" ] && [ -s "$WORK/fifo.out" ] || fail "logits --out replaced the FIFO"
refused 2 "--ids needs a value" "$CASCADIA" perplexity "$M" --ids
refused 2 "--out needs a value" "$CASCADIA" keygen --out
for flag in "--insecure" "--key $WORK/none.key" "--wait-workers 5" "--hidden-dtype f32" \
    "--micro-batches 2" "--local-stage 0"; do
    # shellcheck disable=SC2086 # the flag and its value are two words
    refused 2 "${flag%% *} applies to a fleet only" "$CASCADIA" run "$M" -p x -n 1 $flag
done
# (a server or worker that starts after all would run on: timeout ends it, and the test fails)
refused 2 "--insecure applies to a fleet only" timeout 20 "$CASCADIA" serve "$M" --port 0 --insecure
refused 2 "leave nothing to measure" "$CASCADIA" bench "$M" -p 0 -n 0
refused 2 "--api-key must not be empty" timeout 20 "$CASCADIA" serve "$M" --port 0 --api-key ""
refused 1 "port above 65535" timeout 20 "$CASCADIA" worker --shard "$X/stage-1.shard" \
    --listen 127.0.0.1:99999 --insecure
refused 1 "not a regular file" "$CASCADIA" perplexity "$M" --precision f32 "$WORK"

refused 1 "is the model's own directory" "$CASCADIA" export "$M" --stages 1 --precision int8 \
    --out "$M/"
[ ! -e "$M/manifest.json" ] || fail "an export into the model's own directory was written"
# the fleet's export is f32: --precision int8 would not be what runs
refused 1 "the fleet's export is f32, not --precision int8" "$CASCADIA" run --manifest "$X" \
    --fleet 127.0.0.1:1 --local-stage 0 --insecure --precision int8 -p x -n 1

# output that cannot be written is an error, not a success
if [ -w /dev/full ]; then
    for cmd in "version --json" "logits $M --ids 1,2"; do
        rc=0
        # shellcheck disable=SC2086 # the command and its arguments are words
        "$CASCADIA" $cmd >/dev/full 2>"$WORK/err" || rc=$?
        [ "$rc" -eq 1 ] || fail "$cmd >/dev/full exited $rc"
        grep -q "writing the output failed" "$WORK/err" || fail "$cmd >/dev/full: $(cat "$WORK/err")"
    done
else
    echo "note: /dev/full is not writable here; the failed-write check is skipped"
fi

# --top beyond the vocabulary: every id once, best first (it read past the logits before)
vocab=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
    "$M/config.json")
"$CASCADIA" logits "$M" --ids 1,2 --top 64 >"$WORK/top" 2>"$WORK/err" || fail "logits --top 64"
want=$((vocab < 64 ? vocab : 64))
got=$(head -1 "$WORK/top" | tr ' ' '\n' | grep -c '=')
[ "$got" -eq "$want" ] || fail "logits --top 64 listed $got ids, not $want"

# a context past the trained one runs, with a warning that says so (as llama.cpp)
trained=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" \
    "$M/config.json")
"$CASCADIA" run "$M" -p x -n 1 --ctx $((trained + 8)) >/dev/null 2>"$WORK/err" ||
    fail "run --ctx past the trained context: $(cat "$WORK/err")"
grep -q "exceeds the model's trained context of $trained" "$WORK/err" ||
    fail "run --ctx $((trained + 8)) gave no warning: $(cat "$WORK/err")"
"$CASCADIA" run "$M" -p x -n 1 --ctx "$trained" >/dev/null 2>"$WORK/err" || fail "run --ctx $trained"
! grep -q "trained context" "$WORK/err" || fail "run --ctx $trained warned: $(cat "$WORK/err")"
echo "PASS"

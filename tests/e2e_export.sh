#!/usr/bin/env bash
# `cascadia export` cuts a synthesized model into stage shards + manifest.json; `cascadia inspect`
# reads the manifest (and checks it against the files), the directory and a shard (verifying every
# checksum); a flipped or truncated shard is refused naming the file; planner errors are clear;
# synth refuses to write over a model without --force, export to write into another model's
# directory; exporting again with fewer stages, or without a file the last model had, leaves no
# stale shard or copy.
source "$(dirname "$0")/e2e_lib.sh"
[ -x "$CASCADIA" ] || skip "$CASCADIA not built"
"$CASCADIA" export --help >/dev/null 2>&1 || skip "the export command is not in this binary's command table yet"

M="$WORK/model"
"$CASCADIA" synth --arch qwen3 --preset tiny --out "$M" 2>/dev/null || fail "synth failed"
# synth does not write random weights over a model already there, unless told to.
sum=$(cksum < "$M/model.safetensors")
if err=$("$CASCADIA" synth --arch qwen3 --preset tiny --out "$M" --seed 9 2>&1); then
    fail "synth over an existing model accepted"
fi
grep -qF "already holds a model" <<<"$err" || fail "synth over a model: $err"
[ "$(cksum < "$M/model.safetensors")" = "$sum" ] || fail "a refused synth changed the weights"
"$CASCADIA" synth --arch qwen3 --preset tiny --out "$M" --seed 9 --force 2>/dev/null ||
    fail "synth --force failed"
[ "$(cksum < "$M/model.safetensors")" != "$sum" ] || fail "synth --force left the weights"
"$CASCADIA" synth --arch qwen3 --preset tiny --out "$M" --force 2>/dev/null || fail "synth failed"
# Nor does export write its copies of config.json and the tokenizer over another model's.
"$CASCADIA" synth --arch llama --preset tiny --out "$WORK/other" 2>/dev/null || fail "synth other"
sum=$(cksum < "$WORK/other/config.json")
if err=$("$CASCADIA" export "$M" --stages 1 --out "$WORK/other" 2>&1); then
    fail "export into another model's directory accepted"
fi
grep -qF "holds another model" <<<"$err" || fail "export over a model: $err"
[ "$(cksum < "$WORK/other/config.json")" = "$sum" ] || fail "a refused export changed config.json"
pass=0
ok() { pass=$((pass + 1)); }
has() { grep -qF -- "$2" <<<"$1" || fail "$3: output lacks '$2':
$1"; }

# Two stages at int8; the chat template file (transformers >= 4.50 writes one) goes along.
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}' >"$M/chat_template.jinja"
out=$("$CASCADIA" export "$M" --stages 2 --precision int8 --out "$WORK/exp" 2>"$WORK/log") || fail "export: $(cat "$WORK/log")"
has "$out" "2 stages, int8" "export"
grep -q '"chat_template.jinja"' "$WORK/exp/manifest.json" || fail "the manifest lists no chat_template.jinja"
for f in manifest.json stage-0.shard stage-1.shard config.json tokenizer.json tokenizer_config.json \
    chat_template.jinja; do
    [ -s "$WORK/exp/$f" ] || fail "export did not write $f"
done
grep -q "stage 2/2" "$WORK/log" || fail "no per-stage log line: $(cat "$WORK/log")"
ok

# The memory estimate of a q8 KV cache: int8 keys and values and an f32 scale per head, so less
# per token than the default f16 one, and the manifest it writes reads back.
kv_of() { sed -n 's/.*stage-0.shard.*KV \([0-9]*\) B\/token.*/\1/p' <<<"$1"; }
q8=$("$CASCADIA" export "$M" --stages 2 --precision int8 --kv-type q8 --out "$WORK/exp-q8" 2>&1) ||
    fail "export --kv-type q8: $q8"
[ -n "$(kv_of "$out")" ] && [ -n "$(kv_of "$q8")" ] || fail "no KV per token in: $out / $q8"
[ "$(kv_of "$q8")" -lt "$(kv_of "$out")" ] ||
    fail "q8 KV per token $(kv_of "$q8") not below f16's $(kv_of "$out")"
has "$("$CASCADIA" inspect "$WORK/exp-q8")" "int8 KV cache" "inspect of a q8 KV estimate"
ok

# Exporting again with fewer stages removes the shards the new manifest does not name.
"$CASCADIA" export "$M" --stages 1 --precision int8 --out "$WORK/exp-q8" >/dev/null 2>&1 ||
    fail "export again with 1 stage"
[ -s "$WORK/exp-q8/stage-0.shard" ] && [ ! -e "$WORK/exp-q8/stage-1.shard" ] ||
    fail "after a 1-stage export over a 2-stage one: $(ls "$WORK/exp-q8")"
# ... and a copied file the model no longer has (its chat template would be read as this one's)
rm "$M/chat_template.jinja"
"$CASCADIA" export "$M" --stages 1 --precision int8 --out "$WORK/exp-q8" >/dev/null 2>&1 ||
    fail "export again without a chat template file"
[ ! -e "$WORK/exp-q8/chat_template.jinja" ] || fail "an earlier export's chat_template.jinja stayed"
ok

# inspect on the manifest, the directory and a shard.
man=$("$CASCADIA" inspect "$WORK/exp/manifest.json") || fail "inspect manifest failed"
has "$man" "precision       int8" "inspect manifest"
has "$man" "stage-0.shard    [0, 2)" "inspect manifest"
has "$man" "stage-1.shard    [2, 4)" "inspect manifest"
has "$man" "check           ok" "inspect manifest"
build=$("$CASCADIA" version --json | /usr/bin/python3 -c '
import json, sys
v = json.load(sys.stdin)
print("cascadia-%s-%s" % (v["version"], v["commit"]))')
has "$man" "exported by     $build" "inspect manifest"
dir=$("$CASCADIA" inspect "$WORK/exp") || fail "inspect dir failed"
[ "$dir" = "$man" ] || fail "inspect DIR and DIR/manifest.json differ"
shard=$("$CASCADIA" inspect "$WORK/exp/stage-1.shard") || fail "inspect shard failed"
has "$shard" "stage           1 of 2" "inspect shard"
has "$shard" "layers          [2, 4) of 4, final norm + head" "inspect shard"
has "$shard" "every checksum verified" "inspect shard"
h1=$(grep "^model hash" <<<"$man" | awk '{print $3}')
h2=$(grep "^model hash" <<<"$shard" | awk '{print $3}')
[ -n "$h1" ] && [ "$h1" = "$h2" ] || fail "model hash differs: manifest '$h1' shard '$h2'"
model=$("$CASCADIA" inspect "$M") || fail "inspect MODEL_DIR failed"
has "$model" "tensors" "inspect model dir"
ok

# A flipped byte deep in the tensor data: named file and tensor. A truncated shard: named file.
cp -r "$WORK/exp" "$WORK/bad"
size=$(stat -c %s "$WORK/bad/stage-1.shard")
printf '\x5a' | dd of="$WORK/bad/stage-1.shard" bs=1 seek=$((size - 100)) conv=notrunc status=none
if err=$("$CASCADIA" inspect "$WORK/bad/stage-1.shard" 2>&1); then fail "corrupted shard accepted"; fi
has "$err" "$WORK/bad/stage-1.shard: tensor '" "corrupted shard"
has "$err" "is corrupted" "corrupted shard"
truncate -s $((size / 2)) "$WORK/bad/stage-1.shard"
if err=$("$CASCADIA" inspect "$WORK/bad/stage-1.shard" 2>&1); then fail "truncated shard accepted"; fi
has "$err" "truncated" "truncated shard"
if err=$("$CASCADIA" inspect "$WORK/bad" 2>&1); then fail "manifest of a truncated shard accepted"; fi
has "$err" "stage-1.shard" "manifest check"
ok

# Planning: auto on machines too small, N above the layer count, auto that fits on one machine.
if err=$("$CASCADIA" export "$M" --stages auto --memory 10M,10M --precision f32 --out "$WORK/x" 2>&1); then
    fail "impossible plan accepted"; fi
has "$err" "missing" "impossible plan"
if err=$("$CASCADIA" export "$M" --stages 5 --precision f32 --out "$WORK/x" 2>&1); then fail "5 stages of 4 layers accepted"; fi
has "$err" "use 1 to 4" "too many stages"
# --stages and --memory that cannot be right for any model are usage errors (exit 2), before the
# model is read
for args in "--stages 0" "--stages -1" "--stages 2x" "--stages auto" "--stages 1x" "--stages 1 --memory 1G"; do
    # shellcheck disable=SC2086 # args is a list of words
    rc=0; err=$("$CASCADIA" export "$M" $args --out "$WORK/x" 2>&1) || rc=$?
    [ $rc -eq 2 ] || fail "export $args: rc $rc, want 2: $err"
done
out=$("$CASCADIA" export "$M" --stages auto --memory 1G,1G --precision int4 --ctx 256 --out "$WORK/auto" 2>/dev/null) ||
    fail "auto export failed"
has "$out" "1 stage, int4" "auto export"
"$CASCADIA" inspect "$WORK/auto" >/dev/null || fail "inspect auto export failed"
ok

# A one-stage export runs as it is (run/bench/serve take its directory): the same greedy ids as
# the Hugging Face directory at that precision, without quantizing again. A 2-stage export and a
# --precision other than the export's are refused with what to do instead.
ids() { "$CASCADIA" run "$@" -p "hello world" -n 12 --temp 0 --print-ids --threads 1 2>"$WORK/run.err" | xargs; }
want=$(ids "$M" --precision int4) || fail "run MODEL_DIR: $(cat "$WORK/run.err")"
got=$(ids "$WORK/auto") || fail "run EXPORT_DIR: $(cat "$WORK/run.err")"
[ -n "$want" ] && [ "$want" = "$got" ] || fail "the 1-stage export runs differently:
  hf:     $want
  export: $got"
if err=$("$CASCADIA" run "$WORK/exp" -p hi -n 2 2>&1); then fail "run on a 2-stage export accepted"; fi
has "$err" "an export in 2 stages" "2-stage export"
if err=$("$CASCADIA" run "$WORK/auto" --precision int8 -p hi -n 2 2>&1); then fail "--precision int8 on an int4 export accepted"; fi
has "$err" "the export is int4" "precision mismatch"
# A shard that is not the one the manifest lists (another export's stage 0, without the head) is
# refused before its shapes are trusted: read as this export's, its hidden states became logits.
cp -r "$WORK/auto" "$WORK/swap"
cp "$WORK/exp/stage-0.shard" "$WORK/swap/stage-0.shard"
if err=$("$CASCADIA" run "$WORK/swap" -p hi -n 2 2>&1); then fail "a swapped shard ran"; fi
has "$err" "the manifest lists stage 0 of 1" "swapped shard"
ok

# inspect on a safetensors file with an empty tensor whose other dimensions multiply past 64 bits
# (the reader accepts it: it holds no bytes): the parameter count must not overflow.
mkdir "$WORK/empty" && cp "$M"/*.json "$WORK/empty/"
/usr/bin/python3 - "$M/model.safetensors" "$WORK/empty/model.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["x"] = {"dtype": "F32", "shape": [2**62, 4, 0], "data_offsets": [0, 0]}
text = json.dumps(header).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
out=$("$CASCADIA" inspect "$WORK/empty" 2>&1) || fail "inspect of a model with an empty tensor: $out"
has "$out" "tensors" "inspect with an empty tensor"
ok

# run --logit-bias: +100 forces a token, -100 bans the greedy one; bad values are refused
forced=$(ids "$M" --precision int4 --logit-bias 300=100) || fail "run --logit-bias: $(cat "$WORK/run.err")"
[ "$forced" = "$(printf '300 %.0s' $(seq 12) | xargs)" ] || fail "--logit-bias 300=100 gave: $forced"
first=${want%% *}
banned=$(ids "$M" --precision int4 --logit-bias "$first-100") || fail "run --logit-bias ban"
[ "${banned%% *}" != "$first" ] || fail "--logit-bias $first-100 still starts with $first: $banned"
rc=0; "$CASCADIA" run "$M" -p hi -n 1 --logit-bias 300=101 >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "--logit-bias 300=101: rc $rc, want 2"
# refused before anything is printed (no echoed prompt on stdout)
if "$CASCADIA" run "$M" -p hi -n 1 --logit-bias 99999999=1 >"$WORK/out" 2>"$WORK/err"; then
    fail "a bias outside the vocabulary accepted"; fi
has "$(cat "$WORK/err")" "outside the vocabulary" "logit bias outside the vocabulary"
[ ! -s "$WORK/out" ] || fail "run printed '$(cat "$WORK/out")' before refusing the bias"
ok

echo "$pass passed, 0 failed"

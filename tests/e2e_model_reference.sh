#!/usr/bin/env bash
# Logits of our f32 forward pass match an independent float64 PyTorch forward (tools/torch_ref.py)
# within 1e-4 relative (max |diff| / max |ref| per position) with the same argmax, on the real
# stories260K model and on a synthetic model of each family, also Llama and Qwen3 with
# attention_bias. The synthetic prompts run past the Mistral window (32) and the Llama 3.1
# scaling's original context (64).
source "$(dirname "$0")/e2e_lib.sh"
need_torch
REF="/usr/bin/python3 $CSD_SOURCE_DIR/tools/torch_ref.py"
CMP="/usr/bin/python3 $CSD_SOURCE_DIR/tools/compare_logits.py"

check() { # name dir ids vocab
    "$CASCADIA" logits "$2" --ids "$3" --top 0 --out "$WORK/$1.ours" --precision f32
    $REF "$2" --ids "$3" --out "$WORK/$1.ref"
    echo -n "$1: "
    $CMP "$WORK/$1.ours" "$WORK/$1.ref" "$4" --tol 1e-4 || fail "$1 logits differ from the reference"
}

ids=$(seq -s, 1 3 280)   # 94 tokens, all inside every vocabulary below
for arch in llama mistral qwen2 qwen3; do
    "$CASCADIA" synth --arch "$arch" --preset tiny --out "$WORK/$arch" --seed 7 2>/dev/null
    vocab=$(/usr/bin/python3 -c "import json;print(json.load(open('$WORK/$arch/config.json'))['vocab_size'])")
    check "$arch" "$WORK/$arch" "1,$ids" "$vocab"
done

# attention_bias: true (biases on q, k, v and o) on Llama and Qwen3; the one-stage export's logits
# (INT8, the biases stay f32) agree with the same model loaded from its Hugging Face directory
for arch in llama qwen3; do
    "$CASCADIA" synth --arch "$arch" --preset tiny --out "$WORK/$arch-bias" --seed 9 --attention-bias 2>/dev/null ||
        fail "synth --attention-bias ($arch)"
    grep -q '"attention_bias": *true' "$WORK/$arch-bias/config.json" || fail "$arch-bias: no attention_bias"
    vocab=$(/usr/bin/python3 -c "import json;print(json.load(open('$WORK/$arch-bias/config.json'))['vocab_size'])")
    check "$arch-bias" "$WORK/$arch-bias" "1,$ids" "$vocab"
    "$CASCADIA" export "$WORK/$arch-bias" --stages 1 --precision int8 --out "$WORK/$arch-bias-x" >/dev/null 2>&1 ||
        fail "export $arch-bias"
    "$CASCADIA" logits "$WORK/$arch-bias" --ids "1,$ids" --top 0 --out "$WORK/hf.int8" --precision int8
    "$CASCADIA" logits "$WORK/$arch-bias-x" --ids "1,$ids" --top 0 --out "$WORK/x.int8"
    cmp -s "$WORK/hf.int8" "$WORK/x.int8" || fail "$arch-bias: the export's logits differ from the directory's"
    echo "$arch-bias: the int8 export's logits equal the directory's"
done

if [ -e "$CSD_SHARED_DIR/models/stories260K/golden.json" ]; then
    golden=$(/usr/bin/python3 -c "import json;print(','.join(map(str,json.load(open('$CSD_SHARED_DIR/models/stories260K/golden.json'))['greedy_ids'])))")
    check stories260K "$CSD_SHARED_DIR/models/stories260K" "$golden" 512
else
    echo "stories260K: skipped, $CSD_SHARED_DIR/models/stories260K not found"
fi
echo "7 passed, 0 failed"

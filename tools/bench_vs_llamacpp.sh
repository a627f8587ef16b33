#!/bin/sh
# bench_vs_llamacpp.sh: Cascadia vs llama.cpp, side by side on one machine, same model shape.
# For each pair (our int4 vs Q4_0, int8 vs Q8_0, f16 vs F16) it runs `cascadia bench` and
# `llama_ref bench` (llama.cpp's own llama-bench loop) back to back, ROUNDS times alternating, with
# the load average logged next to every run, and prints a markdown table with the ratios.
# llama.cpp comes from /work/shared/tools/llama-ref (built into ~/.cache/llama-ref); when that
# fails, the llama.cpp columns are skipped with a message. Nothing here is copied into the repo.
#
#   tools/bench_vs_llamacpp.sh                 # BUILD=build-bench MODEL=/tmp/tl11 T=2 P=512 N=128 R=3
#   PAIRS="int4:q4_0" ROUNDS=2 tools/bench_vs_llamacpp.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
CASCADIA=${CASCADIA:-$BUILD/cascadia}
MODEL=${MODEL:-/tmp/tl11}                      # HF dir of the synthetic TinyLlama-1.1B shape
TOKENIZER=${TOKENIZER:-$ROOT/../shared/tokenizers/llama2}
LLAMA_REF_HOME=${LLAMA_REF_HOME:-$HOME/.cache/llama-ref}
LLAMA_REF_SETUP=${LLAMA_REF_SETUP:-$ROOT/../shared/tools/llama-ref/setup.sh}
GGUF_DIR=${GGUF_DIR:-$LLAMA_REF_HOME/models}
PAIRS=${PAIRS:-"int4:q4_0 int8:q8_0 f16:f16"}
T=${T:-2} P=${P:-512} N=${N:-128} R=${R:-3} ROUNDS=${ROUNDS:-1}
OUT=${OUT:-/tmp/bench-vs-llamacpp}
mkdir -p "$OUT"
RES=$OUT/results.tsv
: > "$RES"

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
load() { cut -d' ' -f1 /proc/loadavg; }

[ -x "$CASCADIA" ] || { echo "no $CASCADIA: build first (cmake --build $BUILD)" >&2; exit 1; }
if [ ! -f "$MODEL/config.json" ]; then
    log "writing the synthetic model to $MODEL"
    mkdir -p "$MODEL" && "$CASCADIA" synth --arch llama --preset tinyllama-1.1b --tokenizer "$TOKENIZER" \
        --out "$MODEL" || exit 1
fi

# llama.cpp: build once (BUILD_TOOLS must be unset: setup.sh treats any value as "yes"), then the
# GGUFs of the same shape. Any failure only disables the llama.cpp side.
LLAMA=1
if [ ! -x "$LLAMA_REF_HOME/llama_ref" ]; then
    log "building llama-ref (llama.cpp) into $LLAMA_REF_HOME"
    (unset BUILD_TOOLS; sh "$LLAMA_REF_SETUP") > "$OUT/llama-ref-setup.log" 2>&1 || true
fi
if [ ! -x "$LLAMA_REF_HOME/llama_ref" ]; then
    echo "llama.cpp reference unavailable (see $OUT/llama-ref-setup.log): skipping the llama.cpp columns" >&2
    LLAMA=0
fi
if [ $LLAMA = 1 ]; then
    mkdir -p "$GGUF_DIR"
    for pair in $PAIRS; do
        g=${pair#*:}
        [ -f "$GGUF_DIR/1b-$g.gguf" ] && continue
        log "writing $GGUF_DIR/1b-$g.gguf"
        /usr/bin/python3 "$LLAMA_REF_HOME/make_tiny_llama_gguf.py" -o "$GGUF_DIR/1b-$g.gguf" --preset 1b \
            --type "$g" >> "$OUT/gguf.log" 2>&1 || { echo "GGUF $g failed: skipping llama.cpp" >&2; LLAMA=0; }
    done
fi

run_ours() { # precision round
    l=$(load)
    log "cascadia $1 (load $l)"
    if "$CASCADIA" bench "$MODEL" --precision "$1" -t "$T" -p "$P" -n "$N" -r "$R" --json \
        > "$OUT/ours-$1-$2.json" 2> "$OUT/ours-$1-$2.log"; then
        /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print("ours\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%.2f\t%.2f" % (sys.argv[2], sys.argv[3], d["pp_tps"], d["tg_tps"],
      d["membw_gbs"], d["roofline_fraction"] * 100, d["weight_bytes"] / 2**20, sys.argv[4],
      d["paired_roofline_fraction"] * 100, d["ceiling_fraction"] * 100))' \
            "$OUT/ours-$1-$2.json" "$1" "$2" "$l" >> "$RES"
    else
        log "cascadia $1 failed: $(tail -1 "$OUT/ours-$1-$2.log")"
    fi
}

run_llama() { # gguf-type round
    l=$(load)
    log "llama.cpp $1 (load $l)"
    if "$LLAMA_REF_HOME/llama_ref" bench "$GGUF_DIR/1b-$1.gguf" -p "$P" -n "$N" -t "$T" -r "$R" \
        > "$OUT/llama-$1-$2.txt" 2> "$OUT/llama-$1-$2.log"; then
        awk -v t="$1" -v r="$2" -v l="$l" '/^pp[0-9]+:/ {pp=$2} /^tg[0-9]+:/ {tg=$2}
            END {printf "llama\t%s\t%s\t%s\t%s\t\t\t\t%s\n", t, r, pp, tg, l}' "$OUT/llama-$1-$2.txt" >> "$RES"
    else
        log "llama.cpp $1 failed: $(tail -1 "$OUT/llama-$1-$2.log")"
    fi
}

log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
log "$("$CASCADIA" version | head -1), commit $("$CASCADIA" version | sed -n 's/^commit: *//p')"
if [ -x "$LLAMA_REF_HOME/membw" ]; then
    log "membw (llama-ref's STREAM-like test, load $(load)):"
    "$LLAMA_REF_HOME/membw" 1024 "1,$T" 3 | tee "$OUT/membw.txt" >&2
fi
round=1
while [ $round -le "$ROUNDS" ]; do
    for pair in $PAIRS; do
        ours=${pair%%:*} theirs=${pair#*:}
        if [ $((round % 2)) = 1 ]; then # alternate who goes first
            run_ours "$ours" $round
            [ $LLAMA = 1 ] && run_llama "$theirs" $round
        else
            [ $LLAMA = 1 ] && run_llama "$theirs" $round
            run_ours "$ours" $round
        fi
    done
    round=$((round + 1))
done

# Table: mean over rounds of each engine's figures; ratios ours / llama.cpp.
/usr/bin/python3 - "$RES" "$PAIRS" "$T" "$P" "$N" "$R" <<'EOF'
import sys, collections
res, pairs, T, P, N, R = sys.argv[1], sys.argv[2].split(), *sys.argv[3:]
rows = collections.defaultdict(list)
for line in open(res):
    f = line.rstrip("\n").split("\t")
    rows[(f[0], f[1])].append(f)
def mean(xs): return sum(xs) / len(xs) if xs else float("nan")
print("| ours | llama.cpp | pp%s ours | pp%s llama.cpp | pp ratio | tg%s ours | tg%s llama.cpp | tg ratio "
      "| roofline (ours): peak, paired | stream ceiling (ours) | load avg |" % (P, P, N, N))
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for pair in pairs:
    o, l = pair.split(":")
    ro, rl = rows.get(("ours", o), []), rows.get(("llama", l), [])
    opp, otg = mean([float(f[3]) for f in ro]), mean([float(f[4]) for f in ro])
    lpp = mean([float(f[3]) for f in rl if f[3]]); ltg = mean([float(f[4]) for f in rl if f[4]])
    roof = mean([float(f[6]) for f in ro])
    paired = mean([float(f[9]) for f in ro])
    ceiling = mean([float(f[10]) for f in ro])
    loads = ",".join([f[8] for f in ro] + [f[8] for f in rl])
    print("| %s | %s | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2fx | %.1f%%, %.1f%% | %.1f%% | %s |" % (
        o, l.upper(), opp, lpp, opp / lpp if rl else float("nan"), otg, ltg, otg / ltg if rl else float("nan"),
        roof, paired, ceiling, loads))
# The targets are about one engine beside the other in the same minutes: each round's ratios too.
print("\n| round | pair | pp ratio | tg ratio | roofline (ours): peak, paired |")
print("| ---: | --- | ---: | ---: | ---: |")
for pair in pairs:
    o, l = pair.split(":")
    theirs = {f[2]: f for f in rows.get(("llama", l), [])}
    for f in rows.get(("ours", o), []):
        t = theirs.get(f[2])
        pp = float(f[3]) / float(t[3]) if t and t[3] else float("nan")
        tg = float(f[4]) / float(t[4]) if t and t[4] else float("nan")
        print("| %s | %s / %s | %.2fx | %.2fx | %.1f%%, %.1f%% |" % (
            f[2], o, l.upper(), pp, tg, float(f[6]), float(f[9])))
print("\n(-t %s, -r %s per run; rounds averaged; raw rows in %s)" % (T, R, res))
EOF

#!/usr/bin/env bash
# Shards and the pipeline, end to end with real processes on localhost:
#  - N-stage output equals the single-process output exactly for N = 1..4 (greedy ids), at f32
#    (stories260K: golden.json) and at int8/int4 on a synthetic model, with each worker in its own
#    process; hidden states travel as f32 for the bit-exact comparison and as f16 (the default).
#  - --local-stage 0: the coordinator computes stage 0 itself.
#  - a wrong fleet key and a shard from another export are refused with a clear message.
#  - a worker that dies fails the request with a clear error instead of hanging.
source "$(dirname "$0")/e2e_lib.sh"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# start_worker SHARD LOG [args...]: starts a worker on a free port, prints "pid port"
start_worker() {
    local shard=$1 log=$2; shift 2
    "$CASCADIA" worker --shard "$shard" --listen 127.0.0.1:0 --threads 1 "$@" >"$log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do
        port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$log")
        [ -n "$port" ] && { echo "$pid $port"; return; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$log"; fail "worker for $shard did not start"
}

# fleet_up DIR N [args]: starts N workers for DIR's shards; sets FLEET
fleet_up() {
    local dir=$1 n=$2; shift 2
    FLEET=""
    for k in $(seq 0 $((n - 1))); do
        read -r pid port < <(start_worker "$dir/stage-$k.shard" "$dir/w$k.log" "$@")
        PIDS+=("$pid")
        FLEET="${FLEET:+$FLEET,}127.0.0.1:$port"
    done
}
fleet_down() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }

passed=0
check_equal() { # name want got
    [ "$2" = "$3" ] || fail "$1: fleet ids differ from single process
  single: $2
  fleet:  $3"
    echo "ok: $1"; passed=$((passed + 1))
}

PROMPT="Once upon a time"
run_ids() { "$CASCADIA" run "$@" -p "$PROMPT" -n 24 --temp 0 --print-ids --threads 1 2>"$WORK/run.err" | xargs || { cat "$WORK/run.err"; fail "run $*"; }; }

# 1. a synthetic model at three precisions, 1..4 stages, bit-exact with f32 hidden states
"$CASCADIA" synth --arch llama --preset tiny --out "$WORK/m" --seed 3 2>/dev/null
for prec in f32 int8 int4; do
    single=$(run_ids "$WORK/m" --precision $prec)
    for n in 1 2 3 4; do
        d="$WORK/x-$prec-$n"
        "$CASCADIA" export "$WORK/m" --stages $n --precision $prec --out "$d" >/dev/null 2>&1 || fail "export $prec $n"
        fleet_up "$d" $n --insecure
        got=$(run_ids --fleet "$FLEET" --manifest "$d" --insecure --hidden-dtype f32)
        check_equal "synthetic $prec, $n stage(s)" "$single" "$got"
        fleet_down
    done
done

# 2. stories260K (the real model) at f32: golden ids over 1..4 stages with the default f16 hidden
#    states, and with --local-stage 0
if [ -e "$CSD_SHARED_DIR/models/stories260K/golden.json" ]; then
    S="$CSD_SHARED_DIR/models/stories260K"
    single=$(run_ids "$S")
    for n in 1 2 3 4; do
        d="$WORK/s-$n"
        "$CASCADIA" export "$S" --stages $n --precision f32 --out "$d" >/dev/null 2>&1 || fail "export stories $n"
        fleet_up "$d" $n --insecure
        check_equal "stories260K f32, $n stage(s), f16 hidden" "$single" "$(run_ids --fleet "$FLEET" --manifest "$d" --insecure)"
        fleet_down
    done
    d="$WORK/s-2"
    read -r pid port < <(start_worker "$d/stage-1.shard" "$d/w1.log" --insecure); PIDS+=("$pid")
    check_equal "stories260K, --local-stage 0" "$single" "$(run_ids --fleet "127.0.0.1:$port" --local-stage 0 --manifest "$d" --insecure)"
    fleet_down
else
    echo "stories260K part skipped: $CSD_SHARED_DIR/models/stories260K not found"
fi

# 3. authentication: the right key works, a wrong key and insecure-vs-encrypted are refused
d="$WORK/x-int8-2"
"$CASCADIA" keygen --out "$WORK/fleet.key" >/dev/null 2>&1
"$CASCADIA" keygen --out "$WORK/other.key" >/dev/null 2>&1
fleet_up "$d" 2 --key "$WORK/fleet.key"
single=$(run_ids "$WORK/m" --precision int8)
check_equal "encrypted links" "$single" "$(run_ids --fleet "$FLEET" --manifest "$d" --key "$WORK/fleet.key" --hidden-dtype f32)"
if "$CASCADIA" run --fleet "$FLEET" --manifest "$d" --key "$WORK/other.key" -p x -n 2 >"$WORK/bad.out" 2>&1; then
    fail "a wrong fleet key was accepted"
fi
grep -qi "auth\|key" "$WORK/bad.out" || { cat "$WORK/bad.out"; fail "wrong-key error does not say why"; }
echo "ok: wrong key refused: $(grep -i 'cascadia run' "$WORK/bad.out" | head -1)"; passed=$((passed + 1))
fleet_down

# 4. a shard of another export (different model hash) is refused, naming the mismatch
fleet_up "$WORK/x-f32-2" 2 --insecure
if "$CASCADIA" run --fleet "$FLEET" --manifest "$WORK/x-int8-2" --insecure -p x -n 2 >"$WORK/mm.out" 2>&1; then
    fail "a fleet of another export was accepted"
fi
grep -qi "hash\|mismatch" "$WORK/mm.out" || { cat "$WORK/mm.out"; fail "mismatch error does not name the model hash"; }
echo "ok: other export refused"; passed=$((passed + 1))
fleet_down

# 5. a worker dies mid-generation: the request fails with a clear error, nothing hangs
fleet_up "$WORK/x-f32-2" 2 --insecure
victim=${PIDS[1]}
( rc=0; "$CASCADIA" run --fleet "$FLEET" --manifest "$WORK/x-f32-2" --insecure -p "$PROMPT" -n 400 --ignore-eos \
    --temp 0 >"$WORK/die.out" 2>&1 || rc=$?; echo "exit=$rc" >>"$WORK/die.out" ) &
runner=$!
for _ in $(seq 1 500); do grep -q "connected to the fleet" "$WORK/die.out" 2>/dev/null && break; sleep 0.01; done
kill -STOP "$victim"; sleep 0.3; kill -9 "$victim"   # frozen mid-request, then gone
for _ in $(seq 1 300); do kill -0 "$runner" 2>/dev/null || break; sleep 0.1; done
kill -0 "$runner" 2>/dev/null && fail "run hung after a worker died"
grep -aq "exit=0" "$WORK/die.out" && ! grep -aq "finish: length" "$WORK/die.out" && fail "run claimed success"
if grep -aq "exit=1" "$WORK/die.out"; then
    echo "ok: worker death reported: $(grep -a '^cascadia run' "$WORK/die.out" | head -1)"
else
    echo "ok: generation finished before the worker died (machine was fast)"
fi
passed=$((passed + 1))
fleet_down

echo "$passed passed, 0 failed"

#!/usr/bin/env bash
# Shards and the pipeline, end to end with real processes on localhost:
#  - N-stage output equals the single-process output exactly for N = 1..4 (greedy ids), at f32
#    (stories260K: golden.json) and at int8/int4 on a synthetic model, with each worker in its own
#    process; hidden states travel as f32 for the bit-exact comparison and as f16 (the default).
#  - --local-stage 0: the coordinator computes stage 0 itself.
#  - a wrong fleet key and a shard from another export are refused with a clear message.
#  - a worker that dies fails the request with a clear error instead of hanging.
#  - a bad --kv-mem size is refused before anything is loaded.
#  - a request a worker refuses fails alone, not with the others of its batched step.
#  - on SIGTERM serve drains: 503 to new requests, those in flight finish or, at the timeout or a
#    second signal, end with a server_shutting_down error.
#  - serve waits for workers that start after it; a wrong export fails at once.
#  - a request whose cached prefix a worker evicted computes its prompt instead of failing.
#  - a replica that refuses every request passes them to the other replica.
#  - speculative decoding (serve and run --spec-draft, serve --draft-model) through 2 stages gives
#    the answers it gives without.
source "$(dirname "$0")/e2e_lib.sh"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# start_worker SHARD LOG [args...]: starts a worker on a free port, prints "pid port". It runs in a
# process substitution, so a failure goes to stderr, where it is seen. LOG is emptied here, before
# the start: a log an earlier section left (the same export's w0.log, w1.log) still says
# "listening on port" until the new worker's shell truncates it, which may be after the first look
# (it was, twice, under ThreadSanitizer: the wait ended at once and the port read was empty).
start_worker() {
    local shard=$1 log=$2; shift 2
    : >"$log"
    "$CASCADIA" worker --shard "$shard" --listen 127.0.0.1:0 --threads 1 "$@" >"$log" 2>&1 &
    local pid=$!
    wait_for 30 logged_or_gone "$log" "listening on port [0-9]" "$pid" || true
    port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$log")
    local state="still silent after 30 s"
    gone "$pid" && state="exited"
    [ -n "$port" ] || { cat "$log"; where_stuck "$pid"; fail "worker for $shard did not start ($state)"; } >&2
    echo "$pid $port"
}

# where_stuck PID: what a live process's threads are doing (state, kernel wait channel, system call
# and kernel stack where readable; user-space stacks through gdb), for a worker that stays silent.
where_stuck() {
    local pid=$1 t
    [ -d "/proc/$pid" ] || return 0
    grep -E "^(State|Threads|VmRSS|VmSize)" "/proc/$pid/status" 2>/dev/null
    for t in /proc/"$pid"/task/*; do
        echo "thread ${t##*/} ($(cat "$t/comm" 2>/dev/null)): state $(cut -d' ' -f3 "$t/stat" 2>/dev/null)," \
            "wchan $(cat "$t/wchan" 2>/dev/null), syscall $(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
        cat "$t/stack" 2>/dev/null | head -12
    done
    # user-space stacks too, where gdb is installed and may attach (it is not a dependency)
    command -v gdb >/dev/null && timeout 30 gdb -p "$pid" -batch -ex "thread apply all bt 16" 2>&1 |
        grep -E "^(Thread|#)" | head -80
    return 0
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
        if [ "$prec$n" = int43 ]; then
            # stages on one machine share its cores: by default one micro-batch is in flight
            CSD_LOG=info run_ids --fleet "$FLEET" --manifest "$d" --insecure >/dev/null
            grep -q "3 stage(s) on 1 machine(s): 1 micro-batch(es) in flight" "$WORK/run.err" ||
                fail "localhost fleet: no default of one micro-batch: $(grep micro "$WORK/run.err")"
            echo "ok: a localhost fleet keeps one micro-batch in flight by default"; passed=$((passed + 1))
            # bench --fleet --json: one JSON object whose parts add up to the token time
            "$CASCADIA" bench --fleet "$FLEET" --manifest "$d" --insecure -p 4 -n 4 -r 1 --json \
                > "$WORK/fleet.json" 2>"$WORK/bench.err" || fail "bench --fleet: $(cat "$WORK/bench.err")"
            /usr/bin/python3 - "$WORK/fleet.json" <<'PY' || fail "bench --fleet --json: $(cat "$WORK/fleet.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["mode"] == "fleet" and d["stages"] == 3 and d["local_stage"] is False, d
assert d["n_gen"] == 4 and d["pp_tps"] > 0 and d["tg_tps"] > 0, d
parts = d["remote_compute_ms"] + d["network_wait_ms"] + d["coordinator_ms"] + d["local_compute_ms"]
assert abs(parts - d["ms_per_token"]) <= 0.05 * d["ms_per_token"] + 0.01, (parts, d)
assert d["build_commit"] and d["version"] and d["cpu"], d
PY
            # no prompt test: the warm-up takes one token (it took 32, past the ids and the context)
            "$CASCADIA" bench --fleet "$FLEET" --manifest "$d" --insecure -p 0 -n 4 -r 1 --json \
                > "$WORK/fleet0.json" 2>"$WORK/bench.err" || fail "bench --fleet -p 0: $(cat "$WORK/bench.err")"
            echo "ok: bench --fleet --json"; passed=$((passed + 1))
        fi
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

# 5. a worker dies mid-generation: the request fails with a clear error, nothing hangs. The model is
#    the tiny one with a 4096-token context (a worker's default cap): 4000 tokens take seconds, so
#    the kill always lands mid-request, however fast the machine.
cp -r "$WORK/m" "$WORK/mlong"
/usr/bin/python3 - "$WORK/mlong/config.json" <<'PY' || fail "could not lengthen the context"
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 4096
json.dump(c, open(sys.argv[1], "w"))
PY
"$CASCADIA" export "$WORK/mlong" --stages 2 --precision f32 --out "$WORK/x-long" >/dev/null 2>&1 || fail "export long"
fleet_up "$WORK/x-long" 2 --insecure
victim=${PIDS[1]}
( rc=0; "$CASCADIA" run --fleet "$FLEET" --manifest "$WORK/x-long" --insecure -p "$PROMPT" -n 4000 --ctx 4096 \
    --ignore-eos --temp 0 >"$WORK/die.out" 2>&1 || rc=$?; echo "exit=$rc" >>"$WORK/die.out" ) &
runner=$!
# wait for the connection, so that the kill lands mid-request and not before the run reached the
# stage
wait_for 30 grep -qs "connected to the fleet" "$WORK/die.out" ||
    { tail -5 "$WORK/die.out"; fail "run did not connect to the fleet"; }
kill -STOP "$victim"; sleep 0.3; kill -9 "$victim"   # frozen mid-request, then gone
wait_for 30 gone "$runner" || fail "run hung after a worker died"
grep -aq "exit=1" "$WORK/die.out" || { cat "$WORK/die.out" | tail -5; fail "a worker's death was not reported as a failure (exit 1)"; }
grep -aq "fleet link failed: stage at 127.0.0.1:${FLEET##*:}" "$WORK/die.out" || { tail -5 "$WORK/die.out"; fail "the error does not name the dead stage"; }
echo "ok: worker death reported: $(grep -ao 'cascadia run: .*' "$WORK/die.out" | head -1)"
passed=$((passed + 1))
fleet_down

# 6. serve over two replicas (two --fleet groups): requests spread over both; when a worker of one
#    replica dies, its requests fail cleanly, the other replica keeps serving, and the coordinator
#    reconnects when the worker is back.
d="$WORK/x-f32-2"
fleet_up "$d" 2 --insecure; R1="$FLEET"; R1_PIDS=("${PIDS[@]}"); PIDS=()
fleet_up "$d" 2 --insecure; R2="$FLEET"; R2_PIDS=("${PIDS[@]}")
PIDS=("${R1_PIDS[@]}" "${R2_PIDS[@]}")
# --micro-batches 2: interleaving through the 2 stages is exercised here although they share a machine
CSD_LOG=info "$CASCADIA" serve --manifest "$d" --fleet "$R1" --fleet "$R2" --insecure --port 0 --parallel 2 \
    --hidden-dtype f32 --micro-batches 2 --chat-template chatml >"$WORK/serve.log" 2>&1 &
PIDS+=("$!")
serve_up() { # serve's port is logged and its /health answers
    port=$(sed -n 's|.*listening on http://[0-9.]*:\([0-9]*\).*|\1|p' "$WORK/serve.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1
}
wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve did not start"; }
complete() { curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":12,"temperature":0}'; }
want=$(complete | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')
CURLS=()
for i in $(seq 1 8); do complete >"$WORK/c$i.json" & CURLS+=("$!"); done
for c in "${CURLS[@]}"; do wait "$c" || true; done
for i in $(seq 1 8); do
    got=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$WORK/c$i.json") \
        || fail "request $i through two replicas: $(cat "$WORK/c$i.json")"
    [ "$got" = "$want" ] || fail "request $i differs: '$got' vs '$want'"
done
echo "ok: 8 concurrent requests over 2 replicas, identical answers"; passed=$((passed + 1))
grep -q "2 micro-batch(es) in flight (--micro-batches)" "$WORK/serve.log" || fail "--micro-batches 2 not applied"
# greedy with a logit_bias: the last stage must send the logits back, not its own argmax. Then n
# choices: each equals its seed alone. The seeds run alone first, so the prefix cache holds a
# prompt that was computed, never one copied from another choice: a choice that copied a wrong
# prompt KV (COPY_PREFIX between choices, the first replica to look admits two of the three)
# cannot match. (That choices copy at all is test_coord_engine's.)
/usr/bin/python3 - "http://127.0.0.1:$port" <<'PY' || fail "logit_bias or n choices through the fleet"
import json, sys, urllib.request
def post(path, body):
    req = urllib.request.Request(sys.argv[1] + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
def copied():
    with urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cascadia_prefix_cache_tokens_total "):
                return int(float(line.split()[1]))
forced = post("/tokenize", {"content": " time"})["tokens"][-1]
want = post("/detokenize", {"tokens": [forced] * 4})["content"].strip()
got = post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0,
                               "ignore_eos": True, "logit_bias": {str(forced): 100}})
assert got["choices"][0]["text"].strip() == want, (got, want)
print("ok: logit_bias forces a token through the fleet")
prompt = "Three little foxes ran over the green hill, and one of them said to the others"
n_prompt = post("/tokenize", {"prompt": prompt})["count"]
assert n_prompt > 17, n_prompt
base = {"prompt": prompt, "max_tokens": 8, "temperature": 0.9, "ignore_eos": True}
alone = [post("/v1/completions", dict(base, seed=11 + i))["choices"][0]["text"] for i in range(3)]
before = copied()
group = post("/v1/completions", dict(base, seed=11, n=3))
for i in range(3):
    assert group["choices"][i]["text"] == alone[i], (i, group, alone)
print("ok: n choices through the fleet equal their seeds alone (%d prompt positions reused)"
      % (copied() - before))
PY
passed=$((passed + 2))
# different prompts and seeds, sampled: each alone, then all at once (batched with each other in
# every stage): a user's answer never depends on who else is served
ask() { curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":10,\"temperature\":0.9,\"seed\":$1}" |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'; }
for i in 1 2 3 4 5 6; do ask $i >"$WORK/alone$i"; done
CURLS=()
for i in 1 2 3 4 5 6; do ask $i >"$WORK/together$i" & CURLS+=("$!"); done
for c in "${CURLS[@]}"; do wait "$c" || true; done
for i in 1 2 3 4 5 6; do
    cmp -s "$WORK/alone$i" "$WORK/together$i" || fail "request $i: alone '$(cat "$WORK/alone$i")' vs together '$(cat "$WORK/together$i")'"
done
echo "ok: 6 sampled requests give the same text alone and batched together (2-stage fleet)"; passed=$((passed + 1))
# a prompt longer than the prefill chunk (256): its chunks travel the 2-stage pipeline back to back;
# the text must equal the single-process `cascadia run` (with the prompt echoed, as run prints it)
LONG=$(for i in $(seq 1 90); do printf 'the and was to '; done)
"$CASCADIA" run "$WORK/m" --precision f32 -p "$LONG" -n 12 --temp 0 --threads 1 >"$WORK/long.run" 2>/dev/null
/usr/bin/python3 - "$LONG" >"$WORK/long.json" <<'PY'
import json, sys
print(json.dumps({"prompt": sys.argv[1], "max_tokens": 12, "temperature": 0, "echo": True}))
PY
curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d @"$WORK/long.json" \
    >"$WORK/long.api"
/usr/bin/python3 - "$WORK/long.run" "$WORK/long.api" <<'PY' || fail "long prompt through the fleet differs from cascadia run"
import json, sys
want = open(sys.argv[1], encoding="utf-8", errors="replace").read().rstrip("\n")
got = json.load(open(sys.argv[2]))["choices"][0]["text"]
if got != want:
    print("run:", repr(want[-120:])); print("api:", repr(got[-120:])); sys.exit(1)
PY
echo "ok: a 361-token prompt (2 chunks in flight) gives the single-process text"; passed=$((passed + 1))
# a replica's loss is waited for, not slept on: until the coordinator has seen it, new requests
# still go to it (a kill's sockets close late when a big sanitizer process is torn down)
broken_logged() { grep -c "fleet broken" "$WORK/serve.log" || true; }
broken_since() { [ "$(broken_logged)" -gt "$1" ]; }
broken=$(broken_logged)
kill -9 "${R1_PIDS[1]}"   # replica 1 loses its last stage
wait_for 30 broken_since "$broken" || { tail -5 "$WORK/serve.log"; fail "replica 1's loss not seen"; }
ok=0
for i in $(seq 1 6); do
    out=$(complete)
    echo "$out" | grep -q '"text"' && ok=$((ok + 1))
done
[ "$ok" -ge 1 ] || fail "no request succeeded on the surviving replica"
curl -sf "http://127.0.0.1:$port/health" >/dev/null || true
echo "ok: with one replica down, $ok/6 requests still answered (the rest failed with an error, none hung)"
passed=$((passed + 1))
# the dead worker comes back on its address: replica 1 reconnects; then replica 2 loses a worker
# and every request must still be answered, by replica 1 alone
old_port=${R1##*:}
reconnects_logged() { grep -c "fleet reconnected" "$WORK/serve.log" || true; }
reconnected_since() { [ "$(reconnects_logged)" -gt "$1" ]; }
reconnects=$(reconnects_logged)
"$CASCADIA" worker --shard "$d/stage-1.shard" --listen "127.0.0.1:$old_port" --insecure --threads 1 \
    >"$WORK/again.log" 2>&1 &
PIDS+=("$!")
# the coordinator retries once a second; wait for its INFO line
wait_for 30 reconnected_since "$reconnects" ||
    { tail -5 "$WORK/again.log" "$WORK/serve.log"; fail "replica 1 did not reconnect to the restarted worker"; }
broken=$(broken_logged)
kill -9 "${R2_PIDS[1]}"   # replica 2's last stage
wait_for 30 broken_since "$broken" || { tail -5 "$WORK/serve.log"; fail "replica 2's loss not seen"; }
for i in $(seq 1 4); do
    complete | grep -q '"text"' || fail "request $i after reconnection: replica 1 did not come back"
done
echo "ok: a restarted worker was reconnected and served 4/4 requests"; passed=$((passed + 1))
fleet_down

# 7. --kv-mem is checked before anything is loaded: a size that is not one (NaN, infinite, zero,
#    negative, beyond 1 PiB, an unknown unit) exits 2 naming the flag; a good one is the cap in use
shard="$WORK/x-f32-1/stage-0.shard"
for bad in nan inf 1e30G 0 -1 2X ""; do
    rc=0; out=$(timeout 10 "$CASCADIA" worker --shard "$shard" --listen 127.0.0.1:0 --insecure \
        --kv-mem "$bad" 2>&1) || rc=$?
    [ "$rc" = 2 ] || fail "--kv-mem '$bad': exit $rc, not 2"
    grep -q -- "--kv-mem" <<<"$out" ||
        fail "--kv-mem '$bad': the message does not name the flag: $out"
done
read -r pid port < <(start_worker "$shard" "$WORK/cap.log" --insecure --kv-mem 64MiB)
PIDS+=("$pid")
grep -q "cap 64 MiB" "$WORK/cap.log" ||
    { cat "$WORK/cap.log"; fail "--kv-mem 64MiB is not the cap in use"; }
echo "ok: --kv-mem: 7 bad sizes refused (exit 2), 64MiB is the cap"; passed=$((passed + 1))
fleet_down

# 8. a stage that refuses one request of a batched step fails that request alone: the others in the
#    step go on. Here the worker holds one request (--max-requests 1) and the coordinator runs two,
#    so the second OPEN evicts the first, whose next step the worker refuses ("not open"). The
#    overlap is made, not timed: the first (4000 tokens, seconds long) has streamed a token before
#    the second is sent.
"$CASCADIA" export "$WORK/mlong" --stages 1 --precision f32 --out "$WORK/x-long-1" >/dev/null 2>&1 ||
    fail "export long, 1 stage"
d="$WORK/x-long-1"
read -r pid wport < <(start_worker "$d/stage-0.shard" "$WORK/one.log" --insecure --max-requests 1)
PIDS+=("$pid")
: >"$WORK/serve.log" # emptied first (see start_worker): no look sees the last serve's lines
"$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$wport" --insecure --port 0 --parallel 2 \
    --ctx 4096 >"$WORK/serve.log" 2>&1 &
PIDS+=("$!")
wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve (one-request worker) did not start"; }
/usr/bin/python3 - "$port" <<'PY' || fail "a refused request in a batched step (above)"
import http.client, json, sys
port = int(sys.argv[1])
def send(c, n, stream):
    c.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": n,
              "temperature": 0, "ignore_eos": True, "stream": stream}),
              {"Content-Type": "application/json"})
    return c.getresponse()
a = send(http.client.HTTPConnection("127.0.0.1", port, timeout=300), 4000, True)
first = a.readline()
while first == b"\n":  # (b"" is the end of the stream: asserted below)
    first = a.readline()
assert first.startswith(b"data: {"), first  # the first is open on the worker and generating
b = send(http.client.HTTPConnection("127.0.0.1", port, timeout=300), 150, False)
b_body = b.read().decode()
a_body = a.read().decode()
a_done = a_body.rstrip().endswith("data: [DONE]") and '"error"' not in a_body
b_done = b.status == 200 and json.loads(b_body)["usage"]["completion_tokens"] == 150
refused = [x for x in (a_body, b_body) if "not open on this stage" in x]
assert len(refused) == 1, ("want exactly one refused", a_body[-300:], b_body[-300:])
assert a_done != b_done, ("want the other one whole", a_body[-300:], b_body[-300:])
print("ok: a request the worker refused failed alone; the other in its step finished (%s refused)"
      % ("the first" if b_done else "the second"))
PY
passed=$((passed + 1))

# 9. one coordinator at a time: `cascadia run` pointed at the serving fleet's worker is refused,
#    naming the coordinator it serves, and the server goes on serving
if "$CASCADIA" run --manifest "$d" --fleet "127.0.0.1:$wport" --insecure -p "$PROMPT" -n 4 \
    >"$WORK/second.out" 2>"$WORK/second.err"; then
    fail "a second coordinator was served: $(cat "$WORK/second.out")"
fi
grep -q "this worker serves the coordinator at 127.0.0.1:" "$WORK/second.err" ||
    fail "the second coordinator's error does not say why: $(cat "$WORK/second.err")"
long() { curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":150,"temperature":0,"ignore_eos":true}'; }
long >"$WORK/after.json"
grep -q '"completion_tokens":150' "$WORK/after.json" ||
    fail "serve failed after a second coordinator was refused: $(cat "$WORK/after.json")"
echo "ok: a second coordinator was refused ($(grep -o 'this worker serves[^(]*' "$WORK/second.err" | head -1)); serve went on"
passed=$((passed + 1))
fleet_down

# 9b. graceful shutdown. On SIGTERM serve takes no new request (503 server_shutting_down, /health
#     503 shutting_down) while those in flight finish, and exits as soon as they have; at
#     --shutdown-timeout, or on a second signal, the rest are stopped: a stream's last event is a
#     server_shutting_down error before [DONE], a plain request gets that error with 503. With the
#     worker frozen for good, serve still exits within seconds, not at the fleet's 120 s silence
#     limit. Serve exits 0. The worker is stopped (SIGSTOP) while the two requests are sent, to hold
#     them in flight: made, not timed.
d="$WORK/x-long-1"
read -r wpid wport < <(start_worker "$d/stage-0.shard" "$WORK/drain-w.log" --insecure)
PIDS+=("$wpid")
for mode in finish second timeout frozen; do
    limit=30
    case $mode in timeout | frozen) limit=1 ;; esac
    : >"$WORK/serve.log"
    "$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$wport" --insecure --port 0 --ctx 4096 \
        --shutdown-timeout $limit >"$WORK/serve.log" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve (shutdown, $mode) did not start"; }
    /usr/bin/python3 - "$port" "$spid" "$wpid" "$mode" "$limit" <<'PY' ||
import http.client, json, os, signal, sys, threading, time
port, spid, wpid, mode, limit = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def conn(): return http.client.HTTPConnection("127.0.0.1", port, timeout=120)
def send(c, stream):
    c.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 200,
              "temperature": 0, "ignore_eos": True, "stream": stream}), {"Content-Type": "application/json"})
    return c.getresponse()
def get(path):
    c = conn(); c.request("GET", path); r = c.getresponse(); return r.status, r.read().decode(), r
def in_flight():
    return int([l for l in get("/metrics")[1].splitlines() if l.startswith("cascadia_http_requests_in_flight ")][0].split()[1])
def serve_gone():  # exited (a zombie until the shell reaps it counts)
    try: return open("/proc/%d/stat" % spid).read().split(")")[-1].split()[0] == "Z"
    except OSError: return True
def gone_within(secs):
    t0 = time.time()
    while not serve_gone():
        if time.time() - t0 > secs: return None
        time.sleep(0.05)
    return time.time() - t0
got = {}
def request(stream):
    try:
        r = send(conn(), stream); got[stream] = (r.status, r.read().decode())
    except Exception as e:  # a connection closed without an answer (frozen)
        got[stream] = (0, repr(e))
os.kill(wpid, signal.SIGSTOP)  # the requests wait on the worker: both stay in flight
try:
    threads = [threading.Thread(target=request, args=(s,)) for s in (True, False)]
    for t in threads: t.start()
    deadline = time.time() + 30
    while in_flight() < 2:
        assert time.time() < deadline, "the requests never got in flight"
        time.sleep(0.05)
    os.kill(spid, signal.SIGTERM)
    signalled = time.time()
    deadline = time.time() + 30
    while True:  # the signal is handled on serve's own time
        st, body, r = get("/health")
        if st == 503: break
        assert time.time() < deadline, "/health still %d after SIGTERM" % st
        time.sleep(0.05)
    assert json.loads(body) == {"status": "shutting_down"}, body
    r = send(conn(), False); body = r.read().decode()
    assert r.status == 503 and json.loads(body)["error"]["code"] == "server_shutting_down", (r.status, body)
    assert r.getheader("Connection", "").lower() == "close", r.getheaders()
    if mode == "second":
        os.kill(spid, signal.SIGTERM)
    if mode == "frozen":  # never thawed while serve runs: it must end the step itself
        took = gone_within(60)
        assert took is not None, "serve still running 60 s after SIGTERM with a frozen worker"
        took = time.time() - signalled
        assert took < 30, "serve took %.1f s to exit with a frozen worker" % took
    else:
        time.sleep(limit + 1.0 if mode == "timeout" else 1.0)  # (finish: the drain holds meanwhile)
        assert not serve_gone(), "serve exited before its requests ended"
finally:
    os.kill(wpid, signal.SIGCONT)
for t in threads: t.join(120)
(st_a, stream), (st_b, plain) = got[True], got[False]
if mode == "frozen":
    print("ok: shutdown (frozen worker): serve exited %.1f s after SIGTERM (--shutdown-timeout 1)" % took)
    sys.exit(0)
events = [e[len("data: "):] for e in stream.split("\n\n") if e.startswith("data: ")]
assert st_a == 200 and events and events[-1] == "[DONE]", stream[-300:]
if mode == "finish":
    assert '"error"' not in stream and '"finish_reason":"length"' in stream, stream[-300:]
    assert st_b == 200 and json.loads(plain)["usage"]["completion_tokens"] == 200, plain
    took = gone_within(15)  # the drain ends with its last request, not at the timeout
    assert took is not None, "serve still running 15 s after its last request ended"
else:
    err = json.loads(events[-2])["error"]
    assert err["code"] == "server_shutting_down", events[-2]
    assert st_b == 503 and json.loads(plain)["error"]["code"] == "server_shutting_down", plain
print("ok: shutdown (%s): 503 to new requests and /health while draining; in flight: %s" % (mode,
      "both finished, then serve exited" if mode == "finish" else "stream ends with " + err["code"] + ", plain request 503"))
PY
        { tail -5 "$WORK/serve.log"; fail "graceful shutdown ($mode), above"; }
    wait_for 30 gone "$spid" || fail "serve still running 30 s after SIGTERM ($mode)"
    wait "$spid" || fail "serve exited with status $? after SIGTERM ($mode)"
    grep -q "draining, new requests get 503" "$WORK/serve.log" || fail "serve did not say it drains"
    passed=$((passed + 1))
done
fleet_down

# 10. serve waits for workers that start after it (--wait-workers). Stage 0 is up and stage 1 is
#     not: serve retries with /health saying loading, and answers once stage 1 starts. With no
#     worker at all it gives up when the wait is over, naming the address; a fleet of another
#     export fails at once, however long the wait.
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
d="$WORK/x-f32-2"
read -r pid p0 < <(start_worker "$d/stage-0.shard" "$WORK/wait0.log" --insecure); PIDS+=("$pid")
p1=$(free_port)
: >"$WORK/serve.log"
CSD_LOG=info "$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$p0,127.0.0.1:$p1" --insecure --port 0 \
    --wait-workers 300 >"$WORK/serve.log" 2>&1 &
spid=$!; PIDS+=("$spid")
wait_for 60 logged_or_gone "$WORK/serve.log" "waiting for the fleet" "$spid"
grep -q "waiting for the fleet (.*stage 1: connect 127.0.0.1:$p1" "$WORK/serve.log" ||
    fail "serve did not say what it waits for: $(cat "$WORK/serve.log")"
port=$(sed -n 's|.*listening on http://[0-9.]*:\([0-9]*\).*|\1|p' "$WORK/serve.log")
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
[ "$code" = 503 ] || fail "/health while waiting for a worker: $code, not 503"
"$CASCADIA" worker --shard "$d/stage-1.shard" --listen "127.0.0.1:$p1" --threads 1 --insecure \
    >"$WORK/wait1.log" 2>&1 &
PIDS+=("$!")
wait_for 120 serve_up || { cat "$WORK/serve.log"; fail "serve did not start once its last worker did"; }
complete | grep -q '"completion_tokens":12' || fail "serve after waiting: $(complete)"
echo "ok: serve waited for a late worker (/health 503 meanwhile), then served"; passed=$((passed + 1))
fleet_down
t0=$(date +%s); rc=0
timeout 120 "$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$p0,127.0.0.1:$p1" --insecure \
    --port 0 --wait-workers 2 >"$WORK/nowork.log" 2>&1 || rc=$?
waited=$(($(date +%s) - t0))
[ "$rc" = 1 ] || fail "serve with no worker: exit $rc, not 1: $(tail -3 "$WORK/nowork.log")"
[ "$waited" -ge 2 ] || fail "serve with no worker gave up after $waited s, before --wait-workers 2"
grep -q "after waiting [0-9]* s for the workers: .*127.0.0.1:$p0" "$WORK/nowork.log" ||
    fail "serve with no worker does not say what it waited for: $(tail -3 "$WORK/nowork.log")"
echo "ok: with no worker, serve gave up after --wait-workers 2 ($waited s), naming the address"
passed=$((passed + 1))
# fails_at_once WHAT PATTERN ARGS...: serve ARGS with a long --wait-workers exits 1 within a minute,
# its error matching PATTERN: what a wait cannot mend is not waited for
fails_at_once() {
    local what=$1 pattern=$2 t0 rc=0 waited; shift 2
    t0=$(date +%s)
    timeout 120 "$CASCADIA" serve "$@" --port 0 --wait-workers 100 >"$WORK/once.log" 2>&1 || rc=$?
    waited=$(($(date +%s) - t0))
    [ "$rc" = 1 ] && grep -qi "$pattern" "$WORK/once.log" ||
        fail "serve with $what: exit $rc: $(tail -3 "$WORK/once.log")"
    [ "$waited" -lt 60 ] || fail "serve waited $waited s with $what"
    echo "ok: $what fails at once ($waited s) despite --wait-workers 100"; passed=$((passed + 1))
}
fleet_up "$WORK/x-f32-2" 2 --insecure
fails_at_once "a fleet of another export" "hash\|mismatch" --manifest "$WORK/x-int8-2" \
    --fleet "$FLEET" --insecure
fleet_down
fleet_up "$WORK/x-int8-2" 2 --key "$WORK/fleet.key"
fails_at_once "a wrong fleet key" "key" --manifest "$WORK/x-int8-2" --fleet "$FLEET" \
    --key "$WORK/other.key"
fleet_down
# a signal ends the wait: a clean shutdown (exit 0), not an error
"$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$p0,127.0.0.1:$p1" --insecure --port 0 \
    --wait-workers 300 >"$WORK/sig.log" 2>&1 &
spid=$!
wait_for 60 logged_or_gone "$WORK/sig.log" "waiting for the fleet" "$spid"
gone "$spid" && fail "serve did not wait: $(tail -3 "$WORK/sig.log")"
kill -TERM "$spid"
wait_for 30 gone "$spid" || fail "serve did not stop waiting on SIGTERM"
rc=0; wait "$spid" || rc=$?
[ "$rc" = 0 ] && grep -q "shutting down" "$WORK/sig.log" ||
    fail "SIGTERM while waiting for workers: exit $rc: $(tail -3 "$WORK/sig.log")"
echo "ok: SIGTERM ends the wait for workers cleanly (exit 0)"; passed=$((passed + 1))


# 11. a cached prompt the worker evicted: the worker holds two requests (--max-requests 2) and the
#     coordinator caches up to three prompts, so a later OPEN (the third prompt's, or the fourth
#     request's own) evicts the first prompt's KV, which the coordinator still names. The fourth
#     request starts with the first prompt and copies from it, the worker refuses the copy, and the
#     request computes its whole prompt: the answer is the single-process text, not an error.
d="$WORK/x-f32-1"
read -r pid wport < <(start_worker "$d/stage-0.shard" "$WORK/evict.log" --insecure --max-requests 2)
PIDS+=("$pid")
: >"$WORK/serve.log"
CSD_LOG=info "$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$wport" --insecure --port 0 \
    --parallel 1 --prefix-cache 3 >"$WORK/serve.log" 2>&1 &
PIDS+=("$!")
wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve (two-request worker) did not start"; }
# ask PROMPT MAX_TOKENS: a greedy completion with the prompt echoed, as `cascadia run` prints it
ask() {
    /usr/bin/python3 -c 'import json, sys
print(json.dumps({"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "temperature": 0,
                  "echo": True}))' "$1" "$2" |
        curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d @-
}
DOC=$(for i in $(seq 1 8); do printf 'the and was to '; done)
for p in "$DOC" "Once upon a time there was a cat and a dog" "a b c d e f g h i j k l m n o p"; do
    ask "$p" 4 | grep -q '"completion_tokens":4' || fail "a prompt to fill the cache failed"
done
"$CASCADIA" run "$WORK/m" --precision f32 -p "${DOC}and then" -n 12 --temp 0 --threads 1 \
    >"$WORK/evict.run" 2>/dev/null
ask "${DOC}and then" 12 >"$WORK/evict.api"
/usr/bin/python3 - "$WORK/evict.run" "$WORK/evict.api" <<'PY' || fail "the request after a refused copy"
import json, sys
want = open(sys.argv[1], encoding="utf-8", errors="replace").read().rstrip("\n")
got = json.load(open(sys.argv[2]))
text = got.get("choices", [{}])[0].get("text")
if text != want:
    print("run:", repr(want[-120:])); print("api:", json.dumps(got)[:400]); sys.exit(1)
PY
grep -q "copy prefix: request [0-9]* is not open on this stage" "$WORK/evict.log" ||
    fail "the worker refused no copy: $(cat "$WORK/evict.log")"
grep -q "refused after copying [0-9]* prompt tokens" "$WORK/serve.log" ||
    fail "no copy was refused (nothing was tested): $(tail -5 "$WORK/serve.log")"
# at least the one: a short copy (a shared first token) of another request may be refused too, as
# the worker's evictions fall (once seen: the count was not 1)
refused=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^cascadia_prefix_cache_refused_total //p')
[ "${refused:-0}" -ge 1 ] || fail "/metrics does not count the refused copy: '$refused'"
echo "ok: a request whose cached prefix the worker had evicted computed its prompt (the single-process text)"
passed=$((passed + 1))
fleet_down

# 12. of two replicas, one refuses every request (its worker's --kv-mem holds none): every request
#     is still answered, by the other replica, and the coordinator says it moved them.
d="$WORK/x-f32-1"
read -r pid pa < <(start_worker "$d/stage-0.shard" "$WORK/tiny.log" --insecure --kv-mem 1KiB)
PIDS+=("$pid")
read -r pid pb < <(start_worker "$d/stage-0.shard" "$WORK/whole.log" --insecure)
PIDS+=("$pid")
: >"$WORK/serve.log"
CSD_LOG=info "$CASCADIA" serve --manifest "$d" --fleet "127.0.0.1:$pa" --fleet "127.0.0.1:$pb" \
    --insecure --port 0 --parallel 2 --ctx 256 >"$WORK/serve.log" 2>&1 &
PIDS+=("$!")
wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve (a refusing replica) did not start"; }
# 200 tokens each: the serving replica's 2 slots stay busy while the others arrive, so the
# refusing one (idle) admits some of them
long200() { curl -s -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":200,"temperature":0,"ignore_eos":true}'; }
CURLS=()
for i in $(seq 1 6); do long200 >"$WORK/r$i.json" & CURLS+=("$!"); done
for c in "${CURLS[@]}"; do wait "$c" || true; done
for i in $(seq 1 6); do
    grep -q '"completion_tokens":200' "$WORK/r$i.json" ||
        fail "request $i with a refusing replica: $(cat "$WORK/r$i.json")"
done
grep -q "more than the stage's cap" "$WORK/tiny.log" "$WORK/serve.log" ||
    fail "the small worker refused nothing (nothing was tested): $(tail -3 "$WORK/serve.log")"
moved=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^cascadia_requests_rerouted_total //p')
[ "${moved:-0}" -ge 1 ] || fail "/metrics counts no request moved to the other replica: '$moved'"
echo "ok: with one replica refusing every request, 6/6 were answered by the other ($moved moved)"
passed=$((passed + 1))
fleet_down

# 13. speculative decoding (--spec-draft 4) through a 2-stage fleet: each answer is the one it is
#     without speculation (greedy, and sampled with logprobs), while /metrics counts draft tokens
#     the model agreed with. stories260K: a real model's text repeats itself, so drafts come up.
if [ -e "$CSD_SHARED_DIR/models/stories260K/golden.json" ]; then
    d="$WORK/s-2"
    fleet_up "$d" 2 --insecure
    for k in 0 4 d; do
        spec=(--spec-draft "$k") # d: drafts from a draft model (the int8 model in serve itself)
        [ "$k" = d ] && spec=(--draft-model "$CSD_SHARED_DIR/models/stories260K" --draft-precision int8)
        : >"$WORK/serve.log"
        CSD_LOG=info "$CASCADIA" serve --manifest "$d" --fleet "$FLEET" --insecure --port 0 \
            --hidden-dtype f32 "${spec[@]}" >"$WORK/serve.log" 2>&1 &
        spid=$!
        wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve ${spec[*]} did not start"; }
        for b in '"temperature":0' '"temperature":0.8,"seed":5,"logprobs":2'; do
            curl -s -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
                -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":150,\"ignore_eos\":true,$b}"
            echo
        done >"$WORK/spec$k.json"
        curl -s "http://127.0.0.1:$port/metrics" >"$WORK/spec$k.metrics"
        kill "$spid"; wait "$spid" 2>/dev/null || true
    done
    if ! /usr/bin/python3 - "$WORK/spec0.json" "$WORK/spec4.json" "$WORK/specd.json" <<'PY'
import json, sys
plain, spec, drafted = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:4])
for a, b in list(zip(plain, spec)) + list(zip(plain, drafted)):
    ca, cb = a["choices"][0], b["choices"][0]
    assert b["usage"]["completion_tokens"] == 150, b
    assert ca["text"] == cb["text"], (ca["text"][-80:], cb["text"][-80:])
    la, lb = (c["logprobs"]["token_logprobs"] if c.get("logprobs") else [] for c in (ca, cb))
    assert len(la) == len(lb) and all(abs(x - y) < 1e-3 for x, y in zip(la, lb)), (la[:5], lb[:5])
assert len(plain) == len(spec) == len(drafted) == 2
PY
    then
        cut -c1-300 "$WORK/spec0.json" "$WORK/spec4.json" "$WORK/specd.json"; tail -5 "$WORK/serve.log"
        fail "speculative decoding changed an answer"
    fi
    drafted=$(sed -n 's/^cascadia_spec_draft_tokens_total //p' "$WORK/spec4.metrics")
    agreed=$(sed -n 's/^cascadia_spec_accepted_tokens_total //p' "$WORK/spec4.metrics")
    [ "${agreed:-0}" -ge 1 ] || fail "no draft token was agreed with (nothing was tested): $agreed of $drafted"
    grep -q '^cascadia_spec_draft_tokens_total 0$' "$WORK/spec0.metrics" ||
        fail "drafts without --spec-draft: $(grep spec_draft "$WORK/spec0.metrics")"
    echo "ok: --spec-draft 4 through 2 stages gives the same answers ($agreed of $drafted draft tokens agreed)"
    passed=$((passed + 1))
    drafted=$(sed -n 's/^cascadia_spec_draft_tokens_total //p' "$WORK/specd.metrics")
    agreed=$(sed -n 's/^cascadia_spec_accepted_tokens_total //p' "$WORK/specd.metrics")
    [ "${agreed:-0}" -ge 1 ] || fail "no draft model token was agreed with: $agreed of $drafted"
    echo "ok: --draft-model (int8 self) through 2 stages gives the same answers ($agreed of $drafted draft tokens agreed)"
    passed=$((passed + 1))
    # cascadia run: the same ids with and without, greedy (g) and sampled with a penalty (s)
    for samp in "g --temp 0" "s --temp 0.8 --seed 3 --repeat-penalty 1.1"; do
        m=${samp%% *}
        for k in 0 4; do
            # shellcheck disable=SC2086 # the sampling flags are a list of words
            "$CASCADIA" run --fleet "$FLEET" --manifest "$d" --insecure --hidden-dtype f32 -p "$PROMPT" \
                -n 150 ${samp#* } --print-ids --spec-draft $k >"$WORK/run-$m$k" 2>"$WORK/run-$m$k.err" ||
                fail "run --spec-draft $k: $(cat "$WORK/run-$m$k.err")"
        done
        cmp -s "$WORK/run-${m}0" "$WORK/run-${m}4" ||
            fail "run ${samp#* }: ids differ with --spec-draft 4: $(cat "$WORK/run-${m}0") vs $(cat "$WORK/run-${m}4")"
    done
    grep -q "speculative decoding: [1-9][0-9]* of [0-9]* draft tokens agreed" "$WORK/run-g4.err" ||
        fail "run --spec-draft 4 agreed with no draft: $(cat "$WORK/run-g4.err")"
    echo "ok: run --spec-draft 4 through 2 stages gives the same ids ($(grep -o '[0-9]* of [0-9]*' "$WORK/run-g4.err") agreed, greedy)"
    passed=$((passed + 1))
    fleet_down
else
    echo "speculative decoding part skipped: $CSD_SHARED_DIR/models/stories260K not found"
fi

# 14. a worker dies while a request streams: the request resumes where it was, on the other
#     replica (a) or, with one replica, on its worker restarted on the same address (b), and the
#     client's answer is the one it gets with no death (greedy, f32 weights and KV). The
#     long-context tiny model of part 5 in one stage, 3000 tokens: the kill lands mid-answer.
"$CASCADIA" export "$WORK/mlong" --stages 1 --precision f32 --out "$WORK/x-long-1" >/dev/null 2>&1 ||
    fail "export long, 1 stage"
cat >"$WORK/resume.py" <<'PY'
import json, os, signal, subprocess, sys, time, urllib.request
# usage: resume.py BASE_URL CASCADIA SHARD PORT:PID [PORT:PID]  (with one worker: it is restarted)
base, cascadia, shard = sys.argv[1:4]
workers = [tuple(int(x) for x in w.split(":")) for w in sys.argv[4:]]
body = {"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "ignore_eos": True}
def request(extra):
    return urllib.request.Request(base + "/v1/completions", json.dumps(dict(body, **extra)).encode(),
                                  {"Content-Type": "application/json"})
with urllib.request.urlopen(request({}), timeout=300) as r:
    want = json.load(r)["choices"][0]["text"]
def cpu(pid):  # user + system ticks
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
def kill_busy():
    before = [cpu(pid) for _, pid in workers]
    time.sleep(0.3)
    busy = max(range(len(workers)), key=lambda i: cpu(workers[i][1]) - before[i])
    port, pid = workers[busy]
    os.kill(pid, signal.SIGKILL)
    if len(workers) > 1:
        return None
    time.sleep(0.5)  # its port is free once it is gone (the shell reaps it)
    return subprocess.Popen([cascadia, "worker", "--shard", shard, "--listen", "127.0.0.1:%d" % port,
                             "--insecure", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
text, events, at, usage, finish, again = [], 0, None, None, None, None
try:
    with urllib.request.urlopen(request({"stream": True, "stream_options": {"include_usage": True}}),
                                timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                text.append(c.get("text", ""))
                finish = c.get("finish_reason") or finish
            events += 1
            if events == 50:  # the worker that computes it is the busy one
                at = len("".join(text))
                again = kill_busy()
    got = "".join(text)
    assert finish == "length" and usage and usage["completion_tokens"] == 3000, (finish, usage)
    assert got == want, "resumed text differs at char %d" % next(
        i for i in range(min(len(got), len(want)) + 1) if got[i:i + 1] != want[i:i + 1])
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        m = r.read().decode()
    assert "\ncascadia_requests_resumed_total 1\n" in m, [l for l in m.splitlines() if "resumed" in l]
finally:
    if again:
        again.terminate()
        again.wait()
how = "on the other replica" if len(workers) > 1 else "on its worker, restarted"
print("ok: a worker killed mid-answer (%d of %d characters streamed): the request resumed %s, and "
      "the answer is the one without the death" % (at, len(want), how))
PY
for mode in replica restart; do
    read -r wa pa < <(start_worker "$WORK/x-long-1/stage-0.shard" "$WORK/ra.log" --insecure)
    PIDS+=("$wa")
    fleets=(--fleet "127.0.0.1:$pa") workers=("$pa:$wa")
    if [ $mode = replica ]; then
        read -r wb pb < <(start_worker "$WORK/x-long-1/stage-0.shard" "$WORK/rb.log" --insecure)
        PIDS+=("$wb")
        fleets+=(--fleet "127.0.0.1:$pb") workers+=("$pb:$wb")
    fi
    : >"$WORK/serve.log"
    CSD_LOG=info "$CASCADIA" serve --manifest "$WORK/x-long-1" "${fleets[@]}" --insecure --port 0 \
        --parallel 1 --ctx 4096 >"$WORK/serve.log" 2>&1 &
    PIDS+=("$!")
    wait_for 30 serve_up || { cat "$WORK/serve.log"; fail "serve ($mode, long context) did not start"; }
    /usr/bin/python3 "$WORK/resume.py" "http://127.0.0.1:$port" "$CASCADIA" \
        "$WORK/x-long-1/stage-0.shard" "${workers[@]}" ||
        { tail -5 "$WORK/serve.log"; fail "a request that lost its worker mid-answer ($mode)"; }
    grep -q "after [0-9]* tokens (.*); \(resuming on another\|waiting up to\)" "$WORK/serve.log" ||
        fail "serve did not log the resume ($mode): $(grep -i resum "$WORK/serve.log" | tail -2)"
    passed=$((passed + 1))
    fleet_down
done
echo "$passed passed, 0 failed"

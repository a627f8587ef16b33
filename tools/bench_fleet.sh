#!/bin/sh
# bench_fleet.sh: a 2-stage localhost fleet vs the same model in one process, side by side.
# Exports MODEL as 2 int4 stages (once), then for each worker thread count in WTHREADS runs
#   single: cascadia bench MODEL --precision int4 -t T             (one process, every layer)
#   fleet:  two workers (stage 0 and 1, --threads WT each) + cascadia bench --fleet (coordinator)
#   fleet-local0: the coordinator computes stage 0 (-t T) + one worker for stage 1 (--threads WT)
# alternating, ROUNDS times, with the load average next to every run, and prints the single-stream
# generation rates, the ratio to single-process and the per-token breakdown (coordinator share).
#
#   tools/bench_fleet.sh          # BUILD=build-bench MODEL=/tmp/tl11 T=2 N=128 R=3 WTHREADS="1 2"
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
CASCADIA=${CASCADIA:-$BUILD/cascadia}
MODEL=${MODEL:-/tmp/tl11}
PREC=${PREC:-int4}
EXPORT=${EXPORT:-$MODEL-x2-$PREC}
T=${T:-2} N=${N:-128} R=${R:-3} ROUNDS=${ROUNDS:-1} WTHREADS=${WTHREADS:-"1 2"}
PORT0=${PORT0:-29610}
LINK=${LINK:---insecure}                       # or "--key FILE"
OUT=${OUT:-/tmp/bench-fleet}
mkdir -p "$OUT"
RES=$OUT/results.tsv
: > "$RES"
PIDS=""

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
load() { cut -d' ' -f1 /proc/loadavg; }
stop_workers() { for p in $PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; PIDS=""; }
trap stop_workers EXIT INT TERM

# start_worker STAGE PORT THREADS: returns once the worker listens
start_worker() {
    : > "$OUT/worker-$1.log" # emptied first: the last run's "listening" must not end the wait
    "$CASCADIA" worker --shard "$EXPORT/stage-$1.shard" --listen "127.0.0.1:$2" $LINK --threads "$3" \
        --ctx $((N + 64)) > "$OUT/worker-$1.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    until grep -q listening "$OUT/worker-$1.log" 2>/dev/null; do
        i=$((i + 1)); [ $i -gt 600 ] && { log "worker $1 did not start"; cat "$OUT/worker-$1.log" >&2; exit 1; }
        sleep 0.1
    done
}

[ -x "$CASCADIA" ] || { echo "no $CASCADIA: build first" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "no model in $MODEL (see tools/bench_vs_llamacpp.sh)" >&2; exit 1; }
if [ ! -f "$EXPORT/manifest.json" ]; then
    log "exporting $MODEL -> $EXPORT (2 stages, $PREC)"
    "$CASCADIA" export "$MODEL" --stages 2 --precision "$PREC" --out "$EXPORT" > "$OUT/export.log" 2>&1 || exit 1
fi

row() { # kind wthreads round json
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[4]))
print("%s\t%s\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s" % (sys.argv[1], sys.argv[2], sys.argv[3],
      d["tg_tps"], d.get("ms_per_token", 1e3 / d["tg_tps"]), d.get("local_compute_ms", 0), d.get("remote_compute_ms", 0), d.get("network_wait_ms", 0),
      d.get("coordinator_ms", 0), d.get("coordinator_pct", 0), sys.argv[5]))' "$1" "$2" "$3" "$4" "$5" >> "$RES"
}

single() { # round
    l=$(load); log "single process -t $T (load $l)"
    "$CASCADIA" bench "$MODEL" --precision "$PREC" -t "$T" -p 0 -n "$N" -r "$R" --membw-mib 0 --json \
        > "$OUT/single-$1.json" 2> "$OUT/single-$1.log" && row single "$T" "$1" "$OUT/single-$1.json" "$l"
}

fleet() { # wthreads round
    start_worker 0 $PORT0 "$1"; start_worker 1 $((PORT0 + 1)) "$1"
    l=$(load); log "fleet: 2 workers x $1 threads (load $l)"
    "$CASCADIA" bench --fleet "127.0.0.1:$PORT0,127.0.0.1:$((PORT0 + 1))" --manifest "$EXPORT" $LINK \
        -p 0 -n "$N" -r "$R" --json > "$OUT/fleet-$1-$2.json" 2> "$OUT/fleet-$1-$2.log" &&
        row fleet "$1" "$2" "$OUT/fleet-$1-$2.json" "$l"
    stop_workers
}

fleet_local0() { # wthreads round
    start_worker 1 $((PORT0 + 1)) "$1"
    l=$(load); log "fleet: stage 0 here (-t $T) + 1 worker x $1 threads (load $l)"
    "$CASCADIA" bench --fleet "127.0.0.1:$((PORT0 + 1))" --manifest "$EXPORT" --local-stage 0 -t "$T" $LINK \
        -p 0 -n "$N" -r "$R" --json > "$OUT/local0-$1-$2.json" 2> "$OUT/local0-$1-$2.log" &&
        row fleet-local0 "$1" "$2" "$OUT/local0-$1-$2.json" "$l"
    stop_workers
}

round=1
while [ $round -le "$ROUNDS" ]; do
    single $round
    for wt in $WTHREADS; do
        fleet "$wt" $round
        fleet_local0 "$wt" $round
    done
    single $round
    round=$((round + 1))
done

/usr/bin/python3 - "$RES" <<'EOF'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    rows[(f[0], f[1])].append([float(x) for x in f[3:10]] + [f[10]])
def mean(rs, i): return sum(r[i] for r in rs) / len(rs)
single = [r for k, v in rows.items() if k[0] == "single" for r in v]
s = mean(single, 0) if single else float("nan")
print("| setup | worker threads | tg t/s | vs single | ms/token | stage 0 here | workers' compute "
      "| network + wait | coordinator | coordinator share | load avg |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for (kind, wt), v in sorted(rows.items()):
    tg = mean(v, 0)
    print("| %s | %s | %.2f | %.3fx | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %s |" % (
        kind, wt if kind != "single" else "-", tg, tg / s, mean(v, 1), mean(v, 2), mean(v, 3), mean(v, 4),
        mean(v, 5), mean(v, 6), ",".join(r[7] for r in v)))
EOF

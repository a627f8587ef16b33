#!/usr/bin/env bash
# The router's cost: the same requests sent straight to one `cascadia serve` and through a
# `cascadia route` in front of it, alternating in rounds, at the same concurrency. The model is
# the tiny synthetic one (a step is ~0.1 ms), so the figures are the HTTP path's, not the model's.
# usage: tools/bench_route.sh [REQUESTS] [CONCURRENCY] [ROUNDS] [MAX_TOKENS]
set -euo pipefail
N=${1:-400}; CONC=${2:-8}; ROUNDS=${3:-3}; TOK=${4:-8}
C=${CASCADIA:-build/cascadia}
W=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
"$C" synth --arch llama --preset tiny --out "$W/m" >/dev/null 2>&1

# start NAME ARGS...: runs `cascadia ARGS --port 0` and sets port_NAME once it listens
start() {
    local name=$1 log="$W/$1.log"; shift
    "$C" "$@" --port 0 >/dev/null 2>"$log" &
    pids+=($!)
    for _ in $(seq 1 300); do
        grep -q "listening on" "$log" && break
        sleep 0.1
    done
    local port
    port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\) .*|\1|p' "$log" | head -1)
    [ -n "$port" ] || { cat "$log" >&2; exit 1; }
    eval "port_$name=$port"
}
start serve serve "$W/m" --parallel "$CONC" --queue 1024
start route route --upstream "http://127.0.0.1:$port_serve/v1" --max "$CONC" --queue 1024
serve_port=$port_serve route_port=$port_route
echo "serve on $serve_port (--parallel $CONC), route on $route_port (--max $CONC); load $(cut -d' ' -f1 /proc/loadavg)" >&2

/usr/bin/python3 - "$serve_port" "$route_port" "$N" "$CONC" "$ROUNDS" "$TOK" <<'PY'
import http.client, json, sys, threading, time
serve, route, n, conc, rounds, tok = map(int, sys.argv[1:])
body = json.dumps({"prompt": "Once upon a time", "max_tokens": tok, "temperature": 0,
                   "ignore_eos": True})

def run(port):
    """n requests at concurrency conc, each client on its own keep-alive connection."""
    lat, lock, left = [], threading.Lock(), [n]
    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
            t0 = time.monotonic()
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            assert r.status == 200, (r.status, data[:200])
            with lock:
                lat.append(time.monotonic() - t0)
        c.close()
    t0 = time.monotonic()
    ts = [threading.Thread(target=client) for _ in range(conc)]
    for t in ts: t.start()
    for t in ts: t.join()
    wall = time.monotonic() - t0
    lat.sort()
    return n / wall, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3

run(serve); run(route)  # warm-up
res = {"direct": [], "routed": []}
for _ in range(rounds):
    res["direct"].append(run(serve))
    res["routed"].append(run(route))
print("| path | requests/s | p50 ms | p99 ms |")
print("| --- | ---: | ---: | ---: |")
med = lambda xs: sorted(xs)[len(xs) // 2]
for k in ("direct", "routed"):
    rows = res[k]
    print("| %s | %.1f | %.2f | %.2f |" % (k, med([r[0] for r in rows]), med([r[1] for r in rows]),
                                          med([r[2] for r in rows])))
d, r = res["direct"], res["routed"]
print("\nrouted / direct, per round (requests/s): " +
      ", ".join("%.2fx" % (b[0] / a[0]) for a, b in zip(d, r)))
print("(%d requests of %d tokens at concurrency %d per run; medians of %d rounds)" %
      (n, tok, conc, rounds))
PY

#!/usr/bin/env bash
# Prefix cache: time to first token of a cold request with a long prompt, then of a follow-up that
# shares the same prefix (a system prompt / document) with a different question at the end.
# usage: tools/bench_prefix_cache.sh MODEL_DIR [PRECISION] [PREFIX_WORDS]
set -euo pipefail
M=$1; P=${2:-int4}; WORDS=${3:-1800}
C=${CASCADIA:-build/cascadia}
port=18931
"$C" serve "$M" --precision "$P" --port $port --chat-template chatml --ctx 4096 --prefix-cache 4 \
    2>/tmp/prefix-serve.log &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.5; done
/usr/bin/python3 - "$port" "$WORDS" <<'PY'
import json, sys, time, urllib.request, random
port, words = int(sys.argv[1]), int(sys.argv[2])
random.seed(7)
vocab = "the fleet serves a model cut into stages each worker holds its layers and the coordinator".split()
doc = " ".join(random.choice(vocab) for _ in range(words))
def ttft(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.monotonic(); first = None; usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            ev = json.loads(line[6:])
            if ev.get("choices") and first is None: first = time.monotonic() - t0
            if ev.get("usage"): usage = ev["usage"]
    return first, usage["prompt_tokens"]
cold, n = ttft(doc + " question one")
warm, _ = ttft(doc + " question two is different")
print(f"| prompt tokens | cold TTFT | follow-up TTFT (same prefix) | speed-up |")
print(f"|---|---|---|---|")
print(f"| {n} | {cold*1000:.0f} ms | {warm*1000:.0f} ms | {cold/warm:.1f}x |")
PY
curl -s "http://127.0.0.1:$port/metrics" | grep -E "^cascadia_prefix_cache_(hits|tokens)_total"

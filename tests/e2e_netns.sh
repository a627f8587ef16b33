#!/usr/bin/env bash
# A 2-stage generation across three hosts built with Linux network namespaces and veth pairs on a
# bridge, with 3 ms of delay each way (6 ms round trip: the seeds' WiFi). netem adds the delay where
# the kernel has sch_netem; otherwise tools/delay_relay.py does, in each worker's namespace. The
# output must equal the single-process output. Needs root and iproute2; skips (saying why) otherwise.
source "$(dirname "$0")/e2e_lib.sh"
[ "$(id -u)" -eq 0 ] || skip "not root: cannot create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
TAG="csd$$"
NS_C="$TAG-c"; NS_A="$TAG-a"; NS_B="$TAG-b"; BR="$TAG-br"
ip netns add "$NS_C" 2>/dev/null || skip "cannot create network namespaces here"
cleanup() {
    for ns in "$NS_C" "$NS_A" "$NS_B"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.2
    for ns in "$NS_C" "$NS_A" "$NS_B" "$TAG-sw"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$NS_A"; ip netns add "$NS_B"; ip netns add "$TAG-sw"
ip -n "$TAG-sw" link add "$BR" type bridge; ip -n "$TAG-sw" link set "$BR" up
i=1
for ns in "$NS_C" "$NS_A" "$NS_B"; do
    ip link add "v$TAG$i" type veth peer name "p$TAG$i"
    ip link set "v$TAG$i" netns "$ns"; ip link set "p$TAG$i" netns "$TAG-sw"
    ip -n "$TAG-sw" link set "p$TAG$i" master "$BR"; ip -n "$TAG-sw" link set "p$TAG$i" up
    ip -n "$ns" addr add "10.199.77.$i/24" dev "v$TAG$i"   # private to these namespaces
    ip -n "$ns" link set "v$TAG$i" up; ip -n "$ns" link set lo up
    i=$((i + 1))
done
IP_A=$(ip -n "$NS_A" -4 -o addr show | awk '/10\.199/ {print $4}' | cut -d/ -f1)
IP_B=$(ip -n "$NS_B" -4 -o addr show | awk '/10\.199/ {print $4}' | cut -d/ -f1)

M="$WORK/m"; X="$WORK/x"
"$CASCADIA" synth --arch llama --preset tiny --out "$M" --seed 5 2>/dev/null
"$CASCADIA" export "$M" --stages 2 --precision int8 --out "$X" >/dev/null 2>&1

delay_mode=netem
for ns in "$NS_A" "$NS_B" "$NS_C"; do
    dev=$(ip -n "$ns" -o link show | awk -F': ' '/v'"$TAG"'/ {print $2}' | cut -d@ -f1)
    ip netns exec "$ns" tc qdisc add dev "$dev" root netem delay 3ms 2>/dev/null || { delay_mode=relay; break; }
done
start() { # ns shard port: a worker listening on 127.0.0.1:port+1000, reached at ns_ip:port
    local ns=$1 shard=$2 port=$3 ip=$4
    if [ "$delay_mode" = netem ]; then
        ip netns exec "$ns" "$CASCADIA" worker --shard "$shard" --listen "$ip:$port" --insecure --threads 1 >"$WORK/$ns.log" 2>&1 &
    else
        ip netns exec "$ns" "$CASCADIA" worker --shard "$shard" --listen "127.0.0.1:$((port + 1000))" --insecure --threads 1 >"$WORK/$ns.log" 2>&1 &
        ip netns exec "$ns" /usr/bin/python3 "$CSD_SOURCE_DIR/tools/delay_relay.py" "$ip:$port" "127.0.0.1:$((port + 1000))" 3 >"$WORK/$ns.relay" 2>&1 &
    fi
}
ready() { # ns: its worker listens (and, in relay mode, its relay too)
    grep -qs "listening on" "$WORK/$1.log" &&
        { [ "$delay_mode" = netem ] || grep -qs "relay ready" "$WORK/$1.relay"; }
}
start "$NS_A" "$X/stage-0.shard" 7600 "$IP_A"
start "$NS_B" "$X/stage-1.shard" 7600 "$IP_B"
for ns in "$NS_A" "$NS_B"; do
    wait_for 30 ready "$ns" || { cat "$WORK/$ns".*; fail "the worker in $ns did not start"; }
done
echo "delay: $delay_mode (3 ms each way)"
rtt=$(ip netns exec "$NS_C" /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('$IP_A', 7600)); t = time.monotonic(); s.send(b'x' * 20)
s.settimeout(2)
try: s.recv(1)
except Exception: pass
print('%.1f' % ((time.monotonic() - t) * 1000))" 2>/dev/null || echo "?")
echo "a probe to stage 0 saw its handshake close after ${rtt} ms (>= one round trip)"

single=$("$CASCADIA" run "$M" --precision int8 -p "Once upon a time" -n 16 --temp 0 --print-ids --threads 1 2>/dev/null | xargs)
got=$(ip netns exec "$NS_C" "$CASCADIA" run --fleet "$IP_A:7600,$IP_B:7600" --manifest "$X" --insecure --hidden-dtype f32 \
      -p "Once upon a time" -n 16 --temp 0 --print-ids --threads 1 2>"$WORK/run.err" | xargs) || { cat "$WORK/run.err" "$WORK"/*.log; fail "fleet run across namespaces"; }
grep -a "generation" "$WORK/run.err" || true
[ "$got" = "$single" ] || fail "across namespaces: got '$got' want '$single'"
echo "ok: 2-stage generation across 3 hosts with 6 ms RTT equals the single process"
echo "1 passed, 0 failed"

#!/usr/bin/env bash
# The fleet breakdown across a 6 ms round trip: two workers in their own network namespaces (on a
# bridge), 3 ms each way (netem, or tools/delay_relay.py where the kernel has no sch_netem), and
# `cascadia bench --fleet` in a third namespace. Root only.
# usage: tools/bench_netns.sh EXPORT_DIR [N_TOKENS] [WORKER_THREADS]
#        BENCH_ARGS="--concurrency 1 --spec-draft 4" adds flags to the bench (speculative decoding
#        across the round trip, with and without, side by side)
set -euo pipefail
X=$1; N=${2:-64}; WT=${3:-2}
C=${CASCADIA:-$(cd "$(dirname "$0")/.." && pwd)/build/cascadia}
RELAY="$(cd "$(dirname "$0")" && pwd)/delay_relay.py"
T=csdb$$
cleanup() {
    for ns in $T-c $T-a $T-b; do ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.3; for ns in $T-c $T-a $T-b $T-sw; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
for ns in $T-c $T-a $T-b $T-sw; do ip netns add "$ns"; done
ip -n $T-sw link add name csdbr type bridge; ip -n $T-sw link set csdbr up
i=1
for ns in $T-c $T-a $T-b; do
    ip link add v$T$i type veth peer name p$T$i
    ip link set v$T$i netns $ns; ip link set p$T$i netns $T-sw
    ip -n $T-sw link set p$T$i master csdbr; ip -n $T-sw link set p$T$i up
    ip -n $ns addr add 10.199.78.$i/24 dev v$T$i; ip -n $ns link set v$T$i up; ip -n $ns link set lo up
    i=$((i + 1))
done
mode=netem
for k in 1 2 3; do
    ns=$([ $k = 1 ] && echo $T-c || ([ $k = 2 ] && echo $T-a || echo $T-b))
    ip netns exec $ns tc qdisc add dev v$T$k root netem delay 3ms 2>/dev/null || { mode=relay; break; }
done
start() { # ns shard ip
    if [ $mode = netem ]; then
        ip netns exec $1 "$C" worker --shard "$2" --listen "$3:7600" --insecure --threads $WT 2>/dev/null &
    else
        ip netns exec $1 "$C" worker --shard "$2" --listen 127.0.0.1:8600 --insecure --threads $WT 2>/dev/null &
        ip netns exec $1 /usr/bin/python3 "$RELAY" "$3:7600" 127.0.0.1:8600 3 >/dev/null 2>&1 &
    fi
}
start $T-a "$X/stage-0.shard" 10.199.78.2
start $T-b "$X/stage-1.shard" 10.199.78.3
sleep 4
echo "delay: $mode, 3 ms each way (6 ms round trip)"
ip netns exec $T-c "$C" bench --fleet 10.199.78.2:7600,10.199.78.3:7600 --manifest "$X" --insecure -n "$N" -t 2 \
    ${BENCH_ARGS:-}

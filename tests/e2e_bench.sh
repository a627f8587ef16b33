#!/usr/bin/env bash
# `cascadia bench` on a synthesized tiny model: the table and --json carry pp/tg speeds and the
# roofline; -d (depth) fills the cache first, labels the tests "@ dN" and counts the KV cache the
# attention reads into the roofline; the stream ceiling (model/weight_stream.h) comes beside it;
# bad combinations are refused with exit 2.
source "$(dirname "$0")/e2e_lib.sh"
M="$WORK/tiny"
"$CASCADIA" synth --arch llama --preset tiny --out "$M" >/dev/null 2>&1 || fail "synth"
run_json() { "$CASCADIA" bench "$M" -p 16 -n 8 -r 1 --membw-mib 64 --json "$@" 2>"$WORK/err"; }
run_json > "$WORK/d0.json" || fail "bench --json: $(cat "$WORK/err")"
run_json -d 40 > "$WORK/d40.json" || fail "bench -d 40 --json: $(cat "$WORK/err")"
/usr/bin/python3 - "$WORK/d0.json" "$WORK/d40.json" <<'PY' || fail "bench JSON"
import json, sys
d0, d40 = (json.load(open(p)) for p in sys.argv[1:3])
for r in (d0, d40):
    for f in ("pp_tps", "tg_tps", "roofline_fraction", "membw_gbs", "weight_bytes", "kv_bytes",
              "paired_membw_gbs", "paired_tg_tps", "paired_roofline_fraction",
              "read_ceiling_fraction",
              "ceiling_tps", "ceiling_fraction", "ceiling_tg_tps", "ceiling_tg_fraction"):
        assert r[f] > 0, (f, r)
    assert r["n_prompt"] == 16 and r["n_gen"] == 8, r
assert d0["depth"] == 0 and d40["depth"] == 40, (d0, d40)
# tg reads the cache at its mean context: depth + (n + 1) / 2 positions of equal size (4.5 at n 8)
per_pos0, per_pos40 = d0["kv_bytes"] / 4.5, d40["kv_bytes"] / 44.5
assert per_pos0 == per_pos40 and per_pos0 == int(per_pos0), (d0["kv_bytes"], d40["kv_bytes"])
assert d0["weight_bytes"] == d40["weight_bytes"]
roof = d40["membw_gbs"] * 1e9 / (d40["weight_bytes"] + d40["kv_bytes"])
assert abs(d40["roofline_tps"] - roof) < 1e-3 * roof, (d40["roofline_tps"], roof)
# the paired roofline: the tokens' rate against reads of the same bytes in the same seconds
paired = d40["paired_tg_tps"] * (d40["weight_bytes"] + d40["kv_bytes"]) / (d40["paired_membw_gbs"] * 1e9)
assert abs(d40["paired_roofline_fraction"] - paired) < 1e-3 * paired, (d40, paired)
# the read ceiling: those reads against the peak, what a step that did nothing but read would reach
rc = d40["paired_membw_gbs"] / d40["membw_gbs"]
assert abs(d40["read_ceiling_fraction"] - rc) < 1e-3 * rc, (d40, rc)
# the stream ceiling: its passes against the peak roofline, and the tokens alternated with them
for r in (d0, d40):
    c = r["ceiling_tps"] / r["roofline_tps"]
    assert abs(r["ceiling_fraction"] - c) < 1e-3 * c, (r, c)
    t = r["ceiling_tg_tps"] / r["ceiling_tps"]
    assert abs(r["ceiling_tg_fraction"] - t) < 1e-3 * t, (r, t)
# the peak: the read test's best pass; on a tiny model the other passes (under --peak-min-mib,
# default 256 MiB) run from cache and may not raise it
for r in (d0, d40):
    assert r["membw_source"] == "read test" and r["membw_gbs"] == r["membw_test_gbs"], r
# beside it, the median pass of the way that read best: one of that way's passes is the best one
for r in (d0, d40):
    assert 0 < r["membw_test_median_gbs"] <= r["membw_test_gbs"], r
PY
# with --peak-min-mib 0 every rate the run sustained counts: the peak is the highest of them, it
# names where it came from, and no rate of the run is above it
run_json --peak-min-mib 0 > "$WORK/any.json" || fail "bench --peak-min-mib 0: $(cat "$WORK/err")"
/usr/bin/python3 - "$WORK/any.json" <<'PY' || fail "peak over every rate: $(cat "$WORK/any.json")"
import json, sys
r = json.load(open(sys.argv[1]))
read = r["weight_bytes"] + r["kv_bytes"]
tokens = max(r["tg_tps"], r["paired_tg_tps"], r["ceiling_tg_tps"]) * read / 1e9
rates = {"read test": r["membw_test_gbs"], "paired reads": r["paired_membw_gbs"],
         "weight stream": r["stream_gbs"], "tokens": tokens}
assert all(v > 0 for v in rates.values()), rates
assert abs(r["membw_gbs"] - max(rates.values())) <= 1e-6 * r["membw_gbs"], (r["membw_gbs"], rates)
assert abs(rates[r["membw_source"]] - r["membw_gbs"]) <= 1e-6 * r["membw_gbs"], (r, rates)
assert r["roofline_fraction"] <= 1 + 1e-9 and r["paired_membw_gbs"] <= r["membw_gbs"], r
PY
# every result says which binary and CPU made it: the JSON's fields, the table's last line
"$CASCADIA" version --json > "$WORK/version.json" || fail "version --json"
/usr/bin/python3 - "$WORK/d0.json" "$WORK/version.json" <<'PY' || fail "bench --json build fields"
import json, sys
r, v = (json.load(open(p)) for p in sys.argv[1:3])
assert r["version"] == v["version"] and r["build_commit"] == v["commit"], (r, v)
assert r["cpu"], r
PY
"$CASCADIA" bench "$M" -p 16 -n 8 -r 1 --membw-mib 64 -d 40 > "$WORK/table" 2>/dev/null || fail "bench -d 40"
tail -1 "$WORK/table" | grep -q "^build: cascadia [0-9.]* (commit [0-9a-z-]*), .*; CPU: ." ||
    fail "no build line under the table: $(tail -1 "$WORK/table")"
grep -q "| pp16 @ d40 |" "$WORK/table" || fail "no pp16 @ d40 row: $(cat "$WORK/table")"
grep -q "| tg8 @ d40 |" "$WORK/table" || fail "no tg8 @ d40 row: $(cat "$WORK/table")"
grep -q "MiB KV cache read per token" "$WORK/table" || fail "roofline line without the KV cache"
# the read test runs 5 passes of each way before the tests and 3 after them
grep -q "the best of 8 passes, whose median is [0-9.]* GB/s" "$WORK/table" ||
    fail "the roofline line does not give the read test's median pass: $(grep roofline "$WORK/table")"
grep -q "^paired: .* GB/s read (.*% of the peak: .*), .* t/s generated in the same seconds" "$WORK/table" ||
    fail "no paired roofline line"
grep -q "^ceiling:  the weight stream alone .* t/s = .*% of the roofline" "$WORK/table" || fail "no ceiling line"
set +e
"$CASCADIA" bench "$M" -d 4 --concurrency 1,2 >/dev/null 2>"$WORK/err"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--depth applies" "$WORK/err" || fail "-d with --concurrency: rc $rc, $(cat "$WORK/err")"
# bad values are usage errors (exit 2) naming the flag, before the model is loaded
for args in "-r 0" "-r 1001" "--concurrency 1,," "--concurrency 0" "-p -1" "--bogus 1" \
    "--spec-draft 17" "--spec-draft 2"; do
    flag=${args%% *}
    # shellcheck disable=SC2086 # args is a list of words
    rc=0; "$CASCADIA" bench "$M" $args >/dev/null 2>"$WORK/err" || rc=$?
    [ $rc -eq 2 ] && grep -q -- "$flag" "$WORK/err" || fail "bench $args: rc $rc, $(cat "$WORK/err")"
done
# past the trained context (512 positions in the tiny preset): measured, with a warning
trained=$(/usr/bin/python3 -c "import json;print(json.load(open('$M/config.json'))['max_position_embeddings'])")
"$CASCADIA" bench "$M" -p 4 -n 4 -r 1 --membw-mib 0 -d "$trained" >/dev/null 2>"$WORK/err" \
    || fail "-d past the context failed: $(cat "$WORK/err")"
grep -q "past the model's trained context of $trained" "$WORK/err" || fail "no warning: $(cat "$WORK/err")"
# --json stays valid JSON whatever the directory is called
odd="$WORK/we\"ird\\name"
cp -r "$M" "$odd"
"$CASCADIA" bench "$odd" -p 4 -n 2 -r 1 --membw-mib 0 --json > "$WORK/odd.json" 2>"$WORK/err" ||
    fail "bench on $odd: $(cat "$WORK/err")"
/usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["model"] == sys.argv[2], d' \
    "$WORK/odd.json" "$(basename "$odd")" || fail "bench --json for $odd: $(cat "$WORK/odd.json")"
# --concurrency --json: one object per level, the first the baseline of the speedups
"$CASCADIA" bench "$M" --concurrency 1,2 -n 4 --json > "$WORK/levels.json" 2>"$WORK/err" ||
    fail "bench --concurrency --json: $(cat "$WORK/err")"
/usr/bin/python3 - "$WORK/levels.json" <<'PY' || fail "bench --concurrency --json: $(cat "$WORK/levels.json")"
import json, sys
levels = json.load(open(sys.argv[1]))
assert [l["concurrency"] for l in levels] == [1, 2], levels
assert levels[0]["speedup_vs_1"] == 1 and all(l["aggregate_tps"] > 0 for l in levels), levels
assert abs(levels[1]["speedup_vs_1"] - levels[1]["aggregate_tps"] / levels[0]["aggregate_tps"]) < 1e-6
assert all(l["per_stream_tps"] > 0 and l["ttft_s"] > 0 and l["step_ms"] > 0 for l in levels), levels
assert all(l["build_commit"] and l["version"] and l["cpu"] for l in levels), levels
PY
# a --ctx that cannot hold the streams is refused (they used to end early, reported as -n)
rc=0; "$CASCADIA" bench "$M" --concurrency 1 -n 64 --ctx 32 -r 1 >/dev/null 2>"$WORK/err" || rc=$?
[ $rc -eq 1 ] && grep -q "cannot hold 16 prompt and 64 generated tokens" "$WORK/err" ||
    fail "bench --concurrency with a small --ctx: rc $rc, $(cat "$WORK/err")"
# --spec-draft: each level without and with speculation, side by side
"$CASCADIA" bench "$M" --concurrency 1,2 -n 8 --spec-draft 2 --json > "$WORK/spec.json" 2>"$WORK/err" ||
    fail "bench --spec-draft: $(cat "$WORK/err")"
/usr/bin/python3 - "$WORK/spec.json" <<'PY' || fail "bench --spec-draft --json: $(cat "$WORK/spec.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
assert [(r["concurrency"], r["spec_draft"]) for r in rows] == [(1, 0), (1, 2), (2, 0), (2, 2)], rows
assert all(r["aggregate_tps"] > 0 and 0 <= r["accepted_tokens"] <= r["draft_tokens"] for r in rows)
assert rows[0]["draft_tokens"] == 0 and rows[2]["draft_tokens"] == 0, rows
for plain, spec in ((rows[0], rows[1]), (rows[2], rows[3])):  # each against its own level's
    assert plain["speedup_vs_no_draft"] == 1, plain
    want = spec["aggregate_tps"] / plain["aggregate_tps"]
    assert abs(spec["speedup_vs_no_draft"] - want) < 1e-6 * want, (spec, want)
PY
echo "9 passed, 0 failed"

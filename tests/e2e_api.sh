#!/usr/bin/env bash
# `cascadia serve` end to end: the docs/api.md example as written, then the official OpenAI Node
# client (tools/ref/api_test.mjs) over every endpoint, error, a disconnect and a 200-request load
# test; /metrics through promtool; a real chat template (Qwen3) when ../shared has it; clean SIGTERM.
source "$(dirname "$0")/e2e_lib.sh"

command -v node >/dev/null || skip "node is not installed"
command -v curl >/dev/null || skip "curl is not installed"
REF="$CSD_SOURCE_DIR/tools/ref"
[ -d "$REF/node_modules/openai" ] || skip "the openai npm client is not in tools/ref/node_modules (npm ci there)"
"$CASCADIA" serve --help >/dev/null 2>&1 || skip "this cascadia binary has no 'serve' command"

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# start_server NAME ARGS...: starts `cascadia serve ARGS --port 0`, waits until ready, sets PORT_<NAME>.
start_server() {
    local name=$1
    shift
    local log="$WORK/$name.log"
    : >"$log" # emptied before the start: a look must never see an earlier server's lines
    "$CASCADIA" serve "$@" --port 0 2>"$log" &
    local pid=$!
    PIDS+=("$pid")
    eval "PID_$name=$pid"
    wait_for 30 logged_or_gone "$log" "cascadia serve: ready" "$pid" || true
    if ! grep -q "cascadia serve: ready" "$log"; then
        cat "$log"
        gone "$pid" && fail "server $name exited at start-up"
        fail "server $name not ready after 30 s"
    fi
    local port
    port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\) .*|\1|p' "$log" | head -1)
    eval "PORT_$name=$port"
}

cd "$WORK"
# --- the docs/api.md session, as written (plus --port 0) ---
"$CASCADIA" synth --arch llama --preset tiny --out tiny >/dev/null 2>&1 || fail "synth"
# A model without a chat template (a base model) is served for completions; chat says what to do.
start_server notmpl tiny
grep -q -- "--chat-template" "$WORK/notmpl.log" || fail "no warning for a missing chat template: $(cat "$WORK/notmpl.log")"
code=$(curl -s -o "$WORK/notmpl.out" -w '%{http_code}' "http://127.0.0.1:$PORT_notmpl/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt": "Once upon a time", "max_tokens": 4}')
[ "$code" = 200 ] && grep -q '"text_completion"' "$WORK/notmpl.out" ||
    fail "completions without a chat template: HTTP $code $(cat "$WORK/notmpl.out")"
code=$(curl -s -o "$WORK/notmpl.out" -w '%{http_code}' "http://127.0.0.1:$PORT_notmpl/v1/chat/completions" \
    -H 'Content-Type: application/json' -d '{"messages": [{"role": "user", "content": "hi"}]}')
[ "$code" = 400 ] && grep -q "no chat template" "$WORK/notmpl.out" && grep -q -- "--chat-template" "$WORK/notmpl.out" ||
    fail "chat without a chat template: HTTP $code $(cat "$WORK/notmpl.out")"
kill "$PID_notmpl"
wait "$PID_notmpl" 2>/dev/null || true
echo "ok   a model without a chat template: completions served, chat refused with 400"
# The tool-call format follows the chat template: Llama 3.1's (bare JSON calls) or Hermes tags.
cp -r tiny tiny31
/usr/bin/python3 - tiny31/tokenizer_config.json <<'PY' || fail "a Llama 3.1-style template"
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["chat_template"] = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
                      "{% if tools %}Given the following functions, please respond with a JSON for "
                      "a function call with its proper arguments.{% endif %}{{ '<|python_tag|>' if "
                      "builtin_tools is defined }}assistant: ")
json.dump(c, open(p, "w"))
PY
for want in "llama3-json:" "hermes:--tool-call-format hermes" "mistral:--tool-call-format mistral"; do
    start_server fmt tiny31 ${want#*:}
    grep -q "tool-calls=${want%%:*} " "$WORK/fmt.log" || fail "tool-calls=${want%%:*} not chosen: $(cat "$WORK/fmt.log")"
    kill "$PID_fmt"
    wait "$PID_fmt" 2>/dev/null || true
done
"$CASCADIA" serve tiny31 --tool-call-format xml --port 0 2>"$WORK/fmt.err" && fail "--tool-call-format xml accepted"
grep -q "not auto, hermes, llama3-json or mistral" "$WORK/fmt.err" || fail "--tool-call-format xml: $(cat "$WORK/fmt.err")"
echo "ok   --tool-call-format: llama3-json from a Llama 3.1-style template, hermes and mistral when asked, a bad value refused"
export CASCADIA_API_KEY=secret
start_server main tiny --chat-template chatml
BASE="http://127.0.0.1:$PORT_main"
grep -q "tool-calls=hermes " "$WORK/main.log" || fail "chatml: tool-calls=hermes not chosen: $(cat "$WORK/main.log")"
if timeout 20 "$CASCADIA" serve tiny --chat-template chatml --port "$PORT_main" 2>"$WORK/dup.log"; then
    fail "a second server started on a port already in use"
fi
grep -q "cannot listen" "$WORK/dup.log" || fail "no clear error for a port in use: $(cat "$WORK/dup.log")"

doc_curl=$(sed -n '/^curl -s http:\/\/127.0.0.1:8080\/v1\/chat\/completions/p' "$CSD_SOURCE_DIR/docs/api.md")
[ -n "$doc_curl" ] || fail "no curl example in docs/api.md"
doc_out=$(bash -c "${doc_curl//127.0.0.1:8080/127.0.0.1:$PORT_main}")
doc_out2=$(bash -c "${doc_curl//127.0.0.1:8080/127.0.0.1:$PORT_main}")
echo "$doc_out" | /usr/bin/python3 -c '
import json, re, sys
r = json.load(sys.stdin)
assert r["object"] == "chat.completion" and re.fullmatch("chatcmpl-[0-9a-f]{24}", r["id"]), r
assert json.loads(sys.argv[1])["id"] != r["id"], "two responses share an id"
assert r["choices"][0]["message"]["role"] == "assistant", r
assert r["usage"]["completion_tokens"] == 16 or r["choices"][0]["finish_reason"] == "stop", r
' "$doc_out2" || fail "the docs/api.md curl example did not work: $doc_out"
echo "ok   docs/api.md curl example"
tok_curl=$(sed -n '/^curl -s http:\/\/127.0.0.1:8080\/tokenize/p' "$CSD_SOURCE_DIR/docs/api.md")
[ -n "$tok_curl" ] || fail "no /tokenize curl example in docs/api.md"
tok_out=$(bash -c "${tok_curl//127.0.0.1:8080/127.0.0.1:$PORT_main}")
echo "$tok_out" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["count"] == len(r["tokens"]) > 0 and all(isinstance(t, int) for t in r["tokens"]), r
' || fail "the docs/api.md /tokenize example did not work: $tok_out"
echo "ok   docs/api.md /tokenize example"

# --- a second server with two slots and no queue, for 429 and disconnects: the same weights with an
# 8192-token context, so that a request with ignore_eos runs for seconds, not milliseconds ---
cp -r tiny tinylong
/usr/bin/python3 - tinylong/config.json <<'PY' || fail "could not lengthen the context"
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 8192
json.dump(c, open(sys.argv[1], "w"))
PY
start_server busy tinylong --model-name tiny --chat-template chatml --parallel 2 --queue 0 --ctx 8192

# --- connection flags: bad values refused at start; an idle connection closed after
# --idle-timeout, while responses that wait for their tokens longer than that are not cut ---
while IFS='|' read -r bad want; do
    # shellcheck disable=SC2086 # the flags are meant to split
    "$CASCADIA" serve tiny $bad --port 0 2>"$WORK/bad.err" && fail "serve accepted $bad"
    rc=$?
    [ "$rc" = 2 ] && grep -qF -- "$want" "$WORK/bad.err" ||
        fail "serve $bad: exit $rc, $(cat "$WORK/bad.err")"
done <<'CASES'
--max-connections 0|--max-connections expects an integer in [1, 4096], got '0'
--max-connections 5000|--max-connections expects an integer in [1, 4096], got '5000'
--idle-timeout 0|--idle-timeout expects an integer in [1, 86400], got '0'
--max-connections 4 --max-connections-per-ip 5|--max-connections-per-ip 5 is above --max-connections 4
CASES
# The address limit gets its own server with the default idle timeout (60 s): with a 1 s timeout,
# a slow moment on a loaded machine let the held connections time out before the fifth arrived.
start_server perip tiny --max-connections 8 --max-connections-per-ip 4
/usr/bin/python3 - "$PORT_perip" <<'PY' || fail "--max-connections-per-ip (above)"
import http.client, socket, sys, time
port = int(sys.argv[1])
# four connections from this address are allowed (--max-connections-per-ip 4): a fifth is closed
held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
for c in held:
    c.sendall(b"GET /health HTTP/1.1\r\n")
time.sleep(0.3)  # the server takes them all in
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
try:
    c.request("GET", "/health")
    st = c.getresponse().status
    raise AssertionError("a fifth connection was answered: %d" % st)
except (ConnectionError, http.client.HTTPException):
    pass
# the held ones were open all along: each still gets its answer once its request ends
for h in held:
    h.sendall(b"\r\n")
    assert h.recv(100).startswith(b"HTTP/1.1 200"), "a held connection was dropped"
    h.close()
# once the server notices they are gone (a busy machine may take a while), a new one is served
deadline, st = time.monotonic() + 10, None
while st != 200 and time.monotonic() < deadline:
    time.sleep(0.1)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", "/health")
        st = c.getresponse().status
    except (ConnectionError, http.client.HTTPException):
        pass
assert st == 200, "no connection served 10 s after the held ones closed: %s" % st
print("ok   --max-connections-per-ip: a fifth connection from one address refused, the four served")
PY
kill "$PID_perip"
wait "$PID_perip" 2>/dev/null || true
start_server idle tinylong --model-name tiny --parallel 1 --ctx 8192 --idle-timeout 1
/usr/bin/python3 - "$PORT_idle" <<'PY' || fail "--idle-timeout (above)"
import http.client, json, socket, sys, threading, time
port = int(sys.argv[1])
def post(body, stream_first_line=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps(body),
              {"Content-Type": "application/json", "Authorization": "Bearer secret"})
    r = c.getresponse()
    if stream_first_line is not None:
        stream_first_line.append(r.readline())
        stream_first_line.append(time.monotonic())
    return r.status, r.read()
# an idle connection is closed after about a second (the default would be 60)
t0 = time.monotonic()
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(b"GET /health HTTP/1.1\r\n")
assert s.recv(100) == b"", "an idle connection got an answer"
idle_s = time.monotonic() - t0
assert 0.5 <= idle_s <= 30, idle_s
def metric(name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics", headers={"Authorization": "Bearer secret"})
    for line in c.getresponse().read().decode().split("\n"):
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no %s in /metrics" % name)
def until(cond, what):
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
# The first request holds the one slot (its stream has begun); two more queue behind it for longer
# than the idle timeout, then the first goes away and they run. Made so, not timed: nothing here
# depends on this build's speed.
fc = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
fc.request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 8000,
           "ignore_eos": True, "stream": True}),
           {"Content-Type": "application/json", "Authorization": "Bearer secret"})
fr = fc.getresponse()
until(lambda: metric("cascadia_active_requests") == 1, "the first request did not start")
n = 50
base = {"prompt": "Once", "max_tokens": n, "ignore_eos": True}
out, first = {}, []
def run(name, body, first_line=None):
    out[name] = post(body, first_line)
threads = [threading.Thread(target=run, args=("stream", dict(base, stream=True, stream_options={
               "include_usage": True}), first)),
           threading.Thread(target=run, args=("plain", base))]
for t in threads: t.start()
until(lambda: metric("cascadia_queue_depth") == 2, "the two requests did not queue")
time.sleep(2.5)  # queued for more than twice the idle timeout
assert metric("cascadia_queue_depth") == 2, "a queued request was dropped while it waited"
waited = 2.5
fc.close()  # the first request's client goes away: it is cancelled and the queue runs
for t in threads: t.join()
st, body = out["plain"]
assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == n, (st, body[-200:])
st, body = out["stream"]
events = [l for l in (first[0] + body).decode().split("\n") if l.startswith("data: ")]
assert st == 200 and len(events) >= 3 and events[-1] == "data: [DONE]", \
    ("the queued stream was cut off", st, len(body), events[-3:])
usage = json.loads(events[-2][6:])["usage"]  # the last chunk before [DONE] carries the usage
assert usage["completion_tokens"] == n, (usage, n)
assert json.loads(events[-3][6:])["choices"][0]["finish_reason"] == "length", events[-3]
print("ok   --idle-timeout: idle closed after %.1f s, %d-token answers after %.1f s queued"
      % (idle_s, n, waited))
PY
kill "$PID_idle"
wait "$PID_idle" 2>/dev/null || true

# --- greedy reference from `cascadia run` ---
RUN_PROMPT="Once upon a time"
RUN_N=24
"$CASCADIA" run tiny -p "$RUN_PROMPT" -n "$RUN_N" --temp 0 >"$WORK/run.txt" 2>/dev/null || fail "cascadia run"
CTX=$(curl -s -H "Authorization: Bearer secret" "$BASE/v1/models" |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])')

# --- the OpenAI client suite ---
FINGERPRINT=$("$CASCADIA" version --json | /usr/bin/python3 -c '
import json, sys
v = json.load(sys.stdin)
print("cascadia-%s-%s" % (v["version"], v["commit"]))')
CSD_BASE="$BASE" CSD_KEY=secret CSD_MODEL=tiny CSD_CTX="$CTX" CSD_RUN_PROMPT="$RUN_PROMPT" \
    CSD_RUN_FILE="$WORK/run.txt" CSD_RUN_N="$RUN_N" CSD_BUSY_BASE="http://127.0.0.1:$PORT_busy" \
    CSD_FINGERPRINT="$FINGERPRINT" \
    CSD_LOAD_N="${CSD_LOAD_N:-200}" CSD_LOAD_CONC="${CSD_LOAD_CONC:-16}" \
    node "$REF/api_test.mjs" || { tail -40 "$WORK/main.log"; fail "api_test.mjs failed (server log above)"; }

# --- /metrics is valid Prometheus text ---
curl -s "$BASE/metrics" >"$WORK/metrics.txt"
grep -q '^cascadia_active_requests 0$' "$WORK/metrics.txt" || fail "active requests not back to 0"
build_info=$(echo "$FINGERPRINT" | sed 's/^cascadia-\([^-]*\)-\(.*\)$/cascadia_build_info{version="\1",commit="\2"} 1/')
grep -qxF "$build_info" "$WORK/metrics.txt" ||
    fail "no '$build_info' in /metrics: $(grep build_info "$WORK/metrics.txt")"
if command -v promtool >/dev/null; then
    promtool check metrics <"$WORK/metrics.txt" || fail "promtool check metrics"
    echo "ok   promtool check metrics"
else
    echo "note: promtool not installed, /metrics format not linted"
fi

# --- a real chat template: Qwen3's, with its end-of-turn token ---
if [ -e "$CSD_SHARED_DIR/tokenizers/qwen3/tokenizer_config.json" ]; then
    "$CASCADIA" synth --arch qwen3 --preset tiny --tokenizer "$CSD_SHARED_DIR/tokenizers/qwen3" \
        --out qwen3tiny >/dev/null 2>&1 || fail "synth qwen3"
    start_server qwen qwen3tiny
    MSGS='[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]'
    (cd "$REF" && node chat_prompt_ref.mjs "$WORK/qwen3tiny" "$MSGS") >"$WORK/ref_prompt.json" || fail "chat_prompt_ref.mjs"
    ref_ids=$(/usr/bin/python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ids"]))' "$WORK/ref_prompt.json")
    QB="http://127.0.0.1:$PORT_qwen/v1"
    chat=$(curl -s -H "Authorization: Bearer secret" "$QB/chat/completions" \
        -d "{\"model\":\"qwen3tiny\",\"messages\":$MSGS,\"max_tokens\":8,\"temperature\":0}")
    comp=$(curl -s -H "Authorization: Bearer secret" "$QB/completions" \
        -d "{\"model\":\"qwen3tiny\",\"prompt\":$ref_ids,\"max_tokens\":8,\"temperature\":0}")
    /usr/bin/python3 - "$chat" "$comp" "$ref_ids" <<'PY' || fail "qwen3 chat prompt differs from the reference (jinja + tokenizers)"
import json, sys
chat, comp, ids = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
# the server's rendered + tokenized chat prompt has the reference's length, and greedy decoding
# from it continues exactly like decoding from the reference ids
assert chat["usage"]["prompt_tokens"] == len(ids), (chat["usage"], len(ids))
assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"], (chat, comp)
assert chat["choices"][0]["finish_reason"] in ("stop", "length"), chat
PY
    # a tool-calling conversation: tools and tool_calls reach the template as the reference sees them
    TOOLS='[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
    TMSGS='[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18 C, sunny"}]'
    (cd "$REF" && node chat_prompt_ref.mjs "$WORK/qwen3tiny" "$TMSGS" "$TOOLS") >"$WORK/ref_tools.json" || fail "chat_prompt_ref.mjs tools"
    ref_ids=$(/usr/bin/python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["ids"]))' "$WORK/ref_tools.json")
    chat=$(curl -s -H "Authorization: Bearer secret" "$QB/chat/completions" \
        -d "{\"model\":\"qwen3tiny\",\"messages\":$TMSGS,\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"max_tokens\":8,\"temperature\":0}")
    comp=$(curl -s -H "Authorization: Bearer secret" "$QB/completions" \
        -d "{\"model\":\"qwen3tiny\",\"prompt\":$ref_ids,\"max_tokens\":8,\"temperature\":0}")
    /usr/bin/python3 - "$chat" "$comp" "$ref_ids" <<'PY' || fail "qwen3 tool-call prompt differs from the reference"
import json, sys
chat, comp, ids = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert chat["usage"]["prompt_tokens"] == len(ids), (chat["usage"], len(ids))
assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"], (chat, comp)
PY
    # chat_template_kwargs reach the template (Qwen3's enable_thinking), and a history's
    # reasoning_content is the template's to place, as the reference sees them
    RMSGS='[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","reasoning_content":"Need the tool.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18 C"}]'
    KW='{"enable_thinking":false}'
    (cd "$REF" && node chat_prompt_ref.mjs "$WORK/qwen3tiny" "$RMSGS" null "$KW") >"$WORK/ref_kw.json" || fail "chat_prompt_ref.mjs kwargs"
    /usr/bin/python3 - "$QB" "$RMSGS" "$KW" "$WORK/ref_kw.json" <<'PY' || fail "chat_template_kwargs or reasoning_content"
import json, sys, urllib.request
qb, msgs, kw, ref = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.load(open(sys.argv[4]))
def post(body):
    req = urllib.request.Request(qb + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer secret"})
    with urllib.request.urlopen(req) as r:
        return r.read().decode()
base = {"model": "qwen3tiny", "messages": msgs, "max_tokens": 2, "temperature": 0}
r = json.loads(post(dict(base, chat_template_kwargs=kw)))
assert r["usage"]["prompt_tokens"] == len(ref["ids"]), (r["usage"], len(ref["ids"]))
assert ref["text"].endswith("<think>\n\n</think>\n\n"), ref["text"][-80:]
assert "<think>\nNeed the tool.\n</think>" in ref["text"], ref["text"]
# the answer's thinking: <think> forced twice is an opened, unclosed thought (reasoning_content
# "<think>", no content); streamed, the reasoning_content deltas carry the same
think = 151667
body = dict(base, logit_bias={str(think): 100})
r = json.loads(post(body))
m = r["choices"][0]["message"]
assert m.get("reasoning_content") == "<think>" and m["content"] == "", m
events = [json.loads(l[6:]) for l in post(dict(body, stream=True)).splitlines() if l.startswith("data: {")]
deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
assert "".join(d.get("reasoning_content", "") for d in deltas) == "<think>", deltas
assert "".join(d.get("content") or "" for d in deltas) == "", deltas
PY
    echo "ok   qwen3 chat template (plain and with tools)"
    echo "ok   chat_template_kwargs (enable_thinking) and a history's reasoning_content match the reference; <think> is split into reasoning_content"
else
    echo "note: $CSD_SHARED_DIR/tokenizers/qwen3 absent, real chat template not exercised"
fi

# --- /tokenize and /detokenize (llama-server's and vLLM's helper endpoints), then logit_bias ---
/usr/bin/python3 - "$BASE" "$CASCADIA" <<'PY' || fail "/tokenize, /detokenize, logit_bias"
import json, subprocess, sys, urllib.error, urllib.request
base, cascadia = sys.argv[1], sys.argv[2]
def post(path, body, key="secret", method="POST"):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json",
                                                         "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
text = "Once upon a time"
st, tok = post("/tokenize", {"prompt": text})
assert st == 200 and tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] > 0, tok
# the ids /v1/completions uses for the same prompt
st, cmpl = post("/v1/completions", {"prompt": text, "max_tokens": 1})
assert st == 200 and cmpl["usage"]["prompt_tokens"] == tok["count"], (cmpl["usage"], tok)
st, ids = post("/v1/completions", {"prompt": tok["tokens"], "max_tokens": 1, "temperature": 0})
assert st == 200, ids
# llama-server's convention: no BOS unless asked; the same ids otherwise
st, plain = post("/tokenize", {"content": text})
assert st == 200 and tok["tokens"][len(tok["tokens"]) - len(plain["tokens"]):] == plain["tokens"], (tok, plain)
st, asked = post("/tokenize", {"content": text, "add_special": True})
assert asked["tokens"] == tok["tokens"], (asked, tok)
st, pieces = post("/tokenize", {"content": text, "with_pieces": True})
assert "".join(p["piece"] for p in pieces["tokens"]) == text, pieces
assert [p["id"] for p in pieces["tokens"]] == plain["tokens"], pieces
# special-token strings: read as their ids with "content", literally with parse_special false
st, special = post("/tokenize", {"content": "a</s>"})
st, literal = post("/tokenize", {"content": "a</s>", "parse_special": False})
assert special["count"] < literal["count"], (special, literal)
st, back = post("/detokenize", {"tokens": special["tokens"]})
assert back["content"].endswith("</s>"), back
st, back = post("/v1/detokenize", {"tokens": plain["tokens"]})
assert st == 200 and back["prompt"] == text and back["content"] == text, back
# vLLM's chat form: the ids a chat completion with the same messages starts from
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
st, chat_tok = post("/tokenize", {"messages": msgs})
st, chat = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
assert st == 200 and chat_tok["count"] == chat["usage"]["prompt_tokens"], (chat_tok, chat["usage"])
st, rendered = post("/detokenize", {"tokens": chat_tok["tokens"]})
assert "<|im_start|>user" in rendered["content"] and rendered["content"].endswith("<|im_start|>assistant\n"), rendered
st, err = post("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]})
assert st == 400 and err["error"]["param"].startswith("messages[0]"), err
# errors: 400 naming the field, 401 without the key, 405 for GET
st, err = post("/tokenize", {"prompt": 5})
assert st == 400 and err["error"]["param"] == "prompt", err
st, err = post("/tokenize", ["not", "an", "object"])
assert st == 400 and "object" in err["error"]["message"], err
st, err = post("/detokenize", {"tokens": [0, 10**9]})
assert st == 400 and err["error"]["param"] == "tokens" and "tokens[1]" in err["error"]["message"], err
# an answer is bounded like a request: with pieces, at most 2^18 tokens (one object each)
st, err = post("/tokenize", {"content": "a " * 300000, "with_pieces": True})
assert st == 400 and err["error"]["param"] == "content" and "at most 262144" in err["error"]["message"], err
st, err = post("/tokenize", {"prompt": text}, key="wrong")
assert st == 401, err
st, err = post("/tokenize", None, method="GET")
assert st == 405, err
# null is absent here too; the chat form is bounded as the text form is
st, nulled = post("/tokenize", {"prompt": None, "content": text})
assert st == 200 and nulled["tokens"] == plain["tokens"], nulled
st, nulled = post("/tokenize", {"messages": None, "prompt": text})
assert st == 200 and nulled["tokens"] == tok["tokens"], nulled
st, err = post("/tokenize", {"messages": [{"role": "user", "content": "x" * 1100000}]})
assert st == 400 and err["error"]["param"] == "messages" and "at most 1048576" in err["error"]["message"], err
# a NUL byte is text like any other: it survives /detokenize, echo and logprobs
st, nul = post("/tokenize", {"content": "a\u0000b"})
st, back = post("/detokenize", {"tokens": nul["tokens"]})
assert back["content"] == "a\u0000b" and back["prompt"] == "a\u0000b", (nul, back)
for prompt in ("a\u0000b", nul["tokens"]):
    st, echoed = post("/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 1})
    assert st == 200 and echoed["choices"][0]["text"].startswith("a\u0000b"), echoed
nul_id = next(p["id"] for p in post("/tokenize", {"content": "\u0000", "with_pieces": True})[1]["tokens"]
              if p["piece"] == "\u0000")
st, lp = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                       "logprobs": True, "logit_bias": {str(nul_id): 100}})
c = lp["choices"][0]["logprobs"]["content"][0]
assert st == 200 and c["token"] == "\u0000" and c["bytes"] == [0], c
# a stop string that only the detokenizer's last flush completes (a lone lead byte becomes U+FFFD
# at the end) cuts the answer: "stop", although max_tokens ended it too
lead = json.load(open("tiny/tokenizer.json"))["model"]["vocab"]["<0xE2>"]
st, cut = post("/v1/completions", {"prompt": text, "max_tokens": 1, "logit_bias": {str(lead): 100},
                                   "stop": ["\ufffd"]})
assert st == 200 and cut["choices"][0]["text"] == "" and cut["choices"][0]["finish_reason"] == "stop", cut
print("ok   /tokenize and /detokenize")

# logit_bias: +100 forces a token, -100 bans one, through the whole server
greedy = {"prompt": text, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
forced = post("/tokenize", {"content": " time"})[1]["tokens"][-1]
st, out = post("/v1/completions", dict(greedy, logit_bias={str(forced): 100}))
def forced_text(n):  # a text's first piece loses its leading space when detokenized alone
    return post("/detokenize", {"tokens": [forced] * n})[1]["content"].strip()
want = forced_text(6)
assert st == 200 and out["choices"][0]["text"].strip() == want and out["usage"]["completion_tokens"] == 6, (out, want)
# logprobs' tokens spell the text at their text_offset, leading spaces included (" time", as
# OpenAI shows it: decoding the piece alone lost the space); chat's tokens keep it too
st, lpo = post("/v1/completions", dict(greedy, max_tokens=3, logprobs=1, logit_bias={str(forced): 100}))
lpc = lpo["choices"][0]
toks, offs = lpc["logprobs"]["tokens"], lpc["logprobs"]["text_offset"] + [len(lpc["text"])]
assert st == 200 and toks == [" time"] * 3, lpo
assert [lpc["text"][offs[i]:offs[i + 1]] for i in range(3)] == toks, lpo
st, lpch = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                         "logprobs": True, "logit_bias": {str(forced): 100}})
assert st == 200 and [c["token"] for c in lpch["choices"][0]["logprobs"]["content"]] == [" time"] * 2, lpch
# ban the greedy token: the runner-up comes instead (both from `cascadia logits` on the same ids)
ids = post("/tokenize", {"prompt": text})[1]["tokens"]
top = subprocess.run([cascadia, "logits", "tiny", "--ids", ",".join(map(str, ids)), "--top", "2"],
                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
best, runner_up = [int(kv.split("=")[0]) for kv in top.split(": ", 1)[1].split()]
def piece(i):
    return post("/detokenize", {"tokens": [i]})[1]["content"].strip()
first = {"prompt": ids, "max_tokens": 1, "temperature": 0}
st, unbiased = post("/v1/completions", first)
assert st == 200 and unbiased["choices"][0]["text"].strip() == piece(best), (unbiased, top)
assert piece(best) != piece(runner_up), top  # else the check below proves nothing
st, banned = post("/v1/completions", dict(first, logit_bias={str(best): -100}))
assert st == 200 and banned["choices"][0]["text"].strip() == piece(runner_up), (banned, top)
# chat requests take it too
st, chat = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                         "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                                         "logit_bias": {str(forced): 100}})
assert st == 200 and chat["choices"][0]["message"]["content"].strip() == forced_text(3), chat
st, err = post("/v1/completions", dict(greedy, logit_bias={"99999999": 1}))
assert st == 400 and err["error"]["param"] == "logit_bias", err
print("ok   logit_bias")
# response_format json_object: every answer that ends by itself is one JSON object (sampled, with
# '"' and '}' favoured so that objects close within the budget); without it the same requests are
# not JSON.
def last_id(t):
    return post("/tokenize", {"prompt": t, "add_special_tokens": False})[1]["tokens"][-1]
bias = {str(last_id('"')): 4, str(last_id("}")): 3}
def answers(fmt, endpoint="/v1/completions"):
    out = []
    for seed in range(1, 9):
        body = {"max_tokens": 48, "temperature": 1, "seed": seed, "logit_bias": bias}
        if endpoint == "/v1/completions": body["prompt"] = text
        else: body["messages"] = [{"role": "user", "content": "Hi"}]
        if fmt: body["response_format"] = {"type": fmt}
        st, r = post(endpoint, body)
        assert st == 200, r
        c = r["choices"][0]
        out.append((c["text"] if "text" in c else c["message"]["content"], c["finish_reason"]))
    return out
def parses(t):
    try:
        return isinstance(json.loads(t), dict)
    except ValueError:
        return False
closed = {}
for endpoint in ("/v1/completions", "/v1/chat/completions"):
    got = answers("json_object", endpoint)
    closed[endpoint] = got
    ended = [t for t, why in got if why == "stop"]
    assert ended, ("no JSON answer closed within 48 tokens", got)
    assert all(parses(t) for t in ended), got
    free = answers(None, endpoint)
    assert not all(parses(t) for t, _ in free), free  # else the check above proves nothing
# n choices: choice i samples with seed + i, so each is the answer that seed gave alone above (and
# so each choice was constrained too)
single = closed["/v1/completions"]  # seeds 1..8
body = {"prompt": text, "max_tokens": 48, "temperature": 1, "seed": 5, "logit_bias": bias, "n": 3,
        "response_format": {"type": "json_object"}}
st, r = post("/v1/completions", body)
assert st == 200 and len(r["choices"]) == 3, r
for i, c in enumerate(r["choices"]):
    assert (c["text"], c["finish_reason"]) == single[4 + i], (i, c, single[4 + i])
# streamed: the deltas join into the answer of a seed whose object closed
seed = 1 + [why for _, why in single].index("stop")
req = urllib.request.Request(base + "/v1/completions", method="POST",
                             data=json.dumps(dict(body, n=1, seed=seed, stream=True)).encode(),
                             headers={"Content-Type": "application/json",
                                      "Authorization": "Bearer secret"})
with urllib.request.urlopen(req) as resp:
    events = [json.loads(l[6:]) for l in resp.read().decode().splitlines()
              if l.startswith("data: {")]
streamed = "".join(e["choices"][0]["text"] for e in events if e["choices"])
why = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
assert (streamed, why) == single[seed - 1] and parses(streamed), (streamed, why, single[seed - 1])
print("ok   response_format json_object: %d and %d of 8 answers closed (completions, chat), each one"
      " JSON object; n and stream agree" % tuple(sum(w == "stop" for _, w in closed[k]) for k in closed))

# response_format json_schema: every answer is valid against its schema, properties in its order
schema = {"type": "object", "additionalProperties": False,
          "$defs": {"Color": {"enum": ["red", "green", None], "title": "Color"}},
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                         "color": {"$ref": "#/$defs/Color"},
                         "tags": {"type": "array", "items": {"const": "a"}, "maxItems": 2},
                         "note": {"type": ["string", "null"]}},
          "required": ["ok", "n", "color", "tags"]}
def valid(t):
    try:
        v = json.loads(t)
    except ValueError:
        return False
    keys = list(v)
    return (keys in (["ok", "n", "color", "tags"], ["ok", "n", "color", "tags", "note"])
            and isinstance(v["ok"], bool) and type(v["n"]) is int and v["color"] in ("red", "green", None)
            and len(v["tags"]) <= 2 and all(x == "a" for x in v["tags"])
            and (v.get("note") is None or isinstance(v["note"], str)))
fmt = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
closed_schema = []
for endpoint in ("/v1/completions", "/v1/chat/completions"):
    got = []
    for seed in range(1, 7):
        body = {"max_tokens": 96, "temperature": 1, "seed": seed, "logit_bias": bias, "response_format": fmt}
        if endpoint == "/v1/completions": body["prompt"] = text
        else: body["messages"] = [{"role": "user", "content": "Hi"}]
        st, r = post(endpoint, body)
        assert st == 200, r
        c = r["choices"][0]
        got.append((c["text"] if "text" in c else c["message"]["content"], c["finish_reason"]))
    ended = [t for t, why in got if why == "stop"]
    assert ended and all(valid(t) for t in ended), got
    closed_schema.append(len(ended))
    assert not all(valid(t) for t, _ in closed[endpoint] if _ == "stop"), closed  # json_object alone is not enough
# refused: no schema, a keyword outside the subset (named with its place), a root that is no object
st, err = post("/v1/completions", dict(greedy, response_format={"type": "json_schema"}))
assert st == 400 and err["error"]["param"] == "response_format.json_schema", err
bad = {"type": "object", "properties": {"mail": {"type": "string", "format": "email"}}}
st, err = post("/v1/completions", dict(greedy, response_format={"type": "json_schema", "json_schema": {"schema": bad}}))
assert st == 400 and err["error"]["param"] == "response_format.json_schema.schema", err
assert "/properties/mail" in err["error"]["message"] and "format" in err["error"]["message"], err
st, err = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "response_format":
                                        {"type": "json_schema", "json_schema": {"schema": {"type": "array"}}}})
assert st == 400 and "root" in err["error"]["message"], err
# true is any value, as {} is (an object here); false allows nothing
for schema, status in ((True, 200), ({}, 200), (False, 400)):
    st, r = post("/v1/completions", dict(greedy, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "any", "schema": schema}}))
    assert st == status, (schema, r)
    assert status == 400 or r["choices"][0]["text"].lstrip().startswith("{"), (schema, r)
print("ok   response_format json_schema: %d and %d of 6 answers closed (completions, chat), each one"
      " valid against the schema" % tuple(closed_schema))
# tool calls: a named tool_choice answers with one call whose arguments are valid against the
# function's parameters; streamed, the id and name come first and the argument pieces join into the
# same arguments; "required" among two tools names one of them, with arguments valid against that
# one's parameters; refusals name the field
weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
           "parameters": {"type": "object", "additionalProperties": False,
                          "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city", "days"]}}}
clock = {"type": "function", "function": {"name": "get_time"}}
ask = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [clock, weather],
       "max_tokens": 96, "temperature": 1, "logit_bias": bias,
       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
def args_valid(a):
    v = json.loads(a)
    return list(v) == ["city", "days"] and isinstance(v["city"], str) and type(v["days"]) is int
calls = []
for seed in range(1, 7):
    st, r = post("/v1/chat/completions", dict(ask, seed=seed))
    assert st == 200, r
    c = r["choices"][0]
    m = c["message"]
    assert m["content"] is None and len(m["tool_calls"]) == 1, r
    call = m["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather", call
    assert call["id"].startswith("call_") and len(call["id"]) == 29, call
    assert c["finish_reason"] in ("tool_calls", "length"), c
    if c["finish_reason"] == "tool_calls": assert args_valid(call["function"]["arguments"]), call
    calls.append((call["function"]["arguments"], c["finish_reason"]))
n_closed = sum(why == "tool_calls" for _, why in calls)
assert n_closed, calls
seed = 1 + [why for _, why in calls].index("tool_calls")
req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                             data=json.dumps(dict(ask, seed=seed, stream=True)).encode(),
                             headers={"Content-Type": "application/json",
                                      "Authorization": "Bearer secret"})
with urllib.request.urlopen(req) as resp:
    events = [json.loads(l[6:]) for l in resp.read().decode().splitlines()
              if l.startswith("data: {")]
deltas = [d for e in events for d in e["choices"][0]["delta"].get("tool_calls", [])]
assert deltas[0]["id"].startswith("call_") and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}, deltas[0]
assert all(d["index"] == 0 and "id" not in d for d in deltas[1:]), deltas
streamed = "".join(d["function"]["arguments"] for d in deltas)
why = events[-1]["choices"][0]["finish_reason"]
assert (streamed, why) == calls[seed - 1], (streamed, why, calls[seed - 1])
picked = []
for seed in range(1, 4):
    st, r = post("/v1/chat/completions", dict(ask, seed=seed, tool_choice="required"))
    assert st == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] in ("tool_calls", "length"), r
    if c["finish_reason"] == "length": continue  # cut before the object closed: text
    call = c["message"]["tool_calls"][0]
    name, args = call["function"]["name"], call["function"]["arguments"]
    assert name in ("get_time", "get_weather"), r
    # each tool's own parameters: get_time takes none, get_weather's are checked
    assert json.loads(args) == {} if name == "get_time" else args_valid(args), r
    picked.append(name)
assert picked, "no 'required' call closed in 3 tries"
st, err = post("/v1/chat/completions", dict(ask, tool_choice={"type": "function", "function": {"name": "nope"}}))
assert st == 400 and err["error"]["param"] == "tool_choice.function.name", err
mail = {"type": "function", "function": {"name": "send", "parameters": {"type": "object", "properties":
        {"to": {"type": "string", "format": "email"}}}}}
st, err = post("/v1/chat/completions", dict(ask, response_format={"type": "json_object"}))
assert st == 400 and err["error"]["param"] == "tool_choice", err
st, err = post("/v1/chat/completions", dict(ask, tools=[clock, mail],
                                            tool_choice={"type": "function", "function": {"name": "send"}}))
assert st == 400 and err["error"]["param"] == "tools[1].function.parameters" and "format" in err["error"]["message"], err
print("ok   tool_choice: %d of 6 forced calls closed, each valid against the function's parameters;"
      " streamed deltas join into the same call; %d of 3 'required' calls closed (%s), each valid"
      " against its tool's parameters; refusals name the field"
      % (n_closed, len(picked), ", ".join(picked)))
PY

# --- SIGTERM shuts down cleanly ---
kill -TERM "$PID_main"
wait_for 30 gone "$PID_main" || fail "server still running 30 s after SIGTERM"
wait "$PID_main" || fail "server exited with status $? after SIGTERM"
echo "ok   clean shutdown on SIGTERM"
echo "e2e_api passed"

# tests/tools/serve.sh: neox-eval serve's command line and its behaviour under hostile clients: usage
# errors, then a server on the untrained tiny character-level model answering malformed JSON, wrong
# types, out-of-range values, invalid UTF-8, oversized bodies and prompts, broken connections and
# 1000 concurrent requests (tests/tools/serve_clients.py) while staying up, the bounded queue
# answering 503, SIGTERM ending it with status 0, and batched decoding (tests/tools/serve_batch.py):
# concurrent requests give the texts they give one at a time, and a client that leaves is cancelled. The numbers it serves are checked against the
# harness and neox-eval in tests/oracle/test_serve.py.
source tests/lib.sh


check_output "serve --help" 'max-body-bytes' $EVAL serve --help
check_fails "serve: no config" 2 'no config file' $EVAL serve
check_fails "serve: unknown option" 2 'unrecognized option' $EVAL serve --bogus x.yml
check_fails "serve: port out of range" 2 "--port: '70000' is not an integer from 0 to 65535" $EVAL serve --port 70000 x.yml
check_fails "serve: zero queue" 2 'queue' $EVAL serve --queue 0 x.yml

cat >"$T/model.yml" <<YML
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 256, "max_position_embeddings": 256,
  "pos_emb": "rotary", "rotary_pct": 0.5, "no_weight_tying": true, "tokenizer_type": "CharLevelTokenizer",
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "train_micro_batch_size_per_gpu": 4
}
YML
check_fails "serve: host not numeric" 2 'not a numeric IPv4 or IPv6 address' $EVAL serve -q --host localhost "$T/model.yml"

# start_server LOG ARGS...: starts the server in the background; sets PID and PORT.
start_server() {
    local log=$1; shift
    $EVAL serve -q --port 0 "$@" "$T/model.yml" 2>"$log" &
    PID=$!
    for _ in $(seq 100); do
        PORT=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$log")
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    return 1
}

if start_server "$T/serve.log" --max-prompt-tokens 200 --queue 64; then
    python3 tests/tools/serve_clients.py "$PORT"
    kill -TERM $PID
    wait $PID
    _report $? "serve: SIGTERM after the hostile clients exits 0" "$T/serve.log"
else
    _report 1 "serve: starts and listens" "$T/serve.log"
fi

# The bounded queue: with room for one request, requests sent together get 503 beyond it.
if start_server "$T/queue.log" --queue 1; then
    python3 - "$PORT" >"$T/queue.out" 2>&1 <<'PY'
import concurrent.futures, json, sys, urllib.error, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"
def ask(_):
    req = urllib.request.Request(url, data=json.dumps({"prompt": "ab", "max_tokens": 200, "temperature": 0}).encode())
    try:
        return urllib.request.urlopen(req, timeout=120).status
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert body["error"]["message"], body
        return e.code
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    codes = list(pool.map(ask, range(8)))
print(codes)
assert 200 in codes and 503 in codes and set(codes) <= {200, 503}, codes
PY
    _report $? "serve: a full queue answers 503" "$T/queue.out"
    kill -TERM $PID
    wait $PID
    _report $? "serve: SIGTERM exits 0" "$T/queue.log"
else
    _report 1 "serve: starts with --queue 1" "$T/queue.log"
fi

# Batched decoding: the same requests one at a time with one decoding slot, then all at once with
# four (joining mid-way, taking the slots of those that end) give the same texts; a client that
# closes its connection frees its slots.
if start_server "$T/seq.log" --decode-slots 1; then
    python3 tests/tools/serve_batch.py sequential "$PORT" "$T/texts.json" >"$T/seq.out" 2>&1
    _report $? "serve: requests one at a time with one decoding slot" "$T/seq.out"
    kill -TERM $PID
    wait $PID
else
    _report 1 "serve: starts with --decode-slots 1" "$T/seq.log"
fi
if NEOX_LOG_LEVEL=debug start_server "$T/batch.log" --decode-slots 4; then
    python3 tests/tools/serve_batch.py concurrent "$PORT" "$T/texts.json"
    python3 tests/tools/serve_batch.py cancel "$PORT"
    kill -TERM $PID
    wait $PID
    grep -q "cancelled: its client closed the connection" "$T/batch.log"
    _report $? "serve: a client that closes its connection has its completions cancelled" "$T/batch.log"
else
    _report 1 "serve: starts with --decode-slots 4" "$T/batch.log"
fi
check_fails "serve: too many decoding slots" 2 "--decode-slots: '17' is not an integer from 1 to 16" $EVAL serve --decode-slots 17 x.yml

"""serve_clients.py PORT: hostile and concurrent clients against a running `neox-eval serve` (a bounded
loop over loopback, the standard library only). Prints one TAP line per check: each request is answered
(with the status and OpenAI-style error body it should get) or refused, and the server stays up."""
import concurrent.futures
import json
import socket
import sys

PORT = int(sys.argv[1])
results = []


def tap(ok, name, detail=""):
    results.append(ok)
    print(f"{'ok' if ok else 'not ok'} - serve: {name}{'' if ok else ' # ' + detail}")


def raw(data, read=True, timeout=30):
    """Sends bytes on a fresh connection; returns (status, body) or (None, reason)."""
    with socket.create_connection(("127.0.0.1", PORT), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return None, "not read"
        chunks = []  # (no half-close: HTTP servers take a client's end of input as it giving up)
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    reply = b"".join(chunks)
    if not reply:
        return None, "closed without an answer"
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def request(method, path, body=b"", headers=""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    return raw(head.encode() + body)


def post(obj):
    return request("POST", "/v1/completions", obj if isinstance(obj, bytes) else json.dumps(obj).encode())


def error_of(body):
    try:
        e = json.loads(body)["error"]
        return e if isinstance(e.get("message"), str) and e["message"] else None
    except (ValueError, KeyError, TypeError):
        return None


def expect_error(name, status, body, want_status, param=None):
    e = error_of(body)
    ok = status == want_status and e is not None and (param is None or e.get("param") == param)
    tap(ok, f"{name}: {want_status}", f"got {status} {body[:200]!r}")


def health():
    status, body = request("GET", "/health")
    return status == 200 and json.loads(body) == {"status": "ok"}


# ---- malformed bodies, wrong types, out-of-range values ---------------------------------------------
cases = [
    ("malformed JSON", b'{"prompt": "a",', None),
    ("not an object", b'[1, 2]', None),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe abc"}', None),
    ("a NUL escape", b'{"prompt": "a\\u0000b"}', None),
    ("empty body", b'', None),
    ("prompt missing", {"max_tokens": 3}, "prompt"),
    ("prompt a number", {"prompt": 5}, "prompt"),
    ("prompt list of floats", {"prompt": [1.5, 2]}, "prompt"),
    ("prompt token id negative", {"prompt": [3, -1]}, "prompt"),
    ("prompt token id past the vocabulary", {"prompt": [3, 1 << 30]}, "prompt"),
    ("prompt empty list", {"prompt": []}, "prompt"),
    ("mixed prompt list", {"prompt": ["a", 5]}, "prompt"),
    ("max_tokens a string", {"prompt": "a", "max_tokens": "3"}, "max_tokens"),
    ("max_tokens negative", {"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ("max_tokens past the context", {"prompt": "a", "max_tokens": 100000}, "max_tokens"),
    ("temperature negative", {"prompt": "a", "temperature": -0.5}, "temperature"),
    ("temperature a string", {"prompt": "a", "temperature": "hot"}, "temperature"),
    ("top_p above 1", {"prompt": "a", "top_p": 1.5}, "top_p"),
    ("top_k below -1", {"prompt": "a", "top_k": -2}, "top_k"),
    ("n zero", {"prompt": "a", "n": 0}, "n"),
    ("logprobs above 20", {"prompt": "a", "logprobs": 21}, "logprobs"),
    ("echo a number", {"prompt": "a", "echo": 1}, "echo"),
    ("stop a number", {"prompt": "a", "stop": 3}, "stop"),
    ("stop too many", {"prompt": "a", "stop": ["x"] * 9}, "stop"),
    ("seed a float", {"prompt": "a", "seed": 1.5}, "seed"),
    ("stream true", {"prompt": "a", "stream": True}, "stream"),
    ("unknown field", {"prompt": "a", "best_of": 2}, "best_of"),
    ("duplicate field", b'{"prompt": "a", "prompt": "b"}', None),
    ("deep nesting", b'{"prompt": ' + b'[' * 100000 + b']' * 100000 + b'}', None),
]
for name, body, param in cases:
    status, reply = post(body)
    expect_error(name, status, reply, 400, param)

status, reply = post({"prompt": "a", "model": "gpt-4"})
expect_error("another model's name", status, reply, 404, "model")
status, reply = request("GET", "/v1/completions")
expect_error("GET /v1/completions", status, reply, 405)
status, reply = request("POST", "/v1/chat/completions", b'{"messages": []}')
expect_error("chat completions: an empty conversation", status, reply, 400, "messages")
for name, body in [("chat: deep nesting", b'{"messages": [' + b'[' * 100000 + b']' * 100000 + b']}'),
                   ("chat: invalid UTF-8 content", b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
                   ("chat: a truncated body", b'{"messages": [{"role": "user", "content": "hi"}'),
                   ("chat: a number as content", b'{"messages": [{"role": "user", "content": 5}]}')]:
    status, reply = request("POST", "/v1/chat/completions", body)
    expect_error(name, status, reply, 400)
status, reply = request("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}')
expect_error("chat completions without a chat template (GPT-2's folder has none)", status, reply, 400, "messages")
tap(b"--chat-template" in reply, "chat completions without a chat template: the answer names --chat-template", reply[:200])
status, reply = request("GET", "/nowhere")
expect_error("unknown path", status, reply, 404)

# ---- size limits ----------------------------------------------------------------------------------
big = json.dumps({"prompt": "x" * (10 << 20), "max_tokens": 1}).encode()
status, reply = post(big)
expect_error("10 MB prompt over the body limit", status, reply, 413)
long_prompt = {"prompt": "ab" * 5000, "max_tokens": 1}
status, reply = post(long_prompt)
expect_error("prompt longer than --max-prompt-tokens", status, reply, 400, "prompt")

# ---- broken connections ---------------------------------------------------------------------------
for i, data in enumerate([
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"trunc",  # body cut short
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",                                   # headers cut short
    b"\x00\x01\x02 garbage \xff\r\n\r\n",                                                          # not HTTP
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100000 + b"\r\n\r\n",                # oversized header
]):
    try:
        raw(data, read=i != 0, timeout=5)
    except OSError:
        pass  # the server may close first; what matters is that it stays up
    tap(health(), f"up after broken connection {i}")

# ---- a valid request still works, with the logprob fields the harness reads ---------------------------
status, reply = post({"prompt": "ROMEO:", "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True})
ok = status == 200
if ok:
    c = json.loads(reply)["choices"][0]["logprobs"]
    ok = c["token_logprobs"][0] is None and len(c["token_logprobs"]) == len("ROMEO:") + 1 and \
        all(len(t) == 1 for t in c["top_logprobs"][1:])
tap(ok, "echo + logprobs request answered", f"{status} {reply[:200]!r}")

# ---- many concurrent connections ------------------------------------------------------------------
N = 1000


def one(i):
    body = json.dumps({"prompt": [1 + i % 50, 2, 3], "max_tokens": 1, "temperature": 0}).encode()
    try:
        status, reply = post(body)
    except OSError as e:
        return "refused"
    if status == 200 and json.loads(reply)["choices"][0]["text"] is not None:
        return "answered"
    if status == 503 and error_of(reply):
        return "busy"
    return f"bad {status} {reply[:100]!r}"


with concurrent.futures.ThreadPoolExecutor(max_workers=N) as pool:
    outcomes = list(pool.map(one, range(N)))
bad = [o for o in outcomes if o not in ("answered", "busy", "refused")]
counts = {k: outcomes.count(k) for k in ("answered", "busy", "refused")}
tap(not bad and counts["answered"] > 0, f"{N} concurrent requests answered or refused {counts}", str(bad[:3]))
tap(health(), "up after the concurrent requests")
print(f"# concurrent outcomes: {counts}")
sys.exit(0 if all(results) else 1)

"""serve_batch.py MODE PORT [OUT]: requests for neox-eval serve's batched decoding (the standard library
only). MODE sequential: sends the requests below one at a time and writes their texts to OUT as JSON.
MODE concurrent: sends them all at once, the first a moment before the rest (so that they join it
mid-way and, with fewer slots than completions, take the slots of those that end), and checks each
text against OUT's: greedy and seeded sampled completions give the same text whichever requests
decode beside them. MODE cancel: a long completion whose client closes the connection at once, then a
short request, which must be answered while the long one would still be generating (with one slot)."""
import concurrent.futures
import json
import socket
import sys
import time
import urllib.request

MODE, PORT = sys.argv[1], int(sys.argv[2])
URL = f"http://127.0.0.1:{PORT}/v1/completions"
REQUESTS = [
    {"prompt": "ROMEO:", "max_tokens": 120, "temperature": 0},
    {"prompt": "To be", "max_tokens": 9, "temperature": 0},
    {"prompt": "a", "max_tokens": 30, "temperature": 1.0, "top_k": 20, "seed": 3},
    {"prompt": "The king", "max_tokens": 14, "temperature": 0.9, "top_p": 0.9, "seed": 11, "n": 2},
    {"prompt": "xyz", "max_tokens": 25, "temperature": 0, "stop": ["e"]},
    {"prompt": ["one", "two words"], "max_tokens": 6, "temperature": 0, "logprobs": 2},
    {"prompt": "Once", "max_tokens": 40, "temperature": 0.7, "seed": 5},
]


def ask(body, timeout=120):
    req = urllib.request.Request(URL, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return [[c["text"], c["finish_reason"], (c.get("logprobs") or {}).get("token_logprobs")] for c in out["choices"]]


def tap(ok, name, detail=""):
    print(f"{'ok' if ok else 'not ok'} - serve: {name}{'' if ok else ' # ' + detail}")
    return ok


def sequential(out):
    with open(out, "w") as f:
        json.dump([ask(b) for b in REQUESTS], f)


def together(out):
    want = json.load(open(out))
    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        first = pool.submit(ask, REQUESTS[0])
        time.sleep(0.3)
        rest = [pool.submit(ask, b) for b in REQUESTS[1:]]
        got = [first.result()] + [f.result() for f in rest]
    bad = [i for i in range(len(REQUESTS)) if got[i] != want[i]]
    ok = tap(not bad, "concurrent requests give the texts they give one at a time",
             f"requests {bad}: {[got[i] for i in bad]} != {[want[i] for i in bad]}")
    return ok


def cancel():
    s = socket.create_connection(("127.0.0.1", PORT))
    body = json.dumps({"prompt": ["a"] * 16, "max_tokens": 250, "temperature": 1.0, "n": 16}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.2)
    s.close()
    start = time.time()
    text = ask({"prompt": "b", "max_tokens": 3, "temperature": 0})[0][0]
    return tap(len(text) > 0, "a request after a cancelled one is answered", f"{text!r} after {time.time() - start:.1f} s")


ok = {"sequential": lambda: sequential(sys.argv[3]) or True, "concurrent": lambda: together(sys.argv[3]),
      "cancel": cancel}[MODE]()
sys.exit(0 if ok else 1)

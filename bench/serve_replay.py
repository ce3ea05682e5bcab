"""bench/serve_replay.py: lm-evaluation-harness's lambada_openai loglikelihood requests, sent to a
completions server the way the harness's local-completions model sends them, without the harness.

The requests are built as the harness builds them (context = the text less its last word,
continuation = " " + that word, tokenized with a Hugging Face tokenizer folder, sorted longest
first, `batch` prompts of token ids per request, `concurrent` requests in flight, each
{"prompt", "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": true}) and each answer is read
as the harness reads it (token_logprobs and top_logprobs from the context length on). Prints the
wall time, the client's own time to decode the answers, the bytes received, and the mean
log-likelihood and greedy accuracy (to compare servers). With --stub it serves canned answers of
the right shape itself (no model), so that the harness can be timed against a server that costs
nothing: its floor through the API.

Usage: serve_replay.py send URL TOKENIZER_DIR LAMBADA_JSONL [--limit N] [--batch 32] [--concurrent 4]
       serve_replay.py stub PORT
"""
import argparse
import http.client
import http.server
import json
import queue
import sys
import threading
import time
import urllib.parse


def lambada_requests(tokenizer_dir, path, limit):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json") if _has(f"{tokenizer_dir}/tokenizer.json") else None
    if tok is None:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(tokenizer_dir)
        encode = lambda s: hf(s, add_special_tokens=False)["input_ids"]
    else:
        encode = lambda s: tok.encode(s, add_special_tokens=False).ids
    reqs = []
    with open(path) as f:
        for line in f:
            if limit and len(reqs) == limit:
                break
            words = json.loads(line)["text"].split(" ")
            context, continuation = " ".join(words[:-1]), " " + words[-1]
            whole, ctx = encode(context + continuation), encode(context)
            reqs.append((ctx, whole[len(ctx):]))
    reqs.sort(key=lambda r: (-len(r[0] + r[1]), tuple(r[0] + r[1])))
    return reqs


def _has(path):
    try:
        open(path).close()
        return True
    except OSError:
        return False


def send(args):
    reqs = lambada_requests(args.tokenizer, args.data, args.limit)
    url = urllib.parse.urlparse(args.url)
    chunks = queue.Queue()
    for i in range(0, len(reqs), args.batch):
        chunks.put(reqs[i:i + args.batch])
    results, lock = [], threading.Lock()
    stats = {"decode": 0.0, "bytes": 0}

    def worker():
        conn = http.client.HTTPConnection(url.hostname, url.port)
        while True:
            try:
                chunk = chunks.get_nowait()
            except queue.Empty:
                return
            body = json.dumps({"model": "neox", "prompt": [c + k for c, k in chunk], "temperature": 0,
                               "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
            conn.request("POST", url.path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                sys.exit(f"serve_replay.py: HTTP {resp.status}: {data[:300]!r}")
            t0 = time.perf_counter()
            out = json.loads(data)
            mine = []
            for choice, (ctx, _) in zip(sorted(out["choices"], key=lambda c: c["index"]), chunk):
                lps = choice["logprobs"]["token_logprobs"][len(ctx):-1]
                tops = choice["logprobs"]["top_logprobs"][len(ctx):-1]
                mine.append((sum(lps), all(lp == max(t.values()) for lp, t in zip(lps, tops))))
            with lock:
                stats["decode"] += time.perf_counter() - t0
                stats["bytes"] += len(data)
                results.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrent)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(len(c) + len(k) for c, k in reqs)
    print(f"requests {len(reqs)}, tokens {tokens}, wall {wall:.2f} s, client decode {stats['decode']:.2f} s, "
          f"received {stats['bytes'] / 1e6:.1f} MB")
    print(f"mean loglikelihood {sum(r[0] for r in results) / len(results):.6f}, "
          f"greedy {sum(r[1] for r in results) / len(results):.4f}")


class Stub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer({"object": "list", "data": [{"id": "neox", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompts = req["prompt"] if isinstance(req["prompt"][0], list) else [req["prompt"]]
        choices = []
        for i, p in enumerate(prompts):
            n = len(p) + 1
            choices.append({"index": i, "text": "", "finish_reason": "length", "logprobs": {
                "tokens": ["x"] * n, "token_logprobs": [None] + [-1.0] * (n - 1),
                "top_logprobs": [None] + [{"x": -1.0}] * (n - 1), "text_offset": list(range(n))}})
        self.answer({"id": "cmpl-0", "object": "text_completion", "model": "neox", "choices": choices})

    def answer(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("url")
    s.add_argument("tokenizer")
    s.add_argument("data")
    s.add_argument("--limit", type=int, default=0)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--concurrent", type=int, default=4)
    st = sub.add_parser("stub")
    st.add_argument("port", type=int)
    args = ap.parse_args()
    if args.cmd == "send":
        send(args)
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Stub)
        print(f"listening on port {server.server_address[1]}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()

"""bench/serve_load.py PORT CONCURRENCY TOKENS [ROUNDS]: generation throughput of a running `neox-eval serve`:
CONCURRENCY clients each send one greedy completions request of TOKENS tokens at the same time (distinct
prompts), ROUNDS times; prints the median over rounds of the tokens generated in a round over its wall time
(tokens/s overall; the standard library only)."""
import concurrent.futures
import json
import statistics
import sys
import time
import urllib.request

port, conc, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
URL = f"http://127.0.0.1:{port}/v1/completions"
PROMPTS = ["The king is", "Once upon a time", "In the beginning", "My favourite", "The weather today",
           "She said that", "A long road", "Numbers like"]


def ask(i):
    body = {"prompt": PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), "max_tokens": tokens, "temperature": 0}
    req = urllib.request.Request(URL, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


rates = []
with concurrent.futures.ThreadPoolExecutor(conc) as pool:
    for _ in range(rounds):
        start = time.time()
        made = sum(pool.map(ask, range(conc)))
        rates.append(made / (time.time() - start))
print(f"{statistics.median(rates):.2f}")

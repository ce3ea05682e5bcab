"""serve_ranks_check.py: neox-eval serve on 2 and 3 data-parallel ranks answers what it answers on one.
Usage: serve_ranks_check.py MPIEXEC NEOX_EVAL CONFIG LOGDIR
Each server gets the same requests, sent 4 at a time: scoring (echo + logprobs, one greedy token with
n copies), greedy and seeded sampled generation with logprobs and stop strings. Generated choices must
be identical (each is computed alone, with the KV cache); scored log-probabilities equal within 1e-5
(a pass packs other requests beside a prompt, which on one rank too changes the GEMMs' shapes and so
the float rounding). SIGTERM drains and every rank exits 0. Prints TAP lines."""
import json
import os
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

mpiexec, neox_eval, config, logdir = sys.argv[1:5]
BODIES = [
    {"prompt": ["the king", "thou art the queen", "speak", "love and war"] * 3, "max_tokens": 0, "echo": True, "logprobs": 3},
    {"prompt": ["the night", "art"], "max_tokens": 1, "temperature": 0, "logprobs": 2, "n": 3},
    {"prompt": ["the king", "thou"], "max_tokens": 10, "temperature": 0, "logprobs": 2, "n": 2},
    {"prompt": "speak", "max_tokens": 12, "temperature": 0.9, "top_k": 8, "seed": 5, "n": 4},
    {"prompt": ["love", "war"], "max_tokens": 12, "temperature": 0.9, "seed": 9, "stop": ["e"]},
    {"prompt": [[3, 4, 5, 6], [7, 8]], "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 1},
] * 2
results = []


def tap(ok, name, detail=""):
    results.append(ok)
    print(f"{'ok' if ok else 'not ok'} - serve on ranks: {name}{'' if ok else ' # ' + detail}", flush=True)


def serve(ranks):
    log = open(os.path.join(logdir, f"serve{ranks}.log"), "w+")
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [neox_eval, "serve", config, "--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, NEOX_LOG_LEVEL="debug"))
    port = None
    for line in proc.stderr:
        log.write(line)
        if "listening on port" in line:
            port = int(line.split()[-1])
            break
    if port is None:
        return proc, None, log
    url = f"http://127.0.0.1:{port}/v1/completions"

    def post(body):
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["choices"]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, BODIES))
    proc.send_signal(signal.SIGTERM)
    log.write(proc.stderr.read())
    return proc, answers, log


def close(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a == b


one = serve(1)
tap(one[1] is not None and one[0].wait(timeout=60) == 0, "one rank answers and exits 0")
for ranks in (2, 3):
    proc, answers, log = serve(ranks)
    status = proc.wait(timeout=60)
    tap(answers is not None and status == 0, f"{ranks} ranks answer, and SIGTERM ends every rank with 0", f"status {status}")
    if answers is None:
        continue
    generated = [(a, b) for body, a, b in zip(BODIES, one[1], answers) if body["max_tokens"] > 1]
    scored = [(a, b) for body, a, b in zip(BODIES, one[1], answers) if body["max_tokens"] <= 1]
    tap(all(a == b for a, b in generated), f"{ranks} ranks: generated completions identical to one rank's")
    tap(all(close(a, b) for a, b in scored), f"{ranks} ranks: scored log-probabilities within 1e-5 of one rank's")
    log.seek(0)
    shares = {}
    for line in log:
        if "serving: computed" in line:
            rank = line.split("[rank ")[1].split("]")[0]
            shares[rank] = shares.get(rank, 0) + int(line.split("computed ")[1].split()[0])
    tap(len(shares) == ranks and all(v > 0 for v in shares.values()), f"{ranks} ranks: every rank computes a share",
        str(shares))
sys.exit(0 if all(results) else 1)

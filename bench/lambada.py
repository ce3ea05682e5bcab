"""bench/lambada.py: lm-evaluation-harness's lambada_openai requests for the benchmarks' transformers
sides (bench/eval_transformers.py, bench/shapes.py), standard library only."""
import json


def lambada_requests(tok, path, limit, max_length):
    """Context = all but the last word, continuation = ' ' + last word, tokenized whole and split
    where the context's tokens end, truncated from the left to max_length inputs; (inputs,
    continuation ids) per request, the first `limit` of the file."""
    out = []
    for line in list(open(path, encoding="utf-8"))[:limit]:
        text = json.loads(line)["text"]
        ctx, cont = " ".join(text.split(" ")[:-1]), " " + text.split(" ")[-1]
        whole, c = tok.encode(ctx + cont), tok.encode(ctx)
        cont_ids = whole[len(c):]
        out.append(((c + cont_ids)[-(max_length + 1):][:-1], cont_ids))
    return out

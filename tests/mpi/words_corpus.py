"""tests/mpi/words_corpus.py OUT DOCS SEED: a small synthetic jsonl corpus (random words) for the MPI
training tests, the same for the same seed."""
import json
import random
import sys

out, docs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
words = ["the", "king", "queen", "sword", "crown", "night", "day", "love", "war", "speak", "thou", "art"]
with open(out, "w") as f:
    for _ in range(docs):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(10, 60)))}) + "\n")

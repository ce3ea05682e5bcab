"""dpo_pairs.py: preference pairs for the DPO tests, written with numpy by the independent MMIDIDX
writer of tests/oracle/data_oracle.py. Each pair shares a prompt (PROMPT characters of Tiny
Shakespeare); the chosen side continues it with the text that follows, the rejected side with the
same characters shuffled; both end with EOD (0). Token ids are the characters' codes (the
CharLevelTokenizer of an ASCII text); the label datasets mask the prompt with -100.

  dpo_pairs.py TEXT OUT_PREFIX FIRST_CHAR PAIRS PROMPT CONTINUATION SEED [rm]
writes OUT_PREFIX_{chosen,rejected}_document and OUT_PREFIX_{chosen,rejected}_label_document. With
`rm` (reward-model data, as preprocess_data_with_chat_template.py --for-rm writes it) each side ends
with EOD twice and its labels mask everything but the second EOD, and the rejected continuation has
every letter replaced by a random one (a shuffle is too subtle a difference for the tiny reward model
of the tests to learn in a few dozen steps)."""
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from data_oracle import write_indexed  # noqa: E402


def main(text_path, out, first, pairs, prompt, cont, seed, rm=False):
    text = open(text_path, encoding="ascii").read()
    rng = random.Random(seed)
    span = prompt + cont
    chosen, rejected = [], []
    for i in range(pairs):
        piece = text[first + i * span: first + (i + 1) * span]
        assert len(piece) == span, "the text is too short for that many pairs"
        shuffled = list(piece[prompt:])
        while "".join(shuffled) == piece[prompt:]:
            rng.shuffle(shuffled)
        end = [0, 0] if rm else [0]
        if rm:
            shuffled = [rng.choice("abcdefghijklmnopqrstuvwxyz") if c.isalpha() else c for c in piece[prompt:]]
        chosen.append([ord(c) for c in piece] + end)
        rejected.append([ord(c) for c in piece[:prompt]] + [ord(c) for c in shuffled] + end)
    for name, docs in (("chosen", chosen), ("rejected", rejected)):
        write_indexed(f"{out}_{name}_document", docs, np.uint16)
        labels = [[-100] * (len(d) - 1) + d[-1:] if rm else [-100] * prompt + d[prompt:] for d in docs]
        write_indexed(f"{out}_{name}_label_document", labels, np.int32)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]), a[7:] == ["rm"])

"""kto_data.py: unpaired KTO examples for the KTO tests, written with numpy by the independent
MMIDIDX writer of tests/oracle/data_oracle.py, laid out as GPT-NeoX's chat preprocessing writes them
with --reward-key: a token dataset, its label dataset and its reward dataset (int32, one reward per
document). Each example is PROMPT characters of Tiny Shakespeare and a continuation: the text that
follows (desirable, reward 1) or the same characters shuffled (undesirable, reward -1), chosen at
random; both end with EOD (0). Token ids are the characters' codes (CharLevelTokenizer of an ASCII
text); the label dataset masks the prompt with -100.

  kto_data.py TEXT OUT_PREFIX FIRST_CHAR EXAMPLES PROMPT CONTINUATION SEED
writes OUT_PREFIX_messages_document, OUT_PREFIX_messages_label_document and
OUT_PREFIX_messages_reward_document."""
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from data_oracle import write_indexed  # noqa: E402


def main(text_path, out, first, count, prompt, cont, seed):
    text = open(text_path, encoding="ascii").read()
    rng = random.Random(seed)
    span = prompt + cont
    docs, rewards = [], []
    for i in range(count):
        piece = text[first + i * span: first + (i + 1) * span]
        assert len(piece) == span, "the text is too short for that many examples"
        good = rng.random() < 0.5
        ending = list(piece[prompt:])
        while not good and "".join(ending) == piece[prompt:]:
            rng.shuffle(ending)
        docs.append([ord(c) for c in piece[:prompt]] + [ord(c) for c in ending] + [0])
        rewards.append([1 if good else -1])
    write_indexed(f"{out}_messages_document", docs, np.int32)
    write_indexed(f"{out}_messages_label_document", [[-100] * prompt + d[prompt:] for d in docs], np.int32)
    write_indexed(f"{out}_messages_reward_document", rewards, np.int32)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]))

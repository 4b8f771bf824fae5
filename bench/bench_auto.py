"""Benchmark (prints figures; not a test): what `--dtype auto` picks on this machine, why, and whether it is right.

On the machine at hand: the CPU model and the flags that decide bf16's speed, auto's choice and its reason (from its
cache, as train.py and evaluate.py see it) beside a fresh run of its timing, then fp32 against bf16 (bf16 autocast with
the frozen linears held in bf16, as train.py and evaluate.py run it) for
  - the model's matmuls: (rows x H) @ (H x H), (H x 4H), (4H x H) of MiniLM (H 384), rows = a scoring batch's tokens;
  - a UMLS training step (bench_train.train_step: the README recipe, 32 positives + 96 negatives, bucketed order);
  - a ranking pass (evaluate.rank_queries with evaluate.Scorer: seeded UMLS test queries against all 135 candidates,
    the shipped UMLS adapter).
The two precisions alternate inside every round (other work on a shared machine slows whichever runs beside it);
each figure is the best of --repeat rounds. The row auto picks is marked. Run it on an idle machine.

    python bench/bench_auto.py                   # a few minutes on 2 cores (emulated bf16 is the slow part)
    python bench/bench_auto.py --quick           # tiny sizes: that it runs, not what it measures
    python bench/bench_auto.py --rows 16384 --steps 8 --queries 16 --repeat 5 --threads 2
"""
import argparse, copy, os, sys, time
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data, evaluate, palt, train  # noqa: E402
from support import checkpoints, devices, files, graphs  # noqa: E402
from bench_train import BATCH, NEGATIVES, PALT_CFG, PROMPTS, MAX_SEQ, optimizer, representative, train_step  # noqa: E402

DTYPES = ("fp32", "bf16")
# the flags that decide how fast bf16 runs on a CPU: native bf16 dot products (AVX512_BF16, AMX) or none
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
UMLS_ADAPTER = files.ROOT / "weights" / "palt-umls-minilm.safetensors"


def cpu_line(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name, family and model numbers, and which of FLAGS it has."""
    name, flags = devices.cpu_info(cpuinfo)
    fields = devices.cpu_fields(cpuinfo)
    have = [f for f in FLAGS if f in flags]
    lacks = [f for f in FLAGS if f not in flags]
    return (f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}); has "
            f"{' '.join(have) or 'none of them'}; lacks {' '.join(lacks) or 'none'}")


def best_of(repeat, fns):
    """{name: the fastest of `repeat` calls} of the functions {name: fn}, alternated call by call, after a warm-up."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def matmul_rows(rows, repeat):
    """[(shape, {dtype: GFLOP/s})] of the model's linear layers on (rows, H) inputs as the model runs them: fp32 plain,
    bf16 under autocast with bf16 weights (the frozen linears held in bf16)."""
    H = devices.TIMED_HIDDEN
    g = torch.Generator().manual_seed(0)
    out = []
    for n_in, n_out in ((H, H), (H, 4 * H), (4 * H, H)):
        x = torch.randn(rows, n_in, generator=g)
        w = {"fp32": torch.randn(n_out, n_in, generator=g) / n_in ** 0.5}
        w["bf16"] = w["fp32"].to(torch.bfloat16)

        def run(dtype, x=x, w=w):
            """One linear layer's pass in `dtype`."""
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, dtype == "bf16"):
                F.linear(x, w[dtype])
        seconds = best_of(repeat, {dt: (lambda dt=dt: run(dt)) for dt in DTYPES})
        out.append((f"({rows} x {n_in}) @ ({n_in} x {n_out})", {dt: 2 * rows * n_in * n_out / s / 1e9
                                                               for dt, s in seconds.items()}))
    return out


def training_steps(args, kg, tokenizer):
    """{dtype: sequences/s} of UMLS training steps (bench_train.train_step) at the quantiles of padded size of a
    bucketed epoch, each precision on its own PALT (the same seeded weights; bf16's frozen linears held in bf16)."""
    enc = data.encode(kg, tokenizer)
    neg = data.NegativeSampler(kg, *NEGATIVES, seed=42).negatives(0)
    rows = np.concatenate([kg.train[:, None], neg], 1).reshape(-1, 3)
    keys = data.seq_lengths(enc, rows, PROMPTS, MAX_SEQ).reshape(len(kg.train), -1).max(1)
    order = train.epoch_order(keys, BATCH, 0, 42)
    steps = order[representative(order, keys, args.steps)][:, :args.positives]
    runs = {}
    for dt in DTYPES:
        torch.manual_seed(0)
        model, _ = palt.build_palt("minilm", PALT_CFG)
        model.train()  # dropout on, as in train.py
        devices.hold_frozen_linears(model, dt)
        opt, params = optimizer(model, torch.device("cpu"))
        runs[dt] = (lambda m=model, o=opt, p=params, dt=dt: [train_step(m, o, p, kg, enc, neg, idx, PROMPTS, dt, "cpu")
                                                            for idx in steps])
    seconds = best_of(args.repeat, runs)
    return {dt: steps.size * (1 + sum(NEGATIVES)) / s for dt, s in seconds.items()}


def ranking_pass(args, kg):
    """{dtype: triples/s} of evaluate.rank_queries over seeded UMLS test queries against every candidate, the shipped
    UMLS adapter scored by evaluate.Scorer in each precision (bf16: its frozen linears held in bf16, as evaluate.py)."""
    model, meta, loaded = checkpoints.load_checkpoint(UMLS_ADAPTER)
    enc = data.encode(kg, loaded.tokenizer)
    lpq = evaluate.lp_queries(kg)
    queries = np.sort(np.random.default_rng(0).choice(len(lpq.queries), args.queries, replace=False))
    tri = np.nonzero(np.isin(lpq.triple_query, queries).any(1))[0]
    block = max(1, (1 << 16) // len(lpq.candidates))
    runs = {}
    for dt in DTYPES:
        held = copy.deepcopy(model).eval()
        devices.hold_frozen_linears(held, dt)
        scorer = evaluate.Scorer(held, enc, meta["prompts"], meta["max_seq_length"], "cpu", dt)
        runs[dt] = lambda s=scorer: list(evaluate.rank_queries(s, lpq, tri, queries, block))
    seconds = best_of(args.repeat, runs)
    return {dt: len(queries) * len(lpq.candidates) / s for dt, s in seconds.items()}


def row(what, speed, unit, auto):
    """One line: fp32's and bf16's speed, bf16's share of fp32's, and which auto picked."""
    ratio = speed["bf16"] / speed["fp32"]
    faster = "bf16" if ratio > 1 else "fp32"
    mark = "auto picked the faster" if faster == auto else f"auto picked {auto}, the slower"
    print(f"  {what:40} {speed['fp32']:10,.1f} {speed['bf16']:10,.1f} {unit:>10} {ratio:8.2f}x   {mark}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16384, help="the matmuls' rows (a scoring batch's tokens: 16384)")
    ap.add_argument("--steps", type=int, default=2, help="UMLS training steps timed per precision and round")
    ap.add_argument("--queries", type=int, default=4, help="UMLS test queries ranked per precision and round")
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds after a warm-up; the best of each is kept")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--positives", type=int, default=BATCH, help="a training step's positives (train.py's: 32)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (rows 256, 1 step of 4 positives, 1 query, 1 "
                    "round): that it runs end to end, not a measurement")
    ap.add_argument("--data-dir", help="default $PALT_DATA, else data/")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.steps, args.positives, args.queries, args.repeat = 256, 1, 4, 1, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    print(f"cpu: {cpu_line()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, oneDNN "
          f"{'on' if torch.backends.mkldnn.is_available() else 'off'}; load average {os.getloadavg()[0]:.2f} (a "
          "shared machine slows both precisions alike, the ratios hold better than the figures)")
    auto, why = devices.auto_dtype("cpu")
    print(f"--dtype auto: {auto} ({why})")
    timed = devices.bf16_speedup(rows=min(args.rows, devices.TIMED_ROWS))
    print(f"auto's timing, run again now: bf16 at {timed:.2f}x fp32's speed (bf16 needs >= {devices.BF16_MARGIN:.2f}x)")
    if auto == "bf16" and not devices.cpu_has_native_bf16():
        print("note: auto picked bf16 on a CPU without native bf16?")
    kg = graphs.load_kg("umls", args.data_dir)
    print(f"\n  {'':40} {'fp32':>10} {'bf16':>10} {'':>10} {'bf16/fp32':>9}")
    for shape, speed in matmul_rows(args.rows, args.repeat):
        row(shape, speed, "GFLOP/s", auto)
    _, loaded = palt.build_palt("minilm", PALT_CFG)
    seqs = f"{args.positives}+{args.positives * sum(NEGATIVES)}"
    row(f"UMLS training step ({args.steps} x {seqs} seq)", training_steps(args, kg, loaded.tokenizer), "seq/s", auto)
    row(f"UMLS ranking ({args.queries} queries x 135)", ranking_pass(args, kg), "triples/s", auto)
    print(f"\n{time.time() - t0:.0f} s; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

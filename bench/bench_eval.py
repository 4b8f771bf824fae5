"""Benchmark (prints figures; not a test): evaluate.py's ranking loop against transformers, two ways.

The reference is transformers' BertForNextSentencePrediction run the way KG-BERT's run_bert_link_prediction.py
runs it: fp32, every sequence padded to max_seq_length, one query at a time in batches of eval_batch_size
(both from KG-BERT's README for the dataset), then softmax and argsort. It is given our token ids, so its
Python tokenising per query is not timed (a gift to the reference). The best-effort transformers loop is what a
careful user of transformers would write: SDPA attention, the same candidates sorted by length, each batch padded
to its longest row under our token budget, bf16 autocast where ours runs bf16. Ours: evaluate.rank_queries with
evaluate.Scorer (length-sorted token-budget batches, filtered and raw ranks), in fp32 and in the 'auto' dtype
(bf16 on GPU and on CPUs with native bf16), and in the 'auto' dtype through torch.compile (evaluate.py --compile).
Same queries, candidates and weights; all rows alternated in one run. Beside each of our rows, the scorer alone on
the same triples (no ranking, no filtering): the loop's ceiling, and its share of it. Last, each row's share of the peak: model
FLOPs (linear layers and attention, real tokens) against the spec on GPUs and, on CPUs, a bf16/fp32 matmul
measured once a round beside the rows (the median: a shared host's matmul speed can swing 2x within a minute).

    python bench/bench_eval.py                                                  # MiniLM on this CPU, umls
    python bench/bench_eval.py --data fb15k-237 --queries 2 --cands 1000        # KG-BERT pads to 150 there
    python bench/bench_eval.py --model bert-base-random --data fb15k-237 --queries 8    # on a GPU
    python bench/bench_eval.py --ours-only --queries 200 --repeat 1 --profile  # + where a ranking pass's time goes
"""
import argparse, contextlib, copy, os, shutil, sys, tempfile, time, unittest.mock
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bert, data, evaluate, palt  # noqa: E402
from support import devices, graphs, hub  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()  # MiniLM's missing NSP head is expected here
transformers.utils.logging.disable_progress_bar()

KGBERT = {"umls": (15, 135), "wn18rr": (50, 5000), "fb15k-237": (150, 1500)}  # max_seq_length, eval_batch_size
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense tensor-core FLOP/s (SXM)


def model_dir(name, out):
    """A directory that both loaders read: HF config + model.safetensors with an NSP head, and MiniLM's vocab."""
    minilm = hub.model_dir("minilm")
    torch.manual_seed(0)
    if name == "minilm":  # MiniLM has no NSP head: it is new, random (seeded); speed does not care
        hf = transformers.BertForNextSentencePrediction.from_pretrained(minilm)
    else:  # BERT-base's shape, random weights
        hf = transformers.BertForNextSentencePrediction(transformers.BertConfig())
    hf.save_pretrained(out)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(minilm / f, out / f)
    return out


def sub_queries(lpq, tri, n_cands, rng):
    """lpq cut down to n_cands candidates that include every answer of the test triples `tri`."""
    if not n_cands or n_cands >= len(lpq.candidates):
        return lpq
    must = np.unique(lpq.target[tri])
    others = rng.choice(np.setdiff1d(np.arange(len(lpq.candidates)), must), max(0, n_cands - len(must)), replace=False)
    keep = np.sort(np.concatenate([must, others]))
    where = np.full(len(lpq.candidates), -1)
    where[keep] = np.arange(len(keep))
    pos = where[lpq.filter_pos]
    q = np.repeat(np.arange(len(lpq.queries)), np.diff(lpq.filter_ptr))
    ptr = np.concatenate([[0], np.cumsum(np.bincount(q[pos >= 0], minlength=len(lpq.queries)))])
    return data.LPQueries(lpq.candidates[keep], lpq.queries, lpq.triple_query, where[lpq.target], ptr, pos[pos >= 0])


def plain_attention(q, k, v, attn_mask=None, dropout_p=0.0):
    """softmax(QK^T / sqrt(d)) V in three plain ops: a stand-in for F.scaled_dot_product_attention, measured only
    (--plain-attention; bert.py keeps SDPA, the house rule): SDPA's CPU flash kernel is built for long sequences."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return (s if attn_mask is None else s.masked_fill(~attn_mask, float("-inf"))).softmax(-1) @ v


def attention_of(row):
    """A context in which bert.py's attention is the row's: plain ops for a 'plain attention' row, else SDPA."""
    return unittest.mock.patch.object(bert.F, "scaled_dot_product_attention", plain_attention) \
        if row.endswith("plain attention") else contextlib.nullcontext()


def candidate_triples(lpq, q):
    side, r, e = lpq.queries[q]
    c = lpq.candidates
    fixed = np.full(len(c), e)
    return np.stack([c, np.full(len(c), r), fixed] if side == 0 else [fixed, np.full(len(c), r), c], 1)


@torch.no_grad()
def reference(hf, enc, lpq, queries, max_seq_length, batch_size, device):
    """KG-BERT's loop: per query, all sequences padded to max_seq_length, fp32, softmax, argsort."""
    for q in queries:
        b = data.build_batch(enc, candidate_triples(lpq, q), (0, 0, 0), max_seq_length)
        pad = max_seq_length - b["input_ids"].shape[1]
        ids, types, mask = (F.pad(b[k], (0, pad), value=v) for k, v in
                            (("input_ids", enc.pad_id), ("token_type_ids", 0), ("attention_mask", 0)))
        probs = []
        for i in range(0, len(ids), batch_size):
            logits = hf(input_ids=ids[i:i + batch_size].to(device), token_type_ids=types[i:i + batch_size].to(device),
                        attention_mask=mask[i:i + batch_size].to(device)).logits
            probs.append(logits.softmax(-1)[:, 0].cpu())
        np.argsort(-torch.cat(probs).numpy(), kind="stable")


@torch.no_grad()
def best_effort(hf, enc, lpq, queries, max_seq_length, tokens, block, dtype, device, count):
    """transformers as a careful user runs it: per block of queries (as ours), candidates sorted by length, longest
    first, batches of at most `tokens` padded tokens padded to their longest row, autocast in `dtype`; NSP margin,
    then argsort per query. Returns the (len(queries) * C,) scores; count["padded"] gets the padded tokens."""
    C, parts = len(lpq.candidates), []
    for start in range(0, len(queries), block):
        qs = queries[start:start + block]
        triples = np.concatenate([candidate_triples(lpq, q) for q in qs])
        lengths = data.seq_lengths(enc, triples, (0, 0, 0), max_seq_length)
        order = np.argsort(-lengths, kind="stable")
        scores = torch.empty(len(triples))
        i = 0
        while i < len(order):
            idx = order[i:i + max(1, tokens // int(lengths[order[i]]))]
            b = data.build_batch(enc, triples[idx], (0, 0, 0), max_seq_length)  # padded to its longest row
            with bert.autocast(dtype, device):
                logits = hf(**{k: b[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}).logits
            scores[torch.from_numpy(idx)] = (logits[:, 0].float() - logits[:, 1].float()).cpu()
            count["padded"] += b["input_ids"].numel()
            i += len(idx)
        np.argsort(-scores.view(len(qs), C).numpy(), axis=1, kind="stable")
        parts.append(scores)
    return torch.cat(parts)


def matmul_peak(dtype, device, n):
    """FLOP/s of an n x n x n product in this dtype: the peak the scorer is measured against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    reps = 10 if device.type == "cuda" else 4
    return 2 * n ** 3 * reps / timed(lambda: [a @ b for _ in range(reps)], device)


def flops(cfg, lengths):
    """Model FLOPs of the encoder over rows of these lengths: 2 per weight per token, plus QK^T and AV."""
    H, I, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lengths = np.asarray(lengths, np.float64)
    return 2 * n * (4 * H * H + 2 * H * I) * lengths.sum() + 4 * n * H * (lengths ** 2).sum()


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm", choices=["minilm", "bert-base-random"])
    ap.add_argument("--data", default="umls", choices=list(KGBERT))
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--queries", type=int, default=8, help="test queries ranked (seeded random)")
    ap.add_argument("--cands", type=int, help="candidates per query (default: all); keeps CPU runs short")
    ap.add_argument("--max-seq-length", type=int, help="default: KG-BERT's for the dataset")
    ap.add_argument("--ref-batch", type=int, help="the reference's eval batch size (default: KG-BERT's)")
    ap.add_argument("--tokens", type=int, help="our padded-token budget per batch (default: evaluate.py's)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core); 1 suffers less "
                    "from other work on a shared machine")
    ap.add_argument("--plain-attention", action="store_true", help="add a compiled row with attention in plain ops, "
                    "not SDPA: what the house rule costs (not adopted)")
    ap.add_argument("--ours-only", action="store_true", help="time our rows alone: no transformers, no reference")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds; the best of each is reported")
    ap.add_argument("--profile", action="store_true", help="also a torch.profiler table of one ranking pass of "
                    "each of our rows")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    max_seq, ref_batch = args.max_seq_length or KGBERT[args.data][0], args.ref_batch or KGBERT[args.data][1]
    auto = devices.resolve_dtype("auto", device)
    dtypes = ["fp32"] + ([auto] if auto != "fp32" else [])
    theirs = [] if args.ours_only else dtypes  # transformers' rows; the reference comes with them
    # --ours-only: the 'auto' dtype alone, eager and compiled (the compile is paid in the warm-up, not timed)
    ours_rows = list(dict.fromkeys(theirs + [auto, f"{auto} compiled"]))
    ours_rows += [f"{auto} compiled, plain attention"] * args.plain_attention
    # before 2026-11-29 a bf16 ranking kept the frozen weights in fp32 and autocast cast them at every batch
    ours_rows += [f"{auto}, weights cast per batch"] * (auto == "bf16")
    with tempfile.TemporaryDirectory() as tmp:
        d = model_dir(args.model, Path(tmp))
        ours, loaded = palt.build_palt(str(d), palt.PaltConfig(**palt.ZERO_SHOT))
        hf = transformers.BertForNextSentencePrediction.from_pretrained(d, attn_implementation="sdpa").to(device).eval()
    ours = ours.to(device).eval()
    held = copy.deepcopy(ours)  # evaluate.py's bf16 Predictor: the frozen linears cast to bf16 once
    devices.hold_frozen_linears(held, "bf16")
    kg = graphs.load_kg(args.data, args.data_dir)
    enc = data.encode(kg, loaded.tokenizer)
    rng = np.random.default_rng(0)
    full = evaluate.lp_queries(kg)
    queries = np.sort(rng.choice(len(full.queries), args.queries, replace=False))
    tri = np.nonzero(np.isin(full.triple_query, queries).any(1))[0]  # the test triples that ask them
    lpq = sub_queries(full, tri, args.cands, rng)
    C = len(lpq.candidates)
    block = max(1, (1 << 16) // C)  # queries scored together, as evaluate.py does
    held_in = {dt: held if dt.startswith("bf16") and "per batch" not in dt else ours for dt in ours_rows}
    scorers = {dt: evaluate.Scorer(held_in[dt], enc, (0, 0, 0), max_seq, device, dt.split()[0].rstrip(","),
                                   args.tokens, compile="compiled" in dt) for dt in ours_rows}
    tokens = scorers[auto].tokens  # evaluate.py's default budget unless --tokens
    counts = {dt: {"padded": 0} for dt in theirs}
    def run_ours(dt):
        with attention_of(dt):
            return list(evaluate.rank_queries(scorers[dt], lpq, tri, queries, block))
    run_hf = {dt: (lambda dt=dt: best_effort(hf, enc, lpq, queries, max_seq, tokens, block, dt, device, counts[dt]))
              for dt in theirs}

    # warm up every loop (our rows: by scoring every triple), and check that they compute the same scores
    first = candidate_triples(lpq, queries[0])
    ours_margin = evaluate.Scorer(ours, enc, (0, 0, 0), max_seq, device)(first).cpu()  # fp32, one query
    b = data.build_batch(enc, first, (0, 0, 0), max_seq)
    with torch.no_grad():
        logits = hf(**{k: b[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}).logits.cpu()
    diff = (ours_margin - (logits[:, 0] - logits[:, 1])).abs().max().item()
    every = np.concatenate([candidate_triples(lpq, q) for q in queries])  # the order best_effort returns scores in
    s = {}
    for dt in ours_rows:
        with attention_of(dt):
            s[dt] = scorers[dt](every).cpu()
    s_hf = {dt: run_hf[dt]().cpu() for dt in theirs}
    ref = lambda qs: None if args.ours_only else reference(hf, enc, lpq, qs, max_seq, ref_batch, device)
    ref(queries[:1])

    if args.profile:  # where a ranking pass's time goes: the matmuls, attention, the pointwise ops between
        acts = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * (device.type == "cuda")
        for dt in ours_rows:
            with torch.profiler.profile(activities=acts) as prof:
                run_ours(dt)
            print(f"ours {dt}: one ranking pass profiled, by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
    # alternate all rows, best of --repeat each: other work on a shared machine slows whichever runs beside it
    t_ours, t_hf, t_ref = {dt: [] for dt in ours_rows}, {dt: [] for dt in theirs}, []
    t_scorer = {dt: [] for dt in ours_rows}  # the scorer alone on the same triples: the loop's ceiling
    # the peak: the spec's dense tensor-core figure on a known GPU, else a matmul in the row's dtype measured in
    # every round beside the rows (a shared CPU host's matmul speed can swing 2x within a minute)
    where = (torch.cuda.get_device_name() if device.type == "cuda" else
             f"cpu ({torch.get_num_threads()} threads, native bf16: {devices.cpu_has_native_bf16()})")
    spec = next((v for k, v in PEAK_BF16.items() if k in where), None)
    n_peak = 8192 if device.type == "cuda" else 2048
    peak_samples = {dt: [] for dt in dtypes if not (spec and dt == "bf16")}  # the dtypes with no spec
    for _ in range(args.repeat):
        for dt in peak_samples:
            peak_samples[dt].append(matmul_peak(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dt]),
                                                device, n_peak))
        for dt in ours_rows:
            with attention_of(dt):
                t_scorer[dt].append(timed(lambda: scorers[dt](every), device))
            scorers[dt].n_padded = 0
            t_ours[dt].append(timed(lambda: run_ours(dt), device))
        for dt in theirs:
            counts[dt]["padded"] = 0
            t_hf[dt].append(timed(run_hf[dt], device))
        t_ref.append(timed(lambda: ref(queries), device))
    t_ours, t_hf, t_ref = {dt: min(t) for dt, t in t_ours.items()}, {dt: min(t) for dt, t in t_hf.items()}, min(t_ref)
    t_scorer = {dt: min(t) for dt, t in t_scorer.items()}
    lengths = data.seq_lengths(enc, every, (0, 0, 0), max_seq)

    n, real = len(queries) * C, int(lengths.sum())
    print(f"device {where}; model {args.model} ({sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M params); "
          f"{args.data}: {len(queries)} queries x {C:,} candidates = {n:,} triples, {real / n:.1f} real tokens each; "
          f"best of {args.repeat}; load average {os.getloadavg()[0]:.2f} (the machine may be shared: compare rows "
          f"of one run)")
    print(f"{'':62} {'dtype':>30} {'triples/s':>10} {'tokens/s':>10} {'padded/real':>11} {'seconds':>8}")
    rows = [(f"ours (length-sorted, {tokens:,}-token batches)", dt, t_ours[dt], scorers[dt].n_padded / real)
            for dt in ours_rows]
    rows += [("ours, the scorer alone (same triples, no ranking)", dt, t_scorer[dt], float("nan")) for dt in ours_rows]
    rows += [(f"transformers best effort (sdpa, length-sorted, {tokens:,}-token)", dt, t_hf[dt],
              counts[dt]["padded"] / real) for dt in theirs]
    rows += [(f"reference (KG-BERT's way: padded to {max_seq}, batch {ref_batch}, per query)", "fp32", t_ref,
              max_seq * n / real)] * (not args.ours_only)
    for name, dt, t, pad in rows:
        print(f"{name:62} {dt:>30} {n / t:10,.0f} {real / t:10,.0f} {pad:11.2f} {t:8.2f}")
    if auto != "fp32" and not args.ours_only:
        print(f"ours {auto} / ours fp32: x{t_ours['fp32'] / t_ours[auto]:.2f} (goal >= 1.8 on umls)")
    print(f"ours {auto} compiled / ours {auto}: x{t_ours[auto] / t_ours[auto + ' compiled']:.2f}")
    print("the ranking loop's share of the scorer's own throughput (goal >= 80% on a GPU): " + ", ".join(
        f"{dt} {100 * t_scorer[dt] / t_ours[dt]:.0f}%" for dt in ours_rows))
    gap = lambda x, y: (x - y).abs().max().item()
    print(f"scores: max |ours fp32 - HF fp32| {diff:.2e} on one query, unpadded (HF attention: "
          f"{hf.config._attn_implementation}); over all {n:,}: |ours {auto} compiled - ours {auto}| "
          f"{gap(s[auto + ' compiled'], s[auto]):.2e}")
    if args.plain_attention:
        plain = f"{auto} compiled, plain attention"
        print(f"ours {plain} / ours {auto} compiled: x{t_ours[auto + ' compiled'] / t_ours[plain]:.2f}; scores: "
              f"max |plain - SDPA| {gap(s[plain], s[auto + ' compiled']):.2e}")
    if auto != "fp32" and not args.ours_only:  # bf16: 3 significant digits in the encoder; NSP head and scores: fp32
        print(f"        max |ours {auto} - ours fp32| {gap(s[auto], s['fp32']):.2e} (fp32 scores span "
              f"{s['fp32'].min().item():.2f}..{s['fp32'].max().item():.2f}, std {s['fp32'].std().item():.3f})")
    if not args.ours_only:
        print("ours / transformers best effort, same dtype: "
              + ", ".join(f"{dt} x{t_hf[dt] / t_ours[dt]:.2f}" for dt in dtypes) + " (goal >= 1.5)")
        print("ours / reference per scored triple: " + ", ".join(f"{dt} x{t_ref / t_ours[dt]:.2f}" for dt in dtypes))
        print(f"        |ours fp32 - best effort fp32| {gap(s['fp32'], s_hf['fp32']):.2e}"
              + (f", |best effort {auto} - fp32| {gap(s_hf[auto], s_hf['fp32']):.2e}" if auto != "fp32" else ""))
        # the reference ranks each test triple's two queries on their own; we score each distinct query once
        T, Q, C_full = len(full.target), len(full.queries), len(full.candidates)
        hours = lambda count, rate: count * C_full / rate / 3600
        print(f"whole {args.data} test ({T:,} triples = {2 * T:,} sides asking {Q:,} distinct queries, {C_full:,} "
              f"candidates): ours ({auto}) {hours(Q, n / t_ours[auto]):.2f} h, reference "
              f"{hours(2 * T, n / t_ref):.2f} h, x{hours(2 * T, n / t_ref) / hours(Q, n / t_ours[auto]):.2f} here")
    peaks = {dt: float(np.median(samples)) for dt, samples in peak_samples.items()}
    if spec:  # a known GPU: its bf16 spec, not a matmul measured here
        peaks["bf16"] = spec
    for dt, samples in peak_samples.items():
        print(f"{dt} {n_peak}^3 matmul, once a round: median {peaks[dt] / 1e12:.2f} TFLOP/s, range "
              f"{min(samples) / 1e12:.2f}-{max(samples) / 1e12:.2f} (the shares below use the median)")
    cfg = loaded.config
    model_flops = flops(cfg, lengths)
    linear = 2 * cfg.num_hidden_layers * (4 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size * cfg.intermediate_size) * real
    for name, dt, t, _ in rows:
        peak = peaks[dt.split()[0].rstrip(",")]
        print(f"{name.split(' (')[0]:24} {dt:>30} {model_flops / t / 1e12:6.2f} TFLOP/s of model FLOPs (real tokens), "
              f"MFU {100 * model_flops / t / peak:.1f}% (linear layers alone {100 * linear / t / peak:.1f}%) of "
              f"{peak / 1e12:.2f} TFLOP/s {dt.split()[0].rstrip(',')} {'spec' if spec and dt == 'bf16' else 'measured matmul, median'}")


if __name__ == "__main__":
    main()

"""Benchmark (prints figures; not a test): evaluate.py's ranking loop against KG-BERT's way of ranking.

The reference is transformers' BertForNextSentencePrediction run the way KG-BERT's run_bert_link_prediction.py
runs it: fp32, every sequence padded to max_seq_length, one query at a time in batches of eval_batch_size
(both from KG-BERT's README for the dataset), then softmax and argsort. It is given our token ids, so its
Python tokenising per query is not timed (a gift to the reference). Ours: evaluate.rank_queries with
evaluate.Scorer (length-sorted token-budget batches, bf16 on GPU, filtered and raw ranks). Same queries,
candidates and weights, in one run.

    python bench/bench_eval.py                                                  # MiniLM on this CPU, umls
    python bench/bench_eval.py --data fb15k-237 --queries 2 --cands 1000        # KG-BERT pads to 150 there
    python bench/bench_eval.py --model bert-base-random --data fb15k-237 --queries 8    # on a GPU
"""
import argparse, shutil, sys, tempfile, time
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bert, data, evaluate, palt  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()  # MiniLM's missing NSP head is expected here
transformers.utils.logging.disable_progress_bar()

KGBERT = {"umls": (15, 135), "wn18rr": (50, 5000), "fb15k-237": (150, 1500)}  # max_seq_length, eval_batch_size
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense tensor-core FLOP/s (SXM)


def model_dir(name, out):
    """A directory that both loaders read: HF config + model.safetensors with an NSP head, and MiniLM's vocab."""
    minilm = bert.resolve_model("minilm")
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
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds; the best of each is reported")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    max_seq, ref_batch = args.max_seq_length or KGBERT[args.data][0], args.ref_batch or KGBERT[args.data][1]
    tokens = args.tokens or evaluate.default_tokens(device)
    with tempfile.TemporaryDirectory() as tmp:
        d = model_dir(args.model, Path(tmp))
        ours, loaded = palt.build_palt(str(d), palt.PaltConfig(**evaluate.ZERO_SHOT))
        hf = transformers.BertForNextSentencePrediction.from_pretrained(d).to(device).eval()
    ours = ours.to(device).eval()
    kg = data.load_kg(args.data, args.data_dir)
    enc = data.encode(kg, loaded.tokenizer)
    rng = np.random.default_rng(0)
    full = data.lp_queries(kg)
    queries = np.sort(rng.choice(len(full.queries), args.queries, replace=False))
    tri = np.nonzero(np.isin(full.triple_query, queries).any(1))[0]  # the test triples that ask them
    lpq = sub_queries(full, tri, args.cands, rng)
    C = len(lpq.candidates)
    scorer = evaluate.Scorer(ours, enc, (0, 0, 0), max_seq, tokens, device)
    run_ours = lambda: list(evaluate.rank_queries(scorer, lpq, tri, queries, max(1, (1 << 16) // C)))

    # warm up both, and check that they compute the same scores
    first = candidate_triples(lpq, queries[0])
    ours_margin = scorer(first).cpu()
    b = data.build_batch(enc, first, (0, 0, 0), max_seq)
    with torch.no_grad():
        logits = hf(**{k: b[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}).logits.cpu()
    diff = (ours_margin - (logits[:, 0] - logits[:, 1])).abs().max().item()
    run_ours()
    reference(hf, enc, lpq, queries[:1], max_seq, ref_batch, device)

    # alternate the two, best of --repeat each: other work on a shared machine slows whichever runs beside it
    t_ours, t_ref = [], []
    for _ in range(args.repeat):
        scorer.n_padded = 0
        t_ours.append(timed(run_ours, device))
        t_ref.append(timed(lambda: reference(hf, enc, lpq, queries, max_seq, ref_batch, device), device))
    t_ours, t_ref = min(t_ours), min(t_ref)
    lengths = data.seq_lengths(enc, np.concatenate([candidate_triples(lpq, q) for q in queries]), (0, 0, 0), max_seq)

    n, real = len(queries) * C, int(lengths.sum())
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else f'cpu ({torch.get_num_threads()} threads)'}; "
          f"model {args.model} ({sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M params); {args.data}: "
          f"{len(queries)} queries x {C:,} candidates = {n:,} triples, {real / n:.1f} real tokens each; best of {args.repeat}")
    print(f"{'':58} {'triples/s':>10} {'tokens/s':>10} {'padded/real':>11} {'seconds':>8}")
    rows = [(f"ours ({'bf16' if device.type == 'cuda' else 'fp32'}, length-sorted, {tokens:,}-token batches)", t_ours,
             scorer.n_padded / real),
            (f"reference (HF fp32, padded to {max_seq}, batch {ref_batch}, per query)", t_ref, max_seq * n / real)]
    for name, t, pad in rows:
        print(f"{name:58} {n / t:10,.0f} {real / t:10,.0f} {pad:11.2f} {t:8.2f}")
    # the reference ranks each test triple's two queries on their own; we score each distinct query once
    T, Q, C_full = len(full.target), len(full.queries), len(full.candidates)
    hours = lambda count, rate: count * C_full / rate / 3600
    print(f"speed-up x{t_ref / t_ours:.2f} per scored triple; max |score difference| {diff:.2e} on one query "
          f"(HF attention: {hf.config._attn_implementation})")
    print(f"whole {args.data} test ({T:,} triples = {2 * T:,} sides asking {Q:,} distinct queries, {C_full:,} candidates): "
          f"ours {hours(Q, n / t_ours):.2f} h, reference {hours(2 * T, n / t_ref):.2f} h, "
          f"x{hours(2 * T, n / t_ref) / hours(Q, n / t_ours):.2f} on this device")
    if device.type == "cuda":
        peak = next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name()), None)
        model_flops = flops(loaded.config, lengths)
        for name, t, _ in rows:
            print(f"{name.split(' (')[0]:10} {model_flops / t / 1e12:7.1f} TFLOP/s of model FLOPs (real tokens)"
                  + (f", MFU {100 * model_flops / t / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s bf16 peak" if peak else ""))


if __name__ == "__main__":
    main()

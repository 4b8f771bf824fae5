"""Evaluate PALT: triple classification, and fast, honest filtered link prediction.

    python evaluate.py --lp [--limit 200] [--raw]              (the shipped adapter weights/palt-umls-minilm)
    python evaluate.py --tc --ckpt runs/wn11-minilm             (a run folder: its best.safetensors)
    python evaluate.py --predict virus causes                   (top-10 tails; '?' RELATION TAIL: heads)
    torchrun --nproc_per_node 8 evaluate.py --lp --ckpt PATH    (queries split over the ranks)

A triple's score is the NSP logit margin logits[:,0] - logits[:,1] in fp32 (a softmax probability saturates and
turns distinct scores into ties). A true answer tied with k others has optimistic rank r, pessimistic r + k and
realistic r + k/2 (random tie-breaking, as PyKEEN reports); metrics use realistic filtered ranks, the JSON has all.
--data: the checkpoint's dataset, else umls (wn11 for --tc); no --ckpt and no --model: the adapter shipped for --data.
"""
import argparse, json, os, shutil, sys, time
from pathlib import Path
import numpy as np
import torch
import torch.distributed as dist

import bert, data, files, palt, predict
from predict import ALL_UP_TO, SIZE
from bigrank import NO_ROWS, Progress, State, gather_rows, select, stratified_ranks

KS = (1, 3, 10)  # Hits@k
MIN_ROWS = 32  # a batch's fewest rows where lengths differ (Scorer)
ZERO_SHOT = dict(prompts=(0, 0, 0), calib_layers=(), prompt_encoder=False, prompt_mlp=False, finetune=False)
DEFAULT_DATA = {"lp": "umls", "tc": "wn11", "predict": "umls"}  # what `python evaluate.py --lp` evaluates


# ----------------------------------------------------------------------------- ranks, metrics, thresholds
def query_ranks(scores, row, target, known=None):
    """Optimistic (1 + #better) and pessimistic (#better or tied, the target included) rank (n,) of candidate
    target[i] in the score row scores[row[i]] (K, C): n test triples of K queries in one op. known (K, C) bool marks
    each query's known answers, left out of the ranking (filtered) except the target itself; None: raw ranks."""
    s = scores[row]  # (n, C)
    i = torch.arange(len(row), device=s.device)
    t = s[i, target][:, None]
    keep = torch.ones_like(s, dtype=torch.bool) if known is None else ~known[row]
    keep[i, target] = True
    return 1 + ((s > t) & keep).sum(1), ((s >= t) & keep).sum(1)


def harmonic(n):
    """H_n = 1 + 1/2 + ... + 1/n for float64 arrays of n >= 0 (digamma(n + 1) + Euler's gamma)."""
    return torch.special.digamma(torch.from_numpy(n + 1.0)).numpy() + np.euler_gamma


def rank_metrics(optimistic, pessimistic):
    """MR, MRR, Hits@k of the optimistic, pessimistic and realistic ranks, and "expected": each metric's exact
    expectation when the rank is uniform on optimistic..pessimistic (random tie-breaking). The MRR and Hits of
    the realistic (mean) rank differ from those expectations when there are ties; MR is the same."""
    o, p = np.asarray(optimistic, np.float64), np.asarray(pessimistic, np.float64)
    out = {kind: {"mr": r.mean(), "mrr": (1 / r).mean(), **{f"hits@{k}": (r <= k).mean() for k in KS}}
           for kind, r in (("optimistic", o), ("pessimistic", p), ("realistic", (o + p) / 2))}
    n = p - o + 1  # the tied group's size
    out["expected"] = {"mr": ((o + p) / 2).mean(), "mrr": ((harmonic(p) - harmonic(o - 1)) / n).mean(),
                       **{f"hits@{k}": (np.clip(k - o + 1, 0, n) / n).mean() for k in KS}}
    return {kind: {m: float(v) for m, v in d.items()} for kind, d in out.items()}


def lp_metrics(rows):
    """rows (n, 6): test triple, side (0 = head is ranked), filtered optimistic, pessimistic, raw optimistic,
    pessimistic -> {"filtered"|"raw": {"head"|"tail"|"both": rank_metrics}}."""
    sides = {"head": rows[:, 1] == 0, "tail": rows[:, 1] == 1, "both": np.ones(len(rows), bool)}
    return {setting: {side: rank_metrics(rows[m, c], rows[m, c + 1]) for side, m in sides.items()}
            for setting, c in (("filtered", 2), ("raw", 4))}


def bootstrap_interval(rows, n_resamples=1000, seed=0):
    """95% percentile-bootstrap interval of the filtered realistic MR, MRR, Hits@k of sampled test triples (rows as in
    lp_metrics), resampled with replacement, both sides of a triple together -> {"mr": [lo, hi], ..., "seed"}."""
    r = (rows[:, 2] + rows[:, 3]) / 2  # realistic filtered rank
    triple, side_of = np.unique(rows[:, 0], return_inverse=True)
    per_triple = lambda v: np.bincount(side_of, weights=v, minlength=len(triple))  # sum over the triple's sides
    sums = {"mr": per_triple(r), "mrr": per_triple(1 / r), **{f"hits@{k}": per_triple(r <= k) for k in KS}}
    idx = np.random.default_rng(seed).integers(0, len(triple), size=(n_resamples, len(triple)))
    sides = per_triple(np.ones(len(r)))[idx].sum(1)
    out = {m: [float(x) for x in np.percentile(s[idx].sum(1) / sides, [2.5, 97.5])] for m, s in sums.items()}
    return out | {"resamples": n_resamples, "seed": seed}


def best_threshold(scores, labels):
    """(θ, accuracy) of the best rule "true iff score > θ", by exact search over -inf, the midpoints between distinct
    scores and +inf: after one sort, cumulative counts give every candidate's accuracy. Ties: the lowest θ."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    v, inverse = np.unique(scores, return_inverse=True)  # sorted distinct scores
    pos, neg = (np.bincount(inverse, weights=w, minlength=len(v)) for w in (labels, ~labels))
    # candidate j (0..m) lies just below v[j]: negatives under it are right, positives from v[j] up are right
    correct = np.concatenate([[0], np.cumsum(neg)]) + labels.sum() - np.concatenate([[0], np.cumsum(pos)])
    j = int(np.argmax(correct))
    theta = -np.inf if j == 0 else np.inf if j == len(v) else (v[j - 1] + v[j]) / 2
    return float(theta), float(correct[j] / len(scores))


# ----------------------------------------------------------------------------- scoring
class Scorer:
    """(N, 3) triples -> (N,) fp32 scores of a PALT model, in batches of rows of (almost) equal length, longest first,
    at most `tokens` padded tokens each; autocast in `dtype` ('fp32' or 'bf16'; the NSP head stays fp32); compile:
    torch.compile fuses the casts, adds, LayerNorms and GELUs between the matmuls (bench/bench_eval.py)."""

    def __init__(self, model, enc, prompts, max_seq_length, device="cpu", dtype="fp32", tokens=None, compile=False):
        self.model, self.enc, self.prompts, self.max_seq_length = model.eval(), enc, tuple(prompts), max_seq_length
        self.device, self.dtype = torch.device(device), dtype
        self.tokens = tokens or (1 << 18 if self.device.type == "cuda" else 1 << 14)  # measured sweet spots
        self.forward = torch.compile(model, dynamic=True) if compile else model
        self.n_tokens = self.n_padded = 0  # real and padded tokens scored: the padding overhead

    @torch.inference_mode()
    def __call__(self, triples):
        triples = np.asarray(triples, np.int64).reshape(-1, 3)
        lengths = data.seq_lengths(self.enc, triples, self.prompts, self.max_seq_length)
        order = np.argsort(-lengths, kind="stable")
        descending = lengths[order]
        out = torch.empty(len(triples), dtype=torch.float32, device=self.device)
        i = 0
        while i < len(order):
            # rows of exactly the first (longest) row's length, if they fill half the token budget: no padding, no
            # attention mask (SDPA's unmasked kernel is x1.4 on CPU at 12 tokens); else rows no shorter than 15/16,
            # at least MIN_ROWS (a shortlist's small calls: fewer, fuller batches were x1.3 on 2 cores)
            w = int(descending[i])
            same, near = (int(np.searchsorted(-descending, x - w, side="right")) for x in (0, w // 16))
            end = same if (same - i) * w >= self.tokens // 2 else max(near, i + MIN_ROWS)
            end = min(i + max(1, self.tokens // w), end)
            idx = order[i:end]
            batch = data.build_batch(self.enc, triples[idx], self.prompts, self.max_seq_length)
            batch = {k: bert.to_device(v, self.device) for k, v in batch.items()}
            if lengths[idx[-1]] == w:
                batch["attention_mask"] = None
            with bert.autocast(self.dtype, self.device):
                logits = self.forward(**batch)
            out[bert.to_device(torch.from_numpy(idx), self.device)] = palt.score(logits)
            self.n_tokens += int(lengths[idx].sum())
            self.n_padded += batch["input_ids"].numel()
            i += len(idx)
        return out

    def numpy(self, triples):
        """The scores as a float32 numpy array: the one place they leave the device (a CUDA tensor has no .numpy())."""
        return self(triples).cpu().numpy()


# ----------------------------------------------------------------------------- link prediction
def naive_ranks(scorer, lpq, tri):
    """The definition, one test triple and side at a time (the tests hold rank_queries to it): score every candidate;
    the filtered rank counts the candidates that beat the answer, leaving out the other known answers. (n, 4) rows:
    test triple, side, optimistic rank (1 + those better), pessimistic rank (1 + those better or tied)."""
    rows = []
    for i in tri:
        for side in (0, 1):  # side 0 asks (?, r, e): candidates are heads; side 1 asks (e, r, ?): candidates are tails
            q, answer = lpq.triple_query[i, side], lpq.target[i, side]
            _, r, e = lpq.queries[q]
            scores = scorer.numpy([(c, r, e) if side == 0 else (e, r, c) for c in lpq.candidates])
            others = set(lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]]) - {answer}  # the filter
            rivals = np.array([x for j, x in enumerate(scores) if j != answer and j not in others])
            better, tied = (rivals > scores[answer]).sum(), (rivals == scores[answer]).sum()
            rows.append((i, side, 1 + better, 1 + better + tied))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def known_mask(lpq, qs):
    """(len(qs), C) bool: True at each query's known answers, the true triples of train, dev and test (the filter)."""
    mask = torch.zeros((len(qs), len(lpq.candidates)), dtype=torch.bool)
    for k, q in enumerate(qs):
        mask[k, torch.from_numpy(lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]])] = True
    return mask


def rank_queries(score, lpq, tri, queries, block, overlap=None):
    """Rank the test triples `tri` for these queries, `block` at a time: a query's candidates are scored once, into
    a (block, C) tensor shared by every test triple that asks it. Yields (its queries, rows as in lp_metrics); overlap
    (default: on a GPU) one block behind: the next block's batches are built and queued before this block's ranks are
    waited for (on a CPU the work is done when the call returns: nothing to overlap)."""
    pair_tri, pair_side = np.repeat(tri, 2), np.tile([0, 1], len(tri))
    pair_query, pair_target = lpq.triple_query[pair_tri, pair_side], lpq.target[pair_tri, pair_side]
    cand, row_of = lpq.candidates, np.full(len(lpq.queries), -1)
    # a first block of 1/16 the size: the progress line's rate and ETA come from a measurement within a minute
    bounds = [0, *range(min(len(queries), max(1, block // 16)), len(queries), block), len(queries)]
    pending = None  # the previous block: (queries, rows' triple and side, ranks and finiteness still on the device)
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs = queries[start:end]
        side, r, e = (np.broadcast_to(x[:, None], (len(qs), len(cand))) for x in lpq.queries[qs].T)
        c = np.broadcast_to(cand, side.shape)
        # side 0 asks (?, r, e): candidates are heads; side 1 asks (e, r, ?): candidates are tails
        triples = np.stack([np.where(side == 0, c, e), r, np.where(side == 0, e, c)], -1).reshape(-1, 3)
        scores = score(triples).view(len(qs), len(cand))
        known = known_mask(lpq, qs)
        row_of[qs] = np.arange(len(qs))
        sel = np.nonzero(row_of[pair_query] >= 0)[0]
        row = bert.to_device(torch.from_numpy(row_of[pair_query[sel]]), scores.device)
        row_of[qs] = -1
        target = bert.to_device(torch.from_numpy(pair_target[sel]), scores.device)
        filtered = query_ranks(scores, row, target, bert.to_device(known, scores.device))
        ranks = torch.stack([*filtered, *query_ranks(scores, row, target)], 1)  # then the raw ones
        if pending:
            yield finish_block(*pending)
        pending = qs, np.stack([pair_tri[sel], pair_side[sel]], 1), ranks, torch.isfinite(scores).all()
        if not (scores.device.type == "cuda" if overlap is None else overlap):
            yield finish_block(*pending)
            pending = None
    if pending:
        yield finish_block(*pending)


def finish_block(qs, tri_side, ranks, finite):
    """(queries, rows) of a ranked block, once the device has computed them."""
    if not finite:
        raise SystemExit("error: the model gives non-finite scores (NaN/inf); no ranks computed")
    return qs, np.concatenate([tri_side, ranks.cpu().numpy()], 1)


def rank_split(scorer, kg, split, limit=None, seed=0, sample=None, near=None):
    """Filtered realistic mr, mrr, hits@k of a split (or a seeded `limit` of its triples) in one process, for train.py's
    dev report. sample: rank against that many seeded entities plus the triples' own, not all: cheap, and it flatters.
    near (E, n) with a sample: estimate the exact ranks instead (stratified_ranks, `sample` draws), also unbiased."""
    lpq = data.lp_queries(kg, split)
    tri = select(len(lpq.target), limit, seed)
    if sample and sample < len(lpq.candidates) and near is not None:
        r, scored = stratified_ranks(scorer, lpq, tri, seed, near, sample)
        return {"mr": float(r.mean()), "mrr": float(np.mean(1 / r)), "candidates": scored, "estimate": True,
                **{f"hits@{k}": float(np.mean(r <= k)) for k in KS}}
    if sample and sample < len(lpq.candidates):
        picked = np.union1d(np.random.default_rng(seed).choice(lpq.candidates, sample, replace=False),
                            getattr(kg, split)[tri][:, [0, 2]])  # the triples' own entities are always in
        lpq = data.lp_queries(kg, split, picked)
    block = max(1, (1 << 16) // len(lpq.candidates))
    rows = [r for _, r in rank_queries(scorer, lpq, tri, np.unique(lpq.triple_query[tri]), block)]
    return lp_metrics(np.concatenate(rows))["filtered"]["both"]["realistic"] | {"candidates": len(lpq.candidates)}


def link_prediction(run, scorer, kg, info, state_dir, ddp_rank, world_size):
    """Filtered ranks of every (or --limit seeded random) test triple, as head and as tail; sharded, resumable. The
    state keeps every test triple a scored query ranks: a larger --limit (same seed) scores only unseen queries."""
    lpq = data.lp_queries(kg, run.split, run.candidates)
    T, C = len(lpq.target), len(lpq.candidates)
    first = select(T, run.limit, run.seed, ordered=True)
    tri, estimate = np.sort(first), len(first) < T
    # queries in the order the permutation first asks them: a ranking stopped anywhere has ranked whole triples at
    # the subset's start, so a smaller --limit answers from its state at once
    asked = lpq.triple_query[first].ravel()
    needed = asked[np.sort(np.unique(asked, return_index=True)[1])]
    mine = needed[ddp_rank::world_size]  # round robin: every rank gets head and tail queries alike
    settings = dict(checkpoint_sha256=info["identity"], data=kg.name, data_fingerprint=kg.fingerprint,
                    text=info["text"], prompts=info["prompts"], max_seq_length=info["max_seq_length"], split=run.split,
                    candidates=run.candidates, seed=run.seed, dtype=scorer.dtype)
    state = State(state_dir, settings, ddp_rank, T)
    if dist.is_initialized():
        dist.barrier()  # every rank has read the old state before any rank writes
    ranked = lpq.triple_query[state.prior[:, 0], state.prior[:, 1]]  # the queries of the saved ranks
    todo = mine[~np.isin(mine, ranked)]  # only these: a block of saved and new queries would score the saved again
    resumed = int(np.isin(needed, ranked).sum())
    fresh = len(needed) - resumed  # a resumed ranking scores only the queries not yet saved
    if ddp_rank == 0:  # the cost, before any of it is spent
        print(f"{kg.name} {run.split}: {len(tri):,} of {T:,} triples, {len(needed):,} queries, {resumed:,} ranked "
              f"before (in {state.folder}): {fresh:,} x {C:,} candidates = {fresh * C:,} pairs to score",
              file=sys.stderr)
    whole = -(-len(np.unique(lpq.triple_query)) // world_size) if estimate else None  # per rank, as the rate is
    progress = Progress(len(todo), "queries" + (f" on rank 0 of {world_size}" if world_size > 1 else ""), ddp_rank == 0,
                        whole)
    saved = time.time()
    try:
        for qs, rows in rank_queries(scorer, lpq, np.arange(T), todo, max(1, run.block_rows // C)):
            state.new.append(rows)
            progress.update(len(qs))
            stop = run.stop_after_queries is not None and progress.done >= run.stop_after_queries
            if stop or time.time() - saved >= run.save_every:
                state.save()
                saved = time.time()
            if stop:
                raise SystemExit(f"stopped after {progress.done} queries; the same command resumes from {state.folder}")
    except KeyboardInterrupt:  # Ctrl-C (or the run book's SIGINT at its budget): every finished query is kept
        state.save()
        raise SystemExit(f"stopped after {progress.done} queries (Ctrl-C); the same command resumes from "
                         f"{state.folder}") from None
    state.save()
    progress.update(0, force=True)
    # process 0 brings the earlier runs' ranks
    mine_rows = np.concatenate([state.prior if ddp_rank == 0 else NO_ROWS, *state.new])
    rows = gather_rows(torch.from_numpy(mine_rows).to(scorer.device)).cpu().numpy()
    rows = rows[np.unique(rows[:, 0] * 2 + rows[:, 1], return_index=True)[1]]  # one row per triple and side
    rows = rows[np.isin(rows[:, 0], tri)]  # the state may hold more triples than this --limit asks for
    if len(rows) != 2 * len(tri):
        raise SystemExit(f"error: {len(rows)} of {2 * len(tri)} ranks found; remove {state.folder} and run again")
    counts = dict(test_triples=T, ranked_triples=len(tri), queries=len(needed), candidates=C,
                  resumed_queries=resumed, scored_triples=fresh * C)  # scored_triples: by this run
    metrics = lp_metrics(rows) | {"interval95": bootstrap_interval(rows, seed=run.seed) if estimate else None}
    note = f"estimate ({len(tri)} of {T} {run.split} triples)" if estimate else f"all {T} {run.split} triples"
    return dict(task="lp", split=run.split, estimate=estimate, counts=counts, metrics=metrics, note=note), state


def print_lp(result, raw):
    """Prints the metrics; returns the summary row's MR, MRR and Hits@k (an estimate's with their 95% interval)."""
    c, m = result["counts"], result["metrics"]
    pad = result["settings"]["padded_per_real_token"]  # None when every query came from the saved state
    print(f"{result['data']} {result['split']}: {result['note']}, {c['candidates']:,} candidates, {c['queries']:,} "
          f"queries ({c['resumed_queries']:,} resumed), {c['scored_triples']:,} triples scored"
          + (f" ({pad:.2f} padded tokens per real one)" if pad is not None else " (all ranks resumed)"))
    for setting in ("filtered", "raw") if raw else ("filtered",):
        print(f"{setting + ', realistic ranks':26} {'MR':>8} {'MRR':>7} " + " ".join(f"{f'H@{k}':>7}" for k in KS))
        for side in ("head", "tail", "both"):
            r = m[setting][side]["realistic"]
            print(f"  {side:24} {r['mr']:8.2f} {r['mrr']:7.4f} " + " ".join(f"{r[f'hits@{k}']:7.4f}" for k in KS))
    b, r, ci = m["filtered"]["both"], m["filtered"]["both"]["realistic"], m["interval95"]
    print("ties: MRR optimistic {:.4f}, realistic {:.4f}, pessimistic {:.4f}, expected {:.4f}".format(
        *(b[k]["mrr"] for k in ("optimistic", "realistic", "pessimistic", "expected"))))
    shown = lambda key, fmt=".4f": f"{r[key]:{fmt}}" + (f" [{ci[key][0]:{fmt}}, {ci[key][1]:{fmt}}]" if ci else "")
    if ci:
        print(f"95% interval, filtered realistic, both sides (bootstrap over the {c['ranked_triples']:,} sampled "
              f"triples, {ci['resamples']:,} resamples, seed {ci['seed']}):")
        print("  " + "  ".join(f"{name} {shown(key, '.2f' if key == 'mr' else '.4f')}"
                               for name, key in [("MR", "mr"), ("MRR", "mrr")] + [(f"H@{k}", f"hits@{k}") for k in KS]))
    return [f"{r['mr']:.2f}"] + [shown(key) for key in ["mrr"] + [f"hits@{k}" for k in KS]]


# ----------------------------------------------------------------------------- triple classification
def score_all(scorer, triples, block_rows, ddp_rank, world_size, progress):
    """Scores (N,) float64 of all triples; each rank scores every world-th one, then all are gathered."""
    idx = np.arange(len(triples))[ddp_rank::world_size]
    parts = [torch.zeros(0, device=scorer.device)]
    for i in range(0, len(idx), block_rows):
        parts.append(scorer(triples[idx[i:i + block_rows]]))
        progress.update(len(parts[-1]))
    s = torch.cat(parts).double()
    both = gather_rows(torch.stack([torch.from_numpy(idx).to(s), s], 1)).cpu().numpy()
    return both[np.argsort(both[:, 0]), 1]  # in the triples' order


def triple_classification(run, scorer, kg, ddp_rank, world_size):
    """Accuracy at a threshold tuned on dev (--per-relation: one per relation, else the global one); test errors."""
    progress = Progress(len(kg.dev[ddp_rank::world_size]) + len(kg.test[ddp_rank::world_size]), "triples",
                        enabled=ddp_rank == 0)
    s = {split: score_all(scorer, getattr(kg, split), run.block_rows, ddp_rank, world_size, progress)
         for split in ("dev", "test")}
    progress.update(0, force=True)
    theta, _ = best_threshold(s["dev"], kg.dev_labels)
    by_relation = {r: best_threshold(s["dev"][kg.dev[:, 1] == r], kg.dev_labels[kg.dev[:, 1] == r])[0]
                   for r in np.unique(kg.dev[:, 1])} if run.per_relation else {}
    thresholds = np.full(len(kg.relations), theta)  # the global one where a relation has no dev triples
    thresholds[list(by_relation)] = list(by_relation.values())
    right = {split: (s[split] > thresholds[getattr(kg, split)[:, 1]]) == getattr(kg, f"{split}_labels")
             for split in ("dev", "test")}
    rel = kg.test[:, 1]
    table = [dict(relation=kg.rel_text[r], n=int((rel == r).sum()), error=float(1 - right["test"][rel == r].mean()))
             for r in np.unique(rel)]
    jsonable = lambda x: x if np.isfinite(x) else str(x)  # JSON has no infinities
    return dict(task="tc", estimate=False, counts=dict(dev=len(kg.dev), test=len(kg.test)),
                metrics=dict(dev_accuracy=float(right["dev"].mean()), test_accuracy=float(right["test"].mean()),
                             threshold=jsonable(theta), per_relation_thresholds=run.per_relation,
                             relation_thresholds={kg.relations[r]: jsonable(t) for r, t in by_relation.items()} or None,
                             test_error_by_relation=table)), None


def print_tc(result):
    """Prints the accuracies and the test errors by relation; returns the summary row's two accuracies."""
    m = result["metrics"]
    how = "one threshold per relation" if m["per_relation_thresholds"] else f"threshold {m['threshold']}"
    print(f"{result['data']}: dev accuracy {m['dev_accuracy']:.4f}, test accuracy {m['test_accuracy']:.4f} "
          f"({how}, tuned on dev)")
    print("| relation | n | error % |\n|---|---|---|")
    for row in m["test_error_by_relation"]:
        print(f"| {row['relation']} | {row['n']} | {100 * row['error']:.1f} |")
    return [f"{m['dev_accuracy']:.4f}", f"{m['test_accuracy']:.4f}"]


# ----------------------------------------------------------------------------- command line
def checkpoint_file(path):
    """--ckpt: a checkpoint file, or a run folder of train.py: its best.safetensors (best on dev), else its ckpt."""
    p = Path(path)
    if p.is_dir():
        found = [p / name for name in ("best.safetensors", "ckpt.safetensors") if (p / name).is_file()]
        if not found:
            raise SystemExit(f"error: --ckpt {path}: a folder without best.safetensors or ckpt.safetensors "
                             "(give a run folder of train.py, or a checkpoint file)")
        return found[0]
    if not p.exists():
        raise SystemExit(f"error: --ckpt {path}: no such checkpoint file or run folder")
    return p


def resolve_source(run):
    """Fills in run.ckpt (no --ckpt and no --model: the adapter shipped for the dataset) and run.data from the
    checkpoint's metadata alone (returned; None: zero-shot): command-line mistakes surface before the model loads."""
    if run.model:
        run.data = run.data or DEFAULT_DATA[run.task]
        return None
    if run.ckpt:
        ckpt = checkpoint_file(run.ckpt)
    else:
        if run.data and run.data.lower() not in data.DATASETS:
            raise SystemExit(f"error: --data {run.data}: adapters are shipped for the benchmarks only; give --ckpt")
        name = data.dataset(run.data or DEFAULT_DATA[run.task])[0]
        ckpt = files.ROOT / "weights" / f"palt-{name}-minilm.safetensors"  # the project's, whatever PALT_WEIGHTS says
        if not ckpt.is_file():
            raise SystemExit(f"error: no shipped adapter {ckpt}: train one with python train.py --data {name}, "
                             f"then --ckpt runs/{name}-minilm")
    _, meta = palt.read_checkpoint(ckpt, tensors=False)  # the tensors load once, with the model
    bench = lambda d: d.lower() if d.lower() in data.DATASETS else None  # a graph's folder: the fingerprint decides
    if run.data and bench(meta["data"]) != bench(run.data):
        raise SystemExit(f"error: {ckpt} was trained on {meta['data']}, not {run.data}")
    if run.text not in (None, meta["text"]):
        raise SystemExit(f"error: {ckpt} was trained with --text {meta['text']}, not {run.text}")
    run.ckpt, run.data = str(ckpt), run.data or meta["data"]
    return meta


def results_path(run, shipped):
    """(results JSON, ranking state folder): --out and its .state; else beside the checkpoint, else in results/. The
    state's name leaves --limit out: a rerun with a larger --limit and the same seed finds it and grows the estimate."""
    if run.out:
        return Path(run.out), Path(run.out).with_suffix(".state")
    name, ckpt = data.dataset(run.data, run.data_dir)[0], Path(run.ckpt or "")
    folder, stem = (Path("results"), f"{name}-zeroshot-{Path(run.model).name}") if run.model else \
        (Path("results"), f"{name}-{ckpt.stem}") if shipped else \
        (ckpt.parent, f"eval-{name}{'' if ckpt.stem == 'ckpt' else '-' + ckpt.stem}")  # best and ckpt: two files
    stem += f"-{run.task}" + (f"-{run.split}" if run.task == "lp" else "")
    return (folder / (stem + (f"-limit{run.limit}-seed{run.seed}" if run.limit else "") + ".json"),
            folder / f"{stem}-seed{run.seed}.state")


def train_summary(meta):
    """How a checkpoint was trained (None where older ones lack it): enough to rerun it (`recipe`) and tell it apart."""
    if meta is None:
        return None
    run, arch = json.loads(meta.get("run", "{}")), meta.get("palt", {})
    for k in ("out", "data_dir", "model"):  # a machine's absolute paths stay on that machine
        if isinstance(run.get(k), str) and os.path.isabs(run[k]):
            run[k] = files.project_path(run[k])
    return {"method": "finetune" if arch.get("finetune") else "palt", "model": meta.get("model"),
            **{k: arch.get(k) for k in ("prompts", "calib_layers", "prompt_encoder", "prompt_mlp")},
            **{k: run.get(k) for k in ("lr", "batch", "negatives", "seed")},
            "epochs": meta.get("epoch"), "epochs_scheduled": run.get("epochs"), "steps": meta.get("step"),
            "dtype": meta.get("dtype"), "wall_s": meta.get("train_wall_s"), "tunable": meta.get("tunable"),
            "dev": meta.get("dev"), "best_epoch": meta.get("best_epoch"), "recipe": run or None,
            # 'train': negatives redrawn when a train triple; checkpoints before 2026-11-28 lack the key and
            # redrew any train, dev or test fact
            **{k: meta[k] for k in ("negative_filter",) if k in meta}}


def load_model(run, device):
    """(PALT model, tokenizer, info): from the checkpoint, or zero-shot from a base model with a pretrained NSP head."""
    if run.ckpt:
        model, meta, loaded = palt.load_checkpoint(run.ckpt)
        identity = files.sha256_file(run.ckpt)  # the resume key: these very tensors, on any machine
    else:
        model, loaded = palt.build_palt(run.model, palt.PaltConfig(**ZERO_SHOT))
        if loaded.new_heads:
            raise SystemExit(f"error: {run.model} has no pretrained NSP head, so zero-shot scores would be random; "
                             "give --ckpt")
        identity = loaded.weights_sha256
        meta = dict(model=run.model, text=run.text or "name", prompts=[0, 0, 0], max_seq_length=192)
    info = dict(model=meta["model"], ckpt=run.ckpt and files.project_path(run.ckpt), identity=identity,
                weights_sha256=loaded.weights_sha256, text=meta["text"], prompts=[int(p) for p in meta["prompts"]],
                max_seq_length=run.max_seq_length or int(meta["max_seq_length"]))
    return model.to(device).eval(), loaded.tokenizer, info


def shortlist_size(text):
    if text == "all" or (text.isdigit() and int(text) > 0):
        return text if text == "all" else int(text)
    raise argparse.ArgumentTypeError(f"expected a number of candidates or all, not {text!r}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    task = ap.add_mutually_exclusive_group(required=True)
    task.add_argument("--tc", dest="task", action="store_const", const="tc", help="triple classification")
    task.add_argument("--lp", dest="task", action="store_const", const="lp", help="filtered link prediction")
    task.add_argument("--predict", dest="task", action="store_const", const="predict", help="top-k completions")
    ap.add_argument("query", nargs="*", metavar="QUERY", help="HEAD RELATION or '?' RELATION TAIL (text:X: new entity)")
    ap.add_argument("--queries", help="--predict: a file of queries, one a line, tab-separated as QUERY")
    ap.add_argument("--data", help=f"{', '.join(data.DATASETS)}, or a graph's folder (default: the checkpoint's)")
    ap.add_argument("--data-dir", help="folder of the dataset folders (default $PALT_DATA, else ./data)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--ckpt", help="a train.py checkpoint or run folder (best, else ckpt); default: the shipped one")
    src.add_argument("--model", help="zero-shot: a base model with a pretrained NSP head (e.g. bert-base-uncased)")
    ap.add_argument("--out", help="results JSON (default: beside the checkpoint, or results/); --predict: a TSV")
    ap.add_argument("--split", default="test", choices=["test", "dev"], help="--lp: the split ranked")
    ap.add_argument("--candidates", default="split", choices=["split", "all"], help="entities: in any split, or all")
    ap.add_argument("--limit", type=int, help="--lp: a seeded random N test triples (an estimate, 95%% interval)")
    ap.add_argument("--seed", type=int, default=0, help="--limit: the subset and the bootstrap")
    ap.add_argument("--raw", action="store_true", help="--lp: print raw (unfiltered) ranks too (always in the JSON)")
    ap.add_argument("--per-relation", action="store_true", help="--tc: one threshold per relation")
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--shortlist", type=shortlist_size, help=f"--predict: score at most N candidates chosen as "
                    f"predict.py says, or all (default where a graph has over {ALL_UP_TO:,}: {SIZE:,})")
    ap.add_argument("--tokens", type=int, help="padded tokens per batch (default 16384 on CPU, 262144 on GPU)")
    ap.add_argument("--block-rows", type=int, default=1 << 16, help="candidate triples scored per block of queries")
    ap.add_argument("--save-every", type=float, default=60, help="seconds between saves of finished queries")
    ap.add_argument("--text", choices=data.TEXTS, help="zero-shot: entity texts (default name)")
    ap.add_argument("--max-seq-length", type=int, help="default: the checkpoint's, else 192")
    ap.add_argument("--dtype", choices=bert.DTYPES, default="auto", help="autocast; auto: bf16 where native, else fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile: ~40 s once, then up to x1.1 on CPU")
    ap.add_argument("--stop-after-queries", type=int, help=argparse.SUPPRESS)  # tests: stop (state saved), resume
    args = ap.parse_args(argv)
    if args.task == "predict" and bool(args.query) == bool(args.queries):
        ap.error("--predict needs one query (HEAD RELATION, or '?' RELATION TAIL) or --queries FILE")
    try:
        args.query and predict.parse_query(args.query, "--predict")
        if args.task != "predict" and (args.query or args.queries):
            ap.error(f"unexpected arguments {' '.join(args.query) or '--queries'} (only --predict takes queries)")
        args.data = args.data and (args.data.lower() if args.data.lower() in data.DATASETS else args.data)
        args.data and data.dataset(args.data, args.data_dir)  # a benchmark, or a folder with train.tsv
    except ValueError as e:  # a query that is none; a --data that is neither a benchmark nor a graph's folder
        ap.error(str(e))
    ints = ("limit", "topk", "tokens", "block_rows", "max_seq_length", "stop_after_queries")
    if args.shortlist is not None and args.task != "predict":
        ap.error("--shortlist is for --predict only: --lp and --tc always score every candidate")
    palt.check_limits(ap, args, {**{k: (1, True) for k in ints}, "seed": (0, True), "save_every": (0, False)})
    return args


def check_before_loading(run, shipped):
    """Everything that can be checked without the model, so that a mistake costs seconds, not a load: (checkpoint
    metadata or None, graph, output path or None, ranking state folder or None)."""
    meta = resolve_source(run)
    if run.max_seq_length is not None:
        palt.check_seq_length(run.max_seq_length, sum(int(p) for p in meta["prompts"]) if meta else 0)
    kg = data.load_kg(run.data, run.data_dir, text=meta["text"] if meta else run.text or "name")
    if meta and meta.get("data_fingerprint") not in (None, kg.fingerprint):
        raise SystemExit(f"error: {run.ckpt} was trained on other {kg.name} files (fingerprint "
                         f"{meta['data_fingerprint']}, these are {kg.fingerprint})")
    if run.task == "tc" and kg.task != "tc":
        raise SystemExit(f"error: {kg.name} has no labelled dev/test negatives; triple classification needs "
                         "wn11, fb13 or a folder whose test.tsv has a 4th column (1/-1)")
    need = {"tc": ["dev", "test"], "lp": [run.split]}.get(run.task, [])
    for split in [s for s in need if not len(getattr(kg, s))]:
        raise SystemExit(f"error: {kg.folder / (split + '.tsv')}: no such file (--{run.task} needs it)")
    for note in kg.notes:
        print(note, file=sys.stderr)
    out, state_dir = (run.out and Path(run.out), None) if run.task == "predict" else results_path(run, shipped)
    if out and out.is_dir():
        raise SystemExit(f"error: --out {out} is a folder; give the path of a file")
    if out:
        files.check_writable(out.parent, f"--out {out}")
    if run.queries:
        files.readable(run.queries, data.DataError)
    if out and run.task == "lp":  # the resumable ranking state
        files.check_writable(state_dir, f"{out}: its ranking state")
    return meta, kg, out, state_dir


def main(argv=None):
    t0 = time.time()
    run = parse_args(argv)
    shipped = run.ckpt is None and run.model is None
    try:
        meta, kg, out, state_dir = check_before_loading(run, shipped)
        ddp_rank, _, world_size, device, dtype = palt.init_distributed(run.dtype)
        palt.check_compiler(run.compile, device)
        model, tokenizer, info = load_model(run, device)
        palt.check_seq_length(info["max_seq_length"], sum(info["prompts"]), model.bert.config.max_position_embeddings,
                              info["model"])
        scorer = Scorer(model, data.encode(kg, tokenizer), info["prompts"], info["max_seq_length"], device, dtype,
                        run.tokens, run.compile)
        if run.task == "predict":
            return predict.predict(run, scorer, kg, tokenizer, info) if ddp_rank == 0 else None
        result, state = (link_prediction(run, scorer, kg, info, state_dir, ddp_rank, world_size) if run.task == "lp"
                         else triple_classification(run, scorer, kg, ddp_rank, world_size))
        if ddp_rank != 0:
            return
        settings = dict(text=info["text"], text_file=kg.text_file, prompts=info["prompts"], compile=run.compile,
                        max_seq_length=info["max_seq_length"], candidates=run.candidates, limit=run.limit,
                        seed=run.seed, tokens=scorer.tokens, world_size=world_size, device=str(device), dtype=dtype,
                        padded_per_real_token=round(scorer.n_padded / scorer.n_tokens, 4) if scorer.n_tokens else None)
        result = dict(command=" ".join(["python evaluate.py", *map(str, argv or sys.argv[1:])]), data=kg.name,
                      model=info["model"], ckpt=info["ckpt"], weights_sha256=info["weights_sha256"],
                      data_fingerprint=kg.fingerprint, **result, wall_s=round(time.time() - t0, 2),
                      train=train_summary(meta), settings=settings)
        row = [kg.name + (" (estimate)" if result["estimate"] else ""), info["model"], info["ckpt"] or "zero-shot"]
        row += print_lp(result, run.raw) if run.task == "lp" else print_tc(result)  # shown even if the write fails
        try:
            files.write_atomic(out, lambda f: f.write((json.dumps(result, indent=1) + "\n").encode()))
        except OSError as e:
            keep = (f"the ranks stay saved in {state.folder}: make room, and the same command writes the results "
                    "without scoring again") if state else "the metrics are printed above"
            raise SystemExit(f"error: cannot write {out} ({e.strerror or e}); the previous file is kept, "
                             f"and {keep}") from None
        if state and not result["estimate"]:  # a full ranking is written; an estimate's ranks stay for a larger --limit
            shutil.rmtree(state.folder, ignore_errors=True)
        print(f"wrote {out} ({result['wall_s']:.1f} s)")
        print("| " + " | ".join(row) + " |")
    except (data.DataError, bert.CheckpointError, palt.ConfigError) as e:
        raise SystemExit(f"error: {e}")
    finally:
        if dist.is_initialized():
            dist.barrier()  # no rank tears its connections down while another still uses them
            dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `| head` took what it wanted: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        sys.exit(1)

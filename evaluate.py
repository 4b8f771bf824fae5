"""Evaluate PALT: triple classification, and fast, honest filtered link prediction.

    python evaluate.py --lp [--limit 200] [--raw]    (the shipped adapter weights/palt-umls-minilm)
    python evaluate.py --tc --ckpt runs/wn11-minilm        (a run folder: its best.safetensors)
    python evaluate.py --predict virus causes              (top-10 tails; '?' RELATION TAIL: heads)
    torchrun --nproc_per_node 8 evaluate.py --lp --ckpt PATH   (queries split over the ranks)

A triple's score is the NSP logit margin logits[:,0] - logits[:,1] in fp32 (a softmax probability
saturates and turns distinct scores into ties). A true answer tied with k others has optimistic rank
r, pessimistic r + k and realistic r + k/2 (random tie-breaking, as PyKEEN reports); metrics use
realistic filtered ranks, the JSON has all. --data: the checkpoint's dataset, else umls (wn11 for
--tc); no --ckpt and no --model: the adapter shipped for --data.
"""
import argparse
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer

import palt
from bert import autocast
from data import KG, DataError, Encoded, build_batch, encode, seq_lengths, to_device
from support import bigrank, categories, evalcli, predict
from support.devices import hold_frozen_linears, resolve_dtype, start_processes
from support.evalcli import harmonic, random_mrr
from support.errors import ERRORS, FlagError, ScoreError, Stopped
from support.flags import Run, check_compiler, check_seq_length

KS = (1, 3, 10)  # Hits@k
MIN_ROWS = 32  # a batch's fewest rows where lengths differ (Scorer)
# link prediction's ranks: one row per test triple and side, these int64 columns
TRIPLE, SIDE, FILTERED_OPTIMISTIC, FILTERED_PESSIMISTIC, RAW_OPTIMISTIC, RAW_PESSIMISTIC = range(6)


# -------------------------------------------------------------------- ranks, metrics, thresholds
def query_ranks(scores: torch.Tensor, row: torch.Tensor, target: torch.Tensor,
                answer_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimistic (1 + #better) and pessimistic (#better or tied, the target included) rank (n,) of
    candidate target[i] in the score row scores[row[i]] (Q, C): n test triples of Q queries in one
    op. answer_mask (Q, C) bool marks each query's known answers, left out of the ranking (filtered)
    except the target itself; None: raw ranks."""
    s = scores[row]  # (n, C)
    i = torch.arange(len(row), device=s.device)
    t = s[i, target][:, None]
    keep = torch.ones_like(s, dtype=torch.bool) if answer_mask is None else ~answer_mask[row]
    keep[i, target] = True
    return 1 + ((s > t) & keep).sum(1), ((s >= t) & keep).sum(1)


def rank_metrics(optimistic: np.ndarray, pessimistic: np.ndarray) -> dict:
    """MR, MRR, Hits@k of the optimistic, pessimistic and realistic ranks, and "expected": each
    metric's exact expectation when the rank is uniform on optimistic..pessimistic (random
    tie-breaking). The MRR and Hits of the realistic (mean) rank differ from those expectations when
    there are ties; MR is the same."""
    o, p = np.asarray(optimistic, np.float64), np.asarray(pessimistic, np.float64)
    out = {}
    for kind, rank in (("optimistic", o), ("pessimistic", p), ("realistic", (o + p) / 2)):
        hits = {f"hits@{k}": (rank <= k).mean() for k in KS}
        out[kind] = {"mr": rank.mean(), "mrr": (1 / rank).mean(), **hits}
    n = p - o + 1  # the tied group's size
    hits = {f"hits@{k}": (np.clip(k - o + 1, 0, n) / n).mean() for k in KS}
    mrr = ((harmonic(p) - harmonic(o - 1)) / n).mean()
    out["expected"] = {"mr": ((o + p) / 2).mean(), "mrr": mrr, **hits}
    return {kind: {m: float(v) for m, v in d.items()} for kind, d in out.items()}


def lp_metrics(ranks: np.ndarray) -> dict:
    """ranks (n, 6), columns TRIPLE ... RAW_PESSIMISTIC -> {"filtered"|"raw": {"head"|"tail"|"both":
    rank_metrics}}; side 0 ranks the head."""
    sides = {"head": ranks[:, SIDE] == 0, "tail": ranks[:, SIDE] == 1,
             "both": np.ones(len(ranks), bool)}
    columns = {"filtered": (FILTERED_OPTIMISTIC, FILTERED_PESSIMISTIC),
               "raw": (RAW_OPTIMISTIC, RAW_PESSIMISTIC)}
    return {setting: {side: rank_metrics(ranks[m, o], ranks[m, p]) for side, m in sides.items()}
            for setting, (o, p) in columns.items()}


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(θ, accuracy) of the best rule "true iff score > θ", by exact search over -inf, the midpoints
    between distinct scores and +inf: after one sort, cumulative counts give every candidate's
    accuracy. Ties: the lowest θ."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    v, inverse = np.unique(scores, return_inverse=True)  # sorted distinct scores
    pos, neg = (np.bincount(inverse, weights=w, minlength=len(v)) for w in (labels, ~labels))
    # candidate j (0..m) lies just below v[j]: negatives under it are right, positives from v[j] up
    neg_below = np.concatenate([[0], np.cumsum(neg)])
    pos_below = np.concatenate([[0], np.cumsum(pos)])
    correct = neg_below + labels.sum() - pos_below
    j = int(np.argmax(correct))
    if j == 0:
        theta = -np.inf
    elif j == len(v):
        theta = np.inf
    else:
        theta = (v[j - 1] + v[j]) / 2
    return float(theta), float(correct[j] / len(scores))


# ----------------------------------------------------------------------------- scoring
class Scorer:
    """(N, 3) triples -> (N,) fp32 scores of a PALT model, in batches of rows of (almost) equal
    length, longest first, at most `tokens` padded tokens each; autocast in `precision` ('fp32'
    or 'bf16'; the NSP head stays fp32); compile: torch.compile fuses the casts, adds, LayerNorms
    and GELUs between the matmuls (bench/bench_eval.py)."""

    def __init__(self, model: torch.nn.Module, enc: Encoded, prompts: tuple, max_seq_length: int,
                 device: str | torch.device = "cpu", precision: str = "fp32",
                 tokens: int | None = None, compile: bool = False):
        self.model, self.enc, self.prompts = model.eval(), enc, tuple(prompts)
        self.max_seq_length, self.device = max_seq_length, torch.device(device)
        self.precision = precision
        # The token budgets that scored fastest in bench/bench_eval.py (RESULTS.md): a GPU keeps
        # busy only on big batches, a CPU's caches favour small ones.
        self.tokens = tokens or (1 << 18 if self.device.type == "cuda" else 1 << 14)
        self.forward = torch.compile(model, dynamic=True) if compile else model
        self.n_tokens = self.n_padded = 0  # real and padded tokens scored: the padding overhead

    def batch_end(self, descending: np.ndarray, i: int) -> int:
        """Where the batch that starts at row i of the lengths sorted `descending` ends. Rows of
        exactly its first (longest) row's length w, if they fill half the token budget: no padding,
        no attention mask (SDPA's unmasked kernel is the faster one); else the rows no shorter than
        w - w // 16, at least MIN_ROWS (a shortlist's small calls run faster in fewer, fuller
        batches); never more than tokens // w rows. Example, tokens 16384,
        lengths 40 x 300 then 38 x 500: 300 x 40 = 12,000 >= 8,192 fills a batch of the 300 rows of
        40; the next batch starts at 38 and takes 431 rows (16384 // 38)."""
        w = int(descending[i])
        same = int(np.searchsorted(-descending, -w, side="right"))  # the end of length w
        close = int(np.searchsorted(-descending, w // 16 - w, side="right"))  # of w - w // 16 up
        end = same if (same - i) * w >= self.tokens // 2 else max(close, i + MIN_ROWS)
        return min(i + max(1, self.tokens // w), end)

    @torch.inference_mode()
    def __call__(self, triples: np.ndarray) -> torch.Tensor:
        """(N,) fp32 scores of (N, 3) index triples, on the device."""
        triples = np.asarray(triples, np.int64).reshape(-1, 3)  # (N, 3)
        lengths = seq_lengths(self.enc, triples, self.prompts, self.max_seq_length)
        order = np.argsort(-lengths, kind="stable")
        descending = lengths[order]
        out = torch.empty(len(triples), dtype=torch.float32, device=self.device)
        i = 0
        while i < len(order):
            idx = order[i:self.batch_end(descending, i)]
            batch = build_batch(self.enc, triples[idx], self.prompts, self.max_seq_length)
            batch = {k: to_device(v, self.device) for k, v in batch.items()}
            if lengths[idx[-1]] == descending[i]:  # one length: no padding to mask
                batch["attention_mask"] = None
            with autocast(self.precision, self.device):
                logits = self.forward(**batch)
            out[to_device(torch.from_numpy(idx), self.device)] = palt.score(logits)
            self.n_tokens += int(lengths[idx].sum())
            self.n_padded += batch["input_ids"].numel()
            i += len(idx)
        return out

    def numpy(self, triples: np.ndarray) -> np.ndarray:
        """The scores as a float32 numpy array: the one place they leave the device."""
        return self(triples).cpu().numpy()


# ----------------------------------------------------------------------------- link prediction
@dataclass(eq=False)
class LPQueries:
    candidates: np.ndarray  # (C,) entity indices that are ranked
    queries: np.ndarray  # (Q,3) rows (side, r, e): side 0 = (?, r, t=e), side 1 = (h=e, r, ?)
    triple_query: np.ndarray  # (T,2) index of each triple's head query and tail query
    target: np.ndarray  # (T,2) position in candidates of each triple's true head and tail
    # (Q+1,) CSR: filter_pos[filter_ptr[q]:filter_ptr[q+1]] are the positions in candidates of
    # every known answer of query q (the triple's own one included)
    filter_ptr: np.ndarray
    filter_pos: np.ndarray


def lp_queries(kg: KG, split: str = "test", candidates: str | np.ndarray = "split") -> LPQueries:
    """Unique (?, r, t) and (h, r, ?) queries of a split, so each query's candidates are scored
    once. candidates: 'split' (entities in any split), 'all' (every entity with text), or an array
    of entity indices (a sample).

    A query (side, r, e) is one int64, (side*R + r)*E + e, so that np.unique sorts and numbers them.
    Example, E = 10, R = 2: the triple (3, 1, 7) asks (?, 1, 7), key (0*2 + 1)*10 + 7 = 17, and (3,
    1, ?), key (1*2 + 1)*10 + 3 = 33; every known fact (h, r, t) answers the query keyed like its
    own head query with h and the one keyed like its own tail query with t."""
    E, R = len(kg.entities), len(kg.relations)
    triples, labels = getattr(kg, split), getattr(kg, f"{split}_labels", None)
    if labels is not None:
        triples = triples[labels]  # triple classification: its true triples
    cand = candidates
    if isinstance(candidates, str):
        cand = {"split": kg.split_entities, "all": np.arange(E)}[candidates]
    where = np.full(E, -1, dtype=np.int64)  # entity -> its position in cand
    where[cand] = np.arange(len(cand))
    h, r, t = triples.T
    head_keys, tail_keys = r * E + t, (R + r) * E + h
    ukey, inv = np.unique(np.concatenate([head_keys, tail_keys]), return_inverse=True)
    # the known facts, as answers of those keys
    fh, fr, ft = kg.known // (R * E), kg.known // E % R, kg.known % E
    akey = np.concatenate([fr * E + ft, (R + fr) * E + fh])
    ans = where[np.concatenate([fh, ft])]
    # an answer outside a candidate sample is not ranked: nothing to filter
    keep = (ans >= 0) & np.isin(akey, ukey)
    order = np.lexsort((ans[keep], akey[keep]))  # by query, then by position
    ptr = np.append(np.searchsorted(akey[keep][order], ukey), keep.sum())
    queries = np.stack([ukey // (R * E), ukey // E % R, ukey % E], 1)
    triple_query = inv.reshape(2, -1).T.copy()  # (2T,) -> (T, 2): head query, tail query
    target = np.stack([where[h], where[t]], 1)
    return LPQueries(candidates=cand, queries=queries, triple_query=triple_query, target=target,
                     filter_ptr=ptr, filter_pos=ans[keep][order])


def naive_ranks(scorer: Scorer, lpq: LPQueries, tri: np.ndarray) -> np.ndarray:
    """The definition, one test triple and side at a time (the tests hold rank_queries to it): score
    every candidate; the filtered rank counts the candidates that beat the answer, leaving out the
    other known answers. (n, 4) rows: test triple, side, optimistic rank (1 + those better),
    pessimistic rank (1 + those better or tied)."""
    rows = []
    for i in tri:
        for side in (0, 1):  # side 0 asks (?, r, e): candidates are heads; side 1 (e, r, ?): tails
            q, answer = lpq.triple_query[i, side], lpq.target[i, side]
            _, r, e = lpq.queries[q]
            if side == 0:
                scores = scorer.numpy([(c, r, e) for c in lpq.candidates])
            else:
                scores = scorer.numpy([(e, r, c) for c in lpq.candidates])
            answer_positions = lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]]
            others = set(answer_positions) - {answer}  # the filter
            rivals = np.array([x for j, x in enumerate(scores) if j != answer and j not in others])
            better, tied = (rivals > scores[answer]).sum(), (rivals == scores[answer]).sum()
            rows.append((i, side, 1 + better, 1 + better + tied))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)  # (n, 4), also when n = 0


def answer_masks(lpq: LPQueries, qs: np.ndarray) -> torch.Tensor:
    """(len(qs), C) bool: True at each query's known answers, the true triples of train, dev and
    test (the filter)."""
    mask = torch.zeros((len(qs), len(lpq.candidates)), dtype=torch.bool)
    for k, q in enumerate(qs):
        mask[k, torch.from_numpy(lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]])] = True
    return mask


def rank_queries(scorer: Scorer, lpq: LPQueries, tri: np.ndarray, queries: np.ndarray, block: int,
                 overlap: bool | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Rank the test triples `tri` for these queries, `block` at a time: a query's candidates are
    scored once, into a (block, C) tensor shared by every test triple that asks it. Yields (its
    queries, ranks as in lp_metrics). overlap (default: on a GPU): one block behind, so the next
    block's batches are built and queued before this block's ranks are waited for (on a CPU the work
    is done when the call returns: nothing to overlap)."""
    pair_tri, pair_side = np.repeat(tri, 2), np.tile([0, 1], len(tri))  # each triple, as both sides
    pair_query, pair_target = lpq.triple_query[pair_tri, pair_side], lpq.target[pair_tri, pair_side]
    cand = lpq.candidates
    pending = None  # the previous block: (queries, its pairs, ranks and finiteness on the device)
    for start in range(0, len(queries), block):
        qs = queries[start:start + block]
        side, r, e = (np.broadcast_to(x[:, None], (len(qs), len(cand))) for x in lpq.queries[qs].T)
        c = np.broadcast_to(cand, side.shape)
        # side 0 asks (?, r, e): candidates are heads; side 1 asks (e, r, ?): candidates are tails
        triples = np.stack([np.where(side == 0, c, e), r, np.where(side == 0, e, c)], -1)
        # (queries, C, 3) -> (queries*C, 3) scored -> (queries, C)
        scores = scorer(triples.reshape(-1, 3)).view(len(qs), len(cand))
        # the pairs that ask this block's queries, and the score row of each
        row_in_block = np.full(len(lpq.queries), -1)
        row_in_block[qs] = np.arange(len(qs))
        sel = np.nonzero(row_in_block[pair_query] >= 0)[0]
        row = to_device(torch.from_numpy(row_in_block[pair_query[sel]]), scores.device)
        target = to_device(torch.from_numpy(pair_target[sel]), scores.device)
        answer_mask = to_device(answer_masks(lpq, qs), scores.device)
        filtered = query_ranks(scores, row, target, answer_mask)
        ranks = torch.stack([*filtered, *query_ranks(scores, row, target)], 1)  # then the raw ones
        if pending:
            yield finish_block(*pending)
        tri_side = np.stack([pair_tri[sel], pair_side[sel]], 1)
        pending = qs, tri_side, ranks, torch.isfinite(scores).all()
        if not (scores.device.type == "cuda" if overlap is None else overlap):
            yield finish_block(*pending)
            pending = None
    if pending:
        yield finish_block(*pending)


def finish_block(qs: np.ndarray, tri_side: np.ndarray, ranks: torch.Tensor,
                 finite: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(queries, ranks) of a ranked block, once the device has computed them."""
    if not finite:
        raise ScoreError("the model gives non-finite scores (NaN/inf); no ranks computed")
    return qs, np.concatenate([tri_side, ranks.cpu().numpy()], 1)


def rank_split(scorer: Scorer, kg: KG, split: str, limit: int | None = None, seed: int = 0,
               sample: int | None = None, near: np.ndarray | None = None) -> dict:
    """Filtered realistic mr, mrr, hits@k of a split (or a seeded `limit` of its triples) in one
    process, for train.py's dev report, and random_mrr there. sample: rank against that many seeded
    entities plus the triples' own, not all: cheap, and it flatters. near (E, n) with a sample:
    estimate the exact ranks instead (bigrank.stratified_ranks, `sample` draws): their MR, unbiased,
    and their inverse rank, a figure that orders checkpoints (the mean of 1 / an estimated rank: no
    MRR, RESULTS.md)."""
    lpq = lp_queries(kg, split)
    tri = bigrank.select(len(lpq.target), limit, seed)
    if sample and sample < len(lpq.candidates) and near is not None:
        estimated, _, scored = bigrank.stratified_ranks(scorer=scorer, lpq=lpq, tri=tri, seed=seed,
                                                        near=near, draws=sample)
        # The MR is unbiased; the mean of 1 / an estimated rank is no MRR, since it runs above it.
        return {"mr": float(estimated.mean()), "inverse_rank": float(np.mean(1 / estimated)),
                "candidates": scored, "estimate": True}
    if sample and sample < len(lpq.candidates):
        drawn = np.random.default_rng(seed).choice(lpq.candidates, sample, replace=False)
        # the triples' own entities are always in
        lpq = lp_queries(kg, split, np.union1d(drawn, getattr(kg, split)[tri][:, [0, 2]]))
    block = max(1, (1 << 16) // len(lpq.candidates))
    queries = np.unique(lpq.triple_query[tri])
    scorer = bigrank.Reported(scorer, len(queries) * len(lpq.candidates))  # a line once a minute
    blocks = rank_queries(scorer=scorer, lpq=lpq, tri=tri, queries=queries, block=block)
    ranks = np.concatenate([rows for _, rows in blocks])
    metrics = lp_metrics(ranks)["filtered"]["both"]["realistic"]
    return metrics | {"candidates": len(lpq.candidates), "random_mrr": random_mrr(lpq, tri)}


def dev_metric(model: torch.nn.Module, kg: KG, enc: Encoded, run: Run, device: torch.device,
               precision: str, near: np.ndarray | None = None) -> tuple[dict, str]:
    """(figure, its log line) of train.py's dev point: accuracy at the threshold tuned on dev itself
    (an upper estimate), or the filtered MRR of the same seeded dev_limit dev triples every epoch,
    against all entities or a sample; with dev_near, an estimated MR and inverse rank (no MRR)."""
    scorer = Scorer(model=model, enc=enc, prompts=run.prompts, max_seq_length=run.max_seq_length,
                    device=device, precision=precision)
    if kg.task == "tc":
        scores = scorer.numpy(kg.dev)
        acc = best_threshold(scores, kg.dev_labels)[1]
        chance = chance_accuracy(scores, kg.dev_labels)
        figure = {"metric": "accuracy", "value": acc, "random": chance[0]}
        return figure, f"accuracy {acc:.4f}" + evalcli.chance_note(acc, *chance, "accuracy")
    near = near[:, :run.dev_near] if run.dev_near else None
    m = rank_split(scorer=scorer, kg=kg, split="dev", limit=run.dev_limit, sample=run.dev_sample,
                   near=near)
    triples = min(run.dev_limit or len(kg.dev), len(kg.dev))
    figure = {"mr": m["mr"], "triples": triples, "candidates": m["candidates"]}
    if "estimate" in m:  # the big graphs: MR, and an inverse rank that orders checkpoints; no MRR
        figure |= {"metric": "inverse_rank", "value": m["inverse_rank"], "sampled": False,
                   "estimate": True}
        return figure, (f"inverse rank {m['inverse_rank']:.4f}, MR {m['mr']:.2f} on {triples} "
                        f"dev triples (stratified estimate, {m['candidates']:,} candidates scored "
                        "a query: MR unbiased; the inverse rank, the mean of 1 / an estimated "
                        "rank, orders checkpoints as the exact MRR does but runs ~2x it: not an "
                        "MRR)")
    sampled = bool(run.dev_sample and m["candidates"] < len(kg.split_entities))
    figure |= {"metric": "mrr", "value": m["mrr"], "hits@10": m["hits@10"], "sampled": sampled,
               "estimate": False, "random": m["random_mrr"][0]}
    against = f"against {m['candidates']:,} {'sampled ' if sampled else ''}candidates"
    line = (f"mrr {m['mrr']:.4f}, MR {m['mr']:.2f}, Hits@10 {m['hits@10']:.4f} on "
            f"{triples} dev triples {against}")
    return figure, line + evalcli.chance_note(m["mrr"], *m["random_mrr"], "MRR")


def chance_accuracy(scores: np.ndarray, labels: np.ndarray, n: int = 20,
                    seed: int = 0) -> tuple[float, float]:
    """(mean, sd) of best_threshold's accuracy when the labels are shuffled (`n` seeded
    permutations): what a threshold tuned on scores that carry nothing reaches on these triples."""
    rng = np.random.default_rng(seed)
    acc = [best_threshold(scores, rng.permutation(labels))[1] for _ in range(n)]
    return float(np.mean(acc)), float(np.std(acc))


def link_prediction(args: argparse.Namespace, scorer: Scorer, kg: KG, info: dict, state_dir: Path,
                    ddp_rank: int, world_size: int) -> tuple[dict, bigrank.State]:
    """Filtered ranks of every (or --limit seeded random) test triple, as head and as tail, sharded
    over the ranks and resumable (bigrank.ranked_rows), and their metrics."""
    lpq = lp_queries(kg, args.split, args.candidates)
    rank_block = functools.partial(rank_queries, scorer, lpq, np.arange(len(lpq.target)))
    ranks, tri, counts, state = bigrank.ranked_rows(
        args=args, lpq=lpq, kg=kg, info=info, state_dir=state_dir, rank_block=rank_block,
        scorer=scorer, ddp_rank=ddp_rank, world_size=world_size)
    T, estimate = len(lpq.target), len(tri) < len(lpq.target)
    realistic = (ranks[:, FILTERED_OPTIMISTIC] + ranks[:, FILTERED_PESSIMISTIC]) / 2
    interval = None
    if estimate:
        interval = evalcli.bootstrap_interval(realistic, ranks[:, TRIPLE], KS, seed=args.seed)
    metrics = lp_metrics(ranks) | {"interval95": interval}
    note = f"all {T} {args.split} triples"
    if estimate:
        note = f"estimate ({len(tri)} of {T} {args.split} triples)"
    result = dict(task="lp", split=args.split, estimate=estimate, counts=counts, metrics=metrics,
                  note=note)
    if args.per_relation:  # the relation categories: (n, 4) rows of triple, side and two ranks
        columns = [TRIPLE, SIDE, FILTERED_OPTIMISTIC, FILTERED_PESSIMISTIC]
        result |= categories.report(kg, lpq, ranks[:, columns])
    return result, state


# --------------------------------------------------------------------- triple classification
def triple_classification(args: argparse.Namespace, scorer: Scorer, kg: KG, ddp_rank: int,
                          world_size: int) -> tuple[dict, None]:
    """Accuracy at a threshold tuned on dev (--per-relation: one per relation, else the global one);
    test errors by relation."""
    n = len(kg.dev[ddp_rank::world_size]) + len(kg.test[ddp_rank::world_size])
    progress = bigrank.Progress(n, "triples", enabled=ddp_rank == 0)
    s = {split: bigrank.score_all(scorer=scorer, triples=getattr(kg, split),
                                  block_rows=args.block_rows, ddp_rank=ddp_rank,
                                  world_size=world_size, progress=progress)
         for split in ("dev", "test")}
    progress.update(0, force=True)
    theta, _ = best_threshold(s["dev"], kg.dev_labels)
    by_relation = {}
    for r in np.unique(kg.dev[:, 1]) if args.per_relation else ():
        at_r = kg.dev[:, 1] == r
        by_relation[r] = best_threshold(s["dev"][at_r], kg.dev_labels[at_r])[0]
    thresholds = np.full(len(kg.relations), theta)  # the global one where a relation has no dev
    thresholds[list(by_relation)] = list(by_relation.values())
    right = {}
    for split in ("dev", "test"):
        said = s[split] > thresholds[getattr(kg, split)[:, 1]]
        right[split] = said == getattr(kg, f"{split}_labels")
    metrics = evalcli.tc_metrics(kg=kg, right=right, theta=theta, by_relation=by_relation,
                                 per_relation=args.per_relation)
    counts = dict(dev=len(kg.dev), test=len(kg.test))
    return dict(task="tc", estimate=False, counts=counts, metrics=metrics), None


# ----------------------------------------------------------------------------- from Python
class Predictor:
    """A trained PALT and its graph, from Python (see load): score triples, predict completions,
    rank a split. Entities and relations are named by id or text, as --predict finds them."""

    def __init__(self, scorer: Scorer, kg: KG, tokenizer: Tokenizer, info: dict):
        self.scorer, self.kg, self.tokenizer, self.info = scorer, kg, tokenizer, info

    def find(self, name: str, what: str) -> int:
        """The index of an entity or relation by id or text; else ValueError, in one line."""
        ids, texts = (self.kg.entities, self.kg.ent_text)
        if what == "relation":
            ids, texts = (self.kg.relations, self.kg.rel_text)
        return predict.find(ids, texts, str(name), what)

    def score(self, triples: list) -> np.ndarray:
        """(N,) float32 scores (NSP logit margins: higher is truer) of (head, relation, tail)
        triples named by id or text."""
        parts = ("entity", "relation", "entity")
        idx = [[self.find(x, what) for x, what in zip(t, parts)] for t in triples]
        return self.scorer.numpy(np.array(idx, np.int64).reshape(-1, 3))  # (N, 3) indices

    def predict(self, head: str | None = None, relation: str | None = None,
                tail: str | None = None, k: int = 10) -> list[tuple[str, float]]:
        """The k best completions of (head, relation, ?) or (?, relation, tail) among the entities
        of the graph's splits, every one scored: [(entity id, score)], best first."""
        if (head is None) == (tail is None) or relation is None:
            raise FlagError("give relation and one of head and tail")
        side = int(tail is None)  # 1: tails ranked, as predict.parse_query numbers it
        e = self.find(head if side else tail, "entity")
        cand = self.kg.split_entities
        s = self.scorer.numpy(predict.query_triples(e, self.find(relation, "relation"), side, cand))
        top = np.argsort(-s, kind="stable")[:k]
        return [(self.kg.entities[c], float(v)) for c, v in zip(cand[top], s[top])]

    def rank(self, split: str = "test", limit: int | None = None, seed: int = 0) -> dict:
        """Filtered realistic MR, MRR and Hits@k of a split's triples (or a seeded `limit` of
        them, the subset evaluate.py --lp --limit ranks), each ranked as head and as tail against
        the entities of every split. split: train, test, and dev or valid (one split)."""
        name = {"valid": "dev"}.get(split, split)
        if name not in ("train", "dev", "test"):
            have = [f.stem for s, f in self.kg.split_files.items() if len(getattr(self.kg, s))]
            raise DataError(f"split {split!r}: {self.kg.folder} has {', '.join(have)}")
        if not len(getattr(self.kg, name)):
            raise DataError(f"{self.kg.folder}: no {split} triples to rank")
        return rank_split(scorer=self.scorer, kg=self.kg, split=name, limit=limit, seed=seed)


def open_predictor(args: argparse.Namespace, kg: KG, device: torch.device,
                   precision: str) -> Predictor:
    """The Predictor a checked command line names (evalcli.check_before_loading), on the device."""
    model, tokenizer, info = evalcli.load_model(args, device)
    check_seq_length(info["max_seq_length"], sum(info["prompts"]),
                     model.bert.config.max_position_embeddings, info["model"])
    # A Predictor keeps its precision: the frozen linears are cast once, not per batch.
    hold_frozen_linears(model, precision)
    scorer = Scorer(model=model, enc=encode(kg, tokenizer), prompts=info["prompts"],
                    max_seq_length=info["max_seq_length"], device=device, precision=precision,
                    tokens=args.tokens, compile=args.compile)
    return Predictor(scorer, kg, tokenizer, info)


def load(ckpt: str | Path, data: str | None = None, data_dir: str | None = None,
         device: str | None = None, precision: str = "auto") -> Predictor:
    """A Predictor from a checkpoint file or train.py run folder; its graph and entity text are the
    checkpoint's (data, data_dir: where that graph is, if not where it was). The command line's
    checks, as the project's errors (support/errors.py). precision: auto, fp32 or bf16, as
    --dtype."""
    args = evalcli.parser(__doc__).parse_args(["--predict"])  # evaluate.py's defaults, no output
    args.ckpt, args.data, args.data_dir, args.dtype = str(ckpt), data, data_dir, precision
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    _, kg, _, _ = evalcli.check_before_loading(args, shipped=False)
    return open_predictor(args, kg, device, resolve_dtype(precision, device))


# ----------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> None:
    """python evaluate.py: check everything the command line names, load, score, report."""
    t0 = time.time()
    args = evalcli.parse_args(argv, __doc__)
    shipped = args.ckpt is None and args.model is None
    try:
        meta, kg, out, state_dir = evalcli.check_before_loading(args, shipped)
        procs = start_processes(args.dtype)
        check_compiler(args.compile, procs.device)
        predictor = open_predictor(args, kg, procs.device, procs.dtype)
        scorer = predictor.scorer
        if args.task == "predict":
            if procs.rank == 0:
                predict.predict(args=args, scorer=scorer, kg=kg, tokenizer=predictor.tokenizer,
                                info=predictor.info)
            return
        if args.task == "lp":
            result, state = link_prediction(
                args=args, scorer=scorer, kg=kg, info=predictor.info, state_dir=state_dir,
                ddp_rank=procs.rank, world_size=procs.world_size)
        else:
            result, state = triple_classification(
                args=args, scorer=scorer, kg=kg, ddp_rank=procs.rank, world_size=procs.world_size)
        if procs.rank == 0:
            evalcli.report(args=args, argv=argv, result=result, state=state, scorer=scorer, kg=kg,
                           info=predictor.info, meta=meta, out=out, t0=t0,
                           world_size=procs.world_size)
    except ERRORS as e:
        raise SystemExit(f"error: {e}") from None
    except Stopped as e:  # a ranking's finished queries are saved: the message says how to go on
        raise SystemExit(str(e)) from None
    finally:
        if dist.is_initialized():
            dist.barrier()  # no rank tears its connections down while another still uses them
            dist.destroy_process_group()


if __name__ == "__main__":
    evalcli.quiet_on_broken_pipe(main)

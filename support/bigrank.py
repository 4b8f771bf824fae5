"""Big rankings: what link prediction on FB15k-237 and WN18RR needs beyond the method (evaluate.py)
— ranks kept on disk so a stopped ranking resumes, progress lines with an ETA, queries sharded over
torchrun processes and gathered, seeded subsets that grow, and a stratified estimate of exact ranks
that scores ~170 candidates a query."""
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from support import files
from support.errors import OutputError, Stopped

NO_ROWS = np.zeros((0, 6), np.int64)  # no ranks yet: rows are (test triple, side, four ranks)
EVERY_S = 50  # seconds between progress lines
FIRST_S = 10  # seconds of a wait before its first progress line
PIECE_S = 10  # seconds of work between progress updates, once the rate is measured




def timed_pieces(n, first, most, seconds=PIECE_S):
    """(start, end) spans covering range(n): the first `first` long (it measures the rate), the
    rest sized by the rate so far to take about `seconds` each, at most `most`: a progress line at
    least once a minute whatever the graph, the device and the block size."""
    start, size, t0 = 0, max(1, first), time.time()
    while start < n:
        end = min(n, start + size)
        yield start, end  # the caller's work on the span runs before the generator resumes
        start = end
        rate = start / max(time.time() - t0, 1e-9)
        size = max(1, min(most, int(rate * seconds)))


def master():
    """True in the process that prints: the only one, or torchrun's process 0."""
    return not dist.is_initialized() or dist.get_rank() == 0


class Progress:
    """done/total, rate and ETA on stderr, the first line after FIRST_S seconds, then one every
    EVERY_S seconds; `whole` (units in the whole split) adds its time, once."""

    def __init__(self, total, unit, enabled=True, whole=None):
        self.total, self.unit, self.enabled, self.whole, self.done = total, unit, enabled, whole, 0
        self.t0 = time.time()
        self.shown, self.printed = self.t0 - EVERY_S + FIRST_S, -1

    def update(self, n, force=False):
        """n more done; a line if EVERY_S seconds have passed since the last (force: if anything is
        new)."""
        self.done, now = self.done + n, time.time()
        due = force and self.printed != self.done or now - self.shown > EVERY_S
        if not (self.enabled and due):
            return
        rate = self.done / max(now - self.t0, 1e-9)
        speed, eta, whole = "?/s", "?", ""
        if rate >= 1:
            speed = f"{rate:,.1f}/s"
        elif rate:
            speed = f"{1 / rate:,.1f} s each"
        if rate:
            eta = hms((self.total - self.done) / rate)
        if self.whole and rate:
            whole = f"; the whole split ({self.whole:,}) would take {hms(self.whole / rate)} here"
        print(f"{self.done:,}/{self.total:,} {self.unit} ({speed}, ETA {eta}{whole})",
              file=sys.stderr, flush=True)
        self.shown, self.whole, self.printed = now, None, self.done

    def end(self):
        """The closing line, where the wait printed one before: a short wait stays silent."""
        if self.printed >= 0:
            self.update(0, force=True)


def scored_pieces(score, triples, progress):
    """[score(a piece), ...]: the triples scored in timed_pieces (the first 256 long), each counted
    by `progress`: a line at least once a minute however slow the scoring. No triples: one call."""
    parts = []
    for i, j in timed_pieces(len(triples), 256, len(triples)):
        parts.append(score(triples[i:j]))
        progress.update(j - i)
    return parts or [score(triples)]


class Reported:
    """A scorer whose calls are scored in pieces and counted in one Progress of `total` triples (the
    closing line once they are scored): rank_split's ranking, a line at least once a minute."""

    def __init__(self, scorer, total, unit="triples scored"):
        self.scorer, self.progress = scorer, Progress(total, unit, master())

    def __call__(self, triples):
        scores = torch.cat(scored_pieces(self.scorer, triples, self.progress))
        if self.progress.done >= self.progress.total:
            self.progress.end()
        return scores


def hms(seconds):
    """Seconds as H:MM:SS."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def read_rows(path, n_triples):
    """The (n, 6) rows saved in one state file, or one line naming it: never a traceback, never a
    pickle."""
    try:
        with np.load(path, allow_pickle=False) as z:
            rows = z["rows"]
        shape_ok = rows.ndim == 2 and rows.shape[1] == 6 and rows.dtype.kind in "iu"
        ranks_ok = not len(rows) or (0 <= rows[:, 0].min() and rows[:, 0].max() < n_triples
                                     and set(rows[:, 1]) <= {0, 1} and rows[:, 2:].min() >= 1)
        if not (shape_ok and ranks_ok):
            raise ValueError(f"rows of shape {rows.shape} and dtype {rows.dtype} that are not "
                             "ranks of the test set")
    # truncated, not a zip, other arrays; numpy's words about pickles invite unsafe loading
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        if "pickle" in str(e):
            why = "pickled objects, which are never loaded"
        raise OutputError(f"{path}: damaged ranking state ({why}); delete it (or the folder "
                          f"{path.parent}) to start over") from None
    return rows.astype(np.int64)


class State:
    """The ranks finished so far, in a folder: settings.json (a rerun with other settings refuses
    rather than mix) and one rows file per process (rankP.npz), replaced atomically: a killed run
    restarts from its last save. `prior`: all processes' saves."""

    def __init__(self, folder, settings, ddp_rank, T):
        self.folder, self.path = Path(folder), Path(folder) / f"rank{ddp_rank}.npz"
        saved = self.folder / "settings.json"
        if saved.exists():
            try:
                was = json.loads(saved.read_text())
            except (OSError, ValueError) as e:
                raise OutputError(f"{saved}: damaged ranking state ({e}); delete "
                                  f"{self.folder} to start over") from None
            for k, v in settings.items():
                if was.get(k) != v:
                    raise OutputError(f"{self.folder} holds ranks made with {k} "
                                      f"{was.get(k)}, not {v}: give another --out, or delete it to "
                                      "start over")
        if ddp_rank == 0:  # two rankings never write one state
            files.lock_folder(self.folder, "a ranking state", "give another --out")
        if ddp_rank == 0 and not saved.exists():
            files.write_atomic(saved, lambda f: f.write(json.dumps(settings, indent=1).encode()))
        saves = sorted(self.folder.glob("rank*.npz"))
        self.prior = np.concatenate([NO_ROWS, *(read_rows(f, T) for f in saves)])
        self.new, self.old = [], [read_rows(self.path, T)] if self.path.exists() else []

    def save(self):
        try:
            rows = np.concatenate([NO_ROWS, *self.old, *self.new])
            files.write_atomic(self.path, lambda f: np.savez(f, rows=rows))
        except OSError as e:
            why = e.strerror or e
            raise OutputError(f"cannot save the ranking state {self.path} ({why}); "
                              "the previous save is kept: make room, and the same command resumes "
                              f"from {self.folder}") from None


def select(T, limit, seed, ordered=False):
    """All T test triples, or a seeded random `limit` of them: the first `limit` of one seeded
    permutation, so that the subset of a smaller limit is part of any larger one's (an estimate can
    grow). Sorted, or in that order."""
    if not limit or limit >= T:
        return np.arange(T)
    first = np.random.default_rng(seed).permutation(T)[:limit]
    return first if ordered else np.sort(first)


def stratified_ranks(scorer, lpq, tri, seed, near, draws, middle=None, posterior=0,
                     ks=(1, 3, 10)):
    """(ranks, expected, candidates scored a query): estimates of the filtered realistic ranks of
    `tri` as head and tail against every candidate, and expected {"mrr": E[1 / rank], "hits@k":
    P(rank <= k)} of each (ks). Per query the
    hard stratum (its entity, the entities `near` it and near its answer) is scored whole and counts
    once; `draws` uniform draws from the rest (and from middle(side, r) -> (pool, draws), if given)
    count for (stratum)/(draws) each: the rank is unbiased (so MR is). 1 / that rank is not (a query
    whose draws miss its few rivals reads as rank 1), nor are its Hits: both are expectations over
    the rivals a stratum may hold, b of its k draws better giving p ~ Beta(b + 1/2, k - b + 1/2) and
    a Binomial count of its n - k undrawn, `posterior` seeded draws (0, the dev point's: None;
    bench/devsignal.py asks for them and holds the MRR to exact dev ranks)."""
    rng, cand, batch, parts = np.random.default_rng(seed), lpq.candidates, [], []
    # side 0 asks (?, r, e), side 1 (e, r, ?)
    for i, side in ((i, side) for i in tri for side in (0, 1)):
        q = lpq.triple_query[i, side]
        (_, r, e), answer = lpq.queries[q], cand[lpq.target[i, side]]
        # the answer and the other facts
        known = cand[lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]]]
        hard = np.setdiff1d(np.intersect1d(np.append(near[[e, answer]].ravel(), e), cand), known)
        pool, n = middle(side, r) if middle else (hard[:0], 0)
        mid = np.setdiff1d(np.intersect1d(pool, cand), np.union1d(hard, known))
        rest = np.setdiff1d(cand, np.concatenate([hard, mid, known]))
        strata = [(hard, len(hard)), (mid, n), (rest, draws)]
        drawn = [rng.choice(s, min(k, len(s)), replace=False) for s, k in strata]
        c = np.concatenate([[answer], *drawn])
        columns = [c, np.full_like(c, r), np.full_like(c, e)]  # (c, r, e): c is the head
        if side == 1:
            columns = columns[::-1]  # (e, r, c): c is the tail
        batch.append(np.stack(columns, 1))
        parts.append([(len(d), len(s)) for d, (s, _) in zip(drawn, strata)])  # (drawn, of n)
    triples = np.concatenate(batch)
    progress = Progress(len(triples), "triples scored for the stratified estimate", master())
    scores = np.concatenate(scored_pieces(scorer.numpy, triples, progress))
    progress.end()
    at, ranks, expected = 0, [], []
    post = np.random.default_rng([seed, 1])  # apart from the draws: the ranks stay as they were
    for part in parts:  # per query: the answer's score, then each stratum's candidates
        width = 1 + sum(k for k, _ in part)
        s, at = scores[at:at + width], at + width
        # ties count half
        beats, ends = (s[1:] > s[0]) + 0.5 * (s[1:] == s[0]), np.cumsum([k for k, _ in part])
        better = [beats[end - k:end].sum() for (k, _), end in zip(part, ends)]
        ranks.append(1 + sum(b * n / max(1, k) for b, (k, n) in zip(better, part)))
        if not posterior:  # the dev point's case: the ranks alone
            continue
        rivals = np.ones(posterior)  # 1 + the rivals, in `posterior` draws
        for b, (k, n) in zip(better, part):
            if k == n:  # scored whole: counted as it is
                rivals += b
            elif k:
                p = post.beta(b + 0.5, k - b + 0.5, posterior)
                rivals += b + post.binomial(n - k, p)  # the k drawn, then the n - k not drawn
        expected.append([np.mean(1 / rivals), *(np.mean(rivals <= k) for k in ks)])
    expected = np.array(expected).reshape(-1, 1 + len(ks)).T  # (1 + len(ks), queries)
    expected = dict(zip(["mrr", *(f"hits@{k}" for k in ks)], expected)) if posterior else None
    return np.array(ranks), expected, round(len(scores) / max(1, len(parts)))


def gather_rows(x):
    """Every process's (n_r, ...) tensor concatenated in process order, n_r may differ: all_gather
    of padded tensors."""
    if not dist.is_initialized():
        return x
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(x)], device=x.device))
    # all of one length
    padded = torch.cat([x, x.new_zeros((max(1, int(max(sizes))) - len(x), *x.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:int(n)] for p, n in zip(parts, sizes)])


def ranked_rows(args, lpq, kg, info, state_dir, rank_block, scorer, ddp_rank, world_size):
    """(ranks (2 len(tri), 6), tri, counts, State): the ranks of every (or --limit seeded random)
    test triple as head and as tail, from rank_block(queries, block) (evaluate.rank_queries),
    sharded over the processes and saved as they come: a stopped ranking resumes. The state keeps
    every test triple a scored query ranks: a larger --limit (same seed) scores only unseen
    queries."""
    T, C = len(lpq.target), len(lpq.candidates)
    first = select(T, args.limit, args.seed, ordered=True)
    tri, estimate = np.sort(first), len(first) < T
    # queries in the order the permutation first asks them: a ranking stopped anywhere has ranked
    # whole triples at the subset's start, so a smaller --limit answers from its state at once
    asked = lpq.triple_query[first].ravel()
    needed = asked[np.sort(np.unique(asked, return_index=True)[1])]
    # round robin: every process gets head and tail queries alike
    mine = needed[ddp_rank::world_size]
    settings = dict(checkpoint_sha256=info["identity"], data=kg.name,
                    data_fingerprint=kg.fingerprint, text=info["text"], prompts=info["prompts"],
                    max_seq_length=info["max_seq_length"], split=args.split,
                    candidates=args.candidates, seed=args.seed, dtype=scorer.precision)
    state = State(state_dir, settings, ddp_rank, T)
    if dist.is_initialized():
        dist.barrier()  # every process has read the old state before any writes
    # the queries of the saved ranks
    ranked = lpq.triple_query[state.prior[:, 0], state.prior[:, 1]]
    # only these: a block of saved and new queries would score the saved again
    todo = mine[~np.isin(mine, ranked)]
    resumed = int(np.isin(needed, ranked).sum())
    fresh = len(needed) - resumed  # a resumed ranking scores only the queries not yet saved
    if ddp_rank == 0:  # the cost, before any of it is spent
        print(f"{kg.name} {args.split}: {len(tri):,} of {T:,} triples, {len(needed):,} queries, "
              f"{resumed:,} ranked before (in {state.folder}): {fresh:,} x {C:,} candidates = "
              f"{fresh * C:,} pairs to score", file=sys.stderr)
    whole = None
    if estimate:  # per process, as the rate is
        whole = -(-len(np.unique(lpq.triple_query)) // world_size)
    unit = "queries" + (f" on rank 0 of {world_size}" if world_size > 1 else "")
    progress = Progress(len(todo), unit, ddp_rank == 0, whole)
    blocks = in_pieces(rank_block, todo, max(1, args.block_rows // C))
    save_as_they_come(args, state, progress, blocks)
    # process 0 brings the earlier runs' ranks
    mine_rows = np.concatenate([state.prior if ddp_rank == 0 else NO_ROWS, *state.new])
    rows = gather_rows(torch.from_numpy(mine_rows).to(scorer.device)).cpu().numpy()
    # one per triple, side
    rows = rows[np.unique(rows[:, 0] * 2 + rows[:, 1], return_index=True)[1]]
    rows = rows[np.isin(rows[:, 0], tri)]  # the state may hold more triples than this --limit asks
    if len(rows) != 2 * len(tri):
        raise OutputError(f"{len(rows)} of {2 * len(tri)} ranks found; remove {state.folder} "
                          "and run again")
    counts = dict(test_triples=T, ranked_triples=len(tri), queries=len(needed), candidates=C,
                  resumed_queries=resumed, scored_triples=fresh * C)  # scored_triples: by this run
    return rows, tri, counts, state


def in_pieces(rank_block, todo, block):
    """rank_block(queries, block)'s ranked blocks over the queries `todo`, asked in pieces of about
    PIECE_S seconds (the first, one query, measures the rate)."""
    for i, j in timed_pieces(len(todo), 1, len(todo)):
        yield from rank_block(todo[i:j], block)


def save_as_they_come(args, state, progress, blocks):
    """Each ranked block into the state, saved every --save-every seconds and at the end; Ctrl-C
    (SIGINT) keeps every finished query."""
    saved = time.time()
    try:
        for qs, rows in blocks:
            state.new.append(rows)
            progress.update(len(qs))
            stop = args.stop_after_queries is not None and progress.done >= args.stop_after_queries
            if stop or time.time() - saved >= args.save_every:
                state.save()
                saved = time.time()
            if stop:
                raise Stopped(f"stopped after {progress.done} queries; the same command resumes "
                              f"from {state.folder}")
    except KeyboardInterrupt:
        state.save()
        raise Stopped(f"stopped after {progress.done} queries (Ctrl-C); the same command "
                      f"resumes from {state.folder}") from None
    state.save()
    progress.update(0, force=True)


def score_all(scorer, triples, block_rows, ddp_rank, world_size, progress):
    """Scores (N,) float64 of all triples; each process scores every world_size-th one, then all are
    gathered."""
    idx = np.arange(len(triples))[ddp_rank::world_size]
    parts = [torch.zeros(0, device=scorer.device)]
    for i, j in timed_pieces(len(idx), min(block_rows, 256), block_rows):
        parts.append(scorer(triples[idx[i:j]]))
        progress.update(len(parts[-1]))
    s = torch.cat(parts).double()
    both = gather_rows(torch.stack([torch.from_numpy(idx).to(s), s], 1)).cpu().numpy()
    return both[np.argsort(both[:, 0]), 1]  # in the triples' order

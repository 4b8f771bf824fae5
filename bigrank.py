"""Big rankings: what link prediction on FB15k-237 and WN18RR needs beyond the method (evaluate.py) — ranks kept on
disk so a stopped ranking resumes, progress lines with an ETA, queries sharded over torchrun processes and gathered,
seeded subsets that grow, and a stratified estimate of exact ranks that scores ~170 candidates a query."""
import json, sys, time
from pathlib import Path
import numpy as np
import torch
import torch.distributed as dist

import files

NO_ROWS = np.zeros((0, 6), np.int64)  # no ranks yet: rows are (test triple, side, four ranks)


class Progress:
    """done/total, rate and ETA on stderr, a line a minute; `whole` (units in the whole split) adds its time, once."""

    def __init__(self, total, unit, enabled=True, whole=None, first=15):
        self.total, self.unit, self.enabled, self.whole, self.done = total, unit, enabled, whole, 0
        self.t0 = time.time()
        self.shown, self.printed = self.t0 - 60 + first, -1

    def update(self, n, force=False):
        self.done, now = self.done + n, time.time()
        if self.enabled and (force and self.printed != self.done or now - self.shown > 60):
            rate = self.done / max(now - self.t0, 1e-9)
            hms = lambda s: f"{int(s) // 3600}:{int(s) // 60 % 60:02d}:{int(s) % 60:02d}"
            speed = f"{rate:,.1f}/s" if rate >= 1 else f"{1 / rate:,.1f} s each" if rate else "?/s"
            eta = hms((self.total - self.done) / rate) if rate else "?"
            whole = (f"; the whole split ({self.whole:,}) would take {hms(self.whole / rate)} here"
                     if self.whole and rate else "")
            print(f"{self.done:,}/{self.total:,} {self.unit} ({speed}, ETA {eta}{whole})", file=sys.stderr, flush=True)
            self.shown, self.whole, self.printed = now, None, self.done


def read_rows(path, n_triples):
    """The (n, 6) rows saved in one state file, or one line naming it: never a traceback, never a pickle."""
    try:
        with np.load(path, allow_pickle=False) as z:
            rows = z["rows"]
        shape_ok = rows.ndim == 2 and rows.shape[1] == 6 and rows.dtype.kind in "iu"
        if not shape_ok or len(rows) and not (0 <= rows[:, 0].min() and rows[:, 0].max() < n_triples
                                              and set(rows[:, 1]) <= {0, 1} and rows[:, 2:].min() >= 1):
            raise ValueError(f"rows of shape {rows.shape} and dtype {rows.dtype} that are not ranks of the test set")
    except Exception as e:  # truncated, not a zip, other arrays; numpy's words about pickles invite unsafe loading
        why = "pickled objects, which are never loaded" if "pickle" in str(e) else f"{type(e).__name__}: {e}"
        raise SystemExit(f"error: {path}: damaged ranking state ({why}); delete it (or the folder {path.parent}) "
                         "to start over") from None
    return rows.astype(np.int64)


class State:
    """The ranks finished so far, in a folder: settings.json (a rerun with other settings refuses rather than mix) and
    one rows .npz per rank, replaced atomically: a killed run restarts from its last save. `prior`: all ranks' saves."""

    def __init__(self, folder, settings, ddp_rank, T):
        self.folder, self.path = Path(folder), Path(folder) / f"rank{ddp_rank}.npz"
        saved = self.folder / "settings.json"
        if saved.exists():
            try:
                was = json.loads(saved.read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"error: {saved}: damaged ranking state ({e}); delete {self.folder} "
                                 "to start over") from None
            for k, v in settings.items():
                if was.get(k) != v:
                    raise SystemExit(f"error: {self.folder} holds ranks made with {k} {was.get(k)}, not {v}: "
                                     "give another --out, or delete it to start over")
        elif ddp_rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            files.write_atomic(saved, lambda f: f.write(json.dumps(settings, indent=1).encode()))
        self.prior = np.concatenate([NO_ROWS, *(read_rows(f, T) for f in sorted(self.folder.glob("rank*.npz")))])
        self.new, self.old = [], [read_rows(self.path, T)] if self.path.exists() else []

    def save(self):
        try:
            files.write_atomic(self.path, lambda f: np.savez(f, rows=np.concatenate([NO_ROWS, *self.old, *self.new])))
        except OSError as e:
            raise SystemExit(f"error: cannot save the ranking state {self.path} ({e.strerror or e}); the previous "
                             f"save is kept: make room, and the same command resumes from {self.folder}") from None


def select(T, limit, seed, ordered=False):
    """All T test triples, or a seeded random `limit` of them: the first `limit` of one seeded permutation, so that
    the subset of a smaller limit is part of any larger one's (an estimate can grow). Sorted, or in that order."""
    if not limit or limit >= T:
        return np.arange(T)
    first = np.random.default_rng(seed).permutation(T)[:limit]
    return first if ordered else np.sort(first)


def stratified_ranks(scorer, lpq, tri, seed, near, draws, middle=None):
    """(ranks, candidates scored a query): unbiased estimates of the filtered realistic ranks of `tri` as head and tail
    against every candidate. Per query the hard stratum (its entity, the entities `near` it and near its answer) is
    scored whole and counts once; `draws` uniform draws from the rest (and from middle(side, r) -> (pool, draws), if
    given) count for (stratum)/(draws) each. MRR's top is exact where the hard stratum holds the rivals (RESULTS.md)."""
    rng, cand, batch, parts = np.random.default_rng(seed), lpq.candidates, [], []
    for i, side in ((i, side) for i in tri for side in (0, 1)):  # side 0 asks (?, r, e), side 1 (e, r, ?)
        q = lpq.triple_query[i, side]
        (_, r, e), answer = lpq.queries[q], cand[lpq.target[i, side]]
        known = cand[lpq.filter_pos[lpq.filter_ptr[q]:lpq.filter_ptr[q + 1]]]  # the answer and the other facts
        hard = np.setdiff1d(np.intersect1d(np.append(near[[e, answer]].ravel(), e), cand), known)
        pool, n = middle(side, r) if middle else (hard[:0], 0)
        mid = np.setdiff1d(np.intersect1d(pool, cand), np.union1d(hard, known))
        strata = [(hard, len(hard)), (mid, n), (np.setdiff1d(cand, np.concatenate([hard, mid, known])), draws)]
        drawn = [rng.choice(s, min(k, len(s)), replace=False) for s, k in strata]
        c = np.concatenate([[answer], *drawn])
        batch.append(np.stack([c, np.full_like(c, r), np.full_like(c, e)][::1 if side == 0 else -1], 1))
        parts.append([(len(d), len(s) / max(1, len(d))) for d, (s, _) in zip(drawn, strata)])
    scores, at, ranks = scorer.numpy(np.concatenate(batch)), 0, []
    for part in parts:  # per query: the answer's score, then each stratum's candidates
        width = 1 + sum(k for k, _ in part)
        s, at = scores[at:at + width], at + width
        beats, ends = (s[1:] > s[0]) + 0.5 * (s[1:] == s[0]), np.cumsum([k for k, _ in part])  # ties count half
        ranks.append(1 + sum(w * beats[end - k:end].sum() for (k, w), end in zip(part, ends)))
    return np.array(ranks), round(len(scores) / max(1, len(parts)))


def gather_rows(x):
    """Every rank's (n_r, ...) tensor concatenated in rank order, n_r may differ: all_gather of padded tensors."""
    if not dist.is_initialized():
        return x
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(x)], device=x.device))
    padded = torch.cat([x, x.new_zeros((max(1, int(max(sizes))) - len(x), *x.shape[1:]))])  # all of one length
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:int(n)] for p, n in zip(parts, sizes)])

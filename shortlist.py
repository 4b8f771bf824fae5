"""--predict's shortlist on big graphs: the candidates worth the cross-encoder's time, so that a query takes seconds.

For a query (e, r, side) it takes, in turns until it holds `size`: the best of an anchor query's exact scores (the same
relation and side asked of another entity: what the model puts first for this relation whatever the entity), the
entities nearest e by the frozen encoder's text embedding, those nearest e's train answers, and the relation's train
type by frequency; e's train answers come first where they are few (at most a quarter of the list). Anchor scores and
embeddings are computed once and cached on disk ($PALT_CACHE, else ~/.cache/palt), keyed by the checkpoint, the base
weights and the data. How much of the exact top 10 it keeps is measured in bench/shortlist.py (RESULTS.md). --lp and
--tc never use it: their metrics score every candidate.
"""
import os, sys, time
from pathlib import Path
import numpy as np
import torch

import data, files

SIZE = 1000  # candidates scored a query: chosen by bench/shortlist.py's table (RESULTS.md)
ALL_UP_TO = 5000  # graphs with at most this many candidates score them all: a shortlist would save little
KEEP = 4096  # an anchor's best candidates kept in its cache file


def cache_dir():
    return Path(os.environ.get("PALT_CACHE") or Path.home() / ".cache" / "palt")


class Shortlist:
    def __init__(self, kg, scorer, cand, key, base_key, size=SIZE):
        """kg's train facts give the answers and types; scorer scores the anchors (over the candidates `cand`);
        key names the checkpoint (its sha256) and base_key the frozen encoder (weights sha256) in the cache."""
        self.kg, self.scorer, self.cand, self.size = kg, scorer, cand, size
        self.folder = cache_dir() / f"{kg.name}-{kg.fingerprint}-{kg.text}"
        self.key, self.base_key, self.emb = key[:16], base_key[:16], None
        h, r, t = kg.train.T
        self.train = {1: (h, r, t), 0: (t, r, h)}  # side -> (query entity, relation, answer) of every train fact
        self.pos = np.full(len(kg.entities), -1)  # entity -> its index in cand
        self.pos[cand] = np.arange(len(cand))
        self.built = []  # (what, seconds) of the cached parts computed for the queries so far

    def __call__(self, e, r, side):
        """(candidates, best first by source) of the query (e, r, side): at most `size` of `cand`."""
        q, rel, ans = self.train[side]
        answers = np.unique(ans[(q == e) & (rel == r)])
        typed = ans[rel == r]
        kinds, counts = np.unique(typed, return_counts=True)
        sources = [self.anchor(r, side, e), self.nearest([e]), self.nearest(answers),
                   kinds[np.argsort(-counts, kind="stable")]]
        turns = np.stack([np.resize(s, len(self.cand)) if len(s) else np.full(len(self.cand), -1) for s in sources], 1)
        first = answers if len(answers) <= self.size // 4 else answers[:0]  # thousands (a gender's people): no
        order = np.concatenate([first, turns.ravel()])  # then one from each source in turn
        order = order[(order >= 0) & (self.pos[np.maximum(order, 0)] >= 0)]
        return order[np.sort(np.unique(order, return_index=True)[1])][:self.size]

    def anchor(self, r, side, e):
        """The candidates by the exact score of (a, r, ?) (side 1) or (?, r, a): a the entity most often asked this way
        in train, other than e; computed once and cached."""
        q, rel, _ = self.train[side]
        asked, n = np.unique(q[rel == r], return_counts=True)
        if not len(asked) or asked.tolist() == [e]:
            return np.empty(0, np.int64)
        a = asked[asked != e][np.argmax(n[asked != e])]
        path = self.folder / f"anchor-{self.key}-{self.scorer.max_seq_length}-{len(self.cand)}-r{r}-s{side}-e{a}.npy"
        best = load(path)
        if best is not None:
            return best
        t = time.time()
        fixed, rr = np.full(len(self.cand), a), np.full(len(self.cand), r)
        s = self.scorer.numpy(np.stack([fixed, rr, self.cand] if side else [self.cand, rr, fixed], 1))
        best = self.cand[np.argsort(-s, kind="stable")[:KEEP]]
        save(path, best)
        self.built.append((f"anchor ({self.kg.entities[a]}, {self.kg.relations[r]}, side {side})", time.time() - t))
        return best

    def nearest(self, entities, k=256):
        """The candidates nearest any of `entities` (max cosine of the frozen encoder's embeddings), best first; an
        entity new to the graph (text:...) is embedded on the spot."""
        if not len(entities):
            return np.empty(0, np.int64)
        entities = np.asarray(entities)
        inside = entities < len(self.pos)
        inside[inside] = self.pos[entities[inside]] >= 0
        emb, s = self.embeddings(), self.scorer
        vec = emb[self.pos[entities[inside]]]
        if not inside.all():
            vec = torch.cat([vec, data.entity_embeddings(s.model.bert, entities[~inside], s.enc, s.device, s.dtype)])
        sim = (emb @ vec.T).max(1).values
        return self.cand[sim.topk(min(k, len(sim))).indices.numpy()]

    def embeddings(self):
        if self.emb is None:
            path = self.folder / f"embeddings-{self.base_key}-{len(self.cand)}.npy"
            self.emb = load(path)
            if self.emb is not None:
                self.emb = torch.from_numpy(self.emb).float()
            else:
                t, s = time.time(), self.scorer
                self.emb = data.entity_embeddings(s.model.bert, self.cand, s.enc, s.device, s.dtype).cpu()
                save(path, self.emb.half().numpy())
                self.built.append(("entity embeddings", time.time() - t))
        return self.emb


def load(path):
    """A cached array, or None where there is none or it is damaged (then it is computed again)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None


def save(path, array):
    """Into the cache; where it cannot be written (read-only, full), the next run computes it again: said, not fatal."""
    try:
        files.write_atomic(path, lambda f: np.save(f, array))
    except OSError as e:
        print(f"note: cannot cache {path} ({e.strerror or e}); set PALT_CACHE to a writable folder", file=sys.stderr)

"""A knowledge graph (graphs.py) -> BERT sentence pairs with PALT's prompt slots, negatives,
link-prediction queries."""
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from devices import autocast
from graphs import DataError, in_sorted


# ----------------------------------------------------------------------------- tokens and sequences
@dataclass(eq=False)
class Encoded:
    cls_id: int
    sep_id: int
    pad_id: int
    # np.int32 token ids: entity i is ent_ids[ent_off[i]:ent_off[i+1]], likewise relations
    ent_ids: np.ndarray
    ent_off: np.ndarray
    rel_ids: np.ndarray
    rel_off: np.ndarray


def _flat(tok, texts):
    """The token ids of all texts in one array, text i at ids[off[i]:off[i + 1]]."""
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    off = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
    return np.concatenate(ids) if ids else np.zeros(0, np.int32), off


def encode(kg, tokenizer, new=()):
    """Token ids of every entity and relation text, no special tokens; `new` entity texts follow the
    graph's."""
    # a copy: shipped tokenizers may pad/truncate, we do our own
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    specials = [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if None in specials:
        raise ValueError("tokenizer lacks one of [CLS], [SEP], [PAD]")
    return Encoded(*specials, *_flat(tok, kg.ent_text + list(new)), *_flat(tok, kg.rel_text))


def _part_lengths(enc, triples, max_seq_length):
    """(B,3) token counts of head, relation, tail truncated to M = max_seq_length - 3 tokens
    (callers subtract the prompts) as by popping one token at a time from the longest part (ties:
    tail, then relation, then head; tests/test_data.py holds it to that loop), in closed form: cap
    every part at a level and hand the tokens left over to the parts longer than it, head first.

    Example: lengths (6, 1, 9), M = 10. The two shortest are 1 and 6; cutting the longest alone to
    10 - 1 - 6 = 3 would make it shorter than the 6 left whole, so the two longest are cut: level
    (10 - 1) // 2 = 4, capped (4, 1, 4) = 9 tokens, the 1 left over goes to the head: (5, 1, 4).
    Popping gives the same: (6, 1, 9) -> (6, 1, 6) -> (6, 1, 5) -> (5, 1, 5) -> (5, 1, 4)."""
    if max_seq_length < 3:
        raise ValueError("max_seq_length must leave room for [CLS] and two [SEP]")
    ent_len, rel_len = np.diff(enc.ent_off), np.diff(enc.rel_off)
    lens = np.stack([ent_len[triples[:, 0]], rel_len[triples[:, 1]], ent_len[triples[:, 2]]], 1)
    M = max_seq_length - 3
    s0, s1 = np.sort(lens, 1)[:, :2].T  # the two shortest parts
    # the level: none cut, else the longest alone, else the two longest, else all three
    level = np.full(len(lens), np.iinfo(np.int64).max)  # none cut: they fit
    fits = lens.sum(1) <= M
    all_cut = 3 * s0 >= M  # even the shortest has M / 3 or more
    two_cut = s0 + 2 * s1 >= M  # the middle one has what the longest alone would keep, or more
    level = np.where(fits, level, M - s0 - s1)  # only the longest cut
    level = np.where(~fits & two_cut, (M - s0) // 2, level)
    level = np.where(~fits & all_cut, M // 3, level)
    cut = np.minimum(lens, level[:, None])
    over = lens > level[:, None]
    left = M - cut.sum(1)  # the tokens left over, one to each part over the level, head first
    return cut + (over & (np.cumsum(over, 1) <= left[:, None]))


def seq_lengths(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    """(B,) the length of each triple's sequence as build_batch makes it."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)  # (B, 3)
    return _part_lengths(enc, t, max_seq_length - sum(prompts)).sum(1) + 3 + sum(prompts)


def _fill(out, flat, src, dst, n):
    """out[i, dst[i] + j] = flat[src[i] + j] for j < n[i], all rows at once."""
    rows, j = np.nonzero(np.arange(n.max(initial=0))[None, :] < n[:, None])
    out[rows, dst[rows] + j] = flat[src[rows] + j]


def build_batch(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    """[CLS] P*b head rel P*m [SEP] tail P*e [SEP], right-padded to the longest row, at most
    max_seq_length long."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)  # (B, 3)
    b, m, e = prompts
    lens = _part_lengths(enc, t, max_seq_length - b - m - e)
    n = lens.sum(1) + 3 + b + m + e
    B, L = len(t), int(n.max(initial=3 + b + m + e))
    rows, col = np.arange(B), np.arange(L)[None, :]
    sep1 = 1 + b + lens[:, 0] + lens[:, 1] + m  # the first [SEP]
    input_ids = np.full((B, L), enc.pad_id, dtype=np.int64)
    input_ids[:, 0] = enc.cls_id
    input_ids[rows, sep1] = enc.sep_id
    input_ids[rows, n - 1] = enc.sep_id
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 0]], np.full(B, 1 + b), lens[:, 0])
    _fill(input_ids, enc.rel_ids, enc.rel_off[t[:, 1]], 1 + b + lens[:, 0], lens[:, 1])
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 2]], sep1 + 1, lens[:, 2])
    prompt_index = np.full((B, L), -1, dtype=np.int64)
    # P*b, P*m, P*e: (index of the first prompt vector, first position, count)
    slots = ((0, 1, b), (b, sep1 - m, m), (b + m, sep1 + 1 + lens[:, 2], e))
    for first, start, count in slots:
        for k in range(count):
            prompt_index[rows, start + k] = first + k
    real = col < n[:, None]
    batch = {"input_ids": input_ids, "token_type_ids": real & (col > sep1[:, None]),
             "attention_mask": real, "prompt_index": prompt_index}
    return {k: torch.from_numpy(v.astype(np.int64, copy=False)) for k, v in batch.items()}


# ----------------------------------------------------------------------------- negatives
@torch.inference_mode()
def entity_embeddings(bert, S, enc, device="cpu", dtype="fp32", tokens=1 << 14):
    """(len(S), H) unit vectors: the frozen encoder's mean-pooled [CLS] text [SEP] states of the
    entities S, whose cosines find the near entities (hard negatives, the dev estimate, --predict's
    shortlist)."""
    n = np.minimum(np.diff(enc.ent_off)[S], 62) + 2  # [CLS] text [SEP], at most 64 tokens
    order = np.argsort(-n, kind="stable")
    emb = torch.empty(len(S), bert.config.hidden_size)
    i = 0
    while i < len(S):  # longest first, batches of at most `tokens` tokens
        idx = order[i:i + max(1, tokens // int(n[order[i]]))]
        B, L = len(idx), int(n[idx].max())
        ids = np.full((B, L), enc.pad_id, dtype=np.int64)
        ids[:, 0] = enc.cls_id
        ids[np.arange(B), n[idx] - 1] = enc.sep_id
        _fill(ids, enc.ent_ids, enc.ent_off[S[idx]], np.ones(B, np.int64), n[idx] - 2)
        mask = torch.from_numpy(np.arange(L)[None, :] < n[idx][:, None]).to(device)
        with autocast(dtype, device):
            ids = torch.from_numpy(ids).to(device)
            out = bert(ids, None, mask.long(), output_hidden_states=True)
        h = out.hidden_states[-1]  # (B, L, H)
        emb[idx] = ((h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).cpu()
        i += B
    return torch.nn.functional.normalize(emb, dim=-1)


def nearest_entities(kg, emb, k=32):
    """(E, k) int64: the k split entities nearest each one by the cosine of their embeddings
    (entity_embeddings of kg.split_entities), itself excluded (outside the splits: itself): the hard
    cases random draws from 40k miss."""
    S = kg.split_entities
    near = np.repeat(np.arange(len(kg.entities))[:, None], k, axis=1)
    for s in range(0, len(S) if len(S) > 1 else 0, 1024):  # (1024, |S|) similarities at a time
        sim = emb[s:s + 1024] @ emb.T
        sim[torch.arange(len(sim)), torch.arange(s, s + len(sim))] = -torch.inf  # not itself
        top = sim.topk(min(k, len(S) - 1), dim=1).indices.numpy()
        # fewer than k others: repeated
        near[S[s:s + 1024]] = S[top[:, np.arange(k) % top.shape[1]]]
    return near


class NegativeSampler:
    """Per train positive: n_head, n_rel, n_tail corruptions of that part that are no train triples,
    then n_self (0-2) self-negatives (SimKGC's) (h, r, h), (t, r, t): a text followed by itself
    reads as a perfect continuation, else the query entity outranks the answers. hard: the share of
    entity corruptions drawn from the replaced one's `near`. The filter is the train triples only,
    as in KG-BERT: dev and test facts never shape training, so a corruption that happens to be a
    test fact is a negative like any other."""

    def __init__(self, kg, n_head=1, n_rel=1, n_tail=1, n_self=0, seed=0, rounds=30, near=None,
                 hard=0.0):
        self.kg, self.seed, self.rounds, self.near, self.hard = kg, seed, rounds, near, hard
        # triple classification: train holds positives
        self.train_keys = np.unique(kg.key(kg.train))
        # Each negative slot of a positive is the column (0 head, 1 relation, 2 tail) it replaces.
        # E.g. n_head=1, n_rel=0, n_tail=1, n_self=2 -> column [0, 2, 2, 0], is_self [F, F, T, T]:
        # a new head, a new tail, then (h, r, h) (the tail replaced by the head) and (t, r, t).
        counts = [n_head, n_rel, n_tail, n_self > 0, n_self > 1]
        self.column = np.repeat([0, 1, 2, 2, 0], counts)
        self.is_self = np.arange(len(self.column)) >= n_head + n_rel + n_tail
        self.pools = (kg.split_entities, np.arange(len(kg.relations)), kg.split_entities)

    def is_train(self, triples):
        """True where a triple is a train triple: the corruptions redrawn."""
        return in_sorted(self.train_keys, self.kg.key(triples))

    def negatives(self, epoch):
        """(N_train, K, 3) int64, uniform over the valid corruptions, the same on every rank for
        (seed, epoch)."""
        kg, K = self.kg, len(self.column)
        rng = np.random.default_rng([self.seed, epoch])
        # (N, K, 3) -> (N*K, 3): K copies of each positive, to corrupt
        neg = np.repeat(kg.train[:, None, :], K, axis=1).reshape(-1, 3)
        col = np.tile(self.column, len(kg.train))
        self_rows = np.tile(self.is_self, len(kg.train))
        # the tail becomes the head, or the head the tail
        neg[self_rows, col[self_rows]] = neg[self_rows, 2 - col[self_rows]]
        todo = np.nonzero(~self_rows | self.is_train(neg))[0]  # a self-pair in train: drawn anew
        # draw all, then redraw the train triples (the positive is one)
        for _ in range(self.rounds):
            c = col[todo]
            ent = kg.split_entities[rng.integers(len(kg.split_entities), size=len(todo))]
            # a neighbour of the entity it replaces (column 0 stands in on relation rows, unused)
            if self.hard:
                replaced = kg.train[todo // K, np.where(c == 1, 0, c)]
                near = self.near[replaced, rng.integers(self.near.shape[1], size=len(todo))]
                ent = np.where(rng.random(len(todo)) < self.hard, near, ent)
            rel = rng.integers(len(kg.relations), size=len(todo))
            neg[todo, c] = np.where(c == 1, rel, ent)
            todo = todo[self.is_train(neg[todo])]
        self.enumerate_left(neg, col, todo, K, rng)
        return neg.reshape(-1, K, 3)  # (N*K, 3) -> (N, K, 3)

    def enumerate_left(self, neg, col, todo, K, rng):
        """The corruptions still train triples after the rounds (rarely any: umls has a (?, r, t)
        with 134 of 135 heads true): drawn from their valid choices, enumerated once per query."""
        kg = self.kg
        q = neg[todo]
        q[np.arange(len(todo)), col[todo]] = -1  # the query
        groups, inv = np.unique(np.column_stack([col[todo], q]), axis=0, return_inverse=True)
        for g, (c, *masked) in enumerate(groups):
            rows, pool = todo[inv.ravel() == g], self.pools[c]
            cand = np.tile(masked, (len(pool), 1))
            cand[:, c] = pool
            valid = pool[~self.is_train(cand)]
            if len(valid) == 0:
                h, r, t = kg.train[rows[0] // K]
                part = ["head", "relation", "tail"][c]
                raise DataError(f"{kg.folder}: no {part} corruption of ({kg.entities[h]}, "
                                f"{kg.relations[r]}, {kg.entities[t]}) is false: every candidate "
                                "is a train triple")
            neg[rows, c] = valid[rng.integers(len(valid), size=len(rows))]


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


def lp_queries(kg, split="test", candidates="split"):
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
    return LPQueries(cand, queries, triple_query, target, ptr, ans[keep][order])

"""A knowledge graph (KG; support/graphs.py reads its files) -> BERT sentence pairs with PALT's
prompt slots, and the training negatives, redrawn where they are train triples."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from support.errors import CheckpointError, DataError, FlagError


# ----------------------------------------------------------------------------- the graph
@dataclass(eq=False)
class KG:
    """A knowledge graph: its entities and relations with their texts, and each split as (N, 3)
    index triples (support/graphs.load_kg reads one)."""
    name: str
    task: str  # 'lp' | 'tc'
    folder: Path
    text: str  # 'name' | 'long' | 'description'
    text_file: str  # the entity text file actually read ('ids' where there is none)
    entities: list  # ids as in the files; every entity with text, in text-file order
    relations: list
    ent_text: list
    rel_text: list
    train: np.ndarray  # (N,3) int64 rows (h, r, t)
    dev: np.ndarray  # (0,3) where a graph of one's own has no dev split; likewise test
    test: np.ndarray
    dev_labels: np.ndarray | None  # tc: True for label 1, False for -1; lp: None
    test_labels: np.ndarray | None
    split_entities: np.ndarray  # sorted entities that occur in train/dev/test
    fingerprint: str  # sha256 over the files read
    known: np.ndarray  # sorted unique keys (h*R + r)*E + t of every true triple
    notes: list  # what a graph lacks or repeats, warnings: for the command lines to say once
    # split -> the file read; for a split a graph of one's own lacks, the file it would be
    # (dev.tsv, or valid.txt beside train.txt): what messages about a split name
    split_files: dict

    def is_known(self, triples: np.ndarray) -> np.ndarray:
        """True where a triple is a fact of train, dev or test: the filter of the evaluation's
        ranks."""
        return in_sorted(self.known, triple_keys(self, triples))


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


def _flat(tok: Tokenizer, texts: list) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of all texts in one array, text i at ids[off[i]:off[i + 1]]."""
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    off = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
    return np.concatenate(ids) if ids else np.zeros(0, np.int32), off


def encode(kg: KG, tokenizer: Tokenizer, new: tuple | list = ()) -> Encoded:
    """Token ids of every entity and relation text, no special tokens; `new` entity texts follow the
    graph's."""
    # a copy: shipped tokenizers may pad/truncate, we do our own
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    cls_id, sep_id, pad_id = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    if None in (cls_id, sep_id, pad_id):
        raise CheckpointError("the tokenizer lacks one of [CLS], [SEP], [PAD]")
    ent_ids, ent_off = _flat(tok, kg.ent_text + list(new))
    rel_ids, rel_off = _flat(tok, kg.rel_text)
    return Encoded(cls_id=cls_id, sep_id=sep_id, pad_id=pad_id, ent_ids=ent_ids, ent_off=ent_off,
                   rel_ids=rel_ids, rel_off=rel_off)


def _part_lengths(enc: Encoded, triples: np.ndarray, max_seq_length: int) -> np.ndarray:
    """(B,3) token counts of head, relation, tail truncated to M = max_seq_length - 3 tokens
    (callers subtract the prompts) as by popping one token at a time from the longest part (ties:
    tail, then relation, then head; tests/test_data.py holds it to that loop), in closed form: cap
    every part at a level and hand the tokens left over to the parts longer than it, head first.

    Example: lengths (6, 1, 9), M = 10. The two shortest are 1 and 6; cutting the longest alone to
    10 - 1 - 6 = 3 would make it shorter than the 6 left whole, so the two longest are cut: level
    (10 - 1) // 2 = 4, capped (4, 1, 4) = 9 tokens, the 1 left over goes to the head: (5, 1, 4).
    Popping gives the same: (6, 1, 9) -> (6, 1, 6) -> (6, 1, 5) -> (5, 1, 5) -> (5, 1, 4)."""
    if max_seq_length < 3:
        raise FlagError("max_seq_length must leave room for [CLS] and two [SEP]")
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


def seq_lengths(enc: Encoded, triples: np.ndarray, prompts: tuple = (0, 0, 0),
                max_seq_length: int = 192) -> np.ndarray:
    """(B,) the length of each triple's sequence as build_batch makes it."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)  # (B, 3)
    return _part_lengths(enc, t, max_seq_length - sum(prompts)).sum(1) + 3 + sum(prompts)


def fill_rows(out: np.ndarray, flat: np.ndarray, src: np.ndarray, dst: np.ndarray,
              n: np.ndarray) -> None:
    """out[i, dst[i] + j] = flat[src[i] + j] for j < n[i], all rows at once."""
    rows, j = np.nonzero(np.arange(n.max(initial=0))[None, :] < n[:, None])
    out[rows, dst[rows] + j] = flat[src[rows] + j]


def build_batch(enc: Encoded, triples: np.ndarray, prompts: tuple = (0, 0, 0),
                max_seq_length: int = 192) -> dict[str, torch.Tensor]:
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
    # the head after [CLS] and its prompts, the relation after the head, the tail after [SEP]
    for part, (flat, off, dst) in enumerate([(enc.ent_ids, enc.ent_off, np.full(B, 1 + b)),
                                             (enc.rel_ids, enc.rel_off, 1 + b + lens[:, 0]),
                                             (enc.ent_ids, enc.ent_off, sep1 + 1)]):
        fill_rows(out=input_ids, flat=flat, src=off[t[:, part]], dst=dst, n=lens[:, part])
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


def to_device(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A CPU tensor on the device; to a GPU through pinned memory, so the copy does not wait for the
    GPU's queue: the CPU goes on building the next batch while the GPU runs this one."""
    if torch.device(device).type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


# ----------------------------------------------------------------------------- negatives
def triple_keys(kg: KG, triples: np.ndarray) -> np.ndarray:
    """One int64 per triple, (h*R + r)*E + t: sorted keys make set lookups vectorised."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)  # (N, 3)
    return (t[:, 0] * len(kg.relations) + t[:, 1]) * len(kg.entities) + t[:, 2]


def in_sorted(keys: np.ndarray, k: np.ndarray) -> np.ndarray:
    """True where k is in the sorted array `keys`."""
    return keys[np.minimum(np.searchsorted(keys, k), len(keys) - 1)] == k


class NegativeSampler:
    """Per train positive: n_head, n_rel, n_tail corruptions of that part that are no train triples
    (either_side, with 1, 0, 1: one corruption, of the head or of the tail at p = .5, the authors'
    scripts' negatives), then n_self (0-2) self-negatives (SimKGC's) (h, r, h), (t, r, t): a text
    followed by itself reads as a perfect continuation, else the query entity outranks the answers.
    hard: the share of entity corruptions drawn from the replaced one's `near`. Only a train triple
    is redrawn, as in KG-BERT: dev and test facts never shape training, so a corruption that
    happens to be a test fact is a negative like any other. (The evaluation's filter, kg.known, is
    every split's facts.)"""

    def __init__(self, kg: KG, n_head: int = 1, n_rel: int = 1, n_tail: int = 1, n_self: int = 0,
                 seed: int = 0, rounds: int = 30, near: np.ndarray | None = None,
                 hard: float = 0.0, either_side: bool = False):
        self.kg, self.seed, self.rounds, self.near, self.hard = kg, seed, rounds, near, hard
        self.either_side = either_side
        if either_side and (n_head, n_rel, n_tail, n_self) != (1, 0, 1, 0):
            raise FlagError("either_side draws one head or tail corruption: n_head = n_tail = 1")
        # triple classification: train holds positives
        self.train_keys = np.unique(triple_keys(kg, kg.train))
        # Each negative slot of a positive is the column (0 head, 1 relation, 2 tail) it replaces.
        # E.g. n_head=1, n_rel=0, n_tail=1, n_self=2 -> column [0, 2, 2, 0], is_self [F, F, T, T]:
        # a new head, a new tail, then (h, r, h) (the tail replaced by the head) and (t, r, t).
        counts = [n_head, n_rel, n_tail, n_self > 0, n_self > 1]
        if either_side:  # one slot; which column it replaces is drawn each epoch
            counts = [1, 0, 0, 0, 0]
        self.column = np.repeat([0, 1, 2, 2, 0], counts)
        self.is_self = np.arange(len(self.column)) >= n_head + n_rel + n_tail
        self.pools = (kg.split_entities, np.arange(len(kg.relations)), kg.split_entities)

    def is_train(self, triples: np.ndarray) -> np.ndarray:
        """True where a triple is a train triple: the corruptions redrawn."""
        return in_sorted(self.train_keys, triple_keys(self.kg, triples))

    def negatives(self, epoch: int) -> np.ndarray:
        """(N_train, K, 3) int64, uniform over the valid corruptions, the same on every rank for
        (seed, epoch)."""
        kg, K = self.kg, len(self.column)
        rng = np.random.default_rng([self.seed, epoch])
        # (N, K, 3) -> (N*K, 3): K copies of each positive, to corrupt
        neg = np.repeat(kg.train[:, None, :], K, axis=1).reshape(-1, 3)
        col = np.tile(self.column, len(kg.train))
        if self.either_side:
            col = np.where(rng.random(len(kg.train)) < 0.5, 0, 2)
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
        self.enumerate_left(neg=neg, col=col, todo=todo, K=K, rng=rng)
        return neg.reshape(-1, K, 3)  # (N*K, 3) -> (N, K, 3)

    def enumerate_left(self, neg: np.ndarray, col: np.ndarray, todo: np.ndarray, K: int,
                       rng: np.random.Generator) -> None:
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

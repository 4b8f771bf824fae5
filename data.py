"""Knowledge graphs in KG-BERT's text format -> BERT sentence pairs with PALT's prompt slots. Data lives in
--data-dir, else $PALT_DATA, else ./data; one folder per benchmark (../shared/data/README.md)."""
import hashlib, os
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch
from tokenizers import Tokenizer

from bert import autocast
from files import read_text, readable


OWN_TEXTS = {"name": "entity2text.txt", "long": "entity2textlong.txt", "description": "entity2description.txt"}
DATASETS = {  # name -> (folder, task: 'lp' link prediction or 'tc' triple classification, {--text: entity text file})
    "fb15k-237": ("FB15k-237", "lp", OWN_TEXTS),  # the same three files; descriptions: StAR's "Name -- first sentence"
    "wn18rr": ("WN18RR", "lp", {"name": "entity2text.txt", "long": "entity2text.txt"}),  # names carry the definition
    "umls": ("umls", "lp", {"name": "entity2text.txt", "long": "entity2textlong.txt"}),
    "wn11": ("WN11", "tc", {"name": "entity2text.txt"}),
    "fb13": ("FB13", "tc", {"name": "entity2text_capital.txt", "long": "entity2text.txt"}),
}
TEXTS = ("name", "long", "description")


class DataError(ValueError):
    """Bad or missing data; the message is one line, 'path:line: what is wrong'."""


def data_root(arg=None):
    return Path(arg or os.environ.get("PALT_DATA") or "data")


def dataset(spec, data_dir=None):
    """(name, folder, task) of a benchmark name or of a folder holding one's own graph (train.tsv, optional dev.tsv and
    test.tsv; ./umls if named like a benchmark), whose task is 'tc' if test.tsv (else dev.tsv) has a 4th column 1/-1."""
    spec = str(spec)
    if spec.lower() in DATASETS:
        folder, task, _ = DATASETS[spec.lower()]
        return spec.lower(), data_root(data_dir) / folder, task
    folder = Path(spec)
    if not folder.is_dir():
        raise DataError(f"--data {spec}: neither a benchmark ({', '.join(DATASETS)}) nor a folder")
    if not (folder / "train.tsv").is_file():
        raise DataError(f"{folder / 'train.tsv'}: no such file (a graph's folder needs train.tsv: "
                        "head<TAB>relation<TAB>tail)")
    for split in ("test.tsv", "dev.tsv"):
        if (folder / split).is_file():
            with open(readable(folder / split, DataError), "rb") as f:
                return folder.resolve().name, folder, "tc" if f.readline().count(b"\t") == 3 else "lp"
    return folder.resolve().name, folder, "lp"


# ----------------------------------------------------------------------------- loading
def _read_rows(path, digest, ncols):
    """(rows, their line numbers): tab-separated rows of a UTF-8 file, ncols in each, its bytes added to `digest`.
    BOM, CRs and whitespace around lines (WN11's trailing tabs, which KG-BERT's line.strip() dropped too) are dropped;
    blank lines are skipped, as pandas-based readers skip them."""
    raw, text = read_text(path, DataError)  # missing, permission denied, not UTF-8: one line
    digest.update(path.name.encode() + b"\0" + raw)
    kept = [(i + 1, line.strip()) for i, line in enumerate(text.split("\n")) if line.strip()]
    if not kept:
        raise DataError(f"{path}:1: empty file")
    rows = [line.split("\t") for _, line in kept]
    for (n, _), row in zip(kept, rows):
        if len(row) != ncols:
            raise DataError(f"{path}:{n}: expected {ncols} tab-separated columns, got {len(row)}"
                            + (" (an id with no text)" if ncols == 2 and len(row) == 1 else ""))
    return rows, [n for n, _ in kept]


def _read_texts(path, digest):
    """{id: text} of an id<TAB>text file, in file order."""
    texts, (rows, lines) = {}, _read_rows(path, digest, 2)
    for n, (key, text) in zip(lines, rows):
        if key in texts:
            raise DataError(f"{path}:{n}: duplicate id {key!r}")
        texts[key] = text
    return texts


def _ids(texts, source, rows, cols):
    """(texts, (why an unknown id is an error, {id: index})): `texts` as read from `source`, or where a graph of one's
    own lacks that file, every id in `cols` of the train `rows` in first-seen order, its text with '_' as ' '."""
    why = f"has no text in {source}"
    if texts is None:
        texts = {i: i.replace("_", " ") for i in dict.fromkeys(row[c] for row in rows for c in cols)}
        why = "occurs nowhere in train.tsv"
    return texts, (why, {key: i for i, key in enumerate(texts)})


def _split(path, rows, lines, labelled, ents, rels):
    """(N,3) int64 triples and, when `labelled`, (N,) bool labels (1 -> True, -1 -> False); ents, rels: see _ids."""
    for n, row in zip(lines, rows if labelled else ()):
        if row[3] not in ("1", "-1"):
            raise DataError(f"{path}:{n}: label must be 1 or -1, got {row[3]!r}")
    parts = (ents, rels, ents)
    ids = np.array([[parts[c][1].get(row[c], -1) for c in range(3)] for row in rows], dtype=np.int64).reshape(-1, 3)
    for i, c in np.argwhere(ids < 0)[:1]:  # the first unknown id, by line
        raise DataError(f"{path}:{lines[i]}: {'relation' if c == 1 else 'entity'} {rows[i][c]!r} {parts[c][0]}")
    return ids, np.array([row[3] == "1" for row in rows], dtype=bool) if labelled else None


@dataclass(eq=False)
class KG:
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
    dev: np.ndarray  # (0,3) where a graph of one's own has no dev.tsv; likewise test
    test: np.ndarray
    dev_labels: np.ndarray | None  # tc: True for label 1, False for -1; lp: None
    test_labels: np.ndarray | None
    split_entities: np.ndarray  # sorted entities that occur in train/dev/test
    fingerprint: str  # sha256 over the files read
    known: np.ndarray  # sorted unique keys (h*R + r)*E + t of every true triple
    notes: list  # what a graph of one's own lacks, for the command lines to say once

    def key(self, triples):
        t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        return (t[:, 0] * len(self.relations) + t[:, 1]) * len(self.entities) + t[:, 2]

    def is_known(self, triples):
        """True where a triple is a fact of train, dev or test: the filter of the evaluation's ranks."""
        return in_sorted(self.known, self.key(triples))


def in_sorted(keys, k):
    """True where k is in the sorted array `keys`."""
    return keys[np.minimum(np.searchsorted(keys, k), len(keys) - 1)] == k


def load_kg(spec, data_dir=None, text="name"):
    """A benchmark by name, or one's own graph by folder (see dataset); every file checked, one-line errors."""
    name, folder, task = dataset(spec, data_dir)
    if text not in TEXTS:
        raise ValueError(f"text must be one of {TEXTS}, not {text!r}")
    own = str(spec).lower() not in DATASETS
    if not folder.is_dir():
        raise DataError(f"{folder}: no such dataset folder (python hub.py --download {name}, "
                        "or set --data-dir / PALT_DATA)")
    file, digest = (OWN_TEXTS if own else DATASETS[name][2]).get(text), hashlib.sha256()
    rel_file = None if own and not (folder / "relation2text.txt").is_file() else "relation2text.txt"
    if own and text == "name" and not (folder / file).is_file():
        file = None
    elif file is None or not (folder / file).is_file():  # never train on names by surprise
        raise DataError(f"{folder / (file or OWN_TEXTS[text])}: --text {text} needs the entity descriptions, which "
                        f"{'this release lacks' if file is None else 'are not in the folder'}; use --text name")
    notes = [f"{folder}: no {part}2text.txt, so {part} ids are their text (underscores as spaces)"
             for part, source in (("entity", file), ("relation", rel_file)) if source is None]
    ent = _read_texts(folder / file, digest) if file else None
    rel = _read_texts(folder / rel_file, digest) if rel_file else None
    rows = {s: _read_rows(folder / f"{s}.tsv", digest, 4 if task == "tc" and s != "train" else 3)
            for s in ("train", "dev", "test") if not own or s == "train" or (folder / f"{s}.tsv").is_file()}
    ent, ents = _ids(ent, file, rows["train"][0], (0, 2))
    rel, rels = _ids(rel, rel_file, rows["train"][0], (1,))
    (train, _), (dev, dev_labels), (test, test_labels) = [  # a split a graph of one's own lacks: no rows
        _split(folder / f"{s}.tsv", *rows.get(s, ([], [])), task == "tc" and s != "train", ents, rels)
        for s in ("train", "dev", "test")]
    first = np.sort(np.unique(train, axis=0, return_index=True)[1])
    if own and len(first) < len(train):  # benchmarks stay as released (WN11's train repeats 2,220 lines)
        notes.append(f"{folder / 'train.tsv'}: {len(train) - len(first):,} duplicate triples, each kept once")
        train = train[first]
    kg = KG(name, task, folder, text, file or "ids", list(ent), list(rel), list(ent.values()), list(rel.values()),
            train, dev, test, dev_labels, test_labels, np.unique(np.concatenate([train, dev, test])[:, [0, 2]]),
            digest.hexdigest()[:16], None, notes)
    # dev/test negatives of triple classification (label -1) are not facts
    true = [train] + [t if lab is None else t[lab] for t, lab in ((dev, dev_labels), (test, test_labels))]
    kg.known = np.unique(kg.key(np.concatenate(true)))
    return kg


# ----------------------------------------------------------------------------- tokens and sequences
@dataclass(eq=False)
class Encoded:
    cls_id: int
    sep_id: int
    pad_id: int
    ent_ids: np.ndarray  # np.int32 token ids: entity i is ent_ids[ent_off[i]:ent_off[i+1]], likewise relations
    ent_off: np.ndarray
    rel_ids: np.ndarray
    rel_off: np.ndarray


def _flat(tok, texts):
    """The token ids of all texts in one array, text i at ids[off[i]:off[i + 1]]."""
    ids = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(texts, add_special_tokens=False)]
    off = np.cumsum([0] + [len(x) for x in ids], dtype=np.int64)
    return np.concatenate(ids) if ids else np.zeros(0, np.int32), off


def encode(kg, tokenizer, new=()):
    """Token ids of every entity and relation text, no special tokens; `new` entity texts follow the graph's."""
    tok = Tokenizer.from_str(tokenizer.to_str())  # a copy: shipped tokenizers may pad/truncate, we do our own
    tok.no_padding()
    tok.no_truncation()
    specials = [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if None in specials:
        raise ValueError("tokenizer lacks one of [CLS], [SEP], [PAD]")
    return Encoded(*specials, *_flat(tok, kg.ent_text + list(new)), *_flat(tok, kg.rel_text))


def _part_lengths(enc, triples, max_seq_length):
    """(B,3) token counts of head, relation, tail truncated to max_seq_length - 3 tokens (callers subtract the prompts)
    as by popping one token at a time from the longest part (ties: tail, then relation, then head), in closed form:
    cap every part at a level T and hand the tokens left over to the parts longer than T, head first."""
    if max_seq_length < 3:
        raise ValueError("max_seq_length must leave room for [CLS] and two [SEP]")
    ent_len, rel_len = np.diff(enc.ent_off), np.diff(enc.rel_off)
    lens = np.stack([ent_len[triples[:, 0]], rel_len[triples[:, 1]], ent_len[triples[:, 2]]], 1)
    M = max_seq_length - 3
    s0, s1 = np.sort(lens, 1)[:, :2].T  # the two shortest parts
    T = np.where(s0 + 2 * s1 >= M, (M - s0) // 2, M - s0 - s1)  # the two longest parts cut, else only the longest
    T = np.where(3 * s0 >= M, M // 3, T)  # all three cut
    T = np.where(lens.sum(1) > M, T, np.iinfo(np.int64).max)  # none cut
    cut = np.minimum(lens, T[:, None])
    over = lens > T[:, None]
    return cut + (over & (np.cumsum(over, 1) <= (M - cut.sum(1))[:, None]))


def seq_lengths(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    return _part_lengths(enc, t, max_seq_length - sum(prompts)).sum(1) + 3 + sum(prompts)


def _fill(out, flat, src, dst, n):
    """out[i, dst[i] + j] = flat[src[i] + j] for j < n[i], all rows at once."""
    rows, j = np.nonzero(np.arange(n.max(initial=0))[None, :] < n[:, None])
    out[rows, dst[rows] + j] = flat[src[rows] + j]


def build_batch(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    """[CLS] P*b head rel P*m [SEP] tail P*e [SEP], right-padded to the longest row, at most max_seq_length long."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    b, m, e = prompts
    lens = _part_lengths(enc, t, max_seq_length - b - m - e)
    n = lens.sum(1) + 3 + b + m + e
    B, L = len(t), int(n.max(initial=3 + b + m + e))
    rows, col = np.arange(B), np.arange(L)[None, :]
    sep1 = 1 + b + lens[:, 0] + lens[:, 1] + m  # the first [SEP]
    input_ids = np.full((B, L), enc.pad_id, dtype=np.int64)
    input_ids[:, 0] = enc.cls_id
    input_ids[rows, sep1] = input_ids[rows, n - 1] = enc.sep_id
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 0]], np.full(B, 1 + b), lens[:, 0])
    _fill(input_ids, enc.rel_ids, enc.rel_off[t[:, 1]], 1 + b + lens[:, 0], lens[:, 1])
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 2]], sep1 + 1, lens[:, 2])
    prompt_index = np.full((B, L), -1, dtype=np.int64)
    for first, start, count in ((0, 1, b), (b, sep1 - m, m), (b + m, sep1 + 1 + lens[:, 2], e)):  # P*b, P*m, P*e
        for k in range(count):
            prompt_index[rows, start + k] = first + k
    real = col < n[:, None]
    batch = {"input_ids": input_ids, "token_type_ids": real & (col > sep1[:, None]), "attention_mask": real,
             "prompt_index": prompt_index}
    return {k: torch.from_numpy(v.astype(np.int64, copy=False)) for k, v in batch.items()}


# ----------------------------------------------------------------------------- negatives and link prediction
@torch.inference_mode()
def entity_embeddings(bert, S, enc, device="cpu", dtype="fp32", tokens=1 << 14):
    """(len(S), H) unit vectors: the frozen encoder's mean-pooled [CLS] text [SEP] states of the entities S, whose
    cosines find the near entities (hard negatives, the dev estimate, --predict's shortlist)."""
    n = np.minimum(np.diff(enc.ent_off)[S], 62) + 2  # [CLS] text [SEP], at most 64 tokens
    order, emb, i = np.argsort(-n, kind="stable"), torch.empty(len(S), bert.config.hidden_size), 0
    while i < len(S):  # longest first, batches of at most `tokens` tokens
        idx = order[i:i + max(1, tokens // int(n[order[i]]))]
        B, L = len(idx), int(n[idx].max())
        ids = np.full((B, L), enc.pad_id, dtype=np.int64)
        ids[:, 0], ids[np.arange(B), n[idx] - 1] = enc.cls_id, enc.sep_id
        _fill(ids, enc.ent_ids, enc.ent_off[S[idx]], np.ones(B, np.int64), n[idx] - 2)
        mask = torch.from_numpy(np.arange(L)[None, :] < n[idx][:, None]).to(device)
        with autocast(dtype, device):
            h = bert(torch.from_numpy(ids).to(device), None, mask.long(), output_hidden_states=True).hidden_states[-1]
        emb[idx] = ((h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).cpu()
        i += B
    return torch.nn.functional.normalize(emb, dim=-1)


def nearest_entities(kg, emb, k=32):
    """(E, k) int64: the k split entities nearest each one by the cosine of their embeddings (entity_embeddings of
    kg.split_entities), itself excluded (outside the splits: itself): the hard cases random draws from 40k miss."""
    S = kg.split_entities
    near = np.repeat(np.arange(len(kg.entities))[:, None], k, axis=1)
    for s in range(0, len(S) if len(S) > 1 else 0, 1024):  # (1024, |S|) similarities at a time
        sim = emb[s:s + 1024] @ emb.T
        sim[torch.arange(len(sim)), torch.arange(s, s + len(sim))] = -torch.inf  # not itself
        top = sim.topk(min(k, len(S) - 1), dim=1).indices.numpy()
        near[S[s:s + 1024]] = S[top[:, np.arange(k) % top.shape[1]]]  # fewer than k others: they repeat
    return near


class NegativeSampler:
    """Per train positive: n_head, n_rel, n_tail corruptions of that part that are no train triples, then n_self
    (0-2) self-negatives (SimKGC's) (h, r, h), (t, r, t): a text followed by itself reads as a perfect continuation,
    else the query entity outranks the answers. hard: the share of entity corruptions drawn from the replaced one's
    `near`. The filter is the train triples only, as in KG-BERT: dev and test facts never shape training, so a
    corruption that happens to be a test fact is a negative like any other."""

    def __init__(self, kg, n_head=1, n_rel=1, n_tail=1, n_self=0, seed=0, rounds=30, near=None, hard=0.0):
        self.kg, self.seed, self.rounds, self.near, self.hard = kg, seed, rounds, near, hard
        self.train_keys = np.unique(kg.key(kg.train))  # triple classification: train holds positives only
        self.column = np.repeat([0, 1, 2, 2, 0], [n_head, n_rel, n_tail, n_self > 0, n_self > 1])  # the part replaced
        self.is_self = np.arange(len(self.column)) >= n_head + n_rel + n_tail
        self.pools = (kg.split_entities, np.arange(len(kg.relations)), kg.split_entities)

    def is_train(self, triples):
        """True where a triple is a train triple: the corruptions redrawn."""
        return in_sorted(self.train_keys, self.kg.key(triples))

    def negatives(self, epoch):
        """(N_train, K, 3) int64, uniform over the valid corruptions, the same on every rank for (seed, epoch)."""
        kg, K, rng = self.kg, len(self.column), np.random.default_rng([self.seed, epoch])
        neg = np.repeat(kg.train[:, None, :], K, axis=1).reshape(-1, 3)
        col, own = np.tile(self.column, len(kg.train)), np.tile(self.is_self, len(kg.train))
        neg[own, col[own]] = neg[own, 2 - col[own]]  # the tail becomes the head, or the head the tail
        todo = np.nonzero(~own | self.is_train(neg))[0]  # a self-pair in train: drawn anew
        for _ in range(self.rounds):  # draw all, then redraw the train triples (the positive itself is one)
            c = col[todo]
            ent = kg.split_entities[rng.integers(len(kg.split_entities), size=len(todo))]
            if self.hard:  # a neighbour of the entity it replaces (column 0 stands in on relation rows, unused)
                replaced = kg.train[todo // K, np.where(c == 1, 0, c)]
                near = self.near[replaced, rng.integers(self.near.shape[1], size=len(todo))]
                ent = np.where(rng.random(len(todo)) < self.hard, near, ent)
            neg[todo, c] = np.where(c == 1, rng.integers(len(kg.relations), size=len(todo)), ent)
            todo = todo[self.is_train(neg[todo])]
        # left (rarely any): corruptions with few valid choices (umls has a (?, r, t) with 134 of 135 heads true)
        q = neg[todo]
        q[np.arange(len(todo)), col[todo]] = -1  # the query: each group's valid choices are enumerated once
        groups, inv = np.unique(np.column_stack([col[todo], q]), axis=0, return_inverse=True)
        for g, (c, *masked) in enumerate(groups):
            rows, pool = todo[inv.ravel() == g], self.pools[c]
            cand = np.tile(masked, (len(pool), 1))
            cand[:, c] = pool
            valid = pool[~self.is_train(cand)]
            if len(valid) == 0:
                h, r, t = kg.train[rows[0] // K]
                raise DataError(f"{kg.folder}: no {['head', 'relation', 'tail'][c]} corruption of ({kg.entities[h]}, "
                                f"{kg.relations[r]}, {kg.entities[t]}) is false: every candidate is a train triple")
            neg[rows, c] = valid[rng.integers(len(valid), size=len(rows))]
        return neg.reshape(-1, K, 3)


@dataclass(eq=False)
class LPQueries:
    candidates: np.ndarray  # (C,) entity indices that are ranked
    queries: np.ndarray  # (Q,3) rows (side, r, e): side 0 = (?, r, t=e), side 1 = (h=e, r, ?)
    triple_query: np.ndarray  # (T,2) index of each triple's head query and tail query
    target: np.ndarray  # (T,2) position in candidates of each triple's true head and tail
    filter_ptr: np.ndarray  # (Q+1,) CSR: filter_pos[filter_ptr[q]:filter_ptr[q+1]] are the positions in
    filter_pos: np.ndarray  # candidates of every known answer of query q (the triple's own one included)


def lp_queries(kg, split="test", candidates="split"):
    """Unique (?, r, t) and (h, r, ?) queries of a split, so each query's candidates are scored once. candidates:
    'split' (entities in any split), 'all' (every entity with text), or an array of entity indices (a sample)."""
    E, R = len(kg.entities), len(kg.relations)
    T, labels = getattr(kg, split), getattr(kg, f"{split}_labels", None)
    T = T if labels is None else T[labels]  # triple classification: its true triples
    cand = {"split": kg.split_entities, "all": np.arange(E)}[candidates] if isinstance(candidates, str) else candidates
    where = np.full(E, -1, dtype=np.int64)
    where[cand] = np.arange(len(cand))
    # a query as one int64: (side*R + r)*E + e; every known fact answers one head query and one tail query
    ukey, inv = np.unique(np.concatenate([T[:, 1] * E + T[:, 2], (R + T[:, 1]) * E + T[:, 0]]), return_inverse=True)
    h, r, t = kg.known // (R * E), kg.known // E % R, kg.known % E
    akey, ans = np.concatenate([r * E + t, (R + r) * E + h]), where[np.concatenate([h, t])]
    keep = (ans >= 0) & np.isin(akey, ukey)  # an answer outside a candidate sample is not ranked: nothing to filter
    order = np.lexsort((ans[keep], akey[keep]))  # by query, then by position
    ptr = np.append(np.searchsorted(akey[keep][order], ukey), keep.sum())
    return LPQueries(cand, np.stack([ukey // (R * E), ukey // E % R, ukey % E], 1), inv.reshape(2, -1).T.copy(),
                     np.stack([where[T[:, 0]], where[T[:, 2]]], 1), ptr, ans[keep][order])

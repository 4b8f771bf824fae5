"""Knowledge graphs in KG-BERT's text format -> BERT sentence pairs with PALT's prompt slots.

Data lives in --data-dir, else $PALT_DATA, else ./data; one folder per benchmark (../shared/data/README.md).
"""
import hashlib, os
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch
from tokenizers import Tokenizer

from files import readable


DATASETS = {  # name -> (folder, task: 'lp' link prediction or 'tc' triple classification, {--text: entity text file})
    "fb15k-237": ("FB15k-237", "lp", {"name": "entity2text.txt", "long": "entity2textlong.txt",
                                      "description": "entity2description.txt"}),  # "Name -- first sentence" (StAR's)
    "wn18rr": ("WN18RR", "lp", {"name": "entity2text.txt", "long": "entity2text.txt"}),  # names carry the definition
    "umls": ("umls", "lp", {"name": "entity2text.txt", "long": "entity2textlong.txt"}),
    "wn11": ("WN11", "tc", {"name": "entity2text.txt"}),
    "fb13": ("FB13", "tc", {"name": "entity2text_capital.txt", "long": "entity2text.txt"}),
}
TEXTS = ("name", "long", "description")
OWN_TEXTS = {"name": "entity2text.txt", "long": "entity2textlong.txt", "description": "entity2description.txt"}


class DataError(ValueError):
    """Bad or missing data; the message is one line, 'path:line: what is wrong'."""


def data_root(arg=None):
    return Path(arg or os.environ.get("PALT_DATA") or "data")


def dataset(spec, data_dir=None):
    """(name, folder, task) of a benchmark name (its folder under data_dir) or of a folder holding one's own graph:
    train.tsv, optional dev.tsv and test.tsv; a 4th column (1/-1) in test.tsv (else dev.tsv) makes it triple
    classification. A folder that shares a benchmark's name is given as a path (./umls)."""
    spec = str(spec)
    if spec.lower() in DATASETS:
        folder, task, _ = DATASETS[spec.lower()]
        return spec.lower(), data_root(data_dir) / folder, task
    folder = Path(spec)
    if not folder.is_dir():
        raise DataError(f"--data {spec}: neither a benchmark ({', '.join(DATASETS)}) nor a folder")
    if not (folder / "train.tsv").is_file():
        raise DataError(f"{folder / 'train.tsv'}: no such file (a graph's folder needs train.tsv: head<TAB>relation<TAB>tail)")
    task = "lp"
    for split in ("test.tsv", "dev.tsv"):
        if (folder / split).is_file():
            with open(readable(folder / split, DataError), "rb") as f:
                task = "tc" if f.readline().count(b"\t") == 3 else "lp"
            break
    return folder.resolve().name, folder, task


# ----------------------------------------------------------------------------- loading
def _read_rows(path, digest, ncols):
    """Tab-separated rows of a UTF-8 file, ncols in each; BOM, CRs, whitespace around lines and trailing blank lines
    are dropped (WN11's entity2text.txt has lines with a trailing tab, which KG-BERT's line.strip() dropped too).
    The file's bytes go into `digest`. An empty file is an error."""
    raw = Path(readable(path, DataError)).read_bytes()  # missing, or permission denied: one line
    digest.update(path.name.encode() + b"\0" + raw)
    try:
        lines = raw.decode("utf-8-sig").replace("\r\n", "\n").split("\n")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise DataError(f"{path}:1: empty file")
    rows = [line.strip().split("\t") for line in lines]
    for i, row in enumerate(rows):
        if len(row) != ncols:
            raise DataError(f"{path}:{i + 1}: expected {ncols} tab-separated columns, got {len(row)}"
                            + (" (an id with no text)" if ncols == 2 and len(row) == 1 else ""))
    return rows


def _read_texts(path, digest):
    """{id: text} of an id<TAB>text file, in file order."""
    texts = {}
    for i, (key, text) in enumerate(_read_rows(path, digest, 2)):
        if key in texts:
            raise DataError(f"{path}:{i + 1}: duplicate id {key!r}")
        texts[key] = text
    return texts


def _ids(rows, cols, texts, where):
    """{id: text}: `texts` from a text file, else every id of `cols` in `rows` in first-seen order, the id as its
    text (underscores as spaces); `where` names the file for messages."""
    if texts is not None:
        return texts, where
    ids = dict.fromkeys(row[c] for row in rows for c in cols)
    return {i: i.replace("_", " ") for i in ids}, "train.tsv"


def _split(path, rows, labelled, ents, rels):
    """(N,3) int64 triples and, when `labelled`, (N,) bool labels (1 -> True, -1 -> False). ents and rels:
    (the file that defines them, {id: index})."""
    for i, row in enumerate(rows if labelled else ()):
        if row[3] not in ("1", "-1"):
            raise DataError(f"{path}:{i + 1}: label must be 1 or -1, got {row[3]!r}")
    parts = (ents, rels, ents)
    ids = np.array([[parts[c][1].get(row[c], -1) for c in range(3)] for row in rows], dtype=np.int64).reshape(-1, 3)
    for i, c in np.argwhere(ids < 0)[:1]:  # the first unknown id, by line
        source = parts[c][0]
        why = "has no text in" if source.endswith(".txt") else "occurs nowhere in"
        raise DataError(f"{path}:{i + 1}: {'relation' if c == 1 else 'entity'} {rows[i][c]!r} {why} {source}")
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
        k = self.key(triples)
        i = np.minimum(np.searchsorted(self.known, k), len(self.known) - 1)
        return self.known[i] == k


def load_kg(spec, data_dir=None, text="name"):
    """A benchmark by name, or one's own graph by folder (see dataset); every file checked, one-line errors."""
    name, folder, task = dataset(spec, data_dir)
    if text not in TEXTS:
        raise ValueError(f"text must be one of {TEXTS}, not {text!r}")
    own = str(spec).lower() not in DATASETS
    if not folder.is_dir():
        raise DataError(f"{folder}: no such dataset folder (python hub.py --download {name}, or set --data-dir / PALT_DATA)")
    file, digest, notes = (OWN_TEXTS if own else DATASETS[name][2]).get(text), hashlib.sha256(), []
    if own and text == "name" and not (folder / file).is_file():
        file = None
        notes.append(f"{folder}: no entity2text.txt, so entity ids are their text (underscores as spaces)")
    elif file is None or not (folder / file).is_file():  # never train on names by surprise
        raise DataError(f"{folder / (file or OWN_TEXTS[text])}: --text {text} needs the entity descriptions, which "
                        f"{'this release lacks' if file is None else 'are not in the folder'}; use --text name")
    ent = _read_texts(folder / file, digest) if file else None
    rel = None if own and not (folder / "relation2text.txt").is_file() else _read_texts(folder / "relation2text.txt", digest)
    rows = {s: _read_rows(folder / f"{s}.tsv", digest, 4 if task == "tc" and s != "train" else 3)
            for s in ("train", "dev", "test") if not own or s == "train" or (folder / f"{s}.tsv").is_file()}
    ent, ent_src = _ids(rows["train"], (0, 2), ent, file)
    rel, rel_src = _ids(rows["train"], (1,), rel, "relation2text.txt")
    notes += [f"{folder}: no relation2text.txt, so relation ids are their text (underscores as spaces)"] * (rel_src == "train.tsv")
    ents, rels = (ent_src, {e: i for i, e in enumerate(ent)}), (rel_src, {r: i for i, r in enumerate(rel)})
    empty = (np.zeros((0, 3), np.int64), np.zeros(0, bool) if task == "tc" else None)
    (train, _), (dev, dev_labels), (test, test_labels) = [
        _split(folder / f"{s}.tsv", rows[s], task == "tc" and s != "train", ents, rels) if s in rows else empty
        for s in ("train", "dev", "test")]
    kg = KG(name, task, folder, text, file or "ids", list(ent), list(rel), list(ent.values()), list(rel.values()),
            train, dev, test, dev_labels, test_labels, np.unique(np.concatenate([train, dev, test])[:, [0, 2]]),
            digest.hexdigest()[:16], None, notes)
    # dev/test negatives of triple classification (label -1) are not facts
    true = [train] + [t if lab is None else t[lab] for t, lab in ((dev, dev_labels), (test, test_labels))]
    kg.known = np.unique(kg.key(np.concatenate(true)))
    return kg


# ----------------------------------------------------------------------------- tokenising
@dataclass(eq=False)
class Encoded:
    cls_id: int
    sep_id: int
    pad_id: int
    ent_ids: np.ndarray  # np.int32 token ids: entity i is ent_ids[ent_off[i]:ent_off[i+1]], likewise relations
    ent_off: np.ndarray
    rel_ids: np.ndarray
    rel_off: np.ndarray


def _flat(encodings):
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    off = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=off[1:])
    return np.concatenate(ids) if ids else np.zeros(0, np.int32), off


def encode(kg, tokenizer, new=()):
    """Token ids of every entity and relation text, without special tokens (~1-2 s for 41k WN18RR definitions);
    `new` entity texts, not in the graph, follow its entities (indices len(kg.entities), ...)."""
    tok = Tokenizer.from_str(tokenizer.to_str())  # a copy: shipped tokenizers may pad/truncate, we do our own
    tok.no_padding()
    tok.no_truncation()
    specials = [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if None in specials:
        raise ValueError("tokenizer lacks one of [CLS], [SEP], [PAD]")
    return Encoded(*specials, *_flat(tok.encode_batch(kg.ent_text + list(new), add_special_tokens=False)),
                   *_flat(tok.encode_batch(kg.rel_text, add_special_tokens=False)))


# ----------------------------------------------------------------------------- sequences
def _part_lengths(enc, triples, max_seq_length):
    """(B,3) token counts of head, relation, tail after longest-first truncation to max_seq_length - 3 (callers
    pass max_seq_length less the prompt tokens: the limit counts every position the model sees).

    Same result as popping one token at a time from the end of the currently longest part (ties: tail, then
    relation, then head lose first), in closed form: cap every part at a level T and hand the tokens left over
    to parts longer than T, head first."""
    if max_seq_length < 3:
        raise ValueError("max_seq_length must leave room for [CLS] and two [SEP]")
    lens = np.stack([np.diff(enc.ent_off)[triples[:, 0]], np.diff(enc.rel_off)[triples[:, 1]],
                     np.diff(enc.ent_off)[triples[:, 2]]], 1)
    M = max_seq_length - 3
    s = np.sort(lens, 1)
    T = np.where(3 * s[:, 0] >= M, M // 3, np.where(s[:, 0] + 2 * s[:, 1] >= M, (M - s[:, 0]) // 2, M - s[:, 0] - s[:, 1]))
    T = np.where(lens.sum(1) > M, T, np.iinfo(np.int64).max)
    cut = np.minimum(lens, T[:, None])
    over = lens > T[:, None]
    left = np.where(lens.sum(1) > M, M - cut.sum(1), 0)
    return cut + (over & (np.cumsum(over, 1) <= left[:, None]))


def seq_lengths(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    return _part_lengths(enc, t, max_seq_length - sum(prompts)).sum(1) + 3 + sum(prompts)


def _fill(out, flat, src, dst, n):
    """out[i, dst[i] + j] = flat[src[i] + j] for j < n[i], all rows at once."""
    if len(n) and n.max() > 0:
        rows, j = np.nonzero(np.arange(n.max())[None, :] < n[:, None])
        out[rows, dst[rows] + j] = flat[src[rows] + j]


def build_batch(enc, triples, prompts=(0, 0, 0), max_seq_length=192):
    """[CLS] P*b head rel P*m [SEP] tail P*e [SEP], right-padded to the longest row, at most max_seq_length long."""
    t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    b, m, e = prompts
    lens = _part_lengths(enc, t, max_seq_length - b - m - e)
    n = lens.sum(1) + 3 + b + m + e
    B, L = len(t), int(n.max()) if len(t) else 3 + b + m + e
    rows, col = np.arange(B), np.arange(L)[None, :]
    head = np.full(B, 1 + b)
    sep1 = head + lens[:, 0] + lens[:, 1] + m
    tail = sep1 + 1
    input_ids = np.full((B, L), enc.pad_id, dtype=np.int64)
    input_ids[:, 0] = enc.cls_id
    input_ids[rows, sep1] = input_ids[rows, n - 1] = enc.sep_id
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 0]], head, lens[:, 0])
    _fill(input_ids, enc.rel_ids, enc.rel_off[t[:, 1]], head + lens[:, 0], lens[:, 1])
    _fill(input_ids, enc.ent_ids, enc.ent_off[t[:, 2]], tail, lens[:, 2])
    prompt_index = np.full((B, L), -1, dtype=np.int64)
    prompt_index[:, 1:1 + b] = np.arange(b)
    for k in range(m):
        prompt_index[rows, sep1 - m + k] = b + k
    for k in range(e):
        prompt_index[rows, tail + lens[:, 2] + k] = b + m + k
    real = col < n[:, None]
    return {"input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy((real & (col > sep1[:, None])).astype(np.int64)),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "prompt_index": torch.from_numpy(prompt_index)}


# ----------------------------------------------------------------------------- negatives and link prediction
class NegativeSampler:
    """For each train positive: n_head head, n_rel relation, n_tail tail corruptions that are not known facts, and
    n_self (0-2) self-negatives (SimKGC's): (h, r, h), then (t, r, t). A text followed by itself reads as a perfect
    continuation, and random corruptions never show it: without them the query entity outranks the answers."""

    def __init__(self, kg, n_head=1, n_rel=1, n_tail=1, n_self=0, seed=0, rounds=30):
        self.kg, self.seed, self.rounds = kg, seed, rounds
        self.column = np.repeat([0, 1, 2, 2, 0], [n_head, n_rel, n_tail, n_self > 0, n_self > 1])  # the part replaced
        self.is_self = np.arange(len(self.column)) >= n_head + n_rel + n_tail
        self.pools = (kg.split_entities, np.arange(len(kg.relations)), kg.split_entities)

    def negatives(self, epoch):
        """(N_train, K, 3) int64, uniform over the valid corruptions, the same on every rank for (seed, epoch)."""
        kg, K = self.kg, len(self.column)
        rng = np.random.default_rng([self.seed, epoch])
        neg = np.repeat(kg.train[:, None, :], K, axis=1).reshape(-1, 3)
        col, own = np.tile(self.column, len(kg.train)), np.tile(self.is_self, len(kg.train))
        neg[own, col[own]] = neg[own, 2 - col[own]]  # the tail becomes the head, or the head the tail
        todo = np.nonzero(~own | kg.is_known(neg))[0]  # a self-pair that is a known fact gets a random one instead
        for _ in range(self.rounds):  # draw all, redraw only the known ones (the positive itself is known too)
            c = col[todo]
            ent = kg.split_entities[rng.integers(len(kg.split_entities), size=len(todo))]
            neg[todo, c] = np.where(c == 1, rng.integers(len(kg.relations), size=len(todo)), ent)
            todo = todo[kg.is_known(neg[todo])]
            if len(todo) == 0:
                return neg.reshape(-1, K, 3)
        # left: corruptions with few valid choices (umls has a (?, r, t) with 134 of 135 heads true): enumerate them
        q = neg[todo].copy()
        q[np.arange(len(todo)), col[todo]] = -1
        groups, inv = np.unique(np.column_stack([col[todo], q]), axis=0, return_inverse=True)
        for g, (c, *masked) in enumerate(groups):
            cand = np.repeat(np.array(masked)[None, :], len(self.pools[c]), axis=0)
            cand[:, c] = self.pools[c]
            valid = self.pools[c][~kg.is_known(cand)]
            if len(valid) == 0:
                part, (h, r, t) = ["head", "relation", "tail"][c], kg.train[todo[inv.ravel() == g][0] // K]
                raise DataError(f"{kg.folder}: no {part} corruption of ({kg.entities[h]}, {kg.relations[r]}, "
                                f"{kg.entities[t]}) is false: every candidate is a known fact")
            rows = todo[inv.ravel() == g]
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
    # a query as one int64: (side*R + r)*E + e
    qkey = np.concatenate([T[:, 1] * E + T[:, 2], (R + T[:, 1]) * E + T[:, 0]])
    ukey, inv = np.unique(qkey, return_inverse=True)
    queries = np.stack([ukey // (R * E), ukey // E % R, ukey % E], 1)
    # every known fact answers one head query and one tail query
    k = kg.known
    h, r, t = k // (R * E), k // E % R, k % E
    akey = np.concatenate([r * E + t, (R + r) * E + h])
    ans = where[np.concatenate([h, t])]
    keep = ans >= 0  # an answer outside a candidate sample is not ranked: nothing to filter
    order = np.lexsort((ans[keep], akey[keep]))
    akey, ans = akey[keep][order], ans[keep][order]
    lo, hi = np.searchsorted(akey, ukey, "left"), np.searchsorted(akey, ukey, "right")
    ptr = np.zeros(len(ukey) + 1, dtype=np.int64)
    np.cumsum(hi - lo, out=ptr[1:])
    pos = ans[np.repeat(lo - ptr[:-1], hi - lo) + np.arange(ptr[-1])]
    return LPQueries(cand, queries, inv.reshape(2, -1).T.copy(), np.stack([where[T[:, 0]], where[T[:, 2]]], 1), ptr, pos)

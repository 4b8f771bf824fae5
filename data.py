"""Knowledge graphs in KG-BERT's text format -> BERT sentence pairs with PALT's prompt slots.

    python data.py --stats [--data-dir D] [--model minilm] [--text name|long]
    python data.py --download NAME [--data-dir D]

Data lives in --data-dir, else $PALT_DATA, else ./data; one folder per benchmark (../shared/data/README.md).
Token ids of entity/relation texts are cached in $PALT_CACHE (else ~/.cache/palt) as .npz keyed by the
tokenizer and the files read, because the data folder may be read-only.
"""
import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import bert

DATASETS = {  # name -> (folder, task); 'lp' link prediction, 'tc' triple classification
    "fb15k-237": ("FB15k-237", "lp"), "wn18rr": ("WN18RR", "lp"), "umls": ("umls", "lp"),
    "wn11": ("WN11", "tc"), "fb13": ("FB13", "tc"),
}
TEXT_FILES = {  # name -> (entity names, entity descriptions for --text long; None: the release has none)
    "fb15k-237": ("entity2text.txt", "entity2textlong.txt"), "umls": ("entity2text.txt", "entity2textlong.txt"),
    "wn18rr": ("entity2text.txt", "entity2text.txt"),  # WN18RR's names already carry the synset definition
    "wn11": ("entity2text.txt", None), "fb13": ("entity2text_capital.txt", "entity2text.txt"),
}
PAPER = {  # the PALT paper's table: entities, relations, train, dev, test (tc: positives only)
    "fb15k-237": (14541, 237, 272115, 17535, 20466), "wn18rr": (40943, 11, 86835, 3034, 3134),
    "umls": (135, 46, 5216, 652, 661), "wn11": (38696, 11, 112581, 2609, 10544),
    "fb13": (75043, 13, 316232, 5908, 23733),
}
KGBERT_URL = "https://raw.githubusercontent.com/yao8839836/kg-bert/master/data"
SHA256 = {  # of ../shared/data, byte-identical to KG-BERT's data/<folder>/<file>
    "FB15k-237": {
        "train.tsv": "6e4c2782169af21e9743f3b1d200886f5d595bf6bc504ec1351720949c5cdfae",
        "dev.tsv": "cf6309010852f6a8d47a45df830a426415d1ee6f7a3970a8376ff1fb81db4a5c",
        "test.tsv": "5711cf41623ceb4eacc50eb6108a3ca6565c7492e3caaf82a3e355cc660d1574",
        "entity2text.txt": "16beedcfad3d32696e8b0b98cfa0f5eeb144f5142225f227a64fd9ce37447da5",
        "relation2text.txt": "4bf7cb6ea0ac09b17ad210889f723be5e079669f6ae5d507787e1320bbaa0f72",
        "entities.txt": "7341cc8e03b3b0293d2a3cf7b355513e76a70558a804ad8572bb9847a51fdec1",
        "relations.txt": "8abf7ba03bad41395095538e4678ab61831d337ab37d3d4f8bacea6514e0a9fc"},
    "WN18RR": {
        "train.tsv": "038612e783c215ee5f3ca9fbfca27b8d0739be1028fe4ee7c174aecf0b83d5df",
        "dev.tsv": "453ce7202afa58094a04d2b1560ee2b02660f1c260b32ce6651c8ccedd1028ab",
        "test.tsv": "0383bceaaa1096cf3c03ec021ed0048068e2355dbfc0239b292cefdac821cec5",
        "entity2text.txt": "8f5c6f11753dafa879917b9bdf73d398ceb3bd4bed8d5553177e1e0f2c37521f",
        "relation2text.txt": "91b1de5585d686ed31498d50f1c4eed44ba9486dffbbcc0c28927ac884184918",
        "entities.txt": "178f3020f4a4dd7a2b51a93d8f4e95b38f7b431b0eadb5d317a2ce2f0b3097f0",
        "relations.txt": "53e8790103375e198e418ba55fc52118789dab8ffe55a848a150dfb630cbd3ad"},
    "umls": {
        "train.tsv": "873ef4925516b83e7f6f8cc02b4be51d848828710a7f65a956f0ac4a9e452f35",
        "dev.tsv": "025c98f8a4891e2a6582ec5b40ee0d904031edad9c52554522f4b7904820c98e",
        "test.tsv": "a7eb529a3d2810fcc96341ccc97c625a5e202f8389673aa6bd317eeebbb79014",
        "entity2text.txt": "c6438aafd894917cefe73ea75fc20743d18f4226ebc85a2f43758ff3f77330b9",
        "entity2textlong.txt": "cb4eccdebf5bfc73adc2db0fc582d215256aa11d789d3a16a6c0649f338f5fe3",
        "relation2text.txt": "f5c5eddf696c52fc3c435ac031a4a0b06e00cc09116613db6a835d02d610123c",
        "entities.txt": "c3090e4df683379d0fb47fe229859b5bfddb8d0e7802f8b3c506bb2290c5ff39",
        "relations.txt": "aa4a63754c991824210568dc83e8e4a74d7c0ee0ff6af2c5605fde84e55d82f9"},
    "WN11": {
        "train.tsv": "1a49d78c8bbd2285514f7aaa4d5c9390c1fbb4fdd7151013d8285b01420b4651",
        "dev.tsv": "c98b66ad43717096069551df27b4261f5ddf336d6c742848b52d5f17c3bfaaa0",
        "test.tsv": "ebcf1c6f84d5f27c85e173f399ae7c4755fd582a0d95c7173369f6ca539c9f0f",
        "entity2text.txt": "1d24b57a5f9f357e55d7f0b50c7ccc490c1fa4c3c7e05114774e3d3d6ef13ea8",
        "relation2text.txt": "5c70b04e6c7e1801a3f6dc2bbc88ebf7fbdb4777fa4f60ec2deffb84e56d8364",
        "entities.txt": "b157eb54ddbe968ad20946b63cb722d2d3f85f84beca2b1e47e33af31d15e85a",
        "relations.txt": "ac2e16f32ca29c644bf625178fbfcc331a66951c7addf44fe28a6228bb0a64f0"},
    "FB13": {
        "train.tsv": "a5fbd015907724cea39d1eb8379cdd5b4859515196beda261e302401428035fb",
        "dev.tsv": "431d05a8dd27cf5adbfc9ae5f7f3f40037bcdc9632bfc87eccdb4895e2633c6c",
        "test.tsv": "a85b2e843f64b2020987bf3e99aac0a875ac5d05e900f5a63a37305b7c34741b",
        "entity2text_capital.txt": "5f5ba84d01c04439d08ac1017899d5de6657cece40ef495b28fe8373a41da349",
        "entity2textshort.txt": "b873ce212bfb4c1578a6715a9fe24c46ff3d3432b4806fafc4a3178b8a59e08a",
        "relation2text.txt": "c241b943d1edf0aad191aa1317659d7a4d8a5d6fc326a35d222d9827093c0a58",
        "entities.txt": "cf2bb785e92fea8e6e09aa140706a9177c9011dbce01f5ae58ad6f429773a055",
        "relations.txt": "5462766fa824ab3f725262cba025fa393c29b85ddeb92a03c1d7efd39826c56a"},
}


class DataError(ValueError):
    """Bad or missing data; the message is one line, 'path:line: what is wrong'."""


def data_root(arg=None):
    return Path(arg or os.environ.get("PALT_DATA") or "data")


def dataset(name):
    if name.lower() not in DATASETS:
        raise DataError(f"{name}: unknown dataset (one of {', '.join(DATASETS)})")
    return name.lower(), *DATASETS[name.lower()]

# ----------------------------------------------------------------------------- loading


def _read_lines(path, digest):
    """Lines of a UTF-8 file without BOM, CRs and trailing blank lines; its bytes go into `digest`."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    raw = path.read_bytes()
    digest.update(path.name.encode() + b"\0" + raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _read_texts(path, digest):
    """{id: text} of an id<TAB>text file, in file order."""
    # strip(): WN11's entity2text.txt has lines with a trailing tab, which KG-BERT's line.strip() dropped
    rows = [line.strip().split("\t") for line in _read_lines(path, digest)]
    texts = {}
    for i, row in enumerate(rows):
        if len(row) != 2:
            raise DataError(f"{path}:{i + 1}: expected 'id<TAB>text', got {len(row)} column(s)"
                            + (" (an id with no text)" if len(row) == 1 else ""))
        if row[0] in texts:
            raise DataError(f"{path}:{i + 1}: duplicate id {row[0]!r}")
        texts[row[0]] = row[1]
    return texts


def _read_split(path, digest, labelled, ent_index, rel_index, text_files):
    """(N,3) int64 triples and, when `labelled`, (N,) bool labels (1 -> True, -1 -> False)."""
    rows = [line.split("\t") for line in _read_lines(path, digest)]
    if not rows:
        raise DataError(f"{path}:1: empty split")
    ncols = 4 if labelled else 3
    for i, row in enumerate(rows):
        if len(row) != ncols:
            raise DataError(f"{path}:{i + 1}: expected {ncols} tab-separated columns, got {len(row)}")
    cols = []
    for c, index, what, text_file in ((0, ent_index, "entity", text_files[0]), (1, rel_index, "relation", text_files[1]),
                                      (2, ent_index, "entity", text_files[0])):
        try:
            cols.append(np.array([index[row[c]] for row in rows], dtype=np.int64))
        except KeyError:  # find the line for the message
            i = next(i for i, row in enumerate(rows) if row[c] not in index)
            raise DataError(f"{path}:{i + 1}: {what} {rows[i][c]!r} has no text in {text_file.name}") from None
    labels = None
    if labelled:
        for i, row in enumerate(rows):
            if row[3] not in ("1", "-1"):
                raise DataError(f"{path}:{i + 1}: label must be 1 or -1, got {row[3]!r}")
        labels = np.array([row[3] == "1" for row in rows], dtype=bool)
    return np.stack(cols, 1), labels


@dataclass(eq=False)
class KG:
    name: str
    task: str  # 'lp' | 'tc'
    folder: Path
    text: str  # 'name' | 'long'
    text_file: str  # the entity text file actually read
    entities: list  # ids as in the files; every entity with text, in text-file order
    relations: list
    ent_text: list
    rel_text: list
    train: np.ndarray  # (N,3) int64 rows (h, r, t)
    dev: np.ndarray
    test: np.ndarray
    dev_labels: np.ndarray | None  # tc: True for label 1, False for -1; lp: None
    test_labels: np.ndarray | None
    split_entities: np.ndarray  # sorted entities that occur in train/dev/test
    fingerprint: str  # sha256 over the files read
    known: np.ndarray  # sorted unique keys (h*R + r)*E + t of every true triple

    def key(self, triples):
        t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        return (t[:, 0] * len(self.relations) + t[:, 1]) * len(self.entities) + t[:, 2]

    def is_known(self, triples):
        k = self.key(triples)
        i = np.minimum(np.searchsorted(self.known, k), len(self.known) - 1)
        return self.known[i] == k


def load_kg(name, data_dir=None, text="name"):
    name, folder, task = dataset(name)
    folder = data_root(data_dir) / folder
    if text not in ("name", "long"):
        raise ValueError(f"text must be 'name' or 'long', not {text!r}")
    if not folder.is_dir():
        raise DataError(f"{folder}: no such dataset folder (python data.py --download {name}, or set --data-dir / PALT_DATA)")
    names, long = TEXT_FILES[name]
    if text == "long" and (long is None or not (folder / long).is_file()):  # never train on names by surprise
        raise DataError(f"{folder / (long or 'entity2textlong.txt')}: --text long needs the entity descriptions, "
                        f"which {'this release lacks' if long is None else 'are not in the folder'}; use --text name")
    text_file = folder / (long if text == "long" else names)
    digest = hashlib.sha256()
    ent = _read_texts(text_file, digest)
    rel = _read_texts(folder / "relation2text.txt", digest)
    ent_index = {e: i for i, e in enumerate(ent)}
    rel_index = {r: i for i, r in enumerate(rel)}
    splits = [_read_split(folder / f"{s}.tsv", digest, task == "tc" and s != "train", ent_index, rel_index,
                          (text_file, folder / "relation2text.txt")) for s in ("train", "dev", "test")]
    (train, _), (dev, dev_labels), (test, test_labels) = splits
    kg = KG(name, task, folder, text, text_file.name, list(ent), list(rel), list(ent.values()), list(rel.values()),
            train, dev, test, dev_labels, test_labels,
            np.unique(np.concatenate([s[0][:, [0, 2]].ravel() for s in splits])), digest.hexdigest()[:16], None)
    # dev/test negatives of triple classification (label -1) are not facts
    true = [train] + [t if lab is None else t[lab] for t, lab in ((dev, dev_labels), (test, test_labels))]
    kg.known = np.unique(kg.key(np.concatenate(true)))
    return kg

# ----------------------------------------------------------------------------- tokenising


@dataclass(eq=False)
class Encoded:
    ent: list  # np.int32 token ids per entity text (views into ent_ids)
    rel: list
    cls_id: int
    sep_id: int
    pad_id: int
    ent_ids: np.ndarray  # flat storage: entity i is ent_ids[ent_off[i]:ent_off[i+1]]
    ent_off: np.ndarray
    rel_ids: np.ndarray
    rel_off: np.ndarray


def _flat(encodings):
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    off = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=off[1:])
    return np.concatenate(ids) if ids else np.zeros(0, np.int32), off


def encode(kg, tokenizer, cache_dir=None):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.to_str())  # a copy: shipped tokenizers may pad/truncate, we do our own
    tok.no_padding()
    tok.no_truncation()
    specials = [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if None in specials:
        raise ValueError("tokenizer lacks one of [CLS], [SEP], [PAD]")
    key = hashlib.sha256((tok.to_str() + kg.fingerprint).encode()).hexdigest()[:16]
    cache = Path(cache_dir or os.environ.get("PALT_CACHE") or Path.home() / ".cache" / "palt") / f"{kg.name}-{key}.npz"
    try:
        with np.load(cache, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("ent_ids", "ent_off", "rel_ids", "rel_off")}
        if len(arrays["ent_off"]) != len(kg.entities) + 1 or len(arrays["rel_off"]) != len(kg.relations) + 1:
            arrays = None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # none yet, or damaged: tokenise again
        arrays = None
    if arrays is None:
        ent_ids, ent_off = _flat(tok.encode_batch(kg.ent_text, add_special_tokens=False))
        rel_ids, rel_off = _flat(tok.encode_batch(kg.rel_text, add_special_tokens=False))
        arrays = dict(ent_ids=ent_ids, ent_off=ent_off, rel_ids=rel_ids, rel_off=rel_off)
        try:  # atomic, so that concurrent runs (DDP ranks) never read half a file; a read-only cache is no error
            cache.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=cache.parent, suffix=".tmp", delete=False) as f:
                np.savez(f, **arrays)
            os.replace(f.name, cache)
        except OSError:
            pass
    split = lambda ids, off: np.split(ids, off[1:-1]) if len(off) > 1 else []
    return Encoded(split(arrays["ent_ids"], arrays["ent_off"]), split(arrays["rel_ids"], arrays["rel_off"]),
                   *specials, **arrays)

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
    """For each train positive: n_head head, n_rel relation, n_tail tail corruptions that are not known facts."""

    def __init__(self, kg, n_head=1, n_rel=1, n_tail=1, seed=0, rounds=30):
        self.kg, self.seed, self.rounds = kg, seed, rounds
        self.column = np.repeat([0, 1, 2], [n_head, n_rel, n_tail])  # which part each corruption replaces
        self.pools = (kg.split_entities, np.arange(len(kg.relations)), kg.split_entities)

    def negatives(self, epoch):
        """(N_train, K, 3) int64, uniform over the valid corruptions, the same on every rank for (seed, epoch)."""
        kg, K = self.kg, len(self.column)
        rng = np.random.default_rng([self.seed, epoch])
        neg = np.repeat(kg.train[:, None, :], K, axis=1).reshape(-1, 3)
        col = np.tile(self.column, len(kg.train))
        todo = np.arange(len(neg))
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
    """Unique (?, r, t) and (h, r, ?) queries of a split, so each query's candidates are scored once."""
    E, R = len(kg.entities), len(kg.relations)
    T = getattr(kg, split)
    labels = getattr(kg, f"{split}_labels", None)
    T = T if labels is None else T[labels]
    if candidates not in ("split", "all"):
        raise ValueError(f"candidates must be 'split' or 'all', not {candidates!r}")
    cand = kg.split_entities if candidates == "split" else np.arange(E)  # 'all': every entity with text
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
    order = np.lexsort((ans, akey))
    akey, ans = akey[order], ans[order]
    lo, hi = np.searchsorted(akey, ukey, "left"), np.searchsorted(akey, ukey, "right")
    ptr = np.zeros(len(ukey) + 1, dtype=np.int64)
    np.cumsum(hi - lo, out=ptr[1:])
    pos = ans[np.repeat(lo - ptr[:-1], hi - lo) + np.arange(ptr[-1])]  # every fact's entities are candidates
    return LPQueries(cand, queries, inv.reshape(2, -1).T.copy(), np.stack([where[T[:, 0]], where[T[:, 2]]], 1), ptr, pos)

# ----------------------------------------------------------------------------- download and stats


def download(name, data_dir=None, base_url=None, checksums=None):
    """Fetch a benchmark into <data root>/<folder>, each file checked against its sha256 and renamed atomically."""
    name, folder, _ = dataset(name)
    base = (base_url or os.environ.get("PALT_DATA_URL") or KGBERT_URL).rstrip("/")
    target = data_root(data_dir) / folder
    target.mkdir(parents=True, exist_ok=True)
    for file, want in (checksums or SHA256)[folder].items():
        dest, url = target / file, f"{base}/{folder}/{file}"
        if dest.is_file() and bert.sha256_file(dest) == want:
            continue
        try:
            bert.download(url, dest, sha256=want)  # resumable, checked, atomic
        except bert.CheckpointError as e:
            raise DataError(str(e)) from None
        except urllib.error.HTTPError as e:
            raise DataError(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise DataError(f"{url}: cannot download ({getattr(e, 'reason', e)}); put {', '.join(SHA256[folder])} "
                            f"from KG-BERT's data/{folder}/ into {target}/ (or point --data-dir / PALT_DATA at them)") from None
        print(f"{dest}  ok", file=sys.stderr)
    return target


def stats(data_dir=None, model="minilm", text="name"):
    try:
        tok = bert.load_tokenizer(bert.resolve_model(model))
    except bert.CheckpointError as e:
        raise SystemExit(f"error: {e}")
    root, fmt = data_root(data_dir), lambda x: f"{x:,}"
    found = [name for name, (folder, _) in DATASETS.items() if (root / folder).is_dir()]
    if not found:
        raise DataError(f"{root}: none of {', '.join(f for f, _ in DATASETS.values())} is there (--data-dir, PALT_DATA)")
    print(f"data {root}, tokenizer {model}, --text {text}; tc dev/test = positives+negatives")
    print(f"{'dataset':10} {'entity text':24} {'entities (text)':>18} {'rel':>4} {'train':>8} {'dev':>13} "
          f"{'test':>15} {'tok mean':>8} {'max':>4} | paper: entities rel train dev test")
    for name in found:
        kg = load_kg(name, root, text)
        n_tok = np.diff(encode(kg, tok).ent_off)
        count = lambda s, lab: fmt(len(s)) if lab is None else f"{fmt(lab.sum())}+{fmt((~lab).sum())}"
        print(f"{kg.folder.name:10} {kg.text_file:24} {fmt(len(kg.split_entities)) + f' ({fmt(len(kg.entities))})':>18} "
              f"{len(kg.relations):>4} {fmt(len(kg.train)):>8} {count(kg.dev, kg.dev_labels):>13} "
              f"{count(kg.test, kg.test_labels):>15} {n_tok.mean():8.1f} {n_tok.max():4} | "
              + " ".join(map(fmt, PAPER[name])))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stats", action="store_true", help="counts of every dataset found beside the paper's")
    p.add_argument("--download", metavar="NAME", help=f"fetch one of {', '.join(DATASETS)} from KG-BERT's repository")
    p.add_argument("--data-dir", help="folder holding the dataset folders (default $PALT_DATA, else ./data)")
    p.add_argument("--model", default="minilm", help="tokenizer for --stats: minilm or a model name/dir")
    p.add_argument("--text", default="name", choices=["name", "long"])
    args = p.parse_args()
    if not (args.stats or args.download):
        p.error("nothing to do: give --stats or --download NAME")
    try:
        if args.download:
            download(args.download, args.data_dir)
        if args.stats:
            stats(args.data_dir, args.model, args.text)
    except DataError as e:
        raise SystemExit(f"error: {e}")

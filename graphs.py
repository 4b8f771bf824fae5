"""A knowledge graph's files -> KG: the five benchmarks in KG-BERT's text format, or a folder
holding a graph of one's own; every file and line checked, one-line errors naming file and line.
Data lives in --data-dir, else $PALT_DATA, else ./data; one folder per benchmark
(../shared/data/README.md)."""
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from files import read_text, readable

OWN_TEXTS = {"name": "entity2text.txt", "long": "entity2textlong.txt",
             "description": "entity2description.txt"}
# name -> (folder, task: 'lp' link prediction or 'tc' triple classification, {--text: entity
# text file}); FB15k-237's descriptions are StAR's "Name -- first sentence"; WN18RR's names carry
# the definition
DATASETS = {
    "fb15k-237": ("FB15k-237", "lp", OWN_TEXTS),
    "wn18rr": ("WN18RR", "lp", {"name": "entity2text.txt", "long": "entity2text.txt"}),
    "umls": ("umls", "lp", {"name": "entity2text.txt", "long": "entity2textlong.txt"}),
    "wn11": ("WN11", "tc", {"name": "entity2text.txt"}),
    "fb13": ("FB13", "tc", {"name": "entity2text_capital.txt", "long": "entity2text.txt"}),
}
TEXTS = ("name", "long", "description")


class DataError(ValueError):
    """Bad or missing data; the message is one line, 'path:line: what is wrong'."""


def data_root(arg=None):
    """The folder of the benchmark folders: --data-dir, else $PALT_DATA, else ./data."""
    return Path(arg or os.environ.get("PALT_DATA") or "data")


def dataset(spec, data_dir=None):
    """(name, folder, task) of a benchmark name or of a folder holding one's own graph (train.tsv,
    optional dev.tsv and test.tsv; ./umls if named like a benchmark), whose task is 'tc' if test.tsv
    (else dev.tsv) has a 4th column 1/-1."""
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
                columns = f.readline().count(b"\t") + 1
            return folder.resolve().name, folder, "tc" if columns == 4 else "lp"
    return folder.resolve().name, folder, "lp"


# ----------------------------------------------------------------------------- reading the files
def _read_rows(path, digest, ncols):
    """(rows, their line numbers): tab-separated rows of a UTF-8 file, ncols in each, its bytes
    added to `digest`. BOM, CRs and whitespace around lines (WN11's trailing tabs, which KG-BERT's
    line.strip() dropped too) are dropped; blank lines are skipped, as pandas-based readers skip
    them."""
    raw, text = read_text(path, DataError)  # missing, permission denied, not UTF-8: one line
    digest.update(path.name.encode() + b"\0" + raw)
    kept = [(i + 1, line.strip()) for i, line in enumerate(text.split("\n")) if line.strip()]
    if not kept:
        raise DataError(f"{path}:1: empty file")
    rows = [line.split("\t") for _, line in kept]
    for (n, _), row in zip(kept, rows):
        if len(row) == ncols:
            continue
        hint = " (an id with no text)" if ncols == 2 and len(row) == 1 else ""
        raise DataError(f"{path}:{n}: expected {ncols} tab-separated columns, got {len(row)}{hint}")
    return rows, [n for n, _ in kept]


def _read_texts(path, digest):
    """{id: text} of an id<TAB>text file, in file order."""
    texts = {}
    rows, lines = _read_rows(path, digest, 2)
    for n, (key, text) in zip(lines, rows):
        if key in texts:
            raise DataError(f"{path}:{n}: duplicate id {key!r}")
        texts[key] = text
    return texts


def _ids(texts, source, rows, cols):
    """(texts, (why an unknown id is an error, {id: index})): `texts` as read from `source`, or
    where a graph of one's own lacks that file, every id in `cols` of the train `rows` in first-seen
    order, its text with '_' as ' '."""
    why = f"has no text in {source}"
    if texts is None:
        ids = dict.fromkeys(row[c] for row in rows for c in cols)  # first-seen order
        texts = {i: i.replace("_", " ") for i in ids}
        why = "occurs nowhere in train.tsv"
    return texts, (why, {key: i for i, key in enumerate(texts)})


def _split(path, rows, lines, labelled, ents, rels):
    """(N,3) int64 triples and, when `labelled`, (N,) bool labels (1 -> True, -1 -> False); ents,
    rels: see _ids."""
    for n, row in zip(lines, rows if labelled else ()):
        if row[3] not in ("1", "-1"):
            raise DataError(f"{path}:{n}: label must be 1 or -1, got {row[3]!r}")
    parts = (ents, rels, ents)
    ids = [[parts[c][1].get(row[c], -1) for c in range(3)] for row in rows]
    ids = np.array(ids, dtype=np.int64).reshape(-1, 3)
    for i, c in np.argwhere(ids < 0)[:1]:  # the first unknown id, by line
        what = "relation" if c == 1 else "entity"
        raise DataError(f"{path}:{lines[i]}: {what} {rows[i][c]!r} {parts[c][0]}")
    if not labelled:
        return ids, None
    return ids, np.array([row[3] == "1" for row in rows], dtype=bool)


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
        """One int64 per triple, (h*R + r)*E + t: sorted keys make set lookups vectorised."""
        t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        return (t[:, 0] * len(self.relations) + t[:, 1]) * len(self.entities) + t[:, 2]

    def is_known(self, triples):
        """True where a triple is a fact of train, dev or test: the filter of the evaluation's
        ranks."""
        return in_sorted(self.known, self.key(triples))


def in_sorted(keys, k):
    """True where k is in the sorted array `keys`."""
    return keys[np.minimum(np.searchsorted(keys, k), len(keys) - 1)] == k


def load_kg(spec, data_dir=None, text="name"):
    """A benchmark by name, or one's own graph by folder (see dataset); every file checked, one-line
    errors."""
    name, folder, task = dataset(spec, data_dir)
    if text not in TEXTS:
        raise ValueError(f"text must be one of {TEXTS}, not {text!r}")
    own_graph = str(spec).lower() not in DATASETS
    if not folder.is_dir():
        raise DataError(f"{folder}: no such dataset folder (python hub.py --download {name}, "
                        "or set --data-dir / PALT_DATA)")
    file = (OWN_TEXTS if own_graph else DATASETS[name][2]).get(text)
    digest = hashlib.sha256()
    rel_file = "relation2text.txt"
    if own_graph and not (folder / rel_file).is_file():
        rel_file = None
    if own_graph and text == "name" and not (folder / file).is_file():
        file = None
    elif file is None or not (folder / file).is_file():  # never train on names by surprise
        why = "this release lacks" if file is None else "are not in the folder"
        raise DataError(f"{folder / (file or OWN_TEXTS[text])}: --text {text} needs the entity "
                        f"descriptions, which {why}; use --text name")
    notes = [f"{folder}: no {part}2text.txt, so {part} ids are their text (underscores as spaces)"
             for part, source in (("entity", file), ("relation", rel_file)) if source is None]
    ent = _read_texts(folder / file, digest) if file else None
    rel = _read_texts(folder / rel_file, digest) if rel_file else None
    rows = {}
    for s in ("train", "dev", "test"):
        if not own_graph or s == "train" or (folder / f"{s}.tsv").is_file():
            ncols = 4 if task == "tc" and s != "train" else 3
            rows[s] = _read_rows(folder / f"{s}.tsv", digest, ncols)
    ent, ents = _ids(ent, file, rows["train"][0], (0, 2))
    rel, rels = _ids(rel, rel_file, rows["train"][0], (1,))
    splits = {}
    for s in ("train", "dev", "test"):  # a split a graph of one's own lacks: no rows
        labelled = task == "tc" and s != "train"
        splits[s] = _split(folder / f"{s}.tsv", *rows.get(s, ([], [])), labelled, ents, rels)
    (train, _), (dev, dev_labels), (test, test_labels) = splits.values()
    first = np.sort(np.unique(train, axis=0, return_index=True)[1])
    # benchmarks stay as released (WN11's train repeats 2,220 lines)
    if own_graph and len(first) < len(train):
        notes.append(f"{folder / 'train.tsv'}: {len(train) - len(first):,} duplicate triples, each "
                     "kept once")
        train = train[first]
    split_entities = np.unique(np.concatenate([train, dev, test])[:, [0, 2]])
    kg = KG(name, task, folder, text, file or "ids", list(ent), list(rel), list(ent.values()),
            list(rel.values()), train, dev, test, dev_labels, test_labels, split_entities,
            digest.hexdigest()[:16], None, notes)
    # dev/test negatives of triple classification (label -1) are not facts
    true = [train, dev if dev_labels is None else dev[dev_labels]]
    true.append(test if test_labels is None else test[test_labels])
    kg.known = np.unique(kg.key(np.concatenate(true)))
    return kg

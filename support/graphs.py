"""A knowledge graph's files -> KG: the five benchmarks in KG-BERT's text format, or a folder
holding a graph of one's own; every file and line checked, one-line errors naming file and line.
Data lives in --data-dir, else $PALT_DATA, else ./data; one folder per benchmark
(../shared/data/README.md)."""
import hashlib
import os
import re
from pathlib import Path

import numpy as np

from data import KG, DataError, triple_keys
from support.errors import FlagError
from support.files import read_text, readable

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
# a graph of one's own: each split's names (dev and valid are one split), each .tsv or .txt
SPLITS = {"train": ("train",), "dev": ("dev", "valid"), "test": ("test",)}
SUFFIXES = (".tsv", ".txt")


def data_root(arg=None):
    """The folder of the benchmark folders: --data-dir, else $PALT_DATA, else ./data."""
    return Path(arg or os.environ.get("PALT_DATA") or "data")


def dataset(spec, data_dir=None):
    """(name, folder, task) of a benchmark name or of a folder holding one's own graph (its splits
    as split_files finds them; ./umls if named like a benchmark), whose task is 'tc' if the test
    split (else the dev split) has a 4th column 1/-1."""
    spec = str(spec)
    if spec.lower() in DATASETS:
        folder, task, _ = DATASETS[spec.lower()]
        return spec.lower(), data_root(data_dir) / folder, task
    folder = Path(spec)
    if not folder.is_dir():
        raise DataError(f"--data {spec}: neither a benchmark ({', '.join(DATASETS)}) nor a folder")
    found = split_files(folder)
    if found["train"] is None:
        raise DataError(f"{folder / 'train.tsv'}: no such file, nor train.txt (a graph's folder "
                        "holds train, dev or valid, and test, each .tsv or .txt, tab-separated "
                        "head, relation, tail; only train is required)")
    for path in (found["test"], found["dev"]):
        if path is not None:
            with open(readable(path, DataError), "rb") as f:
                columns = f.readline().count(b"\t") + 1
            return folder.resolve().name, folder, "tc" if columns == 4 else "lp"
    return folder.resolve().name, folder, "lp"


def split_files(folder):
    """{split: the file holding it, or None} of a graph of one's own: each split under any of the
    names KGE datasets ship (KG-BERT's train/dev/test.tsv; PyKEEN's and LibKGE's
    train/valid/test.txt). Two files of one split are an error, never a silent pick."""
    found = {}
    for split, stems in SPLITS.items():
        paths = [folder / (stem + suffix) for stem in stems for suffix in SUFFIXES]
        paths = [path for path in paths if path.is_file()]
        if len(paths) > 1:
            both = " and ".join([str(paths[0])] + [path.name for path in paths[1:]])
            raise DataError(f"{both}: two files of the {split} split in one folder; keep one")
        found[split] = paths[0] if paths else None
    return found


def _would_be(folder, split, train_file):
    """The file a missing split would be read from, for messages: spelled like the train file
    (beside train.txt, PyKEEN's valid.txt)."""
    stem = "valid" if split == "dev" and train_file.suffix == ".txt" else split
    return folder / (stem + train_file.suffix)


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


def _ids(texts, source, rows, cols, text_file):
    """(texts, (why an unknown id is an error, {id: index})): `texts` as read from `source`, or
    where a graph of one's own lacks its text file (`texts` None, `source` the train file), every id
    in `cols` of the train `rows` in first-seen order, its text with '_' as ' '."""
    why = f"has no text in {source}"
    if texts is None:
        ids = dict.fromkeys(row[c] for row in rows for c in cols)  # first-seen order
        texts = {i: i.replace("_", " ") for i in ids}
        # not taken as new: a typo would become one; with text PALT scores it all the same
        why = (f"occurs nowhere in {source}; PALT scores what train never names by its text: list "
               f"every one with its text in {text_file} (id<TAB>text a line)")
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


def _once(path, rows, lines, triples, labels):
    """(triples, labels, how many dropped): each triple once, at its first line (labelled: with
    its label); a triple labelled both 1 and -1 is an error naming both lines."""
    if not len(triples):
        return triples, labels, 0
    _, first, inverse = np.unique(triples, axis=0, return_index=True, return_inverse=True)
    first_of = first[inverse.reshape(-1)]  # (N,) the first line's row of each row's triple
    if labels is not None:
        for i in np.flatnonzero(labels != labels[first_of])[:1]:
            j = first_of[i]
            raise DataError(f"{path}:{lines[i]}: {tuple(rows[i][:3])} labelled {rows[i][3]} here "
                            f"and {rows[j][3]} on line {lines[j]}")
    keep = np.sort(first)
    if labels is not None:
        labels = labels[keep]
    return triples[keep], labels, len(triples) - len(keep)


# ----------------------------------------------------------------------------- text of bare ids
# a piece of 2 or more letters between non-alphanumerics (or the ends): a search stops at the
# first, quick on long descriptions
WORD = re.compile(r"(?:^|[\W_])[^\W\d_]{2,}(?=[\W_]|$)")


def id_like(text):
    """True where a text carries no word: no piece of it (split at what is neither letter nor
    digit) is 2 or more letters alone. 'person84', '/m/02mjmr', 'Q42', 'e_17', '12345' are
    id-like; 'virus', 'Barack Obama', 'dog, domestic dog' are not."""
    return WORD.search(text) is None


def id_like_share(texts):
    """The share of `texts` that are id_like (0 for none)."""
    texts = list(texts)
    return sum(map(id_like, texts)) / max(len(texts), 1)


def _ids_warning(folder, ent_text, rel_text):
    """A note when at least half the entity texts are bare ids ('' otherwise): PALT reads text,
    so on such a graph it scores at chance."""
    share = id_like_share(ent_text)
    if share < 0.5:
        return ""
    example = next(text for text in ent_text if id_like(text))
    rels, give = "", "entity2text.txt"
    rel_share = id_like_share(rel_text)
    if rel_share >= 0.5:
        rel_example = next(text for text in rel_text if id_like(text))
        rels = f", and {rel_share:.0%} of the relation texts (e.g. {rel_example!r})"
        give = "entity2text.txt and relation2text.txt"
    return (f"warning: {folder}: {share:.0%} of the entity texts look like bare ids (e.g. "
            f"{example!r}){rels}; PALT scores a triple by reading its text, so on this graph it "
            "can do no better than chance: a structure model (e.g. PyKEEN's ComplEx) suits it, "
            f"or give {give} with real names")


def load_kg(spec, data_dir=None, text="name"):
    """A benchmark by name, or one's own graph by folder (see dataset); every file checked, one-line
    errors."""
    name, folder, task = dataset(spec, data_dir)
    if text not in TEXTS:
        raise FlagError(f"--text must be one of {', '.join(TEXTS)}, not {text!r}")
    own_graph = str(spec).lower() not in DATASETS
    if not folder.is_dir():
        raise DataError(f"{folder}: no such dataset folder (python -m support.hub --download "
                        f"{name}, or set --data-dir / PALT_DATA)")
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
    paths = {s: folder / f"{s}.tsv" for s in SPLITS}  # benchmarks: their released files
    if own_graph:
        paths = split_files(folder)
    rows = {}
    for s, path in paths.items():
        if path is not None:
            ncols = 4 if task == "tc" and s != "train" else 3
            rows[s] = _read_rows(path, digest, ncols)
    ent, ents = _ids(ent, file or paths["train"].name, rows["train"][0], (0, 2), "entity2text.txt")
    rel, rels = _ids(rel, rel_file or paths["train"].name, rows["train"][0], (1,),
                     "relation2text.txt")
    splits = {}
    for s, path in paths.items():  # a split a graph of one's own lacks: no rows
        labelled = task == "tc" and s != "train"
        triples, labels = _split(path, *rows.get(s, ([], [])), labelled, ents, rels)
        if own_graph:  # benchmarks stay as released (WN11's train repeats 2,220 lines)
            triples, labels, dropped = _once(path, *rows.get(s, ([], [])), triples, labels)
            if dropped:
                notes.append(f"{path}: {dropped:,} duplicate triples, each kept once")
        splits[s] = triples, labels
    (train, _), (dev, dev_labels), (test, test_labels) = splits.values()
    warning = ""
    if own_graph:  # the benchmarks' texts are words, as released (measured: at most 0.2% id-like)
        warning = _ids_warning(folder, list(ent.values()), list(rel.values()))
    if warning:
        notes.append(warning)
    files = {s: path or _would_be(folder, s, paths["train"]) for s, path in paths.items()}
    split_entities = np.unique(np.concatenate([train, dev, test])[:, [0, 2]])
    kg = KG(name, task, folder, text, file or "ids", list(ent), list(rel), list(ent.values()),
            list(rel.values()), train, dev, test, dev_labels, test_labels, split_entities,
            digest.hexdigest()[:16], None, notes, files)
    # dev/test negatives of triple classification (label -1) are not facts
    true = [train, dev if dev_labels is None else dev[dev_labels]]
    true.append(test if test_labels is None else test[test_labels])
    kg.known = np.unique(triple_keys(kg, np.concatenate(true)))
    return kg

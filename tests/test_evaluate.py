"""evaluate.py: ranks with ties, filtered vs raw, the threshold search, resuming, 1 vs 2 torchrun processes, the CLI."""
import errno, io, itertools, json, os, re, shutil, signal, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np
import pytest
import torch

from support import bigrank, checkpoints, evalcli, files, graphs, hub, predict
import data
import evaluate
import palt
from evaluate import best_threshold, query_ranks, rank_metrics
from conftest import FnScorer

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- ranks and metrics


def brute_ranks(scores, target, known):
    """The target's rank in every ordering of the kept candidates that sorts them by score, ties in every order."""
    kept = [c for c in range(len(scores)) if c == target or c not in known]
    return [1 + sorted(perm, key=lambda c: -scores[c]).index(target) for perm in itertools.permutations(kept)]


def test_ranks_with_ties_equal_every_tie_order_enumerated():
    rng = np.random.default_rng(0)
    K, C = 3, 6
    scores = rng.integers(0, 3, size=(K, C)).astype(np.float32)  # 3 values over 6 candidates: many ties
    known = rng.random((K, C)) < 0.3
    row, target = np.repeat(np.arange(K), 4), rng.integers(0, C, size=4 * K)
    o, p = query_ranks(torch.from_numpy(scores), torch.from_numpy(row), torch.from_numpy(target), torch.from_numpy(known))
    brute = [brute_ranks(scores[q], t, set(np.nonzero(known[q])[0])) for q, t in zip(row, target)]
    assert o.tolist() == [min(b) for b in brute] and p.tolist() == [max(b) for b in brute]
    assert any(max(b) > min(b) for b in brute)  # the example has ties at the target
    m = rank_metrics(o.numpy(), p.numpy())
    mean = lambda f: np.mean([np.mean([f(r) for r in b]) for b in brute])  # over triples of the mean over tie orders
    assert m["expected"]["mr"] == pytest.approx(mean(lambda r: r))
    assert m["expected"]["mrr"] == pytest.approx(mean(lambda r: 1 / r))
    for k in (1, 3, 10):
        assert m["expected"][f"hits@{k}"] == pytest.approx(mean(lambda r: r <= k))
    realistic = [np.mean(b) for b in brute]  # the expected rank
    assert m["realistic"]["mr"] == pytest.approx(np.mean(realistic))
    assert m["realistic"]["mrr"] == pytest.approx(np.mean([1 / r for r in realistic]))
    assert m["realistic"]["hits@1"] == pytest.approx(np.mean([r <= 1 for r in realistic]))
    assert m["optimistic"]["mrr"] == pytest.approx(np.mean([1 / min(b) for b in brute]))
    assert m["pessimistic"]["hits@3"] == pytest.approx(np.mean([max(b) <= 3 for b in brute]))


def test_hand_made_ranks_filtered_and_raw():
    # candidate 1 is the answer; 2 ties with it but is a known fact; 4 ties with it and is not known
    s = torch.tensor([[3.0, 5.0, 5.0, 1.0, 5.0, 6.0]])
    known = torch.tensor([[False, True, True, False, False, True]])  # 5 beats it, but is known too
    row, target = torch.tensor([0]), torch.tensor([1])
    assert [x.item() for x in query_ranks(s, row, target, known)] == [1, 2]
    assert [x.item() for x in query_ranks(s, row, target)] == [2, 4]
    m = rank_metrics([1, 2], [2, 4])
    assert m["realistic"] == pytest.approx({"mr": 2.25, "mrr": (1 / 1.5 + 1 / 3) / 2, "hits@1": 0.0, "hits@3": 1.0, "hits@10": 1.0})
    assert m["optimistic"]["hits@1"] == 0.5 and m["pessimistic"]["mr"] == 3
    assert m["expected"]["hits@1"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["expected"]["mrr"] == pytest.approx(((1 + 1 / 2) / 2 + (1 / 2 + 1 / 3 + 1 / 4) / 3) / 2)

# ----------------------------------------------------------------------------- threshold search


def test_threshold_toy_examples():
    assert best_threshold([0.1, 0.4, 0.35, 0.8], [False, True, False, True]) == (pytest.approx(0.375), 1.0)
    assert best_threshold([1.0, 2.0, 3.0], [True, False, True]) == (-np.inf, pytest.approx(2 / 3))  # lowest of the best
    assert best_threshold([1.0, 1.0, 2.0], [False, False, False]) == (np.inf, 1.0)


def test_threshold_equals_brute_force_over_all_thresholds():
    rng = np.random.default_rng(1)
    for _ in range(20):
        s = rng.integers(0, 8, size=30).astype(float)  # ties
        y = rng.random(30) < 1 / (1 + np.exp(-(s - 4 + rng.normal(0, 2, 30))))
        theta, acc = best_threshold(s, y)
        brute = max(np.mean((s > t) == y) for t in [-np.inf, *np.arange(-0.5, 8.5)])  # every split of integer scores
        assert acc == pytest.approx(brute) and np.mean((s > theta) == y) == pytest.approx(acc)

# ----------------------------------------------------------------------------- a tiny graph on disk

WORDS = ["apple", "river bank", "stone", "cloud of dust", "green", "music hall", "paper", "horse race track", "table", "light"]


def write_kg(root, folder, train, dev, test, labels=None):
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "entity2text.txt").write_text("".join(f"e{i}\t{w}\n" for i, w in enumerate(WORDS)))
    (d / "relation2text.txt").write_text("r0\tpart of\nr1\tsimilar to\n")
    (d / "entities.txt").write_text("".join(f"e{i}\n" for i in range(len(WORDS))))
    (d / "relations.txt").write_text("r0\nr1\n")
    line = lambda t: f"e{t[0]}\tr{t[1]}\te{t[2]}"
    (d / "train.tsv").write_text("".join(line(t) + "\n" for t in train))
    for name, rows, lab in (("dev", dev, labels and labels[0]), ("test", test, labels and labels[1])):
        (d / f"{name}.tsv").write_text("".join(line(t) + (f"\t{1 if l else -1}" if lab else "") + "\n"
                                               for t, l in zip(rows, lab or [None] * len(rows))))
    return root


TRAIN = [(0, 0, 1), (0, 0, 2), (3, 0, 1), (4, 1, 5), (5, 1, 6), (2, 1, 7), (8, 0, 9), (6, 0, 1), (7, 1, 4)]
DEV = [(3, 0, 2), (9, 1, 8)]
TEST = [(0, 0, 3), (4, 1, 6), (8, 0, 1), (3, 0, 9), (5, 1, 4), (0, 0, 9)]


@pytest.fixture(scope="module")
def lp_root(tmp_path_factory):
    return write_kg(tmp_path_factory.mktemp("data"), "umls", TRAIN, DEV, TEST)


@pytest.mark.parametrize("candidates", ["split", "sample"])
def test_filtered_and_raw_ranks_on_a_graph_where_they_differ(lp_root, candidates):
    kg = graphs.load_kg("umls", lp_root)
    # a candidate sample (train.py's cheap dev signal on big graphs) holds the answers, not every entity
    sample = np.unique(kg.test[:, [0, 2]]) if candidates == "sample" else None
    lpq = evaluate.lp_queries(kg, candidates=candidates if sample is None else sample)
    table = np.random.default_rng(2).integers(0, 4, size=(10, 2, 10)).astype(np.float32)  # score of (h, r, t), ties
    score = lambda t: torch.from_numpy(table[t[:, 0], t[:, 1], t[:, 2]])
    tri = np.arange(len(kg.test))
    rows = np.concatenate([r for _, r in evaluate.rank_queries(score, lpq, tri, np.arange(len(lpq.queries)), block=3)])
    # independent: from the entity names and the files' triples, with python sets
    facts = {tuple(map(int, t)) for t in np.concatenate([kg.train, kg.dev, kg.test])}
    cands = [int(c) for c in (kg.split_entities if sample is None else sample)]
    assert sample is None or len(cands) < len(kg.split_entities)
    got = {(int(r[0]), int(r[1])): tuple(r[2:]) for r in rows}
    assert len(got) == 2 * len(TEST)
    differ = 0
    for i, (h, r, t) in enumerate(kg.test.tolist()):
        for side, answer in ((0, h), (1, t)):
            triple = lambda c: (c, r, t) if side == 0 else (h, r, c)
            s = lambda c: table[triple(c)]
            kept = [c for c in cands if c == answer or triple(c) not in facts]
            want = (1 + sum(s(c) > s(answer) for c in kept), sum(s(c) >= s(answer) for c in kept),
                    1 + sum(s(c) > s(answer) for c in cands), sum(s(c) >= s(answer) for c in cands))
            assert got[i, side] == want
            differ += want[:2] != want[2:]
    assert differ >= 3  # the graph was chosen so that filtering matters


@pytest.mark.parametrize("graph", ["hand-made", "umls"])
def test_the_fast_ranking_equals_the_naive_definition(graph, lp_root):
    """rank_queries (blocks of queries, one mask, one op) against naive_ranks (a loop over each triple and side)."""
    kg = graphs.load_kg("umls", lp_root if graph == "hand-made" else os.environ.get("PALT_DATA") or ROOT.parent /
                      "shared" / "data")
    lpq = evaluate.lp_queries(kg)
    tri = np.arange(len(kg.test)) if graph == "hand-made" else np.random.default_rng(0).choice(len(kg.test), 25)
    score = FnScorer(lambda t: ((t[:, 0] * 7 + t[:, 1] * 3 + t[:, 2] * 5) % 4).astype(np.float32))  # many ties
    fast = np.concatenate([r for _, r in evaluate.rank_queries(score, lpq, tri, np.unique(lpq.triple_query[tri]), 5)])
    fast = fast[np.isin(fast[:, 0], tri)]
    naive = evaluate.naive_ranks(score, lpq, np.unique(tri))
    assert np.array_equal(fast[np.lexsort((fast[:, 1], fast[:, 0]))][:, :4], naive)
    assert (naive[:, 3] > naive[:, 2]).any() and (fast[:, 4] != fast[:, 2]).any()  # ties; the filter matters


def test_the_stratified_estimate_is_the_exact_rank_when_it_draws_everything_and_unbiased_when_it_draws_few(lp_root):
    """train.py --dev-near: the hard stratum is scored whole and counts once; each draw from the rest counts for
    (rest)/(draws). Drawing all of the rest gives the exact filtered realistic ranks (ties half); drawing 2, their
    mean over seeds; the hard stratum (some entities 'near' each one) never changes what is estimated."""
    kg = graphs.load_kg("umls", lp_root)
    lpq = evaluate.lp_queries(kg, "test")
    table = np.random.default_rng(2).integers(0, 4, size=(10, 2, 10)).astype(np.float32)  # score of (h, r, t), ties
    score = FnScorer(lambda t: table[t[:, 0], t[:, 1], t[:, 2]])
    tri = np.arange(len(kg.test))
    rows = np.concatenate([r for _, r in evaluate.rank_queries(score, lpq, tri, np.arange(len(lpq.queries)), block=3)])
    behind = list(evaluate.rank_queries(score, lpq, tri, np.arange(len(lpq.queries)), block=3, overlap=True))
    assert np.array_equal(np.concatenate([r for _, r in behind]), rows)  # a GPU's way, one block behind: the same
    exact = {(int(r[0]), int(r[1])): (r[2] + r[3]) / 2 for r in rows}
    want = np.array([exact[i, side] for i in tri for side in (0, 1)])
    for near in (np.zeros((len(kg.entities), 0), np.int64), np.random.default_rng(0).integers(0, 10, (10, 2))):
        ranks, expected, scored = bigrank.stratified_ranks(score, lpq, tri, 0, near, 100, posterior=1000)
        assert np.array_equal(ranks, want) and scored <= len(lpq.candidates)
        # every candidate drawn: the expectations are the exact figures
        assert np.allclose(expected["mrr"], 1 / want) and np.array_equal(expected["hits@3"], want <= 3)
        runs = [bigrank.stratified_ranks(score, lpq, tri, s, near, 2, posterior=1000) for s in range(400)]
        assert np.allclose(np.mean([r for r, _, _ in runs], 0), want, atol=0.25) and want.max() > 2  # unbiased
        # 1 / the estimated rank runs high (a query whose draws miss its rivals reads as rank 1); the expected
        # reciprocal rank comes closer to the exact MRR
        plug_in, posterior = np.mean([np.mean(1 / r) for r, _, _ in runs]), np.mean([e["mrr"].mean() for _, e, _ in runs])
        assert abs(posterior - np.mean(1 / want)) < abs(plug_in - np.mean(1 / want))

# ----------------------------------------------------------------------------- the command line, end to end


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny random BERT with an NSP head (so zero-shot is allowed), in Hugging Face's layout, MiniLM's vocab."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    transformers.BertForNextSentencePrediction(cfg).save_pretrained(d)
    (d / "vocab.txt").write_bytes((hub.model_dir("minilm") / "vocab.txt").read_bytes())
    (d / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    return d


def run_cli(*args):
    """evaluate.main in this process; returns its results JSON (--out is among args)."""
    evaluate.main([str(a) for a in args])
    return json.loads(Path(args[args.index("--out") + 1]).read_text())


def test_lp_zero_shot_resume_and_two_processes_give_the_same_metrics(lp_root, tiny_bert, tmp_path, capsys):
    common = ["--lp", "--data", "umls", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 20, "--tokens", 64]
    one = run_cli(*common, "--out", tmp_path / "one.json")
    assert one["counts"] == dict(test_triples=6, ranked_triples=6, queries=10, candidates=10, scored_triples=100,
                                 resumed_queries=0)  # the 12 sides of the 6 triples ask 10 distinct queries
    assert one["metrics"]["filtered"]["both"]["realistic"]["mr"] <= one["metrics"]["raw"]["both"]["realistic"]["mr"]
    assert "| umls | " in capsys.readouterr().out
    assert one["train"] is None and one["settings"]["text_file"] == "entity2text.txt"  # zero-shot: nothing trained
    assert one["command"] == " ".join(["python evaluate.py", *map(str, common), "--out", str(tmp_path / "one.json")])
    assert one["manifest"]["argv"] == ["evaluate.py", *map(str, common), "--out", str(tmp_path / "one.json")]
    assert {"umls/train.tsv", "umls/test.tsv", "umls/entity2text.txt"} <= set(one["manifest"]["data_sha256"])
    # blocks of 2 queries, the first one 1 (a quick first rate for the ETA): killed after 2 blocks, 3 queries; the
    # rerun does the other 7 and ends with the same metrics
    with pytest.raises(SystemExit, match="stopped after 3 queries"):
        run_cli(*common, "--out", tmp_path / "two.json", "--stop-after-queries", 2)
    assert len(list((tmp_path / "two.state").glob("*.npz"))) == 1
    capsys.readouterr()
    two = run_cli(*common, "--out", tmp_path / "two.json")
    assert two["counts"]["resumed_queries"] == 3 and two["counts"]["scored_triples"] == 70  # 7 new queries x 10
    assert two["metrics"] == one["metrics"]
    assert "7/7 queries" in capsys.readouterr().err  # only the rest was scored
    assert not list((tmp_path / "two.state").glob("*.npz"))  # done: the state is removed
    # two torchrun processes (gloo), each ranks half of the queries
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "evaluate.py", *map(str, common), "--out", str(tmp_path / "ddp.json")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output = proc.communicate(timeout=120)[0]
    finally:  # a hung run must not leave its workers behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-2000:]
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert ddp["settings"]["world_size"] == 2 and ddp["metrics"] == one["metrics"]


def test_the_subset_of_a_smaller_limit_is_part_of_every_larger_ones():
    for T, seed in [(50, 0), (1000, 3)]:
        before = set()
        for n in (1, 5, 17, 49, T, None):
            now = set(bigrank.select(T, n, seed).tolist())
            assert before <= now and len(now) == (n or T)
            before = now


def test_keep_ranks_leaves_a_full_rankings_ranks_for_the_paired_gaps(lp_root, tiny_bert, tmp_path, capsys):
    """--keep-ranks: the full ranking's state stays beside its JSON, whole, and bench/paired.py reads the same MRR
    from it; --tc has no ranks to keep."""
    sys.path.insert(0, str(ROOT / "bench"))
    import paired
    common = ["--lp", "--data", "umls", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 20]
    kept = run_cli(*common, "--keep-ranks", "--out", tmp_path / "kept.json")
    ranks, settings = paired.ranks(tmp_path / "kept.state")
    assert len(ranks) == 2 * kept["counts"]["test_triples"] and settings["seed"] == 0
    mrr = np.mean([1 / r for r in ranks.values()])
    assert mrr == pytest.approx(kept["metrics"]["filtered"]["both"]["realistic"]["mrr"])
    assert run_cli(*common, "--keep-ranks", "--out", tmp_path / "kept.json")["metrics"] == kept["metrics"]
    with pytest.raises(SystemExit):
        evaluate.main([str(a) for a in ["--tc", "--keep-ranks", "--model", tiny_bert]])
    assert "--keep-ranks is for --lp only" in capsys.readouterr().err


def test_a_larger_limit_reuses_every_ranked_query_and_other_settings_refuse(lp_root, tiny_bert, trained, tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default paths: results/ under the working folder
    common = ["--lp", "--data", "umls", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 20]
    state = tmp_path / "results" / f"umls-zeroshot-{tiny_bert.name}-lp-test-seed0.state"

    def lp(*extra):
        evaluate.main([str(a) for a in common + list(extra)])
        tag = f"-limit{extra[1]}-seed0" if extra else ""
        return json.loads((tmp_path / "results" / f"umls-zeroshot-{tiny_bert.name}-lp-test{tag}.json").read_text())
    small = lp("--limit", 2)
    assert small["counts"]["resumed_queries"] == 0 and state.is_dir()  # an estimate's ranks stay
    capsys.readouterr()
    big = lp("--limit", 4)
    assert big["counts"]["resumed_queries"] == small["counts"]["queries"] < big["counts"]["queries"]
    # blocks of 2 queries over the larger list straddle the saved ones: only the new queries are scored and counted
    new = big["counts"]["queries"] - small["counts"]["queries"]
    assert re.findall(r"(\d+)/(\d+) queries", capsys.readouterr().err)[-1] == (str(new), str(new))
    fresh = run_cli(*common, "--limit", 4, "--out", tmp_path / "fresh.json")
    assert fresh["counts"]["resumed_queries"] == 0 and fresh["metrics"] == big["metrics"]
    full = lp()
    assert full["counts"]["resumed_queries"] == big["counts"]["queries"] and not state.exists()  # a full ranking: done
    assert full["metrics"] == run_cli(*common, "--out", tmp_path / "full.json")["metrics"]
    # a state never mixes ranks of other settings: the seed, the checkpoint
    before = tree(tmp_path)
    one_line_error(common + ["--limit", 4, "--seed", 1, "--out", tmp_path / "fresh.json"],
                   "fresh.state holds ranks made with seed 0, not 1: give another --out, or delete it")
    one_line_error(["--lp", "--data-dir", lp_root, "--ckpt", trained[0], "--limit", 4, "--out", tmp_path / "fresh.json"],
                   "fresh.state holds ranks made with checkpoint_sha256 [0-9a-f]{64}, not [0-9a-f]{64}")
    assert tree(tmp_path) == before


def test_a_stopped_ranking_leaves_an_estimate_for_a_smaller_limit(lp_root, tiny_bert, tmp_path, monkeypatch, capsys):
    """Queries are ranked in the order the seeded permutation asks them: stopped anywhere, the queries done answer
    whole triples at the subset's start, so a smaller --limit writes its estimate at once, scoring nothing."""
    monkeypatch.chdir(tmp_path)
    common = ["--lp", "--data", "umls", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 10]  # 1 query a block
    for stop in (2, 4):  # fresh states each: the first triple's queries, then the first two triples' (or fewer, shared)
        shutil.rmtree(tmp_path / "results", ignore_errors=True)
        with pytest.raises(SystemExit, match=f"stopped after {stop} queries"):
            evaluate.main([str(a) for a in common + ["--limit", 5, "--stop-after-queries", stop]])
        capsys.readouterr()
        evaluate.main([str(a) for a in common + ["--limit", stop // 2]])
        small = json.loads((tmp_path / "results" / f"umls-zeroshot-{tiny_bert.name}-lp-test-limit{stop // 2}-seed0.json").read_text())
        assert small["counts"]["resumed_queries"] == small["counts"]["queries"] > 0
        assert small["settings"]["padded_per_real_token"] is None and "(all ranks resumed)" in capsys.readouterr().out



def test_ctrl_c_while_ranking_keeps_every_finished_query(lp_root, tiny_bert, tmp_path, monkeypatch):
    """SIGINT (Ctrl-C, or bench/gpu_call.py at its budget) mid-ranking: the queries done are saved, the rerun scores
    only the rest."""
    monkeypatch.chdir(tmp_path)
    common = ["--lp", "--data", "umls", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 10, "--limit", 3]
    real = evaluate.rank_queries

    done = []  # the blocks ranked, over every call (a ranking asks in timed pieces)

    def interrupted(*a, **k):
        for block in real(*a, **k):
            if len(done) == 2:
                raise KeyboardInterrupt
            done.append(block)
            yield block
    monkeypatch.setattr(evaluate, "rank_queries", interrupted)
    with pytest.raises(SystemExit, match=r"stopped after 2 queries \(Ctrl-C\); the same command resumes"):
        evaluate.main([str(a) for a in common])
    monkeypatch.setattr(evaluate, "rank_queries", real)
    evaluate.main([str(a) for a in common])
    [out] = (tmp_path / "results").glob("*.json")
    assert json.loads(out.read_text())["counts"]["resumed_queries"] == 2

@pytest.fixture(scope="module")
def trained(tiny_bert, lp_root, tmp_path_factory):
    """A PALT with prompts and calibration (random, as if trained) saved as a umls checkpoint."""
    torch.manual_seed(1)
    model, loaded = palt.build_palt(str(tiny_bert), palt.PaltConfig(prompts=(2, 1, 1), calib_layers=(0,)))
    with torch.no_grad():
        model.W_c["0"].weight.normal_(0, 0.3)  # W_c starts at zero; make it matter
    kg = graphs.load_kg("umls", lp_root)
    path = tmp_path_factory.mktemp("run") / "ckpt.safetensors"
    checkpoints.save_checkpoint(path, model, {"model": str(tiny_bert), "weights_sha256": loaded.weights_sha256, "data": "umls",
                                       "data_fingerprint": kg.fingerprint, "text": "name", "prompts": [2, 1, 1],
                                       "max_seq_length": 12})
    return path, model.eval(), kg, data.encode(kg, loaded.tokenizer)


def test_scorer_batches_give_each_triple_its_own_score(trained, device):
    _, model, kg, enc = trained
    triples = np.array([(h, r, t) for h in range(10) for r in range(2) for t in range(0, 10, 3)])
    lengths = data.seq_lengths(enc, triples, (2, 1, 1), 12)
    assert len(set(lengths)) > 1  # rows of several lengths, so sorting and padding are exercised
    batched = evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device, tokens=40)(triples)
    alone = torch.cat([evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device, tokens=40)(t[None]) for t in triples])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def long_rows(tiny_bert, lp_root):
    """A PALT whose rows are 20+ tokens long (many prompts), so a batch may mix lengths (15/16 of its longest)."""
    torch.manual_seed(2)
    model, loaded = palt.build_palt(str(tiny_bert), palt.PaltConfig(prompts=(8, 4, 4), calib_layers=(0,)))
    with torch.no_grad():
        model.W_c["0"].weight.normal_(0, 0.3)
    kg = graphs.load_kg("umls", lp_root)
    triples = np.array([(h, r, t) for h in range(len(kg.entities)) for r in range(2) for t in range(0, 10, 3)])
    return model.eval(), data.encode(kg, loaded.tokenizer), triples


def test_scorer_pads_and_masks_mixed_lengths_and_runs_one_length_unmasked(long_rows, device):
    model, enc, pool = long_rows
    lengths = data.seq_lengths(enc, pool, (8, 4, 4), 64)
    count = np.bincount(lengths)
    L = int(np.argmax(np.minimum(count[1:], count[:-1]))) + 1  # the most rows of two lengths, L and L - 1
    n = min(count[L], count[L - 1])
    assert L - 1 >= 16 and n >= 3  # so that a batch of rows of length L may take rows of L - 1 (>= 15/16 of L)
    triples = np.concatenate([pool[lengths == L][:n], pool[lengths == L - 1][:n]])
    # budget 2nL: the n rows of length L fill half of it, a batch alone; 2(n+1)L: they do not, a batch takes both
    for tokens, mixed in ((2 * n * L, False), (2 * (n + 1) * L, True)):
        scorer, unmasked = evaluate.Scorer(model.to(device), enc, (8, 4, 4), 64, device, tokens=int(tokens)), []
        scorer.forward = lambda **b: unmasked.append(b["attention_mask"] is None) or model(**b)
        batched = scorer(triples)
        alone = torch.cat([evaluate.Scorer(model.to(device), enc, (8, 4, 4), 64, device)(t[None]) for t in triples])
        torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
        # padding and a mask exactly where a batch mixes lengths; no mask where every row is real to the end
        assert (scorer.n_padded > scorer.n_tokens, unmasked) == ((True, [False]) if mixed else (False, [True, True]))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="torch.compile on CPU needs g++")
def test_compiled_scorer_gives_the_eager_scores(long_rows, device):
    model, enc, triples = long_rows  # torch.compile: tens of seconds, once; any batch shape after it (dynamic)
    eager = evaluate.Scorer(model.to(device), enc, (8, 4, 4), 64, device, tokens=200)(triples)
    compiled = evaluate.Scorer(model.to(device), enc, (8, 4, 4), 64, device, tokens=200, compile=True)
    torch.testing.assert_close(compiled(triples), eager, atol=1e-4, rtol=0)
    torch.testing.assert_close(compiled(triples[::7]), eager[::7], atol=1e-4, rtol=0)  # other shapes, no error


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, --compile needs no C++ compiler")
def test_compile_without_a_cpu_compiler_is_one_line_before_the_model_loads(trained, lp_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setattr(evalcli, "load_model", lambda *a: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit, match="^error: --compile on CPU needs a C\\+\\+ compiler"):
        evaluate.main(["--lp", "--data", "umls", "--data-dir", str(lp_root), "--ckpt", str(trained[0]), "--compile",
                       "--out", str(tmp_path / "r.json")])
    assert not list(tmp_path.iterdir())  # nothing written


def test_lp_from_a_checkpoint_matches_the_library_call(trained, lp_root, tmp_path, capsys, device):
    path, model, kg, enc = trained
    got = run_cli("--lp", "--data", "umls", "--data-dir", lp_root, "--ckpt", path, "--out", tmp_path / "r.json", "--raw",
                  "--dtype", "fp32")  # the library call scores in fp32; auto is bf16 on CPUs with native bf16
    assert got["settings"]["prompts"] == [2, 1, 1] and got["data_fingerprint"] == kg.fingerprint
    want = evaluate.rank_split(evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device), kg, "test")
    want.pop("random_mrr")  # a random scorer's MRR on these triples: the dev line's yardstick
    assert got["metrics"]["filtered"]["both"]["realistic"] | {"candidates": got["counts"]["candidates"]} == pytest.approx(want)
    assert "raw, realistic ranks" in capsys.readouterr().out
    # a limited run is labelled an estimate
    assert got["metrics"]["interval95"] is None  # the whole test set: no sampling error
    # a limited run is labelled an estimate, with a 95% interval beside the figures
    est = run_cli("--lp", "--data", "umls", "--data-dir", lp_root, "--ckpt", path, "--out", tmp_path / "e.json", "--limit", 3)
    assert est["estimate"] and est["counts"]["ranked_triples"] == 3 and "estimate (3 of 6" in est["note"]
    ci, r = est["metrics"]["interval95"], est["metrics"]["filtered"]["both"]["realistic"]
    assert (ci["resamples"], ci["seed"]) == (1000, 0) and all(ci[m][0] <= r[m] <= ci[m][1] for m in r)
    out = capsys.readouterr().out
    assert f"MRR {r['mrr']:.4f} [{ci['mrr'][0]:.4f}, {ci['mrr'][1]:.4f}]" in out
    assert f"| {r['mrr']:.4f} [{ci['mrr'][0]:.4f}, {ci['mrr'][1]:.4f}] |" in out  # the markdown row too


def top_lines(out):
    """--predict's printed lines without its note on indistinguishable scores (the tiny model's barely differ)."""
    return [line for line in out.splitlines() if not line.startswith("note: the top")]


def test_predict_lists_the_top_completions(trained, lp_root, capsys, device):
    path, model, kg, enc = trained
    evaluate.main(["--predict", "--data", "umls", "--data-dir", str(lp_root), "--ckpt", str(path), "APPLE", "part of",
                   "--topk", "4", "--dtype", "fp32"])
    lines = top_lines(capsys.readouterr().out)
    assert lines[0].startswith("(apple, part of, ?) over 10 candidates") and len(lines) == 5
    s = evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device).numpy([(0, 0, t) for t in range(10)])
    top = [int(line.split()[-2][1:]) for line in lines[1:]]  # the entity id column: e<i>
    assert top == list(np.argsort(-s, kind="stable")[:4])
    assert all(("*" in line) == ((0, 0, t) in TRAIN + DEV + TEST) for line, t in zip(lines[1:], top))


def test_predict_heads_a_file_of_queries_and_an_entity_given_by_text(trained, lp_root, tmp_path, capsys, device):
    """'?' RELATION TAIL ranks heads; a file of queries gives a TSV of the top-k; text:... is an entity that is not
    in the graph, scored by its text exactly as a graph entity with that text is."""
    path, model, kg, enc = trained
    base = ["--predict", "--data-dir", str(lp_root), "--ckpt", str(path), "--topk", "3", "--dtype", "fp32"]
    evaluate.main(base + ["?", "part of", "stone"])
    lines = top_lines(capsys.readouterr().out)
    s = evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device).numpy([(h, 0, 2) for h in range(10)])
    assert lines[0].startswith("(?, part of, stone) over 10 candidates")
    assert [int(re.search(r" e(\d+) ", line)[1]) for line in lines[1:]] == list(np.argsort(-s, kind="stable")[:3])
    (tmp_path / "q.tsv").write_text("apple\tpart of\t?\n\n?\tr1\te6\ntext:stone\tpart of\n")
    evaluate.main(base + ["--queries", str(tmp_path / "q.tsv"), "--out", str(tmp_path / "top.tsv")])
    rows = [r.split("\t") for r in (tmp_path / "top.tsv").read_text().splitlines()]
    assert rows[0] == ["query", "rank", "entity", "text", "score", "known"] and len(rows) == 1 + 3 * 3
    assert [r[0] for r in rows[1::3]] == ["(apple, part of, ?)", "(?, similar to, paper)", "(stone, part of, ?)"]
    known = {(0, 0, t) for t in range(10)} & set(TRAIN + DEV + TEST)
    assert all(r[5] == str(int((0, 0, int(r[2][1:])) in known)) for r in rows[1:4])
    assert {r[5] for r in rows[7:]} == {"0"}  # an entity from text is in no known fact
    graph = {r[2]: float(r[4]) for r in rows[1:]}  # (stone, part of, ?) by id gives the scores of its text
    evaluate.main(base + ["e2", "r0", "--topk", "10", "--out", str(tmp_path / "byid.tsv")])
    byid = {r.split("\t")[2]: float(r.split("\t")[4]) for r in (tmp_path / "byid.tsv").read_text().splitlines()[1:]}
    assert all(byid[e] == pytest.approx(v, abs=1e-5) for e, v in graph.items() if e in [r[2] for r in rows[7:]])


def test_predict_scores_a_shortlist_says_so_and_builds_its_parts_once(trained, lp_root, tmp_path, capsys, device,
                                                                      monkeypatch):
    """--shortlist N scores at most N candidates (here all 8: the best 15 of so few change with each round, so no
    early stop): the query's train answers first (at most N/4 of them), then in rounds from the sources in turns, the
    first round one each: the best of an anchor query's exact scores (the same relation asked of the entity most
    often asked it in train), the nearest entities, ... The header says N of how many. The anchor and the embeddings
    are built once, then read from the cache. --shortlist all, and any graph of few entities, score every candidate."""
    path, model, kg, enc = trained
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "cache"))
    base = ["--predict", "--data-dir", str(lp_root), "--ckpt", str(path), "--topk", "3", "--dtype", "fp32", "apple",
            "part of"]
    evaluate.main(base + ["--shortlist", "8"])
    out = capsys.readouterr().out
    assert "built anchor (e3, r0, side 1)" in out and "built entity embeddings" in out
    lines = top_lines(out)[-4:]
    assert lines[0].startswith("(apple, part of, ?) over a shortlist of 8 of 10 candidates (anchor, nearest, type")
    scorer = evaluate.Scorer(model.to(device), enc, (2, 1, 1), 12, device)
    sha = checkpoints.read_checkpoint(path, tensors=False)[1]["weights_sha256"]
    short = predict.Shortlist(kg, scorer, kg.split_entities, files.sha256_file(path), sha, 8)
    some, s = short(0, 0, 1)
    assert short.built == []  # both parts came from the cache
    assert len(set(some.tolist())) == len(some) == 8
    assert some[:2].tolist() == [1, 2]  # (apple, part of, e1), (apple, part of, e2): train answers, few
    exact = scorer.numpy([(3, 0, t) for t in kg.split_entities])  # the anchor: e3 is asked (e3, part of, ?) in train
    first, sources = short.sources(0, 0, 1)
    assert first.tolist() == [1, 2] and sources[0][0] == kg.split_entities[np.argmax(exact)] and sources[1][0] == 0
    assert some[2] == next(c for c in sources[0] if c not in (1, 2))  # round 1 (ceil((8 - 2) / 10) = 1): the anchor's
    assert s == pytest.approx(scorer.numpy([(0, 0, t) for t in some]), abs=1e-5)  # the scores of those candidates
    assert [int(re.search(r" e(\d+) ", line)[1]) for line in lines[1:]] == some[np.argsort(-s, kind="stable")[:3]].tolist()
    evaluate.main(base + ["--shortlist", "8"])
    assert "built" not in capsys.readouterr().out
    anchor = next((tmp_path / "cache").glob("*/anchor-*.npy"))
    anchor.write_bytes(anchor.read_bytes()[:20])  # damaged: built again, and the same
    evaluate.main(base + ["--shortlist", "8"])
    assert "built anchor (e3, r0, side 1)" in capsys.readouterr().out
    for extra in (["--shortlist", "all"], []):
        evaluate.main(base + extra)
        assert capsys.readouterr().out.startswith("(apple, part of, ?) over 10 candidates")


def test_the_shortlist_takes_from_its_sources_in_weighted_turns():
    """A round takes the first n entries not yet taken, weights[k] from list k a turn (none at weight 0); an entity
    in two lists counts for the one it comes first in."""
    lists = [np.array([1, 2, 3, 4]), np.array([5, 1, 6]), np.array([7, 8])]
    got, came = predict.interleave(lists, np.array([2, 1, 0]), np.array([2]), 5)
    assert got.tolist() == [1, 3, 5, 4, 6] and came.tolist() == [0, 0, 1, 0, 1]
    assert predict.interleave(lists, np.array([1, 1, 1]), np.array([2]), 3)[0].tolist() == [1, 5, 7]
    assert len(predict.interleave(lists, np.array([0, 0, 0]), np.array([]), 3)[0]) == 0


def test_the_shortlist_stops_once_its_best_settle(tmp_path, monkeypatch):
    """Rounds of size/rounds candidates each; once the best 15 stayed the same for `patience` rounds and MIN_SHARE of
    the size is scored, no more rounds. A query whose best keep coming (patience 0, or better ones in every round)
    takes the whole size."""
    monkeypatch.setenv("PALT_CACHE", str(tmp_path))
    E = 300
    kg = SimpleNamespace(name="toy", fingerprint="0", text="name", train=np.array([[0, 0, 1]]),
                         entities=[f"e{i}" for i in range(E)])
    scorer = SimpleNamespace(numpy=lambda tri: (E - tri[:, 2]).astype(np.float32))  # the lower the id, the better
    short = predict.Shortlist(kg, scorer, np.arange(E), "key", "base", size=100)
    short.nearest = lambda entities: np.empty(0, np.int64)
    assert (short.rounds, short.settle, short.patience, predict.MIN_SHARE) == (10, 15, 2, 0.4)
    for source, patience, scored in [(np.arange(2, E), 2, 40), (np.arange(2, E), 0, 100), (np.arange(2, E), 5, 70),
                                     (np.arange(E - 1, 1, -1), 2, 100)]:
        short.sources = lambda e, r, side: (np.empty(0, np.int64), [source])
        short.patience = patience
        some, s = short(0, 0, 1)
        # best first: rounds 3 and 4 leave the best 15 of rounds 1-2 as they were, round 4 reaches 40% of 100
        assert len(some) == scored and some.tolist() == source[:scored].tolist()
        assert s.tolist() == (E - some).tolist()


def test_an_anchor_shipped_beside_the_adapters_is_read_not_built(tmp_path, monkeypatch):
    """Where the cache has no anchor, the one shipped in weights/anchors/ (bench/shortlist.py anchors) is read: a
    relation's first query costs no exact pass. None shipped, or a damaged one: built once, cached, and the same."""
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(predict, "SHIPPED", tmp_path / "shipped")
    E = 50
    kg = SimpleNamespace(name="toy", fingerprint="0", text="name", train=np.array([[3, 0, 1], [3, 0, 2]]),
                         entities=[f"e{i}" for i in range(E)], relations=["r0"])
    scored = []

    def numpy(triples):  # the lower the id, the better
        scored.append(len(triples))
        return (E - triples[:, 2]).astype(np.float32)
    short = predict.Shortlist(kg, SimpleNamespace(max_seq_length=12, numpy=numpy), np.arange(E), "key", "base")
    shipped = tmp_path / "shipped" / "toy-0-name" / "anchor-key-12-50-r0-s1-e3.npy"  # (e3, r0, ?): e3 is asked
    shipped.parent.mkdir(parents=True)
    np.save(shipped, np.array([7, 5, 6]))
    assert short.anchor(0, 1, 0).tolist() == [7, 5, 6] and scored == [] and short.built == []
    shipped.write_bytes(b"damaged")
    assert short.anchor(0, 1, 0).tolist() == list(range(E)) and scored == [E] and len(short.built) == 1
    assert short.anchor(0, 1, 0).tolist() == list(range(E)) and scored == [E]  # now from the cache


def test_a_stopped_file_of_queries_resumes_where_it_stopped(trained, lp_root, tmp_path, capsys, monkeypatch):
    """--queries with --out writes each finished query to OUT.partial; run again, it asks only the rest and writes the
    TSV an unstopped run writes. A .partial of other settings is refused in one line."""
    path = trained[0]
    (tmp_path / "q.tsv").write_text("apple\tpart of\n?\tpart of\tstone\ne4\tr1\ne3\tr0\n")
    base = ["--predict", "--data-dir", str(lp_root), "--ckpt", str(path), "--topk", "3", "--dtype", "fp32",
            "--queries", str(tmp_path / "q.tsv")]
    evaluate.main(base + ["--out", str(tmp_path / "whole.tsv")])
    calls, real = [], evaluate.Scorer.numpy

    def stop_at_the_third(self, triples):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, triples)
    monkeypatch.setattr(evaluate.Scorer, "numpy", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(base + ["--out", str(tmp_path / "top.tsv")])
    assert not (tmp_path / "top.tsv").exists() and len((tmp_path / "top.tsv.partial").read_text().splitlines()) == 7
    calls.clear()
    monkeypatch.setattr(evaluate.Scorer, "numpy", lambda self, t: calls.append(1) or real(self, t))
    evaluate.main(base + ["--out", str(tmp_path / "top.tsv")])
    assert len(calls) == 2 and "resumed: 2 of 4 queries" in capsys.readouterr().err  # the last two only
    assert (tmp_path / "top.tsv").read_text() == (tmp_path / "whole.tsv").read_text()
    assert not (tmp_path / "top.tsv.partial").exists()
    (tmp_path / "top.tsv.partial").write_text("# 0123456789abcdef queries x topk 3 candidates split shortlist all\n")
    with pytest.raises(SystemExit, match=r"top.tsv.partial holds a stopped run of other settings"):
        evaluate.main(base + ["--out", str(tmp_path / "top.tsv")])


def test_predictions_piped_into_head_end_quietly(trained, lp_root):
    """`evaluate.py --predict ... | head -1` closes the pipe early: no traceback."""
    cmd = (f"{sys.executable} evaluate.py --predict --data-dir {lp_root} --ckpt {trained[0]} --dtype fp32 "
           "--queries /dev/stdin --topk 10 | head -1")
    queries = "apple\tpart of\n" * 200  # more lines than a pipe's buffer holds
    proc = subprocess.run(cmd, shell=True, cwd=ROOT, input=queries, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.stdout.startswith("(apple, part of, ?) over 10 candidates") and "Traceback" not in proc.stderr


def test_triple_classification(tiny_bert, tmp_path, capsys, device):
    rng = np.random.default_rng(3)
    dev, test = rng.integers(0, 10, size=(40, 3)) % [10, 2, 10], rng.integers(0, 10, size=(30, 3)) % [10, 2, 10]
    labels = rng.random(40) < 0.5, rng.random(30) < 0.5
    root = write_kg(tmp_path / "d", "WN11", TRAIN, dev.tolist(), test.tolist(), labels=(labels[0].tolist(), labels[1].tolist()))
    common = ["--tc", "--data", "wn11", "--data-dir", root, "--model", tiny_bert, "--dtype", "fp32"]
    got = run_cli(*common, "--out", tmp_path / "tc.json")["metrics"]
    model, loaded = palt.build_palt(str(tiny_bert), palt.PaltConfig(**palt.ZERO_SHOT))
    kg = graphs.load_kg("wn11", root)
    enc = data.encode(kg, loaded.tokenizer)
    scorer = evaluate.Scorer(model.to(device), enc, (0, 0, 0), 192, device)
    s_dev, s_test = scorer.numpy(kg.dev), scorer.numpy(kg.test)
    theta, dev_acc = best_threshold(s_dev, kg.dev_labels)
    assert got["dev_accuracy"] == pytest.approx(dev_acc) and got["threshold"] == pytest.approx(theta)
    assert got["test_accuracy"] == pytest.approx(np.mean((s_test > theta) == kg.test_labels))
    right = np.unpackbits(np.frombuffer(bytes.fromhex(got["test_right"]), dtype=np.uint8))  # for bench/paired.py
    assert right[:30].tolist() == ((s_test > theta) == kg.test_labels).tolist() and not right[30:].any()
    assert sum(r["n"] for r in got["test_error_by_relation"]) == 30
    assert "| similar to |" in capsys.readouterr().out
    per = run_cli(*common, "--out", tmp_path / "tc2.json", "--per-relation")["metrics"]
    assert per["dev_accuracy"] >= got["dev_accuracy"]  # more thresholds fit dev at least as well
    for r, rel in enumerate(["r0", "r1"]):
        m = kg.dev[:, 1] == r
        assert per["relation_thresholds"][rel] == pytest.approx(best_threshold(s_dev[m], kg.dev_labels[m])[0])


def test_find_by_id_text_or_unique_ending():
    ids = ["/people/person/profession", "/people/profession/specialization_of", "/film/film/genre", "/music/genre"]
    texts = ["people person profession", "people profession specialization of", "film film genre", "music genre"]
    assert predict.find(ids, texts, "/film/film/genre", "relation") == 2
    assert predict.find(ids, texts, "People Person Profession", "relation") == 0
    assert predict.find(ids, texts, "profession", "relation") == 0  # the only id or text that ends in it
    with pytest.raises(data.DataError, match="'genre' is ambiguous: /film/film/genre .*, /music/genre"):
        predict.find(ids, texts, "genre", "relation")

# ----------------------------------------------------------------------------- estimates carry an interval


def toy_rows(n, seed=0):
    """Filtered ranks of n test triples x 2 sides (some tied), in lp_metrics' layout."""
    rng = np.random.default_rng(seed)
    o = rng.geometric(0.4, size=2 * n)
    p = o + rng.integers(0, 2, size=2 * n)
    return np.stack([np.repeat(np.arange(n), 2), np.tile([0, 1], n), o, p, o, p], 1)


def interval(rows, seed=0):
    """evalcli.bootstrap_interval of rank rows (lp_metrics' layout), as link_prediction calls it."""
    realistic = (rows[:, evaluate.FILTERED_OPTIMISTIC] + rows[:, evaluate.FILTERED_PESSIMISTIC]) / 2
    return evalcli.bootstrap_interval(realistic, rows[:, evaluate.TRIPLE], evaluate.KS, seed=seed)


def test_bootstrap_interval_is_seeded_narrows_with_n_and_holds_the_full_set_value():
    rows = toy_rows(200)
    ci = interval(rows, seed=0)
    assert ci == interval(rows, seed=0) and ci != interval(rows, seed=1)
    assert (ci["resamples"], ci["seed"]) == (1000, 0)
    full = evaluate.lp_metrics(rows)["filtered"]["both"]["realistic"]
    assert set(full) == {"mr", "mrr", "hits@1", "hits@3", "hits@10"}
    for m, v in full.items():
        assert ci[m][0] < v < ci[m][1]
    big = interval(toy_rows(3200), seed=0)
    for m in full:  # 16x the triples: about a quarter of the width
        assert big[m][1] - big[m][0] < 0.5 * (ci[m][1] - ci[m][0])
    # a triple's two sides are resampled together: head rank 1 and tail rank 4 everywhere leaves nothing to vary
    paired = np.stack([np.repeat(np.arange(50), 2), np.tile([0, 1], 50), *[np.tile([1, 4], 50)] * 4], 1)
    assert interval(paired)["mrr"] == [pytest.approx(0.625)] * 2

# ----------------------------------------------------------------------------- which checkpoint, which dataset


def save_like(path, trained, **meta):
    """The `trained` checkpoint's tensors at path, its metadata changed or extended by meta."""
    src, model, *_ = trained
    _, base = checkpoints.read_checkpoint(src)
    checkpoints.save_checkpoint(path, model, {k: v for k, v in base.items() if k not in ("palt", "kind")} | meta)
    return path


def one_line_error(argv, match):
    """evaluate.main(argv) stops with a single 'error: ...' line that matches."""
    with pytest.raises(SystemExit) as e:
        evaluate.main([str(a) for a in argv])
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg and re.search(match, msg), msg
    return msg


def tree(root):
    """Everything under root: to show that a refused command changed nothing."""
    return {str(p): p.read_bytes() if p.is_file() else None for p in sorted(Path(root).rglob("*"))}


DEV_LOG = [{"epoch": 1, "step": 10, "metric": "mrr", "value": 0.31}, {"epoch": 2, "step": 20, "metric": "mrr", "value": 0.42}]


def test_a_run_folder_means_its_best_checkpoint_else_its_last(trained, lp_root, tmp_path):
    folder = tmp_path / "runs" / "umls-tiny"
    save_like(folder / "ckpt.safetensors", trained, epoch=3, step=30)  # an older train.py: no dtype, no dev log
    common = ["--lp", "--data-dir", lp_root, "--ckpt", folder, "--limit", 2]
    last = run_cli(*common, "--out", tmp_path / "last.json")
    assert last["ckpt"] == str((folder / "ckpt.safetensors").resolve())  # outside the project: absolute
    record = lambda r: {k: r["train"][k] for k in ("epochs", "steps", "dtype", "wall_s", "dev", "best_epoch")}
    assert record(last) == {"epochs": 3, "steps": 30, "dtype": None, "wall_s": None, "dev": None, "best_epoch": None}
    assert last["train"]["method"] == "palt" and last["train"]["prompts"] == [2, 1, 1]
    save_like(folder / "best.safetensors", trained, epoch=2, step=20, dtype="bf16", train_wall_s=12.5, dev=DEV_LOG,
              best_epoch=2, text_file="entity2text.txt")
    evaluate.main([str(a) for a in common])  # no --out: beside the checkpoint, named after it
    best = json.loads((folder / "eval-umls-best-lp-test-limit2-seed0.json").read_text())
    assert best["ckpt"] == str((folder / "best.safetensors").resolve()) and best["data"] == "umls"
    assert record(best) == {"epochs": 2, "steps": 20, "dtype": "bf16", "wall_s": 12.5, "dev": DEV_LOG, "best_epoch": 2}
    assert best["settings"]["text_file"] == "entity2text.txt"


def test_data_defaults_to_the_checkpoints_own_dataset(trained, tmp_path):
    root = write_kg(tmp_path / "d", "WN18RR", TRAIN, DEV, TEST)
    kg = graphs.load_kg("wn18rr", root)
    ckpt = save_like(tmp_path / "wn18rr.safetensors", trained, data="wn18rr", data_fingerprint=kg.fingerprint)
    assert run_cli("--lp", "--data-dir", root, "--ckpt", ckpt, "--out", tmp_path / "r.json", "--limit", 2)["data"] == "wn18rr"
    one_line_error(["--lp", "--data", "umls", "--data-dir", root, "--ckpt", ckpt], "was trained on wn18rr, not umls")


def test_without_ckpt_the_shipped_adapter_is_evaluated(trained, lp_root, tmp_path, monkeypatch, capsys):
    weights = tmp_path / "weights"
    save_like(weights / "palt-umls-minilm.safetensors", trained)
    monkeypatch.setattr(evalcli.files, "ROOT", tmp_path)  # the project's own weights/ ...
    monkeypatch.setattr(hub, "WEIGHTS", tmp_path / "elsewhere")  # ... whatever $PALT_WEIGHTS says
    monkeypatch.chdir(tmp_path)
    evaluate.main(["--lp", "--data-dir", str(lp_root), "--limit", "2"])  # --data: umls
    got = json.loads((tmp_path / "results" / "umls-palt-umls-minilm-lp-test-limit2-seed0.json").read_text())
    assert got["ckpt"] == "weights/palt-umls-minilm.safetensors" and got["data"] == "umls"  # relative to the project
    assert [p.name for p in weights.iterdir()] == ["palt-umls-minilm.safetensors"]  # nothing written into weights/
    evaluate.main(["--predict", "--data-dir", str(lp_root), "apple", "part of"])
    assert "(apple, part of, ?) over 10 candidates" in capsys.readouterr().out
    msg = one_line_error(["--lp", "--data", "fb15k-237"], "")
    assert msg == (f"error: no shipped adapter {weights}/palt-fb15k-237-minilm.safetensors: train one with "
                   "python train.py --data fb15k-237, then --ckpt runs/fb15k-237-minilm")
    one_line_error(["--tc"], "weights/palt-wn11-minilm.safetensors: train one with")  # --tc: wn11


@pytest.mark.skipif(not Path(os.environ.get("PALT_DATA") or ROOT.parent / "shared" / "data", "umls").is_dir(),
                    reason="needs the umls data ($PALT_DATA or ../shared/data)")
def test_the_shipped_adapter_is_found_whatever_palt_weights_says(tmp_path):
    env = dict(os.environ, PALT_WEIGHTS=str(tmp_path), OMP_NUM_THREADS="1",  # base models kept elsewhere
               PALT_DATA=os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data"))  # as the skip found it
    proc = subprocess.run([sys.executable, "evaluate.py", "--lp", "--limit", "2", "--out", str(tmp_path / "r.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["ckpt"] == "weights/palt-umls-minilm.safetensors"
    assert "| umls (estimate) | minilm | weights/palt-umls-minilm.safetensors |" in proc.stdout

# ----------------------------------------------------------------------------- nothing lost, no traceback


def test_outputs_are_checked_writable_before_the_model_loads(trained, lp_root, tmp_path, monkeypatch):
    monkeypatch.setattr(evalcli, "load_model", lambda *a: pytest.fail("the model was loaded"))
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "r.state").write_text("not the ranking state folder")
    before = tree(tmp_path)
    common = ["--lp", "--data-dir", lp_root, "--ckpt", trained[0], "--out"]
    one_line_error(common + [tmp_path / "a_file" / "deeper" / "x.json"], "a_file is not a folder")  # fails for root too
    one_line_error(common + [tmp_path / "folder.json"], "folder.json is a folder; give the path of a file")
    one_line_error(common + [tmp_path / "r.json"], "its ranking state: .*r.state is not a folder")
    assert tree(tmp_path) == before


def stopped_state(common, tmp_path):
    """Run until 1 query is done and saved; the state file it left."""
    with pytest.raises(SystemExit, match="stopped after"):
        evaluate.main([str(a) for a in common] + ["--stop-after-queries", "1"])
    [f] = (tmp_path / "r.state").glob("*.npz")
    return f


def npz(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_a_damaged_ranking_state_is_one_line_and_left_alone(lp_root, tiny_bert, tmp_path):
    common = ["--lp", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 20, "--out", tmp_path / "r.json"]
    f = stopped_state(common, tmp_path)
    good = f.read_bytes()
    for damaged, why in [(good[:len(good) // 2], "BadZipFile"), (b"", "EOFError"), (b"not a zip", "pickled objects"),
                         (npz(rows=np.array([[None] * 6], dtype=object)), "pickled objects"),
                         (npz(rows=np.zeros((2, 5), np.int64)), r"shape \(2, 5\)"),
                         (npz(other=np.zeros((2, 6), np.int64)), "KeyError"),
                         (npz(rows=np.full((1, 6), 99)), "not ranks of the test set")]:
        f.write_bytes(damaged)
        one_line_error(common, f"^error: {re.escape(str(f))}: damaged ranking state .*{why}.*; delete it "
                               f"\\(or the folder {re.escape(str(f.parent))}\\) to start over$")
        assert f.read_bytes() == damaged
    f.write_bytes(good)
    assert run_cli(*common)["counts"]["resumed_queries"] == 1  # the intact state resumes (its first block: 1 query)


def test_a_failed_save_keeps_the_previous_file_and_says_where_to_resume(lp_root, tiny_bert, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    common = ["--lp", "--data-dir", lp_root, "--model", tiny_bert, "--block-rows", 20, "--out", out]
    f = stopped_state(common, tmp_path)
    saved = f.read_bytes()

    def full_disk(file, **arrays):
        file.write(b"PK half a file")
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(evaluate.np, "savez", full_disk)
        one_line_error(common + ["--stop-after-queries", 1], f"cannot save the ranking state {re.escape(str(f))} "
                       r"\(No space left on device\); the previous save is kept: make room, and the same command "
                       f"resumes from {re.escape(str(f.parent))}$")
    # no .tmp (the .lock of the state's last ranking stays: lock_folder)
    assert f.read_bytes() == saved and sorted(p.name for p in f.parent.iterdir()) == [".lock", f.name, "settings.json"]

    out.write_text("older results\n")
    real_replace = os.replace
    def json_disk_full(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(os, "replace", json_disk_full)
        one_line_error(common, f"cannot write {re.escape(str(out))} .*the previous file is kept, and the ranks stay "
                               f"saved in {re.escape(str(f.parent))}")
    assert "filtered, realistic ranks" in capsys.readouterr().out  # the metrics were shown all the same
    assert out.read_text() == "older results\n" and sorted(p.name for p in tmp_path.glob("r.*")) == ["r.json", "r.state"]
    got = run_cli(*common)  # finishes from the saved ranks, scoring nothing
    assert got["counts"]["resumed_queries"] == got["counts"]["queries"] and not (tmp_path / "r.state").exists()


def test_a_graph_without_test_tsv_says_so_before_loading_the_model(trained, lp_root, tmp_path):
    own = tmp_path / "own"
    shutil.copytree(lp_root / "umls", own)
    (own / "test.tsv").unlink()
    kg = graphs.load_kg(own)
    assert kg.task == "lp" and kg.test.shape == (0, 3) and len(kg.dev)
    ckpt = save_like(tmp_path / "c.safetensors", trained, data=str(own), data_fingerprint=kg.fingerprint)
    one_line_error(["--lp", "--ckpt", ckpt], re.escape(f"{own}/test.tsv: no such file (--lp needs it)"))
    one_line_error(["--tc", "--ckpt", ckpt], "own has no labelled dev/test negatives")
    evaluate.main(["--lp", "--ckpt", str(ckpt), "--split", "dev", "--out", str(tmp_path / "dev.json"), "--dtype", "fp32"])
    assert json.loads((tmp_path / "dev.json").read_text())["counts"]["ranked_triples"] == len(kg.dev)


class Clock:
    """A stand-in for the time module: seconds pass only when the fake work says so."""

    def __init__(self):
        self.now = 0.0

    def time(self):
        return self.now


@pytest.mark.parametrize("seconds_a_query", [1.0, 0.01, 30.0])
def test_a_ranking_reports_progress_at_least_once_a_minute(monkeypatch, capsys, seconds_a_query):
    """UMLS on 2 fp32 cores ranks about a query a second in blocks of 485 queries (65,536 rows / 135 candidates):
    one line a block would leave 8 minutes silent. Pieces sized by the measured rate keep every gap under a minute,
    from the first line to the last, for slow and fast rankings alike (one query slower than a minute: a line each)."""
    clock = Clock()
    monkeypatch.setattr(bigrank, "time", clock)

    def rank(queries, block):  # blocks of `block` queries, each costing its queries' time
        for start in range(0, len(queries), block):
            qs = queries[start:start + block]
            clock.now += len(qs) * seconds_a_query
            yield qs, None
    progress = bigrank.Progress(704, "queries")
    printed_at, ranked = [], []
    for qs, _ in bigrank.in_pieces(rank, np.arange(704), 485):
        ranked.extend(qs)
        progress.update(len(qs))
        if capsys.readouterr().err:
            printed_at.append(clock.now)
    assert ranked == list(range(704))  # every query once, in order
    gaps = np.diff([0.0, *printed_at, clock.now])
    assert gaps.max() <= max(60, seconds_a_query), (gaps.max(), len(printed_at))


def test_the_python_api_gives_what_the_command_line_gives(trained, lp_root, tmp_path):
    """evaluate.load: score, predict and rank are the numbers evaluate.py prints and writes, entities named by id or
    text."""
    ckpt, model, kg, enc = trained
    api = evaluate.load(ckpt, data_dir=lp_root, precision="fp32")
    # score: by id or text, as the Scorer scores the indices
    got = api.score([("e0", "part of", "river bank"), ("apple", "r1", "e5")])
    want = evaluate.Scorer(model, enc, (2, 1, 1), 12).numpy(np.array([(0, 0, 1), (0, 1, 5)]))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # rank: the --lp --limit subset and its filtered realistic metrics
    cli = run_cli("--lp", "--data-dir", lp_root, "--ckpt", ckpt, "--limit", 4, "--dtype", "fp32", "--out", tmp_path / "r.json")
    metrics = api.rank(limit=4)
    for k, v in cli["metrics"]["filtered"]["both"]["realistic"].items():
        assert metrics[k] == pytest.approx(v), k
    # predict: --predict's top 3, in its order, tails and heads
    for query, kwargs in ((["apple", "part of"], dict(head="apple", relation="part of")),
                          (["?", "similar to", "e4"], dict(relation="similar to", tail="e4"))):
        evaluate.main(["--predict", "--data-dir", str(lp_root), "--ckpt", str(ckpt), "--topk", "3", "--dtype", "fp32",
                       "--out", str(tmp_path / "top.tsv"), *query])
        rows = [line.split("\t") for line in (tmp_path / "top.tsv").read_text().splitlines()[1:]]
        top = api.predict(**kwargs, k=3)
        assert [e for e, _ in top] == [r[2] for r in rows]
        np.testing.assert_allclose([s for _, s in top], [float(r[4]) for r in rows], atol=1e-5)


def test_a_bf16_predictor_holds_its_frozen_linears_in_bf16_and_scores_bit_identically(trained, lp_root):
    """Under bf16 a Predictor casts the encoder's frozen linears once (autocast would cast them at every batch): the
    scores are those of the fp32-held weights under bf16 autocast, bit for bit; what PALT trained stays fp32."""
    ckpt, model, kg, enc = trained
    api = evaluate.load(ckpt, data_dir=lp_root, precision="bf16")
    held = api.scorer.model
    assert {p.dtype for n, p in held.named_parameters() if ".layers." in n and ".ln" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in held.named_parameters() if not n.startswith("bert.")} == {torch.float32}
    triples = np.array([(h, r, t) for h in range(6) for r in range(2) for t in range(6)])
    want = evaluate.Scorer(model, enc, (2, 1, 1), 12, precision="bf16").numpy(triples)  # fp32 weights, autocast
    assert np.array_equal(api.scorer.numpy(triples), want)


def test_the_python_api_refuses_in_one_line(trained, lp_root, tmp_path):
    ckpt, *_ = trained
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path / 'none.safetensors'))}: no such checkpoint file or run folder$"):
        evaluate.load(tmp_path / "none.safetensors", data_dir=lp_root)
    api = evaluate.load(ckpt, data_dir=lp_root)
    with pytest.raises(ValueError, match=r"^no entity 'banana' \(by id or text\)"):
        api.score([("banana", "part of", "apple")])
    with pytest.raises(ValueError, match="^give relation and one of head and tail$"):
        api.predict(head="apple", relation="part of", tail="stone")
    with pytest.raises(ValueError, match="^no relation 'eats'"):
        api.predict(head="apple", relation="eats")


def test_the_python_api_ranks_the_splits_a_folder_names(trained, lp_root, tmp_path):
    """rank(split=) takes train, test and dev or valid (one split, whichever file the folder has); any other name is a
    ValueError naming the splits the graph has."""
    ckpt, *_ = trained
    api = evaluate.load(ckpt, data_dir=lp_root, precision="fp32")
    assert api.rank("valid", limit=2) == api.rank("dev", limit=2)
    assert api.rank("train", limit=2)["mrr"] > 0
    with pytest.raises(ValueError, match=rf"^split 'validation': {re.escape(str(lp_root / 'umls'))} has train, dev, test$"):
        api.rank("validation")


def test_two_rankings_never_write_one_state(trained, lp_root, tmp_path):
    """evaluate.py --lp --limit keeps its ranks in OUT.state: while another process holds that state (a ranking under
    way), a second is refused in one line naming the holder, writing nothing; once the holder is gone (however it
    ended), the state is free."""
    ckpt, *_ = trained
    out = tmp_path / "r.json"
    argv = ["--lp", "--data-dir", lp_root, "--ckpt", ckpt, "--limit", 3, "--dtype", "fp32", "--out", out]
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from support import files; "
                               f"files.lock_folder({str(tmp_path / 'r.state')!r}, 'x', 'y'); print('held', flush=True); "
                               "sys.stdin.read()"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = tree(tmp_path)
        one_line_error(argv, rf"^error: {re.escape(str(tmp_path / 'r.state'))} \(a ranking state\) is in use by process "
                             rf"{holder.pid} on \S+ \(since [\d-]+ [\d:]+\): wait for it to end, or give another --out$")
        assert tree(tmp_path) == before and not out.exists()
    finally:
        holder.kill()
        holder.wait()
    evaluate.main([str(a) for a in argv])
    got = json.loads(out.read_text())
    assert got["counts"]["ranked_triples"] == 3
    # which weights it measured, each by its own name: the checkpoint's and its base model's
    meta = checkpoints.read_checkpoint(ckpt, tensors=False)[1]
    assert got["checkpoint_sha256"] == files.sha256_file(ckpt) and got["base_weights_sha256"] == meta["weights_sha256"]
    # what a methods table reads: the adapter's bytes on disk; this checkpoint's metadata counts no
    # parameters (as checkpoints older than the counts), so the summary says None, not a guess
    assert got["checkpoint_bytes"] == Path(ckpt).stat().st_size > 0
    assert got["train"]["tunable"] is None and got["train"]["total"] is None


def test_the_train_summary_carries_the_parameter_counts_and_a_methods_settings(tiny_bert):
    """train.py's metadata counts tunable and all parameters (palt.param_report); the summary keeps
    both, and LoRA's rank and alpha with its method."""
    model, _ = palt.build_palt(str(tiny_bert), palt.PaltConfig(method="lora", lora_rank=2, lora_alpha=4))
    report = palt.param_report(model)
    meta = {"palt": {"method": "lora", "lora_rank": 2, "lora_alpha": 4}, "tunable": report["tunable"],
            "total": report["total"], "run": "{}"}
    got = evalcli.train_summary(meta)
    assert (got["method"], got["lora_rank"], got["lora_alpha"]) == ("lora", 2, 4)
    assert 0 < got["tunable"] == report["tunable"] < got["total"] == report["total"]
    assert evalcli.train_summary({"palt": {}, "run": "{}"})["total"] is None  # an older checkpoint


def test_a_random_scorers_mrr_is_what_random_mrr_says(lp_root):
    """random_mrr's mean and sd against 400 random scorers ranked by rank_queries (filtered: the other known answers
    leave the candidates, so n differs by query)."""
    kg = graphs.load_kg("umls", lp_root)
    lpq, tri = evaluate.lp_queries(kg), np.arange(len(kg.test))
    queries = np.unique(lpq.triple_query[tri])
    mean, sd = evaluate.random_mrr(lpq, tri)
    assert len(set(np.diff(lpq.filter_ptr)[lpq.triple_query[tri].ravel()])) > 1  # some queries filter more than others
    rng, mrrs = np.random.default_rng(0), []
    for _ in range(400):
        table = torch.from_numpy(rng.random((10, 2, 10)))  # distinct scores: no ties
        score = lambda t: table[t[:, 0], t[:, 1], t[:, 2]]
        ranks = np.concatenate([r for _, r in evaluate.rank_queries(score, lpq, tri, queries, 4)])
        mrrs.append(evaluate.lp_metrics(ranks)["filtered"]["both"]["realistic"]["mrr"])
    assert abs(np.mean(mrrs) - mean) < 3 * sd / np.sqrt(400)
    assert np.std(mrrs) == pytest.approx(sd, rel=0.15), (np.std(mrrs), sd)


def test_chance_accuracy_is_a_tuned_threshold_on_scores_that_carry_nothing():
    rng = np.random.default_rng(1)
    labels = rng.random(300) < 0.5
    nothing = [evaluate.best_threshold(rng.random(300), labels)[1] for _ in range(200)]  # fresh random scores
    mean, sd = evaluate.chance_accuracy(rng.random(300), labels, n=200)
    assert mean == pytest.approx(np.mean(nothing), abs=0.01) and sd == pytest.approx(np.std(nothing), rel=0.25)
    assert mean > 0.5  # a threshold tuned on the same triples beats a coin
    separating = np.where(labels, 1.0, 0.0) + rng.random(300) * 0.1
    assert evaluate.best_threshold(separating, labels)[1] == 1.0 > mean + 2 * sd


def test_predict_flags_a_top_k_whose_scores_are_indistinguishable(trained, lp_root, monkeypatch, capsys):
    """A model whose scores barely differ (here: all the same) prints a top k anyway; the note says it is noise."""
    ckpt, *_ = trained
    common = ["--predict", "--data-dir", str(lp_root), "--ckpt", str(ckpt), "apple", "part of"]
    real = palt.score
    monkeypatch.setattr(palt, "score", lambda logits: real(logits) * 1e-4)  # the same order, 10,000x closer
    evaluate.main(common)
    out = capsys.readouterr().out
    assert re.search(r"\nnote: the top 10 scores span 0\.0\d{3} \(under 0\.05\): indistinguishable, their order is "
                     r"noise; all 10 scored span 0\.\d{4}\. A model that tells these apart barely", out), out
    monkeypatch.setattr(palt, "score", lambda logits: real(logits) * 1e4)
    evaluate.main(common)
    assert "note: the top" not in capsys.readouterr().out


def test_nan_scores_through_the_python_api_raise_a_score_error_not_system_exit(lp_root):
    """Predictor.rank on a model whose scores are NaN: a ScoreError (a ValueError) in one line, which a notebook can
    catch; never SystemExit, which would end the interpreter."""
    kg = graphs.load_kg("umls", lp_root)

    def nan_scores(triples):
        return torch.full((len(triples),), float("nan"))

    predictor = evaluate.Predictor(nan_scores, kg, tokenizer=None, info={})
    with pytest.raises(evaluate.ScoreError, match=r"^the model gives non-finite scores \(NaN/inf\); no ranks computed$"):
        predictor.rank()
    assert issubclass(evaluate.ScoreError, ValueError) and not issubclass(evaluate.ScoreError, SystemExit)


# ----------------------------------------------------------------------------- progress on long waits
class SlowClock:
    """A stand-in for the time module on a slow machine: every reading 20 s after the one before."""

    def __init__(self):
        self.now = 0.0

    def time(self):
        self.now += 20
        return self.now


def progress_lines(err):
    """The progress lines on stderr: done/total unit (rate, ETA ...)."""
    return [line for line in err.splitlines() if re.fullmatch(r"[\d,]+/[\d,]+ .+ \(.+, ETA \d+:\d\d:\d\d.*\)", line)]


def test_the_first_shortlisted_query_says_how_its_embeddings_and_anchor_come_along(trained, lp_root, tmp_path, capsys,
                                                                                   monkeypatch):
    """On a big graph the first --predict embeds every candidate and scores every one for an anchor (minutes on a
    CPU): progress lines with a count and an ETA on stderr, the first within ~10 s, then at least once a minute
    (here on a slow clock, --shortlist lowering the threshold), each build announced when it begins. The next query reads
    both from the cache: silent."""
    path, *_ = trained
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bigrank, "time", SlowClock())
    base = ["--predict", "--data-dir", str(lp_root), "--ckpt", str(path), "--dtype", "fp32", "--shortlist", "8", "apple",
            "part of"]
    evaluate.main(base)
    err = capsys.readouterr().err
    lines = progress_lines(err)
    assert any(line.startswith("10/10 entities embedded (") for line in lines), lines
    assert any(line.startswith("10/10 candidates scored for the anchor (e3, r0, side 1) (") for line in lines), lines
    # Each build is announced before its first progress line, so a cold start is never silent.
    for said, progress in (("the shortlist's entity embeddings: embedding all 10 candidates once (cached in ",
                            "10/10 entities embedded ("),
                           ("the shortlist's anchor (e3, r0, side 1): scoring all 10 candidates once (cached in ",
                            "10/10 candidates scored for the anchor")):
        assert said in err and err.index(said) < err.index(progress), err
    evaluate.main(base)
    err = capsys.readouterr().err
    assert progress_lines(err) == [] and "the shortlist's " not in err


def test_the_nearest_entity_pass_and_dev_rankings_report_progress_and_a_quick_one_stays_silent(trained, capsys,
                                                                                               monkeypatch):
    """train.py's nearest-entity pass (support/near.py) and its dev point (evaluate.rank_split, exact or the big graphs'
    stratified estimate) print progress lines on a slow machine, with the same results; on a fast one, nothing."""
    from support import near
    _, model, kg, enc = trained
    score = FnScorer(lambda t: (t[:, 0] * 7 + t[:, 2] * 3 % 10).astype(np.float32))

    def run():
        emb = near.entity_embeddings(model.bert, kg.split_entities, enc)
        nearest = near.nearest_entities(kg, emb, 4)
        exact = evaluate.rank_split(score, kg, "dev")
        estimate = evaluate.rank_split(score, kg, "dev", sample=3, near=nearest)
        return emb, nearest, exact, estimate
    quick = run()
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(bigrank, "time", SlowClock())
    slow = run()
    units = [line.split(" (")[0].split(" ", 1)[1] for line in progress_lines(capsys.readouterr().err)]
    assert {"entities embedded", "entities' nearest found", "triples scored",
            "triples scored for the stratified estimate"} <= set(units), units
    assert torch.equal(quick[0], slow[0]) and np.array_equal(quick[1], slow[1])
    assert quick[2]["mrr"] == slow[2]["mrr"] and quick[3] == slow[3]


def test_evaluate_says_its_precision_once_and_the_python_api_stays_quiet(trained, lp_root, tmp_path, capsys,
                                                                         monkeypatch):
    path, *_ = trained
    monkeypatch.setenv("PALT_CACHE", str(tmp_path / "cache"))
    evaluate.main(["--predict", "--data-dir", str(lp_root), "--ckpt", str(path), "apple", "part of"])
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("precision: ")]
    assert re.fullmatch(r"precision: (fp32|bf16) \(.+\)", line)
    evaluate.load(path, data_dir=lp_root).score([("apple", "part of", "stone")])
    assert "precision" not in capsys.readouterr().err


def test_a_wait_says_how_far_it_is_within_10_s_then_at_least_once_a_minute_and_ends_only_if_it_spoke(monkeypatch,
                                                                                                       capsys):
    clock = Clock()
    monkeypatch.setattr(bigrank, "time", clock)
    progress, printed = bigrank.Progress(100, "things"), []
    for second in range(1, 101):
        clock.now = second
        progress.update(1)
        if capsys.readouterr().err:
            printed.append(second)
    assert printed[0] <= 11 and np.diff([*printed, 100]).max() <= 60
    progress.end()
    assert capsys.readouterr().err == "100/100 things (1.0/s, ETA 0:00:00)\n"
    quick = bigrank.Progress(5, "things")
    clock.now += 9
    quick.update(5)
    quick.end()
    assert capsys.readouterr().err == ""

# ----------------------------------------------------------------------------- relation categories
# A hand-made train split with one relation of each category: r0 1-1; r1 1-N (head 0 has three tails: 4 facts over
# 2 heads, tph 2); r2 N-1 (tail 0 has three heads: hpt 2); r3 N-N (tph = hpt = 2; one fact listed twice counts once);
# r4 sits on the threshold (3 facts over 2 heads: tph 1.5, which is N).
CATEGORY_TRAIN = [(0, 0, 1), (2, 0, 3), (4, 0, 5),
                  (0, 1, 1), (0, 1, 2), (0, 1, 3), (4, 1, 5),
                  (1, 2, 0), (2, 2, 0), (3, 2, 0), (5, 2, 4),
                  (0, 3, 1), (0, 3, 2), (1, 3, 1), (1, 3, 2), (0, 3, 1),
                  (6, 4, 7), (6, 4, 8), (9, 4, 1)]
CATEGORY_TEST = [(6, 0, 7), (8, 1, 9), (8, 1, 6), (7, 2, 9), (6, 3, 8), (2, 4, 3)]


def test_relation_categories_count_tails_per_head_and_heads_per_tail_against_one_and_a_half():
    from support import categories
    names, ratios = categories.relation_categories(np.array(CATEGORY_TRAIN), 6)
    assert list(names) == ["1-1", "1-N", "N-1", "N-N", "1-N", ""]  # r5 has no train triple
    np.testing.assert_allclose(ratios[:5], [[1, 1], [2, 1], [1, 2], [2, 2], [1.5, 1]])
    assert np.isnan(ratios[5]).all()


def test_by_category_splits_ranks_by_category_and_side():
    from support import categories
    table = categories.by_category(relation=np.array([0, 0, 1, 1, 2]), side=np.array([0, 1, 0, 1, 0]),
                                   triple=np.array([0, 0, 1, 1, 2]), query=np.array([0, 1, 2, 3, 4]),
                                   optimistic=np.array([1, 2, 1, 3, 1]), pessimistic=np.array([1, 2, 3, 3, 1]),
                                   categories=np.array(["1-1", "N-N", ""], dtype=object))
    one = table["1-1"]
    assert (one["relations"], one["triples"], one["head"]["queries"], one["tail"]["ranks"]) == (1, 1, 1, 1)
    assert one["head"]["metrics"] == {"mr": 1.0, "mrr": 1.0, "hits@1": 1.0, "hits@10": 1.0}
    assert one["tail"]["metrics"] == {"mr": 2.0, "mrr": 0.5, "hits@1": 0.0, "hits@10": 1.0}
    assert one["both"]["metrics"]["mrr"] == 0.75
    many = table["N-N"]
    assert many["head"]["metrics"]["mrr"] == 0.5 and many["tail"]["metrics"]["mrr"] == pytest.approx(1 / 3)
    assert table["1-N"]["both"] == {"ranks": 0, "queries": 0, "metrics": None}
    assert table["uncategorised"] == {"ranks": 1}


def test_lp_per_relation_reports_the_categories_of_a_hand_made_graph(tiny_bert, tmp_path, capsys):
    d = tmp_path / "data" / "cats"
    d.mkdir(parents=True)
    (d / "entity2text.txt").write_text("".join(f"e{i}\t{w}\n" for i, w in enumerate(WORDS[:10])))
    (d / "relation2text.txt").write_text("".join(f"r{r}\t{w}\n" for r, w in enumerate(
        ["part of", "similar to", "made of", "kind of", "next to"])))
    line = lambda t: f"e{t[0]}\tr{t[1]}\te{t[2]}\n"
    (d / "train.tsv").write_text("".join(map(line, CATEGORY_TRAIN)))
    (d / "dev.tsv").write_text(line((2, 0, 5)))
    (d / "test.tsv").write_text("".join(map(line, CATEGORY_TEST)))
    got = run_cli("--lp", "--data", d, "--model", tiny_bert, "--per-relation", "--out", tmp_path / "r.json")
    assert {k: v["category"] for k, v in got["relation_categories"].items()} == {
        "r0": "1-1", "r1": "1-N", "r2": "N-1", "r3": "N-N", "r4": "1-N"}
    table = got["by_category"]
    counts = {name: (table[name]["relations"], table[name]["triples"], table[name]["head"]["queries"],
                     table[name]["tail"]["queries"]) for name in ("1-1", "1-N", "N-1", "N-N")}
    # 1-N: r1's two test triples share their tail query (8, r1, ?), and r4's triple adds one of each
    assert counts == {"1-1": (1, 1, 1, 1), "1-N": (2, 3, 3, 2), "N-1": (1, 1, 1, 1), "N-N": (1, 1, 1, 1)}
    # the categories partition the ranks: their MRRs, weighted by ranks, give the overall one
    both = [table[name]["both"] for name in ("1-1", "1-N", "N-1", "N-N")]
    weighted = sum(b["ranks"] * b["metrics"]["mrr"] for b in both) / sum(b["ranks"] for b in both)
    assert weighted == pytest.approx(got["metrics"]["filtered"]["both"]["realistic"]["mrr"])
    assert table["uncategorised"] == {"ranks": 0}
    assert "by relation category" in capsys.readouterr().out

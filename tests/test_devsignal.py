"""bench/devsignal.py: exact dev MRR beside the sampled dev signals, per checkpoint, and how often they agree."""
import importlib.util, json, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import torch

import data, evaluate, palt
from support import bigrank, checkpoints, graphs
from conftest import FnScorer, make_bert_dir, write_tiny_kg

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """Two random-calibration checkpoints of a tiny umls graph and an exact dev ranking state of 5 of the 6 dev triples
    each (an estimate keeps its state)."""
    root = tmp_path_factory.mktemp("devsignal")
    words = write_tiny_kg(root / "data", "umls")  # 24 entities, 6 dev triples
    base = make_bert_dir(root / "bert", words, layers=2)
    kg = graphs.load_kg("umls", root / "data")
    pairs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model, loaded = palt.build_palt(str(base), palt.PaltConfig(prompts=(1, 0, 0), calib_layers=(1,)))
        with torch.no_grad():
            model.W_c["1"].weight.normal_(0, 0.5)  # W_c starts at zero: make the two checkpoints differ
        ckpt = root / f"c{seed}.safetensors"
        checkpoints.save_checkpoint(ckpt, model, {"model": str(base), "weights_sha256": loaded.weights_sha256, "data": "umls",
                                           "data_fingerprint": kg.fingerprint, "text": "name", "prompts": [1, 0, 0],
                                           "max_seq_length": 16})
        evaluate.main(["--lp", "--split", "dev", "--limit", "5", "--ckpt", str(ckpt), "--data-dir", str(root / "data"),
                       "--out", str(root / f"c{seed}-dev.json")])
        pairs.append((ckpt, root / f"c{seed}-dev.state"))
    return root, kg, pairs


def devsignal(root, *args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "devsignal.py"), *map(str, args), "--data-dir",
                           str(root / "data")], capture_output=True, text=True, cwd=ROOT)


def test_a_sample_holding_every_entity_is_the_exact_ranking(ranked):
    root, kg, pairs = ranked
    r = devsignal(root, *(f"{c}={s}" for c, s in pairs), "--sample", 100, "--near", "3")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(row["triples"] == 5 for row in rows)
    for row, (_, state) in zip(rows, pairs):
        exact = json.loads((root / f"{state.name[:-len('.state')]}.json").read_text())
        assert row["exact"] == pytest.approx(exact["metrics"]["filtered"]["both"]["realistic"]["mrr"])
        assert row["random"] == pytest.approx(row["exact"]) and "near 3" not in row
        # the stratified estimate: every other candidate drawn, each counting once, is the exact rank
        assert row["strat 0"] == pytest.approx(row["exact"]) and row["strat 3"] == pytest.approx(row["exact"])
        assert row["typed 0"] == pytest.approx(row["exact"]) and row["typed 3"] == pytest.approx(row["exact"])
        assert row["strat 3 MR"] == pytest.approx(exact["metrics"]["filtered"]["both"]["realistic"]["mr"])
    assert rows[0]["exact"] != rows[1]["exact"]
    assert "random: orders 1 of 1 checkpoint pairs as the exact MRR does, 0 the other way, 0 tied" in r.stdout


def test_self_wins_is_the_share_of_dev_queries_whose_own_entity_outscores_the_answer(ranked):
    root, kg, pairs = ranked
    r = devsignal(root, f"{pairs[0][0]}={pairs[0][1]}", "--near", "3")
    row = json.loads(r.stdout.splitlines()[0])
    model, meta, loaded = checkpoints.load_checkpoint(pairs[0][0])
    score = evaluate.Scorer(model.eval(), data.encode(kg, loaded.tokenizer), meta["prompts"], meta["max_seq_length"])
    dev = kg.dev[bigrank.select(len(kg.dev), 5, 0)]  # the 5 triples the state ranked
    wins = [float(score(np.array([own]))[0] > score(np.array([[h, rel, t]]))[0])
            for h, rel, t in dev.tolist() for own in ([h, rel, h], [t, rel, t])]
    assert row["self wins"] == pytest.approx(sum(wins) / len(wins))


def test_a_state_of_another_checkpoint_is_refused(ranked):
    root, _, pairs = ranked
    r = devsignal(root, f"{pairs[0][0]}={pairs[1][1]}")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: {pairs[1][1]} ranked another checkpoint than {pairs[0][0]}"



def test_the_stratified_rank_estimate_is_unbiased(ranked):
    """3 draws from the other candidates, each counting for (others)/3: averaged over draws, the estimated ranks are
    the exact ones (every candidate drawn, which the first test checks against evaluate.py). Scores with ties."""
    spec = importlib.util.spec_from_file_location("devsignal", ROOT / "bench" / "devsignal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root, kg, _ = ranked
    tri, near = np.arange(len(kg.dev)), np.zeros((len(kg.entities), 0), dtype=np.int64)  # strat 0: no hard ones
    score = FnScorer(lambda t: ((t[:, 0] * 7 + t[:, 2] * 5) % 11).astype(np.float32))
    exact_mrr, exact_mr, _ = module.stratified(score, kg, tri, 0, near, 10 ** 6)
    mr = np.mean([module.stratified(score, kg, tri, seed, near, 3)[1] for seed in range(300)])
    assert exact_mr > 3 and mr == pytest.approx(exact_mr, rel=0.03)
    typed = np.mean([module.stratified(score, kg, tri, seed, near, 3, "dev", 2)[1] for seed in range(300)])
    assert typed == pytest.approx(exact_mr, rel=0.03)  # and with a middle stratum: the relation's side in train
    assert module.stratified(score, kg, tri, 0, near, 3)[1] != exact_mr  # a single draw is not the exact rank

"""The adapters shipped in weights/ are what weights/README.md says: each loads strictly on the base model it was
trained on (its recorded sha256), and reproduces the metrics stored in its results JSON (results/<same name>.json)
on a part of the data cheap enough for CI. Real MiniLM, real data (../shared/data or $PALT_DATA)."""
import json, os
from pathlib import Path
import numpy as np
import pytest

import data, evaluate
from support import bigrank, checkpoints, devices, evalcli, files, graphs

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {name: ROOT / "weights" / f"palt-{name}-minilm.safetensors"
            for name in ("umls", "wn11", "fb13", "wn18rr", "fb15k-237")}
DATA = os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data")


def shipped(name):
    path, result = ADAPTERS[name], ROOT / "results" / f"palt-{name}-minilm.json"
    assert path.is_file() and path.stat().st_size < 8 * 2**20, f"{path}: missing, or over 8 MB"
    assert result.is_file(), f"{result}: the evaluation of {path.name} is missing"
    if not Path(DATA, graphs.DATASETS[name][0]).is_dir():
        pytest.skip(f"no {name} data in {DATA}")
    model, meta, loaded = checkpoints.load_checkpoint(path)  # strict: the sha256 of the base model, every tensor's shape
    assert meta["data"] == name and loaded.weights_sha256 == meta["weights_sha256"]
    kg = graphs.load_kg(name, DATA, meta["text"])
    assert kg.fingerprint == meta["data_fingerprint"]  # trained on these very files
    result = json.loads(result.read_text())
    # The JSON evaluates this training run: its summary is the checkpoint's, but for keys added to summaries since.
    summary, newer = evalcli.train_summary(meta), {"total", "search"}
    assert {k: v for k, v in summary.items() if k in result["train"] or k not in newer} == result["train"]
    assert meta["dev"]
    # ... and names this very file by its sha256 (bench/rescore.py re-ranked some of its triples), as weights/README does
    sha = files.sha256_file(path)
    assert result["checkpoint_sha256"] == sha, f"{name}: python bench/rescore.py {path} results/palt-{name}-minilm.json"
    assert f"| `{path.name}` (shipped) | `{sha}` |" in (ROOT / "weights" / "README.md").read_text()
    return model.eval(), meta, data.encode(kg, loaded.tokenizer), kg, result


def dtype_and_tolerance(result, exact):
    """The stored run's precision where this CPU runs it natively; else fp32 (emulated bf16 is ~100x slower), and
    then a few borderline scores may differ: a looser tolerance."""
    stored = result["settings"]["dtype"]
    if stored == "fp32" or devices.resolve_dtype("auto", "cpu") == "bf16":
        return stored, exact
    return "fp32", 0.01


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ("wn11", "fb13") if ADAPTERS[n].is_file()])  # every one shipped
def test_a_triple_classification_adapter_reproduces_its_dev_accuracy(name):
    model, meta, enc, kg, result = shipped(name)
    dtype, tolerance = dtype_and_tolerance(result, 0.001)
    scores = evaluate.Scorer(model, enc, meta["prompts"], meta["max_seq_length"], "cpu", dtype)(kg.dev).numpy()
    _, acc = evaluate.best_threshold(scores, kg.dev_labels)
    # the whole dev set, re-scored: a borderline triple or two may flip with the thread count (1 in 5,218 = 0.0002)
    assert acc == pytest.approx(result["metrics"]["dev_accuracy"], abs=tolerance)


@pytest.mark.slow
def test_the_link_prediction_adapter_reproduces_its_estimate_and_agrees_with_its_full_ranking():
    model, meta, enc, kg, result = shipped("umls")
    full = result["metrics"]["filtered"]["both"]["realistic"]
    assert not result["estimate"] and result["counts"]["ranked_triples"] == len(kg.test)
    # `python evaluate.py --lp --limit 60 --dtype fp32` wrote this estimate (an MRR .821 [.750, .887])
    stored = json.loads((ROOT / "results" / "umls-palt-umls-minilm-lp-test-limit60-seed0.json").read_text())["metrics"]
    dtype, tolerance = dtype_and_tolerance(result, 0.01)
    sample = evaluate.rank_split(evaluate.Scorer(model, enc, meta["prompts"], meta["max_seq_length"], "cpu", dtype),
                                 kg, "test", limit=60, seed=0)
    est = stored["filtered"]["both"]["realistic"]
    for k in ("mrr", "hits@1", "hits@10"):  # the same 60 triples: the same ranks, up to a rare bf16 flip
        assert sample[k] == pytest.approx(est[k], abs=2 * tolerance), k
    lo, hi = stored["interval95"]["mrr"]
    assert lo <= full["mrr"] <= hi  # and the full test set's MRR lies inside the estimate's 95% interval


@pytest.mark.parametrize("name", [n for n in ("wn18rr", "fb15k-237") if ADAPTERS[n].is_file()])  # every one shipped
def test_a_big_graph_adapter_is_the_one_its_growable_estimate_ranked(name):
    """One query of a big graph costs a CPU seconds to minutes (15k-41k candidates), so here: the JSON's metrics are
    exactly those of the ranks committed in its state folder, which were made with this very adapter and these data
    files, against every entity (candidates 'split'), and the point estimate lies inside its own interval."""
    _, meta, _, kg, result = shipped(name)
    folder = ROOT / "results" / f"palt-{name}-minilm.state"
    settings = json.loads((folder / "settings.json").read_text())
    assert settings["checkpoint_sha256"] == files.sha256_file(ADAPTERS[name])
    assert settings["data_fingerprint"] == kg.fingerprint and settings["candidates"] == "split"
    c = result["counts"]
    assert result["estimate"] and c["candidates"] == len(kg.split_entities) and c["test_triples"] == len(kg.test)
    tri = bigrank.select(len(kg.test), result["settings"]["limit"], result["settings"]["seed"])
    rows = np.concatenate([bigrank.read_rows(f, len(kg.test)) for f in sorted(folder.glob("rank*.npz"))])
    _, first = np.unique(rows[:, 0] * 2 + rows[:, 1], return_index=True)
    rows = rows[first][np.isin(rows[first][:, 0], tri)]
    assert len(rows) == 2 * len(tri) == 2 * c["ranked_triples"]
    assert evaluate.lp_metrics(rows)["filtered"] == result["metrics"]["filtered"]
    est, ci = result["metrics"]["filtered"]["both"]["realistic"], result["metrics"]["interval95"]
    for k in ("mr", "mrr", "hits@10"):
        assert ci[k][0] <= est[k] <= ci[k][1], k

"""bench/paired.py: the paired difference of two rankings of the same triples, per side, with its bootstrap."""
import json, os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import paired  # noqa: E402
from support import graphs  # noqa: E402


def state(folder, ranks, **settings):
    """A ranking state folder: ranks[t] = (head rank, tail rank), as optimistic = pessimistic."""
    folder.mkdir()
    (folder / "settings.json").write_text(json.dumps({"data": "umls", "split": "test", "seed": 0} | settings))
    rows = [[t, s, r, r, r, r] for t, (h, tl) in ranks.items() for s, r in ((0, h), (1, tl))]
    np.savez(folder / "rank0.npz", rows=np.array(rows, dtype=np.int64))
    return folder


def test_paired_difference_per_side(tmp_path):
    a = state(tmp_path / "a", {0: (1, 2), 1: (4, 1), 2: (10, 3), 5: (1, 1)})
    b = state(tmp_path / "b", {0: (1, 1), 1: (2, 1), 2: (10, 1), 7: (3, 3)})  # 5 and 7: ranked by one only
    res = paired.paired(paired.ranks(a)[0], paired.ranks(b)[0], n_resamples=2000)
    assert res["triples"] == 3
    va, vb, d, (lo, hi) = res["head"]["mrr"]
    assert np.isclose(va, (1 + 1 / 4 + 1 / 10) / 3) and np.isclose(vb, (1 + 1 / 2 + 1 / 10) / 3)
    assert np.isclose(d, vb - va) and lo <= d <= hi
    assert res["tail"]["hits@1"][:3] == (1 / 3, 1.0, 2 / 3) and res["both"]["mr"][2] < 0  # B ranks better
    assert res["head"]["hits@10"][3] == [0.0, 0.0]  # the same on every triple: no spread


def test_states_of_different_tasks_are_refused(tmp_path):
    a = state(tmp_path / "a", {0: (1, 2)})
    b = state(tmp_path / "b", {0: (1, 2)}, seed=1)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "paired.py"), str(a), str(b)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == "error: the states differ in seed (0 vs 1): not the same ranking task"


def test_other_entity_texts_rank_the_same_triples(tmp_path):
    """Names vs descriptions: the fingerprint covers the text file, so it differs; the triples are the same task."""
    run = lambda a, b: subprocess.run([sys.executable, str(ROOT / "bench" / "paired.py"), str(a), str(b)],
                                      capture_output=True, text=True)
    a = state(tmp_path / "a", {0: (1, 2)}, data_fingerprint="f1", text="name")
    b = state(tmp_path / "b", {0: (1, 1)}, data_fingerprint="f2", text="description")
    c = state(tmp_path / "c", {0: (1, 1)}, data_fingerprint="f2", text="name")
    r = run(a, b)
    assert r.returncode == 0 and "entity texts differ (name vs description)" in r.stdout and "| tail | mrr | 0.500 | 1.000 |" in r.stdout
    r = run(a, c)  # the same text read from other files: other triples, refused
    assert r.returncode == 1 and "differ in data_fingerprint (f1 vs f2)" in r.stderr


def test_by_relation_adds_a_row_per_relation_of_the_compared_triples(tmp_path):
    """--by-relation: each relation of the triples ranked by both, its count, and the same paired MRR as the whole
    table would give on those triples alone (here: each relation's rows, checked against paired() directly)."""
    root = os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data")
    if not Path(root, "umls").is_dir():
        pytest.skip("needs the umls data")
    kg = graphs.load_kg("umls", root)
    by_rel = {}
    for t, r in enumerate(kg.test[:, 1]):  # the first two test triples of two relations
        if len(by_rel.setdefault(int(r), [])) < 2 and (len(by_rel) <= 2 or int(r) in by_rel):
            by_rel[int(r)].append(t)
    (r1, t1), (r2, t2) = [(r, ts) for r, ts in by_rel.items() if len(ts) == 2][:2]
    a = state(tmp_path / "a", {t1[0]: (1, 2), t1[1]: (4, 1), t2[0]: (2, 2), t2[1]: (1, 1)})
    b = state(tmp_path / "b", {t1[0]: (1, 1), t1[1]: (1, 1), t2[0]: (2, 2), t2[1]: (3, 3)})
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "paired.py"), str(a), str(b), "--by-relation",
                          "--data-dir", root], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {line.split(" | ")[0][2:]: line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert rows[kg.relations[r1]].startswith(f"| {kg.relations[r1]} | 2 | 0.688 | 1.000 | +0.312")  # (1+.5+.25+1)/4
    assert rows[kg.relations[r2]].startswith(f"| {kg.relations[r2]} | 2 | 0.750 | 0.417 | -0.333")  # (.5+.5+1+1)/4


def tc_result(path, right, **fields):
    """A triple-classification results JSON whose test triples were right (1) or wrong (0) as given."""
    bits = np.packbits(np.array(right, dtype=bool)).tobytes().hex()
    result = {"task": "tc", "data": "wn11", "data_fingerprint": "f", "counts": {"dev": 4, "test": len(right)},
              "metrics": {"test_right": bits}} | fields
    path.write_text(json.dumps(result))
    return str(path)


def test_triple_classification_accuracy_paired_on_the_same_test_triples(tmp_path):
    a = [1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1]  # 11 triples: the packed bits end mid-byte
    b = [1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1]
    ra, rb = paired.rights(tc_result(tmp_path / "a.json", a))[0], paired.rights(tc_result(tmp_path / "b.json", b))[0]
    assert ra.tolist() == [bool(x) for x in a]
    va, vb, d, (lo, hi) = paired.paired_accuracy(ra, rb, n_resamples=2000)
    assert (va, vb) == (7 / 11, 8 / 11) and np.isclose(d, 1 / 11) and lo <= d <= hi
    assert paired.paired_accuracy(ra, ra)[3] == [0.0, 0.0]  # the same model: no spread
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "paired.py"), tc_result(tmp_path / "a.json", a),
                        tc_result(tmp_path / "b.json", b)], capture_output=True, text=True)
    assert r.returncode == 0 and "| accuracy | 63.64 | 72.73 | +9.09 [" in r.stdout
    assert "right only by A: 1, only by B: 2, by both: 6" in r.stdout


def test_triple_classification_results_of_other_tasks_are_refused(tmp_path):
    a = tc_result(tmp_path / "a.json", [1, 0])
    run = lambda b: subprocess.run([sys.executable, str(ROOT / "bench" / "paired.py"), a, b], capture_output=True,
                                   text=True)
    r = run(tc_result(tmp_path / "b.json", [1, 0], data="fb13"))
    assert r.returncode == 1 and r.stderr.strip() == ("error: the results differ in data (wn11 vs fb13): not the same "
                                                      "test triples")
    lp = tmp_path / "lp.json"
    lp.write_text(json.dumps({"task": "lp", "metrics": {}}))
    r = run(str(lp))
    assert r.returncode == 1 and r.stderr.startswith(f"error: {lp}: not a triple-classification result")

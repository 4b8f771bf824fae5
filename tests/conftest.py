"""Shared helpers: a tiny BERT checkpoint in Hugging Face's layout, written by the tests themselves; --device."""
import json, os, random, re, tempfile
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from bert import NAME_TABLE, Bert, BertConfig

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def hf_name(ours):
    """Our parameter name -> the Hugging Face checkpoint key (NAME_TABLE read backwards)."""
    for pattern, target in NAME_TABLE:
        m = re.fullmatch(target.replace(".", r"\.").replace(r"\1", r"(\w+)").replace(r"\2", r"(\w+)"), ours)
        if m:
            key = pattern.replace(r"\.", ".")
            for g in m.groups():
                key = re.sub(r"\([^)]*\)", g, key, count=1)
            return key if key.startswith("cls.") else "bert." + key
    raise KeyError(ours)



def signal_at_step(monkeypatch, n, signal="SIGTERM"):
    """train.train_step wrapped so that `signal` arrives while its call n runs, as from Ctrl-C or a kill
    (runlog.STOP cleared first); the list of calls made, one item a step."""
    import train
    from support import runlog
    real, calls = train.train_step, []

    def step(*a, **k):
        calls.append(1)
        if len(calls) == n:
            runlog.STOP.append(signal)
        return real(*a, **k)
    monkeypatch.setattr(train, "train_step", step)
    monkeypatch.setattr(runlog, "STOP", [])
    return calls

def make_bert_dir(path, words, nsp=True, hidden=32, layers=2, heads=2, dropout=0.0, seed=0):
    """A random small BERT saved like transformers does (config.json, model.safetensors, vocab.txt)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + sorted(set(words) - set(SPECIAL))
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=256, hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    model = Bert(cfg)
    sd = {hf_name(k): v.contiguous() for k, v in model.state_dict().items() if nsp or not k.startswith(("nsp", "pooler"))}
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg.__dict__ | {"hidden_act": "gelu"}))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return path


def write_tiny_kg(root, folder="umls", n_ent=24, n_rel=3, seed=0):
    """A small KG with a learnable rule, t = h + r + 1 (mod n_ent), in the KG-BERT text format.
    Triple-classification folders (WN11, FB13) get labelled dev/test with one corrupted tail per fact.
    Returns the words of its texts (a vocabulary for make_bert_dir)."""
    rng = random.Random(seed)
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    ent = [f"e{i}" for i in range(n_ent)]
    triples = [(f"e{h}", f"r{r}", f"e{(h + r + 1) % n_ent}") for r in range(n_rel) for h in range(n_ent)]
    rng.shuffle(triples)
    dev, test, train = triples[:6], triples[6:12], triples[12:]
    tc = folder in ("WN11", "FB13")
    line = lambda t, label=None: "\t".join(t) + ("" if label is None else f"\t{label}") + "\n"
    def split(rows):
        if not tc:
            return "".join(line(t) for t in rows)
        wrong = lambda t: (t[0], t[1], f"e{(int(t[2][1:]) + 5) % n_ent}")  # t = h + r + 6 is never a fact
        return "".join(line(t, 1) + line(wrong(t), -1) for t in rows)
    (d / "train.tsv").write_text(split(train) if not tc else "".join(line(t) for t in train))
    (d / "dev.tsv").write_text(split(dev))
    (d / "test.tsv").write_text(split(test))
    text_file = "entity2text_capital.txt" if folder == "FB13" else "entity2text.txt"
    (d / text_file).write_text("".join(f"{e}\tw{i} w{(3 * i) % n_ent}\n" for i, e in enumerate(ent)))
    (d / "relation2text.txt").write_text("".join(f"r{r}\trel{r}\n" for r in range(n_rel)))
    return [f"w{i}" for i in range(n_ent)] + [f"rel{r}" for r in range(n_rel)]


class FnScorer:
    """evaluate.Scorer's interface over a function of (N, 3) int triples -> (N,) float32 numpy scores."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, triples):
        return torch.from_numpy(self.fn(np.asarray(triples)))

    def numpy(self, triples):
        return self(triples).numpy()


def pytest_addoption(parser):
    parser.addoption("--device", choices=("cpu", "cuda"), help="where train.py, evaluate.py and the Scorer tests run "
                     "(default: as train.py and evaluate.py choose, CUDA where there is one)")


def pytest_configure(config):
    # The precision verdict and the shortlist's parts are cached per machine: the tests keep theirs in a folder of
    # their own, never in the user's ~/.cache/palt (subprocesses inherit it).
    os.environ["PALT_CACHE"] = tempfile.mkdtemp(prefix="palt-test-cache-")
    # A relative $PALT_DATA (CI sets ../shared/data) names a folder from where pytest started; the tests that run a
    # command from another folder hand it on, so it is made absolute once, here.
    if os.environ.get("PALT_DATA"):
        os.environ["PALT_DATA"] = os.path.abspath(os.environ["PALT_DATA"])
    choice = config.getoption("--device")
    if choice == "cpu":  # before anything asks CUDA: train.py and evaluate.py (and their subprocesses) see no GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if choice == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA device here")


@pytest.fixture
def device():
    """The device train.py and evaluate.py pick (devices.start_processes), for tests that build a Scorer themselves."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def clear_table_caches():
    """support.tables caches what it reads by name; a test with a results folder of its own empties them
    before and after, so that no figure crosses between that folder and the project's."""
    from support import tables
    for cached in (tables.result, tables.paired_lp, tables.paired_tc, tables.search_counts):
        cached.cache_clear()


def study_with(folder, values_and_lrs, low=1e-5, high=1e-3, settings=None):
    """folder/study.db, support.tune's study: one complete trial a (value, lr), lr drawn on a log
    scale from low to high, and settings {name: value} fixed beside it."""
    optuna = pytest.importorskip("optuna")
    folder.mkdir(parents=True)
    study = optuna.create_study(study_name="tune", storage=f"sqlite:///{folder / 'study.db'}", direction="maximize")
    fixed = {name: optuna.distributions.CategoricalDistribution([value]) for name, value in (settings or {}).items()}
    for value, lr in values_and_lrs:
        study.add_trial(optuna.trial.create_trial(
            params={"lr": lr, **(settings or {})}, value=value,
            distributions={"lr": optuna.distributions.FloatDistribution(low, high, log=True), **fixed}))
    return study

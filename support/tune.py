"""A hyper-parameter search over train.py's recipes, on Optuna: each trial one train.py run, pruned
at its dev points; the study in SQLite in the search's folder, so that a search stopped at any
point resumes with the same command.

    python -m support.tune --data umls --method palt --trials 40 --out runs/tune-umls-palt
    python -m support.tune --data umls --method finetune --max-epochs 4 --dev-limit 100 ...
    python -m support.tune ... --space 'lr=1e-4:1e-3,epochs=2:4,negatives=1,1,1|5,5,5'
    python -m support.tune ... -- --text long  (flags after -- go to every trial's train.py)
    python -m support.tune ... --try-recipe  (the recipe's own settings as one trial, once)
    python -m support.tune ... --join  (one more worker on the same --out: another core or machine)
    python -m support.tune --report --out runs/tune-umls-palt  (top trials, importances: markdown)
    python -m support.tune --data wn11 --positives 25600 ...  (trials of 25,600 positives each)

SPACE (in this file) is what is searched for each method (train.py --method: palt, finetune, lora,
bitfit, prompt, probe), one train.py flag an item: a range (KIND log: on a log scale) or choices.
--space narrows or moves items (name=low:high, name=value, name=a|b|c); --max-epochs caps the
epochs of every method alike. Every trial trains as `python train.py ... --seed S --out
OUT/trials/N`, one seed for all (--seed, 42); its value is its best dev figure at an epoch's end
(MRR on link prediction, accuracy on triple classification), the one train.py keeps
best.safetensors by. Each dev point goes to
Optuna at step 1000 x its epoch (epochs in thousandths, so that recipes of other batch sizes meet
at the same steps), where the pruner ends a trial that falls behind (--pruner median: below the
median of the finished trials at that step, once --startup-trials have finished; halving:
successive halving; none): its train.py is killed, and the trial counts as pruned. A trial's
last dev point (after its planned epochs) is never pruned: it has trained in full, complete.

OUT holds study.db (Optuna's storage: settings and dev figures, no weights), trials.tsv (a row a
trial: number, state, value, settings, the dev figure at each epoch, steps, wall seconds; rewritten
after each trial), best.txt (the best trial's train.py line, every setting spelled out) and
trials/N/ (train.py's log.txt and its output, train.out; the *.safetensors go when the trial ends).
A search ended by Ctrl-C, kill -9 or a machine gone resumes with the same command: finished trials
are kept, and a trial that was running trains again with its settings in its folder, from its
last saved state (train.py --resume, in the precision it began in). Ctrl-C lets the running
train.py save first; where the search dies at once, the kernel ends its train.py too (Linux).

--join: a second search on the same OUT (without it, a folder in use is refused) works on the same
study beside the first, one trial a worker at a time: on another core, or on another machine that
sees OUT on a shared file system with working locks. Each worker's sampler is seeded (--seed,
plus 1000 x its index, plus the trials the study held), the seed kept in the study's user attrs
(workers), so that its draws can be drawn again. optuna is an optional extra, as matplotlib
is for plot.py: pip install optuna.
"""
import argparse
import contextlib
import ctypes
import fcntl
import functools
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

try:
    import optuna
except ImportError:  # an optional extra: main says how to install it
    optuna = None

import palt
import plot
import train
from support import devices, files, flags, hub
from support.errors import ERRORS, Stopped, TuneError
from support.checkpoints import read_checkpoint
from support.graphs import load_kg

NO_OPTUNA = "support.tune needs optuna: pip install optuna"
TRAIN = files.ROOT / "train.py"
STEPS_AN_EPOCH = 1000  # a dev point's Optuna step: its epoch in thousandths (train.py rounds to 3)
POLL_S = 0.25  # how often the running trial's log is read
FAILURES_IN_A_ROW = 3  # then the search ends: something is wrong with every trial, not one recipe
STOP = []  # the signals received (SIGINT, SIGTERM): the search ends once its train.py has saved

# ----------------------------------------------------------------------------- the search space
# One row a train.py flag (a field of flags.Run): how it is drawn, then its range for each method
# (None: not searched there, train.py's default or the recipe's). log: a float on a log scale from
# low to high; float, int: uniform from low to high; choice: one of them. calib's middle and last
# are the model's own layers.
# A choice may carry a further flag: the authors' one negative a positive, of its head or its tail.
EITHER = "1,0,1 --either-side"
# How each parameter is drawn, in the order the sampler draws them (the older studies' order first,
# so that their draws stay the same): log, a float on a log scale from low to high; float, int:
# uniform from low to high; choice: one of them.
KIND = dict(
    lr="log",
    head_lr="log",
    batch="choice",
    negatives="choice",
    epochs="int",
    warmup="float",
    prompts="choice",
    calib="choice",
    adam_beta2="choice",
    adam_eps="choice",
    head_input="choice",
    lora_rank="choice",
    lora_alpha="choice",
)
# What every method searches alike.
COMMON = dict(
    batch=(8, 16, 32),  # positives a step
    negatives=("1,1,1", "5,5,5", EITHER),  # ours; the paper's; the authors' scripts'
    epochs=(1, 8),  # --max-epochs caps it
    warmup=(0.0, 0.2),  # a fraction of the steps
    adam_beta2=(0.999, 0.98),  # AdamW's default; the authors' scripts'
    adam_eps=(1e-8, 1e-6),  # AdamW's default; the authors' scripts'
    head_input=("cls", "mean"),  # what the head reads: BERT's [CLS], or MiniLM's mean
)
HEAD_LR = (1e-5, 3e-3)  # the pooler and new NSP head of a model without one, at their own lr
# SPACE[method]: the train.py flags it searches (a field of flags.Run) and their ranges or choices.
# calib's middle and last are the model's own layers.
SPACE = {
    "palt": dict(COMMON, lr=(1e-5, 3e-3), head_lr=HEAD_LR,
                 prompts=("2,0,0", "10,10,10", "0,0,0"),  # WN11's; the paper's; none
                 calib=("middle,last", "last", "none")),
    # The whole LM moves: a small lr. Its first searches stopped at 3e-4 and their best trials lay
    # near the top, so the range now goes to 1e-3.
    "finetune": dict(COMMON, lr=(1e-5, 1e-3)),
    "lora": dict(COMMON, lr=(1e-5, 3e-3), head_lr=HEAD_LR,
                 lora_rank=(4, 8, 16),  # the LoRA paper's ranks on GPT-3 went from 1 to 64
                 lora_alpha=(8.0, 16.0, 32.0)),
    "bitfit": dict(COMMON, lr=(1e-5, 3e-3), head_lr=HEAD_LR),
    "prompt": dict(COMMON, lr=(1e-5, 3e-3), head_lr=HEAD_LR,
                   prompts=("2,0,0", "10,10,10")),  # as PALT's, with some
    "probe": dict(COMMON, lr=(1e-5, 3e-3)),  # only heads train: one lr
}
METHODS = tuple(SPACE)
# what a method sets beside its space (flags.parse_args gives finetune no prompts, calib or W_p)
METHOD_FLAGS = {m: ["--method", m] for m in METHODS} | {"palt": [], "finetune": ["--finetune"]}
# train.py's flags that the search sets itself; the searched ones are refused after -- as well
OWN_FLAGS = ("data", "model", "recipe", "data_dir", "seed", "out", "resume", "finetune",
             "method", "dev_limit")




@dataclass
class Param:
    """A searched flag: its kind (log, float, int, choice) and values: (low, high) or the
    choices."""
    name: str
    kind: str
    values: tuple

    def distribution(self):
        """Optuna's distribution of the parameter."""
        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(self.values)
        if self.kind == "int":
            return optuna.distributions.IntDistribution(*self.values)
        return optuna.distributions.FloatDistribution(*self.values, log=self.kind == "log")

    def corners(self):
        """The values train.py must take: each choice, or the range's ends."""
        return tuple(dict.fromkeys(self.values))

    def draw(self, trial):
        """The trial's value: Optuna's sampler draws it (or gives the one drawn before)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, self.values)
        if self.kind == "int":
            return trial.suggest_int(self.name, *self.values)
        return trial.suggest_float(self.name, *self.values, log=self.kind == "log")


def flag_text(value):
    """A setting as train.py's flag takes it: floats to 3 significant digits."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def split_space(text):
    """'lr=1e-4:1e-3,negatives=1,1,1|5,5,5' -> {'lr': '1e-4:1e-3', 'negatives': '1,1,1|5,5,5'}:
    a comma starts a new item only before a name=."""
    items = []
    for piece in text.split(","):
        if "=" in piece:
            items.append(piece)
        elif items:
            items[-1] += "," + piece
        else:
            raise TuneError(f"--space {text}: expected items like lr=1e-4:1e-3,batch=8|16")
    return {name.strip().replace("-", "_"): value.strip()
            for name, value in (item.split("=", 1) for item in items)}


def parse_values(name, kind, table, text):
    """--space's text for one row: 'low:high' or 'value' for a range, 'a|b|c' for choices; values
    of the table's own type."""
    where = f"--space {name}={text}"
    if not text:
        raise TuneError(f"{where}: no values (give low:high, a value, or choices a|b)")
    if kind == "choice":
        if ":" in text:
            raise TuneError(f"{where}: {name} takes choices like {'|'.join(map(str, table))}, "
                            "not a range")
        pieces = text.split("|")
    else:
        if "|" in text:
            raise TuneError(f"{where}: {name} takes a range like {table[0]}:{table[1]}, not "
                            "choices")
        pieces = text.split(":", 1)
    pieces = [p.strip() for p in pieces]
    if "" in pieces:
        raise TuneError(f"{where}: an empty value")
    kind_of = type(table[0]) if kind == "choice" else {"int": int}.get(kind, float)
    try:
        values = tuple(kind_of(p) for p in pieces)
    except ValueError:
        raise TuneError(f"{where}: not {kind_of.__name__} values") from None
    if kind != "choice" and len(values) == 1:
        values = values * 2  # one value: the range from it to itself
    if kind != "choice" and values[0] > values[1]:
        raise TuneError(f"{where}: an empty range ({values[0]} > {values[1]})")
    if kind == "log" and values[0] <= 0:
        raise TuneError(f"{where}: a log scale starts above 0")
    return values


def layer_choices(choices, n_layers):
    """calib's choices as layer numbers (0-based, as train.py's --calib takes them): middle and
    last are the model's n_layers // 2 and n_layers - 1; alike choices once."""
    words = {"middle": n_layers // 2, "last": n_layers - 1}
    out = []
    for choice in choices:
        if choice == "none":
            out.append(choice)
            continue
        try:
            layers = {words[w] if w in words else int(w) for w in choice.split(",")}
        except ValueError:
            raise TuneError(f"calib {choice}: layer numbers, middle, last or none") from None
        if max(layers) >= n_layers or min(layers) < 0:
            raise TuneError(f"calib {choice}: the model's layers are 0..{n_layers - 1}")
        out.append(",".join(map(str, sorted(layers))))
    return tuple(dict.fromkeys(out))


def layer_count(model):
    """The base model's layers, from its config.json."""
    try:
        config = hub.model_dir(model) / "config.json"
        return json.loads(config.read_text())["num_hidden_layers"]
    except (hub.DownloadError, OSError, KeyError, ValueError) as e:
        raise TuneError(f"--model {model}: cannot read its layer count ({e})") from None


def search_space(method, space_texts, max_epochs, model, positives=None):
    """The method's Params: SPACE[method], --max-epochs, then --space's items (refused in one
    line: an unknown parameter, one the method does not search, an empty range); under
    --positives no epochs (the budget sets each trial's length)."""
    space = SPACE[method]
    given = {}
    for text in space_texts:
        given |= split_space(text)
    for name in given:
        if name not in KIND:
            raise TuneError(f"--space {name}: unknown parameter (the search knows "
                            f"{', '.join(KIND)})")
        if name not in space:
            raise TuneError(f"--space {name}: --method {method} does not search it")
        if name == "epochs" and positives:
            raise TuneError(f"--space epochs: --positives {positives} sets each trial's length")
    params = []
    for name, kind in KIND.items():
        values = space.get(name)
        if values is None or (name == "epochs" and positives):
            continue
        if name == "epochs" and max_epochs:
            values = (min(values[0], max_epochs), max_epochs)
        if name in given:
            values = parse_values(name, kind, values, given[name])
        if name == "calib":
            values = layer_choices(values, layer_count(model))
        params.append(Param(name, kind, values))
    return params


def recipe_value(run, name, n_layers):
    """A Run's setting as the searched parameter `name` spells it: a head's lr is the LM's where
    the recipe sets none, the calibrated layers PALT's default where it names none."""
    if name == "head_lr":
        return run.head_lr or run.lr
    if name == "negatives" and run.either_side:
        return EITHER
    if name in ("negatives", "prompts"):
        return ",".join(map(str, getattr(run, name)))
    if name == "calib":
        layers = palt.default_calib_layers(n_layers) if run.calib is None else run.calib
        return ",".join(map(str, sorted(set(layers)))) or "none"
    return getattr(run, name)


def recipe_point(args, params, out, text):
    """--try-recipe's trial {name: value}: the recipe's own settings (epochs capped at the space's
    top), where `text` ('lr=1e-4,batch=16') changes none or some; refused in one line where one
    lies outside the space."""
    given = split_space(text) if text else {}
    by_name = {p.name: p for p in params}
    for name in given:
        if name not in by_name:
            raise TuneError(f"--try-recipe {name}: not searched here (the search has "
                            f"{', '.join(by_name)})")
    run = parse_train(train_argv(args, {}, out / "trials" / "0", budget=False))
    n_layers = layer_count(args.model)
    point = {}
    for p in params:
        if p.name in given:
            value = parse_values(p.name, p.kind, p.values, given[p.name])[0]
            if p.name == "calib":
                value = layer_choices((value,), n_layers)[0]
        else:
            value = recipe_value(run, p.name, n_layers)
        if p.name == "epochs":
            value = min(value, p.values[1])
        if p.kind == "choice" and value not in p.values:
            raise TuneError(f"--try-recipe: {p.name} {flag_text(value)} is not one of the searched "
                            f"{'|'.join(map(flag_text, p.values))} (give {p.name}=...)")
        low, high = p.values[0], p.values[-1]
        if p.kind != "choice" and not low <= value <= high:
            raise TuneError(f"--try-recipe: {p.name} {flag_text(value)} lies outside the searched "
                            f"{flag_text(low)}:{flag_text(high)} (give {p.name}=...)")
        point[p.name] = value
    return point


# ----------------------------------------------------------------------------- train.py's lines
def train_argv(args, settings, out, budget=True):
    """train.py's flags for one trial: the search's fixed flags, the method's, the trial's
    settings {name: value}, the flags after --, the seed and the run folder; then (budget) the
    trial's length under --positives (budget_flags)."""
    argv = ["--data", args.data, "--model", args.model]
    for name in ("recipe", "data_dir", "dev_limit"):
        if getattr(args, name) is not None:
            argv += [flags.flag(name), str(getattr(args, name))]
    argv += METHOD_FLAGS[args.method]
    for name, value in settings.items():
        argv += [flags.flag(name), *shlex.split(flag_text(value))]  # EITHER: two flags
    argv += args.train_args + ["--seed", str(args.seed), "--out", str(out)]
    if budget and args.positives:
        argv += budget_flags(args.positives, parse_train(argv).batch, args.n_train)
    return argv


def budget_flags(positives, batch, n_train):
    """--positives N as train.py's flags, alike for every batch size: the steps that see N
    positives (the lr schedule ends there), the epochs that hold them, and a dev point after each
    quarter of the steps and at the end (on a big graph, at the same fractions of an epoch whatever
    the batch: Optuna's steps meet there)."""
    steps = -(-positives // batch)
    epochs = -(-steps // max(1, n_train // batch))
    return ["--epochs", str(epochs), "--max-steps", str(steps),
            "--dev-every", str(max(1, steps // 4))]


def parse_train(argv):
    """train.py's Run of these flags, or its refusal as a TuneError (argparse's last line)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return train.parse_args(argv)
    except SystemExit as e:
        said = e.code if isinstance(e.code, str) else err.getvalue().strip().splitlines()[-1]
        raise TuneError(said.split("error: ", 1)[-1]) from None


def check_with_train(args, params, out):
    """Every choice and range end through train.py's own flag checks, the other settings at their
    first values: a trial that train.py would refuse is refused now, before any trains."""
    first = {p.name: p.corners()[0] for p in params}
    try:
        parse_train(train_argv(args, first, out / "trials" / "0"))
    except TuneError as e:
        raise TuneError(f"train.py refuses the trials' flags: {e}") from None
    for p in params:
        for value in p.corners()[1:]:
            try:
                parse_train(train_argv(args, first | {p.name: value}, out / "trials" / "0"))
            except TuneError as e:
                raise TuneError(f"{p.name} {flag_text(value)}: train.py refuses it: {e}") from None


def check_train_args(args, params):
    """The flags after -- must leave the search's own and the searched ones alone."""
    searched = {p.name for p in params}
    for word in args.train_args:
        name = word[2:].split("=")[0].replace("-", "_") if word.startswith("--") else ""
        if args.positives and name in ("epochs", "max_steps", "dev_every"):
            raise TuneError(f"flags after --: {word} is set by --positives {args.positives}")
        if name in searched:
            raise TuneError(f"flags after --: {word} is searched (--space {name}=... fixes or "
                            "narrows it)")
        if name in OWN_FLAGS:
            raise TuneError(f"flags after --: {word} is the search's own (give it before --)")


def train_line(args, settings, out):
    """The `python train.py ...` line that trains these settings again into out, every setting
    spelled out (a recipe's too, so that the line stays right when PRESETS change)."""
    run = parse_train(train_argv(args, settings, out))
    words = ["python", "train.py"]
    for f in fields(flags.Run):
        value = getattr(run, f.name)
        if f.name in ("out", "resume") or value is None:
            continue
        if value == f.default and f.name not in ("data", "model", "recipe", "seed"):
            continue
        if value is True:
            words.append(flags.flag(f.name))
        elif value is False:  # a recipe's switch (--compile) turned off
            words.append("--no-" + flags.flag(f.name)[2:])
        elif isinstance(value, tuple):
            words += [flags.flag(f.name), ",".join(map(str, value)) or "none"]
        else:
            words += [flags.flag(f.name), str(value)]
    return shlex.join(words + ["--out", str(out)])


# ----------------------------------------------------------------------------- the study
def try_lock(path):
    """An exclusive flock on path (created), held while the file returned is open; None where
    another process holds it. The kernel lets go of it when its process ends, however it ends."""
    f = open(path, "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


@contextlib.contextmanager
def mutex(out):
    """One worker at a time in the study's short sections: claiming a trial, writing the table."""
    with open(out / "mutex.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def search_record(args, out):
    """What makes two searches one study: train.py's settings that are not searched (data,
    model, method, seed, recipe, the flags after --), as the trials' checkpoints record them."""
    record = flags.recorded(parse_train(train_argv(args, {}, out, budget=False)))
    skip = set(KIND) | {"out", "resume"}
    record = {k: v for k, v in record.items() if k not in skip}
    if args.positives:
        record["positives"] = args.positives
    return json.loads(json.dumps(record))


def open_study(out, args, params):
    """The study in out/study.db, new or resumed: a resumed one must be the same search (its
    record), and its choices the same (Optuna keeps a choice parameter's choices)."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{(out / 'study.db').resolve()}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    study = optuna.create_study(study_name="tune", storage=storage, direction="maximize",
                                load_if_exists=True)
    record = search_record(args, out)
    old = study.user_attrs.get("search")
    if old is None:
        study.set_user_attr("search", record)
        old = record
    for k in sorted(set(old) | set(record)):
        if old.get(k) != record.get(k):
            raise TuneError(f"{out} holds a search with {k} {old.get(k)}, not {record.get(k)}: "
                            "the same command resumes it; choose another --out for another")
    trials = study.get_trials(deepcopy=False)
    for p in params:
        seen = [t.distributions[p.name] for t in trials if p.name in t.distributions]
        for d in seen[:1]:
            try:
                optuna.distributions.check_distribution_compatibility(d, p.distribution())
            except ValueError:
                said = (f"--space {p.name}: {out} searched it in {d}; a study keeps a choice's "
                        "choices and a range's scale: choose another --out")
                raise TuneError(said) from None
    study.sampler = optuna.samplers.TPESampler(seed=worker_seed(study, args, len(trials)))
    study.pruner = {"median": optuna.pruners.MedianPruner(n_startup_trials=args.startup_trials),
                    "halving": optuna.pruners.SuccessiveHalvingPruner(),
                    "none": optuna.pruners.NopPruner()}[args.pruner]
    return study


def worker_seed(study, args, n_trials):
    """The sampler's seed of the worker that opens the study now, recorded in the study's user
    attrs ("workers": index, seed, trials at its start, whether it joined), so that each worker's
    draws can be drawn again: --seed, plus 1000 x the worker's index (0: the lead, then each
    --join in turn), plus the trials the study held, so that a resumed worker draws afresh."""
    workers = study.user_attrs.get("workers", [])
    index = sum(1 for w in workers if w["joined"]) + 1 if args.join else 0
    seed = args.seed + 1000 * index + n_trials
    record = dict(index=index, seed=seed, trials_before=n_trials, joined=bool(args.join))
    study.set_user_attr("workers", [*workers, record])
    return seed


def next_trial(study, out, params, n_trials):
    """(trial, its FrozenTrial before or None, its claim, its settings): a trial left running by
    a search that is gone (its claim free: the same settings again), else a new one while the study
    has fewer than n_trials (an enqueued one first); None when it has them. Under the mutex, so
    that two workers never take one trial."""
    with mutex(out):
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            claim = try_lock(trial_folder(out, t.number) / "search.lock")
            if claim is not None:
                # Optuna's Trial of a stored trial: the object study.ask returns for a new one
                trial = optuna.trial.Trial(study, t._trial_id)
                settings = suggest(trial, params, t.params)
                return trial, t, claim, settings
        trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
        if not waiting and len(counted(trials)) >= n_trials:
            return None
        for _ in range(REDRAWS):
            trial = study.ask()  # an enqueued trial (--try-recipe) first
            settings = suggest(trial, params, {})
            earlier = repeats(study.get_trials(deepcopy=False)).get(trial.number)
            if earlier is None:
                claim = try_lock(trial_folder(out, trial.number) / "search.lock")
                return trial, None, claim, settings
            # Told as failed, which the sampler sets aside, with nothing trained.
            trial.set_user_attr("note", f"repeats trial {earlier}: not trained")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            print(f"trial {trial.number} repeats trial {earlier}'s settings: not trained, drawn "
                  "again", flush=True)
        raise TuneError(f"{REDRAWS} draws in a row repeated earlier trials' settings: the space "
                        f"holds fewer settings than --trials {n_trials}")


# Draws in a row that may repeat earlier trials' settings before the search gives up.
REDRAWS = 100


def repeats(trials) -> dict[int, int]:
    """{number: the earlier trial it repeats} of the trials whose settings, as train.py takes them
    (floats to 3 significant digits), an earlier trial had: two draws of an lr a hair apart would
    train the same run twice. A repeat does not count toward --trials."""
    first, out = {}, {}
    for t in sorted(trials, key=lambda t: t.number):
        if not t.params:
            continue
        key = tuple(sorted((k, flag_text(v)) for k, v in t.params.items()))
        if key in first:
            out[t.number] = first[key]
        else:
            first[key] = t.number
    return out


def counted(trials) -> list:
    """The trials that count toward --trials: all but repeats."""
    repeated = repeats(trials)
    return [t for t in trials if t.number not in repeated]


def suggest(trial, params, stored):
    """The trial's settings {name: value}: those it has (a trial that resumes, whatever --space
    says now), the others drawn."""
    return {p.name: stored[p.name] if p.name in stored else p.draw(trial) for p in params}


def trial_folder(out, number):
    """out/trials/<number>, made: the trial's train.py run folder, and its claim."""
    folder = out / "trials" / str(number)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ----------------------------------------------------------------------------- one trial
def die_with(parent, prctl):
    """In train.py's process before it starts: SIGKILL when the search's process ends (Linux's
    PR_SET_PDEATHSIG), and at once where it has ended already."""
    if prctl is not None:
        prctl(1, ctypes.c_ulong(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def start(argv, output):
    """train.py in a process group of its own (setsid): Ctrl-C in the search's terminal reaches the
    search alone, which lets train.py save first; and killed by the kernel if the search dies
    (Linux)."""
    prctl = None
    if sys.platform.startswith("linux"):
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    return subprocess.Popen([sys.executable, str(TRAIN), *argv], stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=functools.partial(die_with, os.getpid(), prctl))


def end(child, sig):
    """Signal train.py's process group and wait for it; a second signal to the search kills it.
    A train.py that has ended and been waited for gets none (its pid may be another's now)."""
    if child.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, sig)
    signals = len(STOP)
    while child.poll() is None:
        if len(STOP) > signals:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        time.sleep(POLL_S)


def dev_points(folder):
    """The dev points of the trial's log.txt so far (plot.parse_log; whole lines only), and the
    last step it logged."""
    log = folder / "log.txt"
    if not log.is_file():
        return [], 0
    text = log.read_text(errors="replace")
    curve = plot.parse_log(text[:text.rfind("\n") + 1], folder.name)
    return curve.dev, curve.loss[-1][0] if curve.loss else 0


def run_trial(trial, before, settings, args, folder):
    """Train one trial as a train.py process, reporting each dev point to Optuna and ending it
    where the pruner says: (state, value, note). A trial that resumes continues its folder from its
    saved state, or starts it again where it saved none."""
    TrialState = optuna.trial.TrialState
    argv = train_argv(args, settings, folder)
    reported, wall0, note = set(), 0.0, ""
    if before is not None:  # a trial that a search left running: its points are reported already
        reported, note = set(before.intermediate_values), "resumed"
        wall0 = before.user_attrs.get("wall_s", 0.0)
        if (folder / "state.safetensors").is_file():
            argv += resume_flags(folder / "state.safetensors")
        else:  # killed before its first save: what it wrote goes
            for f in (*folder.glob("*.safetensors"), folder / "log.txt"):
                f.unlink(missing_ok=True)
    planned = parse_train(argv).epochs  # its last dev point comes after this epoch
    trial.set_user_attr("epochs", planned)
    t0 = time.time()
    # where it trains: a resumed trial adds a machine for each segment
    machines = before.user_attrs.get("machines", []) if before is not None else []
    trial.set_user_attr("machines", [*machines, devices.machine()])
    with open(folder / "train.out", "ab") as output:
        child = start(argv, output)
    try:
        while True:
            exited = child.poll() is not None
            points, steps = dev_points(folder)
            for p in points:
                step = round(p["epoch"] * STEPS_AN_EPOCH)
                if step in reported:
                    continue
                trial.report(p["value"], step)
                reported.add(step)
                trial.set_user_attr("metric", p["metric"])
                trial.set_user_attr("wall_s", wall0 + time.time() - t0)
                # The point at the planned end is the trial's last: it has trained in full
                # whatever the pruner says, and finishes as complete.
                if p["epoch"] < planned and trial.should_prune():
                    end(child, signal.SIGKILL)
                    return TrialState.PRUNED, None, steps, notes(note, f"pruned at epoch "
                                                                f"{p['epoch']:g}")
            if exited:
                break
            if STOP:
                end(child, signal.SIGTERM)  # it saves, then --resume continues it
                raise Stopped(STOP[0])
            time.sleep(POLL_S)
    finally:
        end(child, signal.SIGKILL)
        trial.set_user_attr("wall_s", wall0 + time.time() - t0)
    ends = [p["value"] for p in points if float(p["epoch"]).is_integer()]
    if child.returncode != 0:
        return TrialState.FAIL, None, steps, notes(note, last_line(folder / "train.out"))
    if not ends:
        return TrialState.FAIL, None, steps, notes(note, "no dev point at an epoch's end (a graph "
                                                  "without a dev split cannot be searched)")
    return TrialState.COMPLETE, max(ends), steps, note


def resume_flags(state):
    """train.py's flags that continue a trial from its saved state: --resume, in the precision it
    began in (a search that moves to another machine may resolve --dtype auto otherwise, and
    train.py resumes a run only in its own precision)."""
    meta = read_checkpoint(state, kind="train-state", tensors=False)[1]
    return ["--resume", "--dtype", meta["dtype"]]


def notes(*parts):
    """A trial's notes in one cell."""
    return "; ".join(p for p in parts if p)


def last_line(path):
    """The last line of a trial's train.py output: its error, where it failed."""
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"{path}: no output"


def finish(study, trial, outcome, folder):
    """Tell Optuna how the trial ended, then delete its weights (the best recipe trains again)."""
    state, value, steps, note = outcome
    trial.set_user_attr("steps", steps)
    trial.set_user_attr("note", notes(trial.user_attrs.get("tried"), note))
    study.tell(trial, value, state=state)
    for f in folder.glob("*.safetensors"):
        f.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the table
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
          "WAITING": "waiting"}
REPEAT = "repeat"  # the state the table gives a repeat (repeats()), whatever Optuna's


def trained_in_full(t) -> bool:
    """Whether a trial reached its planned end: complete, or pruned at its last dev point (a study
    written before a trial's last point was spared the pruner: it had trained in full all the
    same). The planned epochs are the trial's record, else its epochs setting; a budget search of
    before (--positives) has its only dev point at a whole epoch at its end."""
    TrialState = optuna.trial.TrialState
    if t.state == TrialState.COMPLETE:
        return True
    if t.state != TrialState.PRUNED or not t.intermediate_values:
        return False
    last = max(t.intermediate_values)
    planned = t.user_attrs.get("epochs", t.params.get("epochs"))
    if planned is None:
        return last % STEPS_AN_EPOCH == 0
    return last >= planned * STEPS_AN_EPOCH


def state_of(t, repeat: bool = False) -> str:
    """A trial's state as the table says it: one that trained in full is complete; a repeat of an
    earlier trial's settings, a repeat."""
    if repeat:
        return REPEAT
    return "complete" if trained_in_full(t) else STATES[t.state.name]


def value_of(t) -> float | None:
    """A trial's value: Optuna's for a complete one; for one pruned at its last dev point, its best
    dev figure at an epoch's end, as a complete trial's value is."""
    if t.state == optuna.trial.TrialState.COMPLETE or not trained_in_full(t):
        return t.value
    return max(v for step, v in t.intermediate_values.items() if step % STEPS_AN_EPOCH == 0)


def finished_trials(study) -> list:
    """The trials that trained in full, as complete FrozenTrials (value_of's value), best first."""
    out = []
    for t in study.get_trials(deepcopy=False):
        if trained_in_full(t):
            out.append(optuna.trial.create_trial(
                params=t.params, distributions=t.distributions, value=value_of(t),
                intermediate_values=t.intermediate_values, user_attrs=t.user_attrs))
            out[-1].number = t.number
    return sorted(out, key=lambda t: (-t.value, t.number))


def row_of(t, repeat_of: int | None = None):
    """A trial's cells: number, state, value, settings {name: text}, dev, steps, wall, note;
    repeat_of: the earlier trial whose settings it repeats (repeats())."""
    dev = " ".join(f"{step / STEPS_AN_EPOCH:g}:{v:.4f}"
                   for step, v in sorted(t.intermediate_values.items()))
    value = "" if value_of(t) is None else f"{value_of(t):.4f}"
    note = t.user_attrs.get("note", "")
    if repeat_of is not None and not note:
        note = f"repeats trial {repeat_of}: not counted"
    return dict(number=str(t.number), state=state_of(t, repeat_of is not None), value=value,
                settings={k: flag_text(v) for k, v in t.params.items()}, dev=dev,
                steps=str(t.user_attrs.get("steps", "")),
                wall_s=f"{t.user_attrs.get('wall_s', 0):.0f}", note=note)


def write_table(study, out):
    """out/trials.tsv, rewritten atomically: a row a trial, its settings a column each."""
    trials = study.get_trials(deepcopy=False)
    repeated = repeats(trials)
    rows = [row_of(t, repeated.get(t.number)) for t in trials]
    names = [name for name in KIND if any(name in r["settings"] for r in rows)]
    lines = ["\t".join(["number", "state", "value", *names, "dev", "steps", "wall_s", "note"])]
    for r in rows:
        cells = [r["number"], r["state"], r["value"], *(r["settings"].get(n, "") for n in names),
                 r["dev"], r["steps"], r["wall_s"], r["note"]]
        lines.append("\t".join(c.replace("\t", " ") for c in cells))
    text = "\n".join(lines) + "\n"
    files.write_atomic(out / "trials.tsv", lambda f: f.write(text.encode()))


def trial_line(t):
    """The line the search prints when a trial ends."""
    r = row_of(t)
    value = f"{t.user_attrs.get('metric', 'dev')} {r['value']}" if r["value"] else ""
    settings = " ".join(f"{k} {v}" for k, v in r["settings"].items())
    parts = [f"trial {r['number']} {r['state']}", value, settings, f"dev {r['dev'] or '-'}",
             f"{r['steps']} steps {r['wall_s']} s", r["note"]]
    return " | ".join(p for p in parts if p)


# ----------------------------------------------------------------------------- the search
def search(args):
    """Run trials until the study has --trials of them, one after another; then the summary and
    the best trial's train.py line."""
    out = Path(args.out or f"runs/tune-{Path(args.data).name.lower()}-{args.method}")
    params = search_space(args.method, args.space, args.max_epochs, args.model, args.positives)
    kg = load_kg(args.data, args.data_dir)
    if not len(kg.dev):  # a trial's value is its dev figure: without dev, every trial would fail
        raise TuneError(f"--data {args.data}: no dev split ({kg.split_files['dev']}), and a "
                        "trial is judged by its dev figure: add one")
    args.n_train = len(kg.train) if args.positives else 0
    check_train_args(args, params)
    check_with_train(args, params, out)
    point, tried = None, ""
    if args.try_recipe is not None:
        point = recipe_point(args, params, out, args.try_recipe)
        tried = f"the {args.recipe or 'default'} recipe"
        if args.try_recipe:
            tried += f" with {args.try_recipe}"
    files.check_writable(out, f"--out {out}")
    if not args.join:
        files.lock_folder(out, "--out", "add --join to work on the same study beside it")
    (out / "trials").mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with mutex(out):
            study = open_study(out, args, params)
            if point and len(counted(study.get_trials(deepcopy=False))) < args.trials:
                # Once a study: a trial of the same settings, in any state, stops it.
                study.enqueue_trial(point, user_attrs={"tried": tried}, skip_if_exists=True)
        failures = 0
        while True:
            if STOP:
                raise Stopped(STOP[0])
            got = next_trial(study, out, params, args.trials)
            if got is None:
                break
            trial, before, claim, settings = got
            folder = trial_folder(out, trial.number)
            try:
                outcome = run_trial(trial, before, settings, args, folder)
                finish(study, trial, outcome, folder)
            finally:
                claim.close()
            with mutex(out):
                write_table(study, out)
            print(trial_line(study.get_trials(deepcopy=False)[trial.number]), flush=True)
            failures = failures + 1 if outcome[0] == optuna.trial.TrialState.FAIL else 0
            if failures >= FAILURES_IN_A_ROW:
                raise TuneError(f"{failures} trials in a row failed, the last with: "
                                f"{outcome[3]} ({folder}/train.out)")
        summary(study, args, out)
    finally:
        files.release_folder(out)


def counts_text(trials) -> str:
    """'14 complete, 16 pruned': the trials by state_of, the states that occur; then the repeats,
    which do not count ('; 1 repeat, not counted')."""
    repeated = repeats(trials)
    counts = {s: 0 for s in STATES.values()}
    for t in trials:
        if t.number not in repeated:
            counts[state_of(t)] += 1
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if repeated:
        said += f"; {len(repeated)} {REPEAT}{'s' * (len(repeated) > 1)}, not counted"
    return said


def summary(study, args, out):
    """The counts, the best trial and its train.py line (also out/best.txt)."""
    trials = study.get_trials(deepcopy=False)
    said, n = counts_text(trials), len(counted(trials))
    finished = finished_trials(study)
    if not finished:
        print(f"{n} trials ({said}) in {out}/trials.tsv; none complete", flush=True)
        return
    best = finished[0]
    line = train_line(args, best.params, out / "best")
    files.write_atomic(out / "best.txt", lambda f: f.write((line + "\n").encode()))
    print(f"{n} trials ({said}) in {out}/trials.tsv; best trial {best.number}, dev "
          f"{best.user_attrs.get('metric', 'figure')} {best.value:.4f}; to train it:\n{line}",
          flush=True)


def report(out, top=5):
    """A finished or running search, as markdown for a results document: its counts and wall
    time, the machines it ran on, the `top` trials by dev figure, and which parameters mattered
    (Optuna's fANOVA importances over the complete trials, seeded)."""
    if not (out / "study.db").is_file():
        raise TuneError(f"--report: {out} holds no study.db")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{(out / 'study.db').resolve()}")
    study = optuna.load_study(study_name="tune", storage=storage)
    trials = study.get_trials(deepcopy=False)
    hours = sum(t.user_attrs.get("wall_s", 0) for t in trials) / 3600
    machines = sorted({m for t in trials for m in t.user_attrs.get("machines", [])})
    lines = [f"{out}: {len(counted(trials))} trials "
             f"({counts_text(trials)}), "
             f"{hours:.1f} h of trials on {'; '.join(machines) or 'machines not recorded'}", ""]
    complete = finished_trials(study)
    if not complete:
        return "\n".join([*lines, "no trial is complete yet"]) + "\n"
    metric = complete[0].user_attrs.get("metric", "dev")
    names = [name for name in KIND if name in complete[0].params]
    lines.append("| trial | dev " + metric + " | " + " | ".join(names) + " | dev by epoch | s |")
    lines.append("|" + "---|" * (len(names) + 4))
    # The top trials, and any that ties the last of them at the figure shown.
    shown = [t for t in complete if round(t.value, 4) >= round(complete[:top][-1].value, 4)]
    for t in shown:
        r = row_of(t)
        cells = [r["number"], r["value"], *(r["settings"][n] for n in names), r["dev"],
                 r["wall_s"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if len(complete) < 2:
        return "\n".join([*lines, "importances need at least 2 complete trials"]) + "\n"
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        # Over the trials that trained in full, pruned at their last point ones included.
        finished = optuna.create_study(direction="maximize")
        finished.add_trials(complete)
        importances = optuna.importance.get_param_importances(finished, evaluator=evaluator)
    except ImportError:  # Optuna's fANOVA stands on scikit-learn, an optional extra
        return "\n".join([*lines, "importances need scikit-learn: pip install scikit-learn"]) + "\n"
    said = ", ".join(f"{name} {value:.2f}" for name, value in importances.items())
    lines.append(f"importances (fANOVA over {len(complete)} complete trials): {said}")
    return "\n".join(lines) + "\n"


def whole(text, least=1):
    """An argparse type: an integer of at least `least`."""
    try:
        n = int(text)
    except ValueError:
        n = least - 1
    if n < least:
        raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, not {text!r}")
    return n


def parse_args(argv=None):
    """The search's flags; the words after -- go to every trial's train.py."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(prog="python -m support.tune",
                                 description=" ".join(__doc__.split("\n\n")[0].split()),
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a benchmark, or a folder with train.tsv (required but for "
                    "--report)")
    ap.add_argument("--method", choices=METHODS, default="palt",
                    help="train.py's --method, each with its own space (SPACE)")
    ap.add_argument("--trials", type=whole, default=40, help="trials in the study, all workers "
                    "together (default 40)")
    ap.add_argument("--out", help="the search's folder (default runs/tune-<data>-<method>)")
    ap.add_argument("--model", default="minilm", help="train.py's --model")
    ap.add_argument("--data-dir", help="train.py's --data-dir")
    ap.add_argument("--recipe", choices=tuple(train.PRESETS),
                    help="train.py's --recipe: the settings not searched")
    ap.add_argument("--seed", type=int, default=42, help="every trial's train.py --seed")
    ap.add_argument("--max-epochs", type=whole, help="the epochs range's top, either method "
                    "(default SPACE's)")
    ap.add_argument("--dev-limit", type=whole, help="train.py's --dev-limit for every trial")
    ap.add_argument("--positives", type=whole, help="each trial trains on this many positive "
                    "triples, whatever its batch, with a dev point each quarter (a big graph's "
                    "trials shorter than an epoch); epochs are then not searched")
    ap.add_argument("--space", action="append", default=[],
                    help="name=low:high, name=value or name=a|b|c, comma-separated")
    ap.add_argument("--try-recipe", nargs="?", const="", metavar="NAME=VALUE,...",
                    help="one trial of the recipe's own settings (epochs capped at the space's "
                    "top) before the sampler's next draw, once a study; NAME=VALUE items change "
                    "some (finetuning's lr: lr=1e-4)")
    ap.add_argument("--pruner", choices=("median", "halving", "none"), default="median",
                    help="ends a trial falling behind at a dev point (default median)")
    ap.add_argument("--startup-trials", default=5, type=functools.partial(whole, least=0),
                    help="median: trials that finish before any is pruned (default 5)")
    ap.add_argument("--join", action="store_true",
                    help="work on the study of a search running in --out, beside it")
    ap.add_argument("--report", action="store_true",
                    help="train nothing: print --out's search as markdown (its top trials and "
                    "Optuna's parameter importances)")
    ap.add_argument("--top", type=whole, default=5, help="--report: trials shown (default 5)")
    args = ap.parse_args(argv)
    if args.report and not args.out:
        ap.error("--report needs --out, the search's folder")
    if not args.report and not args.data:
        ap.error("the following arguments are required: --data")
    args.train_args = extra
    return args


def main(argv=None):
    """python -m support.tune ARGS: 0 when done, 130 when a signal stopped it; errors in one
    line."""
    if optuna is None:
        raise SystemExit(NO_OPTUNA)
    args = parse_args(argv)
    try:
        if args.report:
            print(report(Path(args.out), args.top), end="", flush=True)
            return 0
        search(args)
    except Stopped as e:
        print(f"stopped ({e}): the same command resumes the search", flush=True)
        return 130
    except ERRORS as e:
        raise SystemExit(f"error: {e}") from None
    return 0


def on_signal(signum, frame):
    """SIGINT (Ctrl-C) or SIGTERM: the search ends once its running train.py has saved."""
    STOP.append(signal.Signals(signum).name)


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    sys.exit(main())

"""The tables of README.md and RESULTS.md, written from results/ (the JSONs, the searches' study.db,
the ranking states): cog blocks in the two files call the functions here, and

    python -m support.tables           rewrites every table in place (cog -r)
    python -m support.tables --check   fails where the committed text differs from the data

so that no measured number is typed by hand. Figures: MRR and Hits@k as .789, MR as 2.29, accuracy
in points as 89.72; "± sd" over seeds (sample sd), "[lo, hi]" a 95% bootstrap interval; a paired
gap is B - A over the test triples both scored (bench/paired.py, seed 0, 10,000 resamples)."""
import argparse
import functools
import importlib.util
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass

import numpy as np

from support import files

RESULTS = files.ROOT / "results"
DOCUMENTS = ("README.md", "RESULTS.md")
RESAMPLES = 10_000

# The papers' own figures (not ours): PALT's (Shen et al. 2022, Tables 2 and 3, BERT-base) and
# KG-BERT's (Yao et al. 2019), as MR / Hits@10 or accuracy.
PAPER = {"umls": ("1.65", ".988"), "wn11": ("93.3",), "fb13": ("91.3",),
         "wn18rr": ("62", ".679"), "fb15k-237": ("149", ".434")}
KG_BERT = {"umls": ("1.47", ".990"), "wn11": ("93.5",), "fb13": ("90.4",),
           "wn18rr": ("97", ".524"), "fb15k-237": ("153", ".420")}

# The shipped adapters: benchmark -> (its JSON, the one line that trains it again).
SHIPPED = {
    "umls": ("palt-umls-minilm", "python train.py --data umls --recipe cpu --seed 1 --dtype fp32"),
    "wn11": ("palt-wn11-minilm", "python train.py --data wn11 --recipe tuned"),
    "fb13": ("palt-fb13-minilm", "python train.py --data fb13 --recipe tuned"),
    "wn18rr": ("palt-wn18rr-minilm", "python train.py --data wn18rr --recipe gpu"),
    "fb15k-237": ("palt-fb15k-237-minilm",
                  "python train.py --data fb15k-237 --recipe cpu --dtype fp32"),
}
NAMES = {"umls": "UMLS", "wn11": "WN11", "fb13": "FB13", "wn18rr": "WN18RR",
         "fb15k-237": "FB15k-237"}
SEEDS = (42, 1, 2)


# ----------------------------------------------------------------------------- reading results/
@functools.cache
def result(name: str) -> dict:
    """results/NAME.json."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def lp(name: str, metric: str) -> float:
    """A link-prediction JSON's filtered, realistic figure, both sides."""
    return result(name)["metrics"]["filtered"]["both"]["realistic"][metric]


def accuracy(name: str, split: str = "test") -> float:
    """A triple-classification JSON's accuracy in points."""
    return 100 * result(name)["metrics"][f"{split}_accuracy"]


def interval(name: str, metric: str) -> list[float] | None:
    """The 95% bootstrap interval a sampled ranking's JSON holds, else None."""
    return (result(name)["metrics"].get("interval95") or {}).get(metric)


def bench(module: str):
    """bench/MODULE.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(module, files.ROOT / "bench" / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


# ----------------------------------------------------------------------------- formats
def rate(x: float) -> str:
    """.789 (MRR, Hits@k)."""
    return f"{x:.3f}".replace("0.", ".", 1)


def signed(x: float, fmt=rate) -> str:
    """+.067, -.001."""
    return ("+" if x >= 0 else "-") + fmt(abs(x))


def points(x: float) -> str:
    """89.72 (accuracy in points)."""
    return f"{x:.2f}"


def mr(x: float) -> str:
    """2.29, 256 (MR: two decimals below 10, none above 100)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def mean_sd(values: list[float], fmt=rate) -> str:
    """.757 ± .034 over seeds."""
    return f"{fmt(statistics.mean(values))} ± {fmt(statistics.stdev(values))}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- paired gaps
@functools.cache
def paired_lp(a: str, b: str, metric: str = "mrr") -> tuple[float, list[float], int]:
    """B - A of two ranking states (results/NAME.state), as bench/paired.py gives it: (gap,
    [lo, hi], triples)."""
    paired = bench("paired")
    ra, _ = paired.ranks(RESULTS / f"{a}.state")
    rb, _ = paired.ranks(RESULTS / f"{b}.state")
    out = paired.paired(ra, rb, n_resamples=RESAMPLES)
    _, _, gap, ci = out["both"][metric]
    return gap, ci, out["triples"]


@functools.cache
def paired_tc(a: str, b: str) -> tuple[float, list[float]]:
    """B - A in test accuracy (points) of two triple-classification JSONs, as bench/paired.py
    gives it, its resamples drawn in chunks (the same draws, a fraction of the memory)."""
    paired = bench("paired")
    (ra, _), (rb, _) = paired.rights(RESULTS / f"{a}.json"), paired.rights(RESULTS / f"{b}.json")
    rng = np.random.default_rng(0)
    d = rb.astype(float) - ra
    means = np.concatenate([d[rng.integers(0, len(d), size=(1000, len(d)))].mean(1)
                            for _ in range(RESAMPLES // 1000)])
    lo, hi = np.percentile(means, [2.5, 97.5])
    return 100 * float(d.mean()), [100 * float(lo), 100 * float(hi)]


def gap_text(gap: float, ci: list[float], fmt=rate) -> str:
    """+.067 [+.050, +.085]."""
    return f"{signed(gap, fmt)} [{signed(ci[0], fmt)}, {signed(ci[1], fmt)}]"


def same_checkpoint(row: str, state: str) -> bool | None:
    """Whether a ranking state ranked the checkpoint its table row's JSON names; None where either
    names none (JSONs of before 2026-11-29 name the base model only)."""
    settings = json.loads((RESULTS / f"{state}.state" / "settings.json").read_text())
    ours, theirs = settings.get("checkpoint_sha256"), result(row).get("checkpoint_sha256")
    return None if ours is None or theirs is None else ours == theirs


# ----------------------------------------------------------------------------- what a run got
def positives(name: str) -> int:
    """Positive triples the evaluated checkpoint trained on: its steps x its batch."""
    t = result(name)["train"]
    return int(t["steps"]) * int(t["batch"])


def budget(name: str) -> str:
    """'8 epochs, 41.7k positives' of the evaluated checkpoint (its epoch of best dev)."""
    t = result(name)["train"]
    n = positives(name)
    said = f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"
    return f"{t['epochs']} epoch{'s' if int(t['epochs']) > 1 else ''}, {said} positives"


def study_at(folder: str):
    """The Optuna study of results/FOLDER (support.tune's study.db), read quietly."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{(RESULTS / folder / 'study.db').resolve()}")
    return optuna.load_study(study_name="tune", storage=storage)


@functools.cache
def search_counts(folder: str) -> tuple[int, str]:
    """(trials, '16 complete, 14 pruned') of results/FOLDER's study, by support/tune.py's rule."""
    from support import tune
    trials = study_at(folder).get_trials(deepcopy=False)
    return len(tune.counted(trials)), tune.counts_text(trials)


def trials_of(folder: str | None) -> str:
    """'30 search trials' of a search, or 'no search'."""
    return f"{search_counts(folder)[0]} search trials" if folder else "no search"


# ----------------------------------------------------------------------------- the tables
def shipped_row(data: str) -> tuple[str, str]:
    """(figure, note) of a shipped adapter: MR, Hits@10 (MRR) or accuracy."""
    name = SHIPPED[data][0]
    r = result(name)
    if r["task"] == "tc":
        return points(accuracy(name)), f"best of {r['train']['epochs_scheduled']} epochs at " \
                                        f"{r['train']['epochs']}"
    figure = f"{mr(lp(name, 'mr'))}, {rate(lp(name, 'hits@10'))}"
    ci = interval(name, "hits@10")
    if ci:
        figure += f" [{rate(ci[0])}, {rate(ci[1])}]"
    note = f"MRR {rate(lp(name, 'mrr'))}"
    if r["estimate"]:
        note += f"; {r['counts']['ranked_triples']} test triples"
    return figure, note


def negatives_of(name: str) -> str:
    """How the run drew its training negatives."""
    if result(name)["train"].get("negative_filter") == "train":
        return "train-only"
    return "filtered with dev/test facts"


def summary() -> str:
    """RESULTS' summary: the paper, KG-BERT and each shipped adapter, its JSON and its command."""
    rows = []
    for data, (name, command) in SHIPPED.items():
        figure, note = shipped_row(data)
        rows.append([f"[{NAMES[data]}](#{data})", ", ".join(PAPER[data]), ", ".join(KG_BERT[data]),
                     f"**{figure}** ({note})", negatives_of(name), f"`{name}`", f"`{command}`"])
    return table(["benchmark", "paper: PALT, BERT-base", "KG-BERT", "ours: PALT, MiniLM, shipped",
                  "negatives", "JSON", "train it again"], rows)


def readme_results() -> str:
    """README's results table: the paper's PALT and the shipped adapters, with RESULTS' links;
    then the methods compared at equal budgets."""
    rows = []
    for data in SHIPPED:
        figure, note = shipped_row(data)
        metric = "accuracy" if result(SHIPPED[data][0])["task"] == "tc" else "MR, Hits@10"
        rows.append([f"[{NAMES[data]}](RESULTS.md#{data}) ({metric})", ", ".join(PAPER[data]),
                     f"{figure} ({note})"])
    return table(["benchmark", "paper: PALT, BERT-base", "ours: PALT, MiniLM (shipped adapter)"],
                 rows) + "\n\n" + readme_methods()


def readme_methods() -> str:
    """README's sentence on the paper's claim: each graph's headline test figure per method from
    the finals of results/methods/, at the budget they share (or saying they do not)."""
    parts = []
    for graph, what, fmt in (("umls", "test MRR", rate), ("wn11", "test accuracy", points)):
        got = finals(graph)
        if not got:
            parts.append(f"{NAMES[graph]} awaits its finals")
            continue
        budgets = list(dict.fromkeys(budget(n) for names in got.values() for n in names.values()))
        each = f"{budgets[0]} each" if len(budgets) == 1 else "unequal budgets"
        said = ", ".join(f"{NAMES_OF_METHODS[m]} {over_seeds(names, fmt)}"
                         for m, names in got.items())
        parts.append(f"{NAMES[graph]} {what} ({each}): {said}")
    return ("The paper's claim, PALT within a fraction of a point of finetuning, tested at equal "
            "budgets ([RESULTS.md](RESULTS.md#palt-against-finetuning)): " + "; ".join(parts) + ".")


def seeds_row(label: str, stem: str) -> list[str]:
    """A UMLS row over seeds 42, 1, 2 (results/STEM-sS.json)."""
    names = [f"{stem}-s{s}" for s in SEEDS]
    return [label, "42, 1, 2", *(mean_sd([lp(n, m) for n in names], f) for m, f in (
        ("mr", mr), ("mrr", rate), ("hits@1", rate), ("hits@10", rate))), f"`{stem}-sS`"]


def umls() -> str:
    """UMLS: the shipped adapter, and each recipe over three seeds."""
    name = SHIPPED["umls"][0]
    rows = [["**PALT, cpu recipe: the shipped adapter** (seed 1, best of 3 by dev)", "1",
             *(f(lp(name, m)) for m, f in (("mr", mr), ("mrr", rate), ("hits@1", rate),
                                            ("hits@10", rate))), f"`{name}`"],
            seeds_row("PALT, cpu recipe (8 epochs)", "umls-cpu-trainneg"),
            seeds_row("finetuning, cpu recipe, lr 1e-4 (8 epochs)", "umls-ft-trainneg"),
            seeds_row("PALT, tuned (search trial 17), 4 epochs", "umls-palt-tuned"),
            seeds_row("PALT, tuned (search trial 17), 8 epochs", "umls-palt-tuned8"),
            seeds_row("finetuning, tuned (search trial 12), 4 epochs", "umls-ft-tuned")]
    return table(["run (train-only negatives)", "seeds", "MR", "MRR", "Hits@1", "Hits@10", "JSON"],
                 rows)


def dev_curve(name: str) -> str:
    """The dev figure at each dev point of the evaluated checkpoint's run, the best in bold."""
    dev = result(name)["train"]["dev"]
    best = max(p["value"] for p in dev)
    return " / ".join(f"**{points(100 * p['value'])}**" if p["value"] == best
                      else points(100 * p["value"]) for p in dev)


def tc_table(rows: list[tuple[str, str]]) -> str:
    """A triple-classification table: label, JSON -> epochs, dev by dev point, dev, test."""
    out = []
    for label, name in rows:
        t = result(name)["train"]
        out.append([label, f"{t['epochs']} of {t['epochs_scheduled']}", dev_curve(name),
                    points(accuracy(name, "dev")), f"**{points(accuracy(name))}**", f"`{name}`"])
    return table(["run (train-only negatives)", "best epoch", "dev by dev point, to the best",
                  "dev", "test", "JSON"], out)


def wn11() -> str:
    return tc_table([("**PALT, tuned recipe, 20 epochs: the shipped adapter**", "palt-wn11-minilm"),
                     ("PALT, cpu recipe, 6 epochs (shipped 2026-11-28)", "wn11-shipped-2026-11-28"),
                     ("PALT, cpu recipe, 3 epochs", "wn11-palt-3ep-trainneg"),
                     ("finetuning, cpu recipe, lr 1e-4, 3 epochs", "wn11-ft-trainneg"),
                     ("PALT, tuned (search trial 19), 1 epoch", "wn11-palt-tuned-s42"),
                     ("finetuning, tuned (search trial 10), 1 epoch", "wn11-ft-tuned-s42")])


def fb13() -> str:
    return tc_table([("**PALT, tuned WN11 recipe, 5 epochs: the shipped adapter**",
                      "palt-fb13-minilm"),
                     ("PALT, cpu recipe, 14,000 steps (shipped 2026-11-28)",
                      "fb13-shipped-2026-11-28"),
                     ("finetuning, tuned WN11 finetuning recipe, 2 epochs", "fb13-ft-tuned-s42")])


def lp_rows(rows: list[tuple[str, str]]) -> str:
    """A big graph's link-prediction table: label, JSON -> triples, MR, MRR, Hits@1, Hits@10."""
    out = []
    for label, name in rows:
        cells = []
        for m, f in (("mr", mr), ("mrr", rate), ("hits@1", rate), ("hits@10", rate)):
            ci = interval(name, m)
            cells.append(f(lp(name, m)) + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else ""))
        out.append([label, str(result(name)["counts"]["ranked_triples"]), *cells, f"`{name}`"])
    return table(["adapter", "test triples", "MR", "MRR", "Hits@1", "Hits@10", "JSON"], out)


def wn18rr() -> str:
    return lp_rows([("**10 epochs, `--recipe gpu`: shipped**", "palt-wn18rr-minilm"),
                    ("1 epoch, cpu recipe with self-negatives", "wn18rr-1ep-lp"),
                    ("1 epoch, cpu recipe without self-negatives", "wn18rr-noself-lp")])


def fb15k_237() -> str:
    return lp_rows([("**1 epoch, cpu recipe: shipped**", "palt-fb15k-237-minilm"),
                    ("epoch 1 of `--recipe gpu`", "fb15k-237-gpu-ep1-lp"),
                    ("3,000 steps, descriptions", "fb15k-237-desc-lp")])


# PALT against finetuning: (benchmark, what differs, PALT's rows, finetuning's rows, the searches
# behind each side (None: none), the paired JSONs or states, A then B: finetuning - PALT).
COMPARISONS = [
    ("UMLS", "cpu recipe, 8 epochs each", "umls-cpu-trainneg", "umls-ft-trainneg", None, None,
     [("umls-cpu-trainneg-s42-lp300", "umls-ft-trainneg-s42-lp660"),
      ("umls-cpu-trainneg-s1-lp660", "umls-ft-trainneg-s1-lp660")]),
    ("UMLS", "tuned, 4 epochs each (the searches' cap)", "umls-palt-tuned", "umls-ft-tuned",
     "tune-umls-palt", "tune-umls-finetune",
     [(f"umls-palt-tuned-s{s}-lp660", f"umls-ft-tuned-s{s}-lp660") for s in SEEDS]),
    ("UMLS", "tuned, PALT 8 epochs, finetuning 4", "umls-palt-tuned8", "umls-ft-tuned",
     "tune-umls-palt", "tune-umls-finetune",
     [(f"umls-palt-tuned8-s{s}-lp660", f"umls-ft-tuned-s{s}-lp660") for s in SEEDS]),
    ("WN11", "cpu recipe, 3 epochs each", "wn11-palt-3ep-trainneg", "wn11-ft-trainneg", None,
     None, [("wn11-palt-3ep-trainneg", "wn11-ft-trainneg")]),
    ("WN11", "tuned, PALT 20 epochs (shipped), finetuning 1", "palt-wn11-minilm",
     "wn11-ft-tuned-s42", "tune-wn11-palt", "tune-wn11-finetune",
     [("palt-wn11-minilm", "wn11-ft-tuned-s42")]),
    ("WN11", "PALT tuned, 20 epochs (shipped); finetuning cpu recipe, 3", "palt-wn11-minilm",
     "wn11-ft-trainneg", "tune-wn11-palt", None, [("palt-wn11-minilm", "wn11-ft-trainneg")]),
    ("FB13", "WN11's tuned recipes, PALT 5 epochs (shipped), finetuning 2", "palt-fb13-minilm",
     "fb13-ft-tuned-s42", "tune-wn11-palt", "tune-wn11-finetune",
     [("palt-fb13-minilm", "fb13-ft-tuned-s42")]),
]


def side(stem: str, search: str | None) -> tuple[str, str, list[str]]:
    """(figure, what it got, its JSONs) of one side: a JSON, or seeds 42, 1, 2 of a stem."""
    names = [stem] if (RESULTS / f"{stem}.json").is_file() else [f"{stem}-s{s}" for s in SEEDS]
    if result(names[0])["task"] == "tc":
        figure = points(accuracy(names[0]))
    else:
        values = [lp(n, "mrr") for n in names]
        figure = mean_sd(values) if len(values) > 1 else rate(values[0])
    got = f"{budget(names[0])}, {trials_of(search)}"
    return figure, got, names


def gaps(pairs: list[tuple[str, str]]) -> tuple[str, str]:
    """The paired gaps, finetuning - PALT, one a pair, and what they were computed on."""
    said, notes = [], []
    for a, b in pairs:
        if (RESULTS / f"{a}.state").is_dir():
            gap, ci, n = paired_lp(a, b)
            said.append(f"{gap_text(gap, ci)} ({n})")
        else:
            gap, ci = paired_tc(a, b)
            said.append(gap_text(gap, ci, points))
    return "; ".join(said), "; ".join(notes)


def palt_against_finetuning() -> str:
    """PALT against finetuning at the budgets each side got: each side's figure and what it got
    (epochs, positives of the evaluated checkpoint, search trials), the mean gap and the paired
    gaps. A UMLS pairing whose states ranked checkpoints other than the rows' JSONs says so."""
    rows = []
    for data, what, palt, ft, palt_search, ft_search, pairs in COMPARISONS:
        (pf, pgot, pnames), (ff, fgot, fnames) = side(palt, palt_search), side(ft, ft_search)
        if result(pnames[0])["task"] == "tc":
            mean_gap = signed(accuracy(fnames[0]) - accuracy(pnames[0]), points)
        else:
            mean_gap = signed(statistics.mean(lp(n, "mrr") for n in fnames)
                              - statistics.mean(lp(n, "mrr") for n in pnames))
        paired, _ = gaps(pairs)
        lp_pairs = [(a, b) for a, b in pairs if (RESULTS / f"{a}.state").is_dir()]
        if lp_pairs:
            rows_of = dict(zip([a for a, _ in lp_pairs], pnames)) | dict(
                zip([b for _, b in lp_pairs], fnames))
            same = {same_checkpoint(rows_of[s], s) for pair in lp_pairs for s in pair}
            if False in same:
                paired += " (retrained checkpoints: see below)"
            elif None in same:
                paired += " (checkpoints unrecorded: see below)"
        rows.append([data, what, f"{pf} ({pgot})", f"{ff} ({fgot})", mean_gap, paired])
    return table(["graph", "budgets", "PALT (what it got)", "finetuning (what it got)",
                  "finetuning - PALT", "paired, by seed (triples)"], rows)


def retrained_pairings() -> str:
    """The UMLS ranking states paired above that ranked another checkpoint than their row's JSON:
    a sentence naming them, or '' where every state ranked its row's checkpoint."""
    odd, unknown = set(), set()
    for _, _, palt, ft, _, _, pairs in COMPARISONS:
        for a, b in pairs:
            for state, stem in ((a, palt), (b, ft)):
                if not (RESULTS / f"{state}.state").is_dir():
                    continue
                row = next((f"{stem}-s{s}" for s in SEEDS if f"-s{s}-" in state + "-"), stem)
                same = same_checkpoint(row, state)
                if same is False:
                    odd.add(f"`{state}`")
                elif same is None:
                    unknown.add(f"`{state}`")
    said = []
    if odd:
        said.append(f"The paired gaps marked retrained rank checkpoints trained again with the "
                    f"same command and seed, not those of the rows' JSONs (their "
                    f"`checkpoint_sha256` differ): {', '.join(sorted(odd))}.")
    if unknown:
        said.append(f"Those marked unrecorded pair states whose row's JSON names no checkpoint, so "
                    f"that which checkpoint they ranked cannot be checked: "
                    f"{', '.join(sorted(unknown))}.")
    return " ".join(said)


def tuning() -> str:
    """A row a search in results/ (tune-GRAPH-METHOD, by graph, then method): its trials by state,
    the hours of its trials and the machines they ran on, and its best trial (the one best.txt
    trains) with its dev figure and settings, as the study holds them. Each search's top trials
    and importances: `python -m support.tune --report --top 3 --out results/tune-GRAPH-METHOD`."""
    from support import tune
    methods = ("palt", "finetune", "lora", "bitfit", "prompt", "probe")  # then any other search

    def place(folder: str) -> tuple:  # tune-GRAPH-METHOD: by graph, then by method
        _, graph, method = folder.split("-", 2)
        return graph, methods.index(method) if method in methods else len(methods), method

    rows = []
    found = [p.name for p in RESULTS.glob("tune-*-*") if (p / "study.db").is_file()]
    for folder in sorted(found, key=place):
        study = study_at(folder)
        trials = study.get_trials(deepcopy=False)
        hours = sum(t.user_attrs.get("wall_s", 0) for t in trials) / 3600
        machines = sorted({m for t in trials for m in t.user_attrs.get("machines", [])})
        cells = [f"`{folder}`", f"{len(tune.counted(trials))} ({tune.counts_text(trials)})",
                 f"{hours:.1f}",
                 "; ".join(machines) or "not recorded"]
        finished = tune.finished_trials(study)
        if finished:
            best = tune.row_of(finished[0])
            metric = finished[0].user_attrs.get("metric", "dev")
            settings = ", ".join(f"{k} {v}" for k, v in best["settings"].items())
            cells += [best["number"], f"{metric} {best['value']}", settings]
        else:
            cells += ["-", "-", "no trial has trained in full yet"]
        rows.append(cells)
    return table(["search", "trials", "hours", "machines", "best trial", "its dev", "its settings"],
                 rows)


# A search's best lr near the top of the log range it drew from may have been held back by that
# top, as finetuning's first searches' were (their range stopped at 3e-4). A LoRA or BitFit search
# whose best lr lies in the top tenth gets a second search (bench/finals.py), as finetuning did:
# its best trial's settings, the lr alone from a third of the old top to ten times it.
EDGE = 0.9
SECOND_SEARCHES = ("lora", "bitfit")  # searched over the whole space, as PALT and finetuning were


@dataclass
class BestLr:
    settings: dict[str, str]  # the best trial's settings as support.tune spells them
    value: str  # its dev figure
    lr: float
    low: float  # the log range the search drew lr from
    high: float
    trials: int  # the search's trials, every state

    @property
    def place(self) -> float:
        """Where lr lies up the log range: 0 at its bottom, 1 at its top."""
        return math.log(self.lr / self.low) / math.log(self.high / self.low)


def best_lr(folder: str) -> BestLr | None:
    """The best trial's lr of results/FOLDER's search and the range it was drawn from; None where
    no trial has trained in full, or the search drew no lr (it was fixed)."""
    from support import tune
    if not (RESULTS / folder / "study.db").is_file():
        return None
    study = study_at(folder)
    finished = tune.finished_trials(study)
    if not finished or "lr" not in finished[0].distributions:
        return None
    best, drawn = finished[0], finished[0].distributions["lr"]
    row = tune.row_of(best)
    return BestLr(row["settings"], row["value"], best.params["lr"], drawn.low, drawn.high,
                  len(tune.counted(study.get_trials(deepcopy=False))))


def second_searches() -> str:
    """Where each method's best lr lies in its range, and whether a second search of the lr
    (results/tune-GRAPH-METHOD-lr: finetuning's always, up to 1e-3; LoRA's and BitFit's where
    their best lies in the top tenth) moved the best dev figure."""
    said = []
    for graph in METHOD_GRAPHS:
        places, moves = [], []
        for method in METHODS:
            first, second = best_lr(f"tune-{graph}-{method}"), best_lr(f"tune-{graph}-{method}-lr")
            if first is None:
                continue
            name = NAMES_OF_METHODS[method]
            places.append(f"{name} {first.lr:.3g} ({first.place:.0%} of the way from {first.low:g} "
                          f"to {first.high:g})")
            wanted = method == "finetune" or (method in SECOND_SEARCHES and first.place >= EDGE)
            folder = f"`tune-{graph}-{method}-lr`"
            if second is not None:
                gain = float(second.value) - float(first.value)
                moved = f"moved ({gain:+.4f})" if gain > 0 else "did not move"
                moves.append(f"{name}'s best {moved} with its lr searched again up to "
                             f"{second.high:g} ({folder}): {second.value} at lr {second.lr:.3g} "
                             f"({second.trials} trial{'s' * (second.trials != 1)}) against "
                             f"{first.value}")
            elif wanted:
                moves.append(f"{name}'s lr searched again ({folder}) has no "
                             "trial trained in full yet")
        if places:
            said.append(f"On {NAMES[graph]}, each search's best lr: {'; '.join(places)}.")
        if moves:
            text = "; ".join(moves)
            said.append(f"{text[0].upper()}{text[1:]}.")
    return " ".join(said)


# ----------------------------------------------------------------------------- the methods
# The methods compared at equal budgets, in the table's order, and where their finals live:
# results/methods/GRAPH-METHOD-sSEED.json, written by `evaluate.py --lp` (UMLS, all test triples)
# or `evaluate.py --tc` (WN11). The UMLS ranking keeps its ranks (--keep-ranks) beside its JSON,
# in results/methods/umls-METHOD-sSEED.state, which the paired gaps read.
METHODS = ("palt", "finetune", "lora", "lora-r48", "bitfit", "prompt", "probe")
# A row that is another method's searched settings with one change: {row: (method, flags)}.
# LoRA at PALT's parameter count asks whether PALT's design beats LoRA at PALT's count, not only
# at the rank LoRA's search chose: rank 48 at 9,216 parameters a rank (A and B of the query and
# value projections, 384 wide, in 6 layers) comes within 0.2% of PALT's count on MiniLM. Alpha
# stays the searched one, as the LoRA paper holds alpha while it varies r so that the lr needs no
# new search (Hu et al. 2021, section 4.1).
VARIANTS = {"lora-r48": ("lora", "--lora-rank 48")}
METHODS_FOLDER = "methods"
METHOD_GRAPHS = ("umls", "wn11")
FINAL = re.compile(r"^(?P<graph>[a-z0-9-]+?)-(?P<method>[a-z][a-z0-9-]*?)-s(?P<seed>\d+)$")
FINALS_COMMAND = ("python evaluate.py --lp --keep-ranks --ckpt runs/umls-METHOD-sSEED "
                  "--out results/methods/umls-METHOD-sSEED.json")


def seed_order(seed: int) -> tuple[int, int]:
    """Seeds 42, 1, 2 first, in that order, then any other by number."""
    return (SEEDS.index(seed), 0) if seed in SEEDS else (len(SEEDS), seed)


def finals(graph: str) -> dict[str, dict[int, str]]:
    """{method: {seed: NAME}} of the finals in results/methods/ for one graph, NAME as result()
    takes it (methods/GRAPH-METHOD-sSEED); methods in METHODS' order, seeds 42, 1, 2 first."""
    found: dict[str, dict[int, str]] = {}
    for path in sorted((RESULTS / METHODS_FOLDER).glob(f"{graph}-*-s*.json")):
        m = FINAL.match(path.stem)
        if m and m["graph"] == graph and m["method"] in METHODS:
            found.setdefault(m["method"], {})[int(m["seed"])] = f"{METHODS_FOLDER}/{path.stem}"
    return {method: dict(sorted(found[method].items(), key=lambda kv: seed_order(kv[0])))
            for method in METHODS if method in found}


def figure_of(name: str) -> float:
    """A final's headline figure: test MRR (link prediction) or test accuracy in points."""
    return lp(name, "mrr") if result(name)["task"] == "lp" else accuracy(name)


def over_seeds(names: dict[int, str], fmt=rate) -> str:
    """'.781 ± .012 (seeds 42, 1, 2)', or one seed's figure with its seed."""
    values = [figure_of(n) for n in names.values()]
    said = mean_sd(values, fmt) if len(values) > 1 else fmt(values[0])
    return f"{said} ({seed_words(list(names))})"


def seed_words(seeds: list[int]) -> str:
    """'seed 42' or 'seeds 42, 1'."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def train_of(name: str, key: str):
    """A key of a final's train summary; None where an older JSON lacks it."""
    return (result(name).get("train") or {}).get(key)


def device_of(name: str) -> str:
    """The machine a final trained on, as its manifest names it ('?' where unrecorded)."""
    device = (result(name).get("manifest") or {}).get("device")
    if not isinstance(device, dict):
        return "?"
    what = device.get("gpu") or device.get("cpu", "?")
    return f"{what}, {device.get('threads', '?')} threads"


def parameters_cell(name: str) -> str:
    """'592,898 (2.56%)' tunable parameters and their share of the model."""
    tunable, total = train_of(name, "tunable"), train_of(name, "total")
    if tunable is None:
        return "?"
    return f"{tunable:,}" + (f" ({100 * tunable / total:.2f}%)" if total else "")


def adapter_mb(name: str) -> str:
    """The adapter's file in MB (10^6 bytes)."""
    size = result(name).get("checkpoint_bytes")
    return "?" if size is None else f"{size / 1e6:.1f}"


def minutes_per_epoch(names: dict[int, str]) -> str:
    """Minutes of training steps per epoch (train.wall_s / epochs), mean over seeds, with the
    machines the seeds trained on."""
    values = [train_of(n, "wall_s") / train_of(n, "epochs") for n in names.values()
              if train_of(n, "wall_s") and train_of(n, "epochs")]
    if not values:
        return "?"
    machines = "; ".join(dict.fromkeys(device_of(n) for n in names.values()))
    return f"{statistics.mean(values) / 60:.1f} ({machines})"


def umls_pair(method: str, reference: str, seed: int) -> str | None:
    """The paired MRR gap METHOD - REFERENCE of one UMLS seed over the triples both ranked, from
    their kept ranks (results/methods/umls-METHOD-sSEED.state); None where one lacks them."""
    a, b = (f"{METHODS_FOLDER}/umls-{m}-s{seed}" for m in (reference, method))
    if not all((RESULTS / f"{n}.state").is_dir() for n in (a, b)):
        return None
    gap, ci, n = paired_lp(a, b)
    return f"s{seed}: {gap_text(gap, ci)} ({n})"


def wn11_pair(reference: str, name: str, seed: int) -> str:
    """The paired accuracy gap of one WN11 seed, METHOD - REFERENCE, over all test triples."""
    gap, ci = paired_tc(reference, name)
    return f"s{seed}: {gap_text(gap, ci, points)}"


def gap_cell(method: str, reference: str, umls: dict, wn11: dict) -> str:
    """The paired gaps METHOD - REFERENCE by graph and seed, the sides' budgets beside them (once
    where every seed's are the same)."""
    if method == reference:
        return "(the reference)"
    said = []
    for graph, got in (("UMLS", umls), ("WN11", wn11)):
        ref, ours = got.get(reference, {}), got.get(method, {})
        seeds = [s for s in ours if s in ref]
        if not seeds:
            continue
        if graph == "UMLS":
            pairs = [umls_pair(method, reference, s) for s in seeds]
            text = "; ".join(p for p in pairs if p) or "ranks not kept (no .state folders)"
        else:
            text = "; ".join(wn11_pair(ref[s], ours[s], s) for s in seeds)
        by_seed = {s: budget_pair(ours[s], ref[s]) for s in seeds}
        budgets = (by_seed[seeds[0]] if len(set(by_seed.values())) == 1
                   else "; ".join(f"s{s}: {b}" for s, b in by_seed.items()))
        said.append(f"{graph} {text} ({budgets})")
    return "<br>".join(said) or f"no {reference} final to pair with"


def budget_pair(name: str, reference: str) -> str:
    """'each 1 epoch, 112.6k positives' where both sides trained alike, else 'X against Y'."""
    ours, theirs = budget(name), budget(reference)
    return f"each {ours}" if ours == theirs else f"{ours} against {theirs}"


def search_trials(graph: str, method: str) -> str:
    """'20 + 10': the trials of a method's searches on a graph, its first and then its lr alone
    (tune-GRAPH-METHOD, tune-GRAPH-METHOD-lr), as the tuning table counts them; 'none'."""
    method = VARIANTS.get(method, (method,))[0]  # a variant's settings are its method's
    folders = (f"tune-{graph}-{method}", f"tune-{graph}-{method}-lr")
    counts = [str(search_counts(f)[0]) for f in folders if (RESULTS / f / "study.db").is_file()]
    return " + ".join(counts) or "none"


def methods() -> str:
    """The methods at equal budgets, one row a method with a final in results/methods/: tunable
    parameters, adapter size, the search trials behind its settings, minutes a UMLS epoch, UMLS
    test MRR, WN11 test accuracy and the paired gaps to finetuning and to PALT; one sentence while
    no final has run."""
    umls, wn11 = finals("umls"), finals("wn11")
    if not umls and not wn11:
        return (f"The methods' finals have not run yet: `results/{METHODS_FOLDER}/` will hold "
                f"`umls-METHOD-sSEED.json` and `wn11-METHOD-sSEED.json` (`{FINALS_COMMAND}`, "
                f"and `--tc` for WN11; `python bench/finals.py methods --graph umls|wn11` runs "
                f"them in turn).")
    rows = []
    for method in METHODS:
        u, w = umls.get(method, {}), wn11.get(method, {})
        if not u and not w:
            continue
        first = next(iter((u or w).values()))
        searched = "; ".join(f"{NAMES[g]} {search_trials(g, method)}"
                             for g, got in (("umls", u), ("wn11", w)) if got)
        rows.append([method, parameters_cell(first), adapter_mb(first), searched,
                     minutes_per_epoch(u) if u else "—", over_seeds(u) if u else "—",
                     over_seeds(w, points) if w else "—", gap_cell(method, "finetune", umls, wn11),
                     gap_cell(method, "palt", umls, wn11)])
    return table(["method", "tunable parameters (% of the model)", "adapter (MB)", "search trials",
                  "minutes a UMLS epoch (machine)", "UMLS test MRR", "WN11 test accuracy",
                  "paired gap, method - finetuning, by seed (budgets)",
                  "paired gap, method - PALT, by seed (budgets)"], rows)


def method_points(graph: str) -> list[tuple[str, int, float, float, list[int]]]:
    """(method, tunable parameters, mean, sd, seeds) of a graph's headline test figure per method
    with finals and a parameter count (sd 0 with one seed): the points plot.py methods draws."""
    out = []
    for method, names in finals(graph).items():
        tunable = train_of(next(iter(names.values())), "tunable")
        if tunable is None:
            continue
        values = [figure_of(n) for n in names.values()]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append((method, int(tunable), statistics.mean(values), sd, list(names)))
    return out


def missing_finals(graph: str, wanted: tuple[str, ...], seeds: tuple[int, ...]) -> list[str]:
    """The finals of these methods and seeds not in results/methods/ (a method missing every seed
    named once, its seed as -sS)."""
    got, out = finals(graph), []
    for method in wanted:
        lacking = [s for s in seeds if s not in got.get(method, {})]
        if len(lacking) == len(seeds) and len(seeds) > 1:
            out.append(f"`{graph}-{method}-sS`")
        else:
            out += [f"`{graph}-{method}-s{s}`" for s in lacking]
    return out


def mean_figure(names: dict[int, str]) -> float:
    """The mean headline figure over seeds."""
    return statistics.mean(figure_of(n) for n in names.values())


def same_budget(a: dict[int, str], b: dict[int, str]) -> bool:
    """Whether two methods' finals trained on the same epochs and positives, seed by seed."""
    return all((train_of(a[s], "epochs"), positives(a[s])) == (train_of(b[s], "epochs"),
                                                              positives(b[s])) for s in a if s in b)


def methods_verdict() -> str:
    """Two plain answers from the finals, graph by graph: (a) is PALT within .01 MRR (UMLS) and 1
    point (WN11) of finetuning at equal budgets, (b) does PALT beat LoRA (at its searched rank and
    at PALT's count) and BitFit, each with its tunable parameters; (a) once a graph's finals are in
    results/methods/, (b) at the seeds both sides hold so far, saying which where not all; and
    which finals the rest awaits."""
    umls, wn11 = finals("umls"), finals("wn11")
    wn11_seeds = tuple(s for s in wn11.get("palt", {}) if s in wn11.get("finetune", {})) or (42,)
    graphs = (("UMLS", "umls", umls, rate, 0.01, " MRR", SEEDS),
              ("WN11", "wn11", wn11, points, 1.0, " points", wn11_seeds))
    said, parts, missing = [], [], []
    for graph, key, got, fmt, margin, unit, seeds in graphs:
        lacking = missing_finals(key, ("palt", "finetune"), seeds)
        if lacking:
            missing += lacking
            continue
        p, f = got["palt"], {s: got["finetune"][s] for s in got["palt"] if s in got["finetune"]}
        gap = mean_figure(f) - mean_figure({s: p[s] for s in f})
        within = "within" if gap <= margin else "not within"
        p_budget, f_budget = (budget(next(iter(x.values()))) for x in (p, f))
        budgets = (f"equal budgets: {p_budget} each" if same_budget(p, f)
                   else f"unequal budgets: {p_budget} against {f_budget}")
        parts.append(f"on {graph} PALT is {within} {fmt(margin)}{unit} of finetuning "
                     f"({fmt(mean_figure(p))} against {fmt(mean_figure(f))}, finetuning "
                     f"{signed(gap, fmt)}; {budgets})")
    if parts:
        said.append("The paper's claim at equal budgets: " + "; ".join(parts) + ".")
    if missing:
        said.append(f"Whether PALT comes within .01 MRR and 1 point of finetuning at equal budgets "
                    f"{'on the other graph ' if parts else ''}awaits {', '.join(missing)}.")
    answers, missing = [], []
    for other in ("lora", "lora-r48", "bitfit"):
        wins = []
        for graph, key, got, fmt, _, _, seeds in graphs:
            missing += missing_finals(key, ("palt", other), seeds)
            # The means are over the seeds both hold, so that a seed one side lacks moves neither.
            shared = [s for s in seeds if s in got.get("palt", {}) and s in got.get(other, {})]
            if not shared:
                continue
            p, o = (mean_figure({s: got[m][s] for s in shared}) for m in ("palt", other))
            alone = "" if len(shared) == len(seeds) else f", {seed_words(shared)} alone"
            wins.append(f"{'beats' if p > o else 'does not beat'} it on {graph} "
                        f"({fmt(p)} against {fmt(o)}{alone})")
        if wins:
            answers.append(f"{NAMES_OF_METHODS[other]}{tunable_of(other)}: PALT "
                           f"{' and '.join(wins)}")
    if answers:
        said.append(f"PALT{tunable_of('palt')} against the general methods: "
                    f"{'; '.join(answers)}.")
    if missing:
        where = " at every seed on both graphs" if answers else ""
        said.append(f"Whether PALT beats the general methods{where} awaits "
                    f"{', '.join(dict.fromkeys(missing))}.")
    return " ".join(said)


def tunable_of(method: str) -> str:
    """' (592k tunable)': a method's tunable parameters as its first final records them; '' where
    no final records them."""
    for graph in METHOD_GRAPHS:
        names = finals(graph).get(method)
        tunable = train_of(next(iter(names.values())), "tunable") if names else None
        if tunable is not None:
            return f" ({tunable / 1e3:.0f}k tunable)"
    return ""


NAMES_OF_METHODS = {"palt": "PALT", "finetune": "finetuning", "lora": "LoRA",
                    "lora-r48": "LoRA at PALT's count (rank 48)", "bitfit": "BitFit",
                    "prompt": "prompt tuning", "probe": "the probe"}


# ----------------------------------------------------------------------------- Table 4
# The paper's Table 4 on WN11 at a real budget: variant -> (its row's label, its train.py flags).
# Every variant trains one epoch of the tuned WN11 PALT recipe with one change, finetuning one of
# its own tuned recipe; bench/finals.py runs this dict and table4() reads what it wrote, so the
# commands a reader sees and those that ran are the same. The tuned recipe has no prompt tokens,
# so the prompt row adds the paper's WN11 ones rather than take them away.
TABLE4 = {
    "palt": ("PALT", "--recipe tuned"),
    "prompts": ("w/ prompts 2,0,0 (the tuned recipe has none)", "--recipe tuned --prompts 2,0,0"),
    "nowp": ("w/o W_p", "--recipe tuned --no-wp"),
    "nocalib-mid": ("w/o calibration at the middle (layer 3)", "--recipe tuned --calib 5"),
    "nocalib-last": ("w/o calibration at the last (layer 5)", "--recipe tuned --calib 3"),
    "nocalib": ("w/o calibration at both", "--recipe tuned --calib none"),
    "probe": ("w/o the encoder (probe)", "--recipe tuned --method probe"),
    "finetune": ("finetuning", "--method finetune --recipe tuned-finetune"),
}
TABLE4_FOLDER = "table4"
TABLE4_SEEDS = (42, 1)
TABLE4_TRAIN = ("python train.py --data wn11 --epochs 1 {flags} --seed {seed} --dtype auto "
                "--out runs/table4-{variant}-s{seed}")
TABLE4_EVALUATE = ("python evaluate.py --tc --ckpt runs/table4-{variant}-s{seed} --dtype fp32 "
                   "--out results/table4/wn11-{variant}-s{seed}.json")


def table4_finals() -> dict[str, dict[int, str]]:
    """{variant: {seed: NAME}} of the JSONs in results/table4/, NAME as result() takes it
    (table4/wn11-VARIANT-sSEED); variants in TABLE4's order, seeds 42, 1, 2 first."""
    found: dict[str, dict[int, str]] = {}
    for variant in TABLE4:
        pattern = re.compile(rf"^wn11-{re.escape(variant)}-s(\d+)$")
        for path in (RESULTS / TABLE4_FOLDER).glob(f"wn11-{variant}-s*.json"):
            m = pattern.match(path.stem)
            if m:
                found.setdefault(variant, {})[int(m[1])] = f"{TABLE4_FOLDER}/{path.stem}"
    return {variant: dict(sorted(seeds.items(), key=lambda kv: seed_order(kv[0])))
            for variant, seeds in found.items()}


def table4() -> str:
    """The paper's Table 4 on WN11 at a real budget, one row a variant with JSONs in
    results/table4/: its seeds, test accuracy over them, tunable parameters and the paired gap to
    PALT over all test triples for each seed both have; one sentence while no run has been made."""
    got = table4_finals()
    if not got:
        pattern = dict(flags="FLAGS", seed="SEED", variant="VARIANT")
        each = "; ".join(f"{label} `{flags}`" for label, flags in TABLE4.values())
        return (f"Table 4's runs at a real budget have not been made yet: "
                f"`results/{TABLE4_FOLDER}/` will hold `wn11-VARIANT-sSEED.json` for seeds "
                f"{', '.join(map(str, TABLE4_SEEDS))} from `{TABLE4_TRAIN.format(**pattern)}` "
                f"and then `{TABLE4_EVALUATE.format(**pattern)}`, FLAGS by row: {each} "
                f"(`python bench/finals.py table4` runs them in turn).")
    reference = got.get("palt", {})
    rows = []
    for variant, names in got.items():
        values = [accuracy(n) for n in names.values()]
        figure = mean_sd(values, points) if len(values) > 1 else points(values[0])
        # A gap pairs two runs of one seed: the same negatives drawn, the same test triples.
        pairs = [wn11_pair(reference[seed], name, seed)
                 for seed, name in names.items() if seed in reference and variant != "palt"]
        gap = ("(the reference)" if variant == "palt"
               else "; ".join(pairs) or "— (no seed shared with PALT)")
        rows.append([TABLE4[variant][0], ", ".join(map(str, names)), figure,
                     parameters_cell(next(iter(names.values()))), gap,
                     f"`{TABLE4_FOLDER}/wn11-{variant}-sS`"])
    return table(["variant (1 epoch)", "seeds", "test accuracy",
                  "tunable parameters (% of the model)", "paired gap to PALT [95%], by seed",
                  "JSON"], rows)


# ----------------------------------------------------------------------------- speed
class SpeedLogError(ValueError):
    """A speed log whose format the parsers do not understand: the check stops, naming the file,
    rather than drop a number."""


def not_understood(path, what: str):
    """The error of a log whose figures are not where its parser looks."""
    return SpeedLogError(f"{files.project_path(path)}: no {what} found; a format this module's "
                         f"speed parsers do not understand")


def auto_figures(path) -> str:
    """bench/bench_auto.py: the UMLS training step's and ranking's fp32 and bf16 figures."""
    found = re.findall(r"^\s*UMLS (training step|ranking) \([^)]*\)\s+([\d.]+)\s+([\d.]+)\s+"
                       r"(seq/s|triples/s)", path.read_text(), re.M)
    if len(found) != 2:
        raise not_understood(path, "'UMLS training step' and 'UMLS ranking' rows")
    return "; ".join(f"{'step' if what == 'training step' else 'ranking'} fp32 {fp32}, bf16 "
                     f"{bf16} {unit}" for what, fp32, bf16, unit in found)


def train_figures(path) -> str:
    """bench/bench_train.py: sequences a second by recipe."""
    found = re.findall(r"^(\S+)\s+\d+\s+\d+\s+\S+\s+([\d,]+)\s+[\d,]+\s+[\d.]+\s", path.read_text(),
                       re.M)
    if not found:
        raise not_understood(path, "recipe rows (recipe, batch, seq/step, compiled, seq/s)")
    return ", ".join(f"{recipe} {seqs}" for recipe, seqs in found) + " seq/s"


RANK_ROW = re.compile(r"^ours \(length-sorted[^)]*\)\s+(\S.*?\S)\s+([\d,]+)\s+[\d,]+\s+[\d.]+\s+"
                      r"[\d.]+\s*$", re.M)


def rank_figures(path) -> str:
    """bench/bench_eval.py: the ranking's triples a second by dtype."""
    found = RANK_ROW.findall(path.read_text())
    if not found:
        raise not_understood(path, "'ours (length-sorted ...)' rows")
    return ", ".join(f"{dtype} {rate_}" for dtype, rate_ in found) + " triples/s"


def gpu_figures(path) -> str:
    """bench/gpu_call.py's JSON: scoring triples a second by dtype (its throughput step), training
    sequences a second as each train step's log last printed them, and the ranking's triples a
    second where its speed step ran bench_eval.py."""
    said = []

    def read(call: dict) -> None:
        by_pair: dict[str, list[str]] = {}
        for row in (call.get("throughput") or {}).get("rows", []):
            by_pair.setdefault(f"{row['model']} {row['data']}", []).append(
                f"{row['dtype']} {row['triples_per_s']:,.0f}")
        said.extend(f"scoring {pair}: {', '.join(rates)} triples/s"
                    for pair, rates in by_pair.items())
        for run in call.get("train", []):
            seqs = re.findall(r"seq/s (\d+)", run.get("tail", ""))
            if seqs:
                said.append(f"{run['data']} training {int(seqs[-1]):,} seq/s")
        for run in call.get("speed", []):
            said.extend(f"ranking {dtype} {r} triples/s"
                        for dtype, r in RANK_ROW.findall(run.get("tail", "")))
        for inner in call.get("calls", []):
            read(inner)

    read(json.loads(path.read_text()))
    if not said:
        raise not_understood(path, "throughput rows, train logs with seq/s or ranking rows")
    return "; ".join(said)


PARSERS = {"speed-auto-": auto_figures, "speed-train-": train_figures,
           "speed-rank-": rank_figures, "gpu-call-": gpu_figures}

# The speed table: what, the command, the CPU or GPU and date, and its logs in results/ (the
# profile logs are links: their figures are tables of operators, no headline).
SPEED = [
    ("training step, UMLS cpu recipe, against the step before its cheaper dropout masks",
     "`python bench/bench_train.py --data umls --recipes cpu:today,cpu --steps 16 --repeat 5`",
     "2 cores Intel Xeon with AMX (family 6 model 207), 2026-11-29",
     ["speed-train-umls-bf16-2026-11-29.log", "speed-train-umls-bf16-2026-11-29-evening.log"]),
    ("the same in fp32", "`... --steps 8 --repeat 3 --dtype fp32`", "the same",
     ["speed-train-umls-fp32-2026-11-29.log"]),
    ("the step compiled against eager", "`... --recipes cpu,cpu:compile --steps 10 --repeat 3`",
     "the same", ["speed-train-umls-compile-2026-11-29.log"]),
    ("ranking UMLS, eager and `--compile`",
     "`python bench/bench_eval.py --ours-only --data umls --queries 200 --repeat 3`", "the same",
     ["speed-rank-umls-2026-11-29.log", "speed-rank-umls-2026-11-29-peak.log"]),
    ("where the step's time goes", "`python bench/bench_train.py ... --profile`", "the same",
     ["profile-umls-cpu-step-2026-11-29.log", "profile-umls-cpu-step-today-and-new-2026-11-29.log",
      "profile-rank-umls-2026-11-29.log"]),
    ("`--dtype auto` against fp32 and bf16: matmuls, a training step, a ranking pass",
     "`python bench/bench_auto.py`",
     "2 cores AMD EPYC (family 25 model 1, no AVX512), 2026-12-01",
     ["speed-auto-2026-12-01-amd-epyc.log"]),
    ("the same, a CPU with AVX512_BF16", "`python bench/bench_auto.py`",
     "2 cores AMD EPYC (family 25 model 17), 2026-12-02",
     ["speed-auto-2026-12-02-amd-epyc-zen4.log"]),
    ("scoring on a GPU, fp32 / bf16 / compiled",
     "`python bench/gpu_call.py --steps tests,throughput --triples 32768`",
     "H200 and H100, 2026-11-26",
     ["gpu-call-h200-2026-11-26.json", "gpu-call-h100-2026-11-26.json"]),
    ("ranking and training steps on a GPU", "`bench/gpu_call.py` (`bench/gpu_pack.sh` prints the "
     "calls)", "H200, 2026-11-27", ["gpu-call-h200-2026-11-27a.json",
                                    "gpu-call-h200-2026-11-27a-train.json",
                                    "gpu-call-h200-2026-11-27b.json"]),
]


def log_figures(log: str) -> str:
    """A log's headline figures by its parser ('' for a profile log, a link only)."""
    parser = next((f for prefix, f in PARSERS.items() if log.startswith(prefix)), None)
    return parser(RESULTS / log) if parser else ""


def speed() -> str:
    """RESULTS' speed table: each row's figures parsed from the logs it names."""
    rows = []
    for what, command, machine, logs in SPEED:
        figures = [(log, log_figures(log)) for log in logs]
        cell = "<br>".join(f"`{log}`: {f}" if len(logs) > 1 else f for log, f in figures if f)
        rows.append([what, command, machine, cell or "(operator tables)",
                     ", ".join(f"`{log}`" for log in logs)])
    return table(["what", "command", "CPU or GPU, date", "figures", "log"], rows)


def out(text: str) -> None:
    """Write a table into the cog block (cog's own `cog.out`), with the newline cog expects."""
    import cog
    if text:
        cog.out(text + "\n")


# ----------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """cog over README.md and RESULTS.md: rewrite them (-r), or --check them."""
    from cogapp import Cog
    ap = argparse.ArgumentParser(prog="python -m support.tables",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="rewrite nothing: fail where a table differs from what the data gives")
    ap.add_argument("files", nargs="*", default=[str(files.ROOT / d) for d in DOCUMENTS])
    args = ap.parse_args(argv)
    return Cog().main(["cog", "--check" if args.check else "-r", *args.files])


if __name__ == "__main__":
    sys.exit(main())

"""Runs the methods comparison's searches, then trains and evaluates the finals that results/ does not hold yet.

    python bench/finals.py searches [--only tune-umls-lora,...] [--jobs 2] [--dry-run]
    python bench/finals.py sync [--runs DIR]
    python bench/finals.py table4 [--seeds 42,1] [--jobs 2] [--dry-run]
    python bench/finals.py methods --graph umls|wn11 [--seeds 42,1,2] [--methods palt,finetune] [--jobs 2] [--dry-run]

searches: each search of searches() (python -m support.tune) to its trials, in runs/NAME, begun from the study committed
in results/NAME: its ended trials stay, a running one trains again. A search is skipped once results/NAME holds its
trials, ended. A LoRA or BitFit search whose best lr ends in the top tenth of its range is followed by a second,
NAME-lr, of its lr alone (where --only is given, it names that too). sync: copies each search's small state from runs/ (or DIR, a clone's runs/) into results/NAME: the
study (by SQLite's backup, safe while it runs), trials.tsv, best.txt and the ended trials' log.txt; searches syncs
each search as it stops. --jobs N: N searches or finals at a time, each logging to runs/NAME.log. Ctrl-C (SIGINT) or
SIGTERM passes to every running command, which saves and stops (the same command goes on), and starts no other.

table4: the paper's Table 4 on WN11, each variant of support/tables.py's TABLE4 for one epoch, into
results/table4/wn11-VARIANT-sSEED.json. methods: each method at its searched settings (palt the tuned
recipe; finetune tuned-finetune; the others their search's results/tune-GRAPH-METHOD/best.txt; or the
second search's best, where there is one and it beats the first's; lora-r48 LoRA's at rank 48, PALT's
count) into results/methods/: UMLS 8 epochs, ranked on every test triple with --keep-ranks (the ranks
stay for the paired gaps); WN11 one epoch, classified with --tc.
A final waits, refused in one line, until the search it takes its settings from holds its trials, ended.
WN11's PALT and finetuning finals at their recipes evaluate Table 4's runs of the same seeds.

A final that ends keeps its run's log.txt as results/NAME.train.log beside each JSON.
A final whose results JSON exists is skipped; a run folder that holds a resume state continues with
--resume. Training takes --dtype auto, evaluation fp32. Each command is printed with the time before
it runs; --dry-run prints one line a final (its commands joined by &&) and runs nothing.
"""
import argparse, contextlib, shlex, shutil, signal, sqlite3, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from support import recipes, tables  # noqa: E402

RUNNING = set()  # the commands under way (Popen), to pass a signal on to
STOP = []  # the signals received: no command starts after one, and each running one gets it


def on_signal(signum, frame):
    """SIGINT or SIGTERM: passed on to every running command (train.py and support.tune save and
    stop), and no other starts; the searches under way are synced as they stop."""
    STOP.append(signum)
    for p in list(RUNNING):
        p.send_signal(signum)


def call(command: str, log: Path | None = None) -> int:
    """One command, its output to the console or appended to log; its exit status (130 when a
    signal came first)."""
    if STOP:
        return 130
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {command}" + (f" > {log}" if log else ""), flush=True)
    with open(log, "a") if log else contextlib.nullcontext() as f:
        p = subprocess.Popen(shlex.split(command), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT if f else None)
        RUNNING.add(p)
        try:
            return p.wait()
        finally:
            RUNNING.discard(p)

# ----------------------------------------------------------------------------- the searches
# The searches behind the finals, at the budgets and dev sets of the PALT and finetuning studies
# (results/tune-GRAPH-palt, -finetune): on UMLS at most 4 epochs a trial, 200 dev triples; on WN11
# 12,800 positives a trial. LoRA and BitFit search like PALT and finetuning (as many trials, the cpu
# recipe as one trial). Prompt tuning and the probe take PALT's tuned settings and search their lr;
# finetuning's second search takes its tuned settings and its lr up to 1e-3, and so does a LoRA or
# BitFit search's where its best lr lies in the top tenth of its range (support/tables.py, EDGE).
BUDGET = {"umls": "--recipe cpu --max-epochs 4 --dev-limit 200", "wn11": "--recipe cpu --positives 12800"}
TRIALS = {"umls": 30, "wn11": 20}  # the PALT and finetuning studies'
WIDE_LR = "1e-4:3e-2"  # prompts and heads alone: prompt tuning's lr runs high (Lester et al. 2021)
FINETUNE_LR = "1e-4:1e-3"  # its first searches stopped at 3e-4, their best trials near the top
SECOND_TRIALS = 10  # a second search of the lr alone, finetuning's or another's


def pins(recipe: dict, names: tuple[str, ...]) -> str:
    """--space items fixing `names` at a recipe's values, as support.tune spells them."""
    out = []
    for name in names:
        value = recipe.get(name)
        if name == "negatives":
            value = "1,0,1 --either-side" if recipe.get("either_side") else ",".join(map(str, value))
        elif name == "epochs":
            value = 4  # the UMLS searches' cap (--max-epochs 4)
        elif isinstance(value, float):
            value = f"{value:.3g}"
        out.append(f"{name}={value}")
    return ",".join(out)


COMMON = ("batch", "negatives", "warmup", "adam_beta2", "adam_eps", "head_input")


def searches() -> dict[str, str]:
    """{results folder: support.tune's flags} of every search, UMLS's first."""
    out = {}
    for graph in ("umls", "wn11"):
        common = COMMON + (("epochs",) if graph == "umls" else ())
        palt, ft = recipes.TUNED[graph], recipes.TUNED_FINETUNE[graph]
        base = f"--data {graph} {BUDGET[graph]}"
        for method in tables.SECOND_SEARCHES:
            out[f"tune-{graph}-{method}"] = (f"{base} --method {method} --trials {TRIALS[graph]} "
                                             "--try-recipe")
            second = second_search(graph, method)
            if second:
                out[f"tune-{graph}-{method}-lr"] = f"{base} --method {method} {second}"
        space = pins(palt, common + ("head_lr",))
        out[f"tune-{graph}-prompt"] = (f"{base} --method prompt --trials 8 "
                                       f"--space '{space},prompts=10,10,10,lr={WIDE_LR}'")
        space = pins(palt, common)
        out[f"tune-{graph}-probe"] = f"{base} --method probe --trials 8 --space '{space},lr={WIDE_LR}'"
        space = pins(ft, common)
        out[f"tune-{graph}-finetune-lr"] = (f"{base} --method finetune --trials {SECOND_TRIALS} "
                                            f"--space '{space},lr={FINETUNE_LR}'")
    return out


def second_search(graph: str, method: str) -> str | None:
    """The flags of a second search of a method's lr: its first search's best settings, the lr
    from a third of that search's top to ten times it; None until the first holds its trials,
    ended, and where its best lr lies below the top tenth of its range."""
    name = f"tune-{graph}-{method}"
    if trials_of(tables.RESULTS / name)[0] < TRIALS[graph]:
        return None
    best = tables.best_lr(name)
    if best is None or best.place < tables.EDGE:
        return None
    space = ",".join(f"{k}={v}" for k, v in best.settings.items() if k != "lr")
    return f"--trials {SECOND_TRIALS} --space '{space},lr={best.high / 3:g}:{best.high * 10:g}'"


def follow_up(name: str) -> str:
    """The name of a search's second search, where it has one."""
    return f"{name}-lr"


def wanted(name: str) -> int:
    """The trials a search of searches() runs to."""
    words = shlex.split(searches()[name])
    return int(words[words.index("--trials") + 1])


def rows_of(folder: Path) -> list[dict[str, str]]:
    """A search's trials.tsv, a row a trial by column (number, state, value, ...); [] without one."""
    table = folder / "trials.tsv"
    if not table.is_file():
        return []
    header, *lines = table.read_text().splitlines()
    return [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]


def trials_of(folder: Path) -> tuple[int, int]:
    """(ended, all) trials of a search, repeats of an earlier trial's settings left out (they do
    not count: support/tune.py's repeats())."""
    rows = [r for r in rows_of(folder) if r["state"] != "repeat"]
    return sum(r["state"] != "running" for r in rows), len(rows)


def sync(src: Path, dst: Path) -> None:
    """A search's small state from its run folder into results/: the study (SQLite's backup, safe
    while the search writes), trials.tsv, best.txt and the ended trials' log.txt."""
    dst.mkdir(parents=True, exist_ok=True)
    a, b = sqlite3.connect(src / "study.db"), sqlite3.connect(dst / "study.db")
    a.backup(b)
    b.close(), a.close()
    for name in ("trials.tsv", "best.txt"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for number in (r["number"] for r in rows_of(src) if r["state"] != "running"):
        log = src / "trials" / number / "log.txt"
        if log.is_file():
            (dst / "trials" / number).mkdir(parents=True, exist_ok=True)
            shutil.copy2(log, dst / "trials" / number / "log.txt")


def search_command(name: str, flags: str) -> str:
    return f"python -m support.tune {flags} --out runs/{name} -- --dtype auto"


def run_search(name: str, flags: str) -> int:
    """One search to its trials in runs/NAME (begun from results/NAME), logging to runs/NAME.log;
    synced into results/NAME when it stops, however it stops."""
    run, kept = ROOT / "runs" / name, tables.RESULTS / name
    if not run.exists() and kept.is_dir():
        shutil.copytree(kept, run)
    run.parent.mkdir(exist_ok=True)
    try:
        return call(search_command(name, flags), ROOT / "runs" / f"{name}.log")
    finally:
        if (run / "study.db").is_file():
            sync(run, kept)

def run_chain(name: str, only: list[str] | None) -> int:
    """A search, then its second search where its best calls for one (and --only, where given,
    names that too)."""
    code = run_search(name, searches()[name])
    second = follow_up(name)
    if code or STOP or (only is not None and second not in only):
        return code
    flags = searches().get(second)
    if flags is None or trials_of(tables.RESULTS / second)[0] >= wanted(second):
        return code
    return run_search(second, flags)

# A search's best.txt trains the search's budget into the search's folder: the final sets these
# itself (its epochs, seed, folder and precision), and drops the search's step cap and dev points
# so that every method trains whole epochs and is judged at each epoch's end, as the recipes are.
BUDGET_FLAGS = ("--data", "--out", "--seed", "--epochs", "--max-steps", "--dev-every", "--dtype")
EPOCHS = {"umls": 8, "wn11": 1}
RECIPES = {"palt": "--method palt --recipe tuned", "finetune": "--method finetune --recipe tuned-finetune"}
# WN11's PALT and finetuning finals train as Table 4's rows of the same names do (the same recipe, one
# epoch): they evaluate Table 4's run of the seed, which trains once (a finished run resumed does nothing).
TABLE4_SHARED = ("palt", "finetune")


@dataclass
class Final:
    run: str  # the run folder, relative to the repository
    train: str
    evaluations: list[tuple[str, str]]  # (the results JSON relative to results/, the command writing it)


def seeds_list(text: str) -> list[int]:
    return [int(s) for s in text.split(",")]


def table4_finals(seeds: list[int]) -> list[Final]:
    """Every variant of TABLE4 for each seed, in TABLE4's order, seed by seed."""
    out = []
    for seed in seeds:
        for variant, (_, flags) in tables.TABLE4.items():
            words = dict(flags=flags, seed=seed, variant=variant)
            name = f"{tables.TABLE4_FOLDER}/wn11-{variant}-s{seed}.json"
            out.append(Final(f"runs/table4-{variant}-s{seed}", tables.TABLE4_TRAIN.format(**words),
                             [(name, tables.TABLE4_EVALUATE.format(**words))]))
    return out


def searched(graph: str, method: str) -> str:
    """The train.py flags of a method's searched settings, less those of the search's budget: its
    recipe (PALT's, finetuning's) or its search's best, or its second search's best where that
    beats the first's; a method without a finished search stops the command in one line. A
    variant (tables.VARIANTS) is its method's settings with its own flags in place of theirs."""
    if method in tables.VARIANTS:
        base, change = tables.VARIANTS[method]
        words, changes = shlex.split(searched(graph, base)), shlex.split(change)
        for flag, value in zip(changes[::2], changes[1::2]):
            if flag in words:
                words[words.index(flag) + 1] = value
            else:
                words += [flag, value]
        return shlex.join(words)
    first = RECIPES[method] if method in RECIPES else best_flags(graph, method)
    name = f"tune-{graph}-{method}"
    if follow_up(name) not in searches():
        return first
    wide = best_flags(graph, f"{method}-lr", final=method)
    if best_value(tables.RESULTS / follow_up(name)) > best_value(tables.RESULTS / name):
        return wide
    return first


def best_trial(folder: Path) -> tuple[int, float]:
    """(number, dev figure) of a search's best trial, as its best.txt trains it: the highest figure
    among the trials that trained in full (trials.tsv), the first such on a tie."""
    done = [(-float(r["value"]), int(r["number"])) for r in rows_of(folder)
            if r["state"] == "complete" and r["value"]]
    value, number = min(done)
    return number, -value


def best_value(folder: Path) -> float:
    return best_trial(folder)[1]


def best_flags(graph: str, method: str, final: str | None = None) -> str:
    """The flags of results/tune-GRAPH-METHOD/best.txt, less the search's budget; refused in one
    line until the search holds its trials, ended."""
    name = f"tune-{graph}-{method}"
    need, (ended, _) = wanted(name), trials_of(tables.RESULTS / name)
    best = tables.RESULTS / name / "best.txt"
    if ended < need or not best.is_file():
        sys.exit(f"error: results/{name} holds {ended} of its {need} trials, ended: the {final or method} final on "
                 f"{graph} waits for it; --methods names the methods to run without it")
    words, kept = shlex.split(best.read_text())[2:], []  # after `python train.py`
    while words:
        word = words.pop(0)
        if word in BUDGET_FLAGS:
            words.pop(0)  # its value
        else:
            kept.append(word)
    number, _ = best_trial(tables.RESULTS / name)
    return shlex.join(kept + ["--search", f"results/{name} trial {number}"])  # kept in the checkpoint


def methods_finals(graph: str, seeds: list[int], methods: list[str]) -> list[Final]:
    """Each method for each seed at the graph's epochs, in the methods table's order, seed by seed.
    Every method's settings are read first, so that a missing search stops the command before any
    training."""
    flags = {method: searched(graph, method) for method in methods}
    out = []
    for seed in seeds:
        for method in methods:
            stem, run = f"{graph}-{method}-s{seed}", f"runs/{graph}-{method}-s{seed}"
            folder = f"results/{tables.METHODS_FOLDER}"
            train = (f"python train.py --data {graph} {flags[method]} --epochs {EPOCHS[graph]} --seed {seed} "
                     f"--dtype auto --out {run}")
            if graph == "wn11" and method in TABLE4_SHARED and flags[method] == RECIPES[method]:  # one run, both
                words = dict(flags=tables.TABLE4[method][1], seed=seed, variant=method)
                run, train = f"runs/table4-{method}-s{seed}", tables.TABLE4_TRAIN.format(**words)
            task = "--lp --keep-ranks" if graph == "umls" else "--tc"  # the paired gaps read the ranks
            evaluate = f"python evaluate.py {task} --ckpt {run} --dtype fp32"
            evaluations = [(f"{tables.METHODS_FOLDER}/{stem}.json", f"{evaluate} --out {folder}/{stem}.json")]
            out.append(Final(run, train, evaluations))
    return out


def plan(final: Final) -> list[str]:
    """The commands a final still needs: none once its JSONs exist; else training (resumed where
    its folder holds a state, and a finished run resumed does nothing) and each missing JSON."""
    missing = [command for name, command in final.evaluations if not (tables.RESULTS / name).is_file()]
    if not missing:
        return []
    resume = " --resume" if (ROOT / final.run / "state.safetensors").is_file() else ""
    return [final.train + resume, *missing]


def run_final(final: Final, commands: list[str], log: Path | None) -> int:
    """A final's commands one after another (to the console, or appended to log); the first
    failing one's exit status, else 0."""
    for command in commands:
        code = call(command, log)
        if code:
            if not STOP:
                print(f"error: exit status {code} from: {command}", file=sys.stderr, flush=True)
            return code
    keep_log(final)
    return 0


def keep_log(final: Final) -> None:
    """The run's training log (its log.txt) beside each JSON of the final, as NAME.train.log, so
    that results/ keeps how the figures were trained once runs/ is gone."""
    log = ROOT / final.run / "log.txt"
    for name, _ in final.evaluations:
        kept = (tables.RESULTS / name).with_suffix(".train.log")
        if log.is_file() and (tables.RESULTS / name).is_file() and not kept.is_file():
            shutil.copyfile(log, kept)


def in_parallel(jobs: int, work: list) -> int:
    """Each (function, args) of work, `jobs` at a time; 130 where a signal stopped them, else 1
    where any failed, else 0."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(pool.map(lambda w: w[0](*w[1]), work))
    return 130 if STOP else int(any(codes))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/finals.py", description=__doc__.split("\n")[0])
    ap.add_argument("which", choices=("searches", "sync", "table4", "methods"))
    ap.add_argument("--graph", choices=tuple(EPOCHS), help="methods: the graph (required)")
    ap.add_argument("--seeds", type=seeds_list, help="comma-separated (default: table4 42,1; methods 42,1,2)")
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(tables.METHODS),
                    help=f"methods: which (default {','.join(tables.METHODS)})")
    ap.add_argument("--only", type=lambda s: s.split(","), help="searches, sync: these searches (default all)")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs", help="sync: the folder holding the run folders")
    ap.add_argument("--jobs", type=int, default=1, help="searches or finals at a time (default 1)")
    ap.add_argument("--dry-run", action="store_true", help="print each final's commands, run nothing")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    every = searches()
    seconds = [follow_up(f"tune-{graph}-{method}") for graph in TRIALS for method in tables.SECOND_SEARCHES]
    known = list(dict.fromkeys([*every, *seconds]))  # a second search may be named before it exists
    unknown = [n for n in args.only or () if n not in known]
    if unknown:
        ap.error(f"--only: {', '.join(unknown)} is not one of {', '.join(known)}")
    chosen = {n: f for n, f in every.items() if args.only is None or n in args.only}
    if args.which == "sync":
        for name in chosen:
            if (args.runs / name / "study.db").is_file():
                sync(args.runs / name, tables.RESULTS / name)
                ended, _ = trials_of(tables.RESULTS / name)
                print(f"synced {args.runs / name} -> results/{name} ({ended} trials ended)", flush=True)
        return 0
    if args.which == "searches":
        work = []
        for name, flags in chosen.items():
            trials, (ended, _) = wanted(name), trials_of(tables.RESULTS / name)
            if ended >= trials:
                print(f"# results/{name} holds its {trials} trials: skipped", flush=True)
            elif args.dry_run:
                print(search_command(name, flags), flush=True)
            else:
                work.append((run_chain, (name, args.only)))
        return in_parallel(args.jobs, work) if work else 0
    if args.which == "table4":
        finals = table4_finals(args.seeds or list(tables.TABLE4_SEEDS))
    else:
        if args.graph is None:
            ap.error("methods needs --graph umls or --graph wn11")
        unknown = [m for m in args.methods if m not in tables.METHODS]
        if unknown:
            ap.error(f"--methods: {', '.join(unknown)} is not one of {', '.join(tables.METHODS)}")
        finals = methods_finals(args.graph, args.seeds or list(tables.SEEDS), args.methods)
    work = []
    for final in finals:
        commands = plan(final)
        if not commands:
            print(f"# {', '.join(f'results/{name}' for name, _ in final.evaluations)} exists: skipped", flush=True)
        elif args.dry_run:
            print(" && ".join(commands), flush=True)
        else:
            log = ROOT / f"{final.run}.log" if args.jobs > 1 else None
            work.append((run_final, (final, commands, log)))
    if args.jobs > 1:
        (ROOT / "runs").mkdir(exist_ok=True)
    return in_parallel(args.jobs, work) if work else 0


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    sys.exit(main())

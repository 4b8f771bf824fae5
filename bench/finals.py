"""Trains and evaluates, one after another, the finals that results/ does not hold yet.

    python bench/finals.py table4 [--seeds 42,1] [--dry-run]
    python bench/finals.py methods --graph umls|wn11 [--seeds 42,1,2] [--methods palt,finetune] [--dry-run]

table4: the paper's Table 4 on WN11, each variant of support/tables.py's TABLE4 for one epoch, into
results/table4/wn11-VARIANT-sSEED.json. methods: each method at its searched settings (palt the tuned
recipe, finetune tuned-finetune, the others their search's results/tune-GRAPH-METHOD/best.txt) into
results/methods/: UMLS 8 epochs, ranked on every test triple with --keep-ranks (the ranks stay for the
paired gaps); WN11 one epoch, classified with --tc.

A final whose results JSON exists is skipped; a run folder that holds a resume state continues with
--resume. Training takes --dtype auto, evaluation fp32. Each command is printed with the time before
it runs; --dry-run prints one line a final (its commands joined by &&) and runs nothing.
"""
import argparse, shlex, subprocess, sys, time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from support import tables  # noqa: E402

# A search's best.txt trains the search's budget into the search's folder: the final sets these
# itself (its epochs, seed, folder and precision), and drops the search's step cap and dev points
# so that every method trains whole epochs and is judged at each epoch's end, as the recipes are.
BUDGET_FLAGS = ("--data", "--out", "--seed", "--epochs", "--max-steps", "--dev-every", "--dtype")
EPOCHS = {"umls": 8, "wn11": 1}
RECIPES = {"palt": "--method palt --recipe tuned", "finetune": "--method finetune --recipe tuned-finetune"}


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
    """The train.py flags of a method's searched settings, less those of the search's budget; a
    method without a finished search stops the command in one line."""
    if method in RECIPES:
        return RECIPES[method]
    best = tables.RESULTS / f"tune-{graph}-{method}" / "best.txt"
    if not best.is_file():
        sys.exit(f"error: results/{best.relative_to(tables.RESULTS)} does not exist yet (no trial of the {method} "
                 f"search on {graph} has finished); --methods names the methods to run without it")
    words, kept = shlex.split(best.read_text())[2:], []  # after `python train.py`
    while words:
        word = words.pop(0)
        if word in BUDGET_FLAGS:
            words.pop(0)  # its value
        else:
            kept.append(word)
    return shlex.join(kept)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/finals.py", description=__doc__.split("\n")[0])
    ap.add_argument("which", choices=("table4", "methods"))
    ap.add_argument("--graph", choices=tuple(EPOCHS), help="methods: the graph (required)")
    ap.add_argument("--seeds", type=seeds_list, help="comma-separated (default: table4 42,1; methods 42,1,2)")
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(tables.METHODS),
                    help=f"methods: which (default {','.join(tables.METHODS)})")
    ap.add_argument("--dry-run", action="store_true", help="print each final's commands, run nothing")
    args = ap.parse_args(argv)
    if args.which == "table4":
        finals = table4_finals(args.seeds or list(tables.TABLE4_SEEDS))
    else:
        if args.graph is None:
            ap.error("methods needs --graph umls or --graph wn11")
        unknown = [m for m in args.methods if m not in tables.METHODS]
        if unknown:
            ap.error(f"--methods: {', '.join(unknown)} is not one of {', '.join(tables.METHODS)}")
        finals = methods_finals(args.graph, args.seeds or list(tables.SEEDS), args.methods)
    for final in finals:
        commands = plan(final)
        if not commands:
            print(f"# {', '.join(f'results/{name}' for name, _ in final.evaluations)} exists: skipped", flush=True)
        elif args.dry_run:
            print(" && ".join(commands), flush=True)
        else:
            for command in commands:
                print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {command}", flush=True)
                done = subprocess.run(shlex.split(command), cwd=ROOT)
                if done.returncode:
                    sys.exit(f"error: exit status {done.returncode} from: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

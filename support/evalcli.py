"""evaluate.py's command line: its flags, which checkpoint and graph they name (checked before the
model loads), where results go, how a checkpoint was trained, and the printed tables and results
JSON of a finished evaluation."""
import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

import data
import palt
from data import DataError
from support import categories, files, graphs, predict
from support.manifest import manifest
from support.checkpoints import checkpoint_file, load_checkpoint, read_checkpoint
from support.devices import DTYPES
from support.files import OutputError
from support.flags import FlagError, check_limits, check_seq_length

# what `python evaluate.py --lp` evaluates
DEFAULT_DATA = {"lp": "umls", "tc": "wn11", "predict": "umls"}


def shortlist_size(text):
    """--shortlist: a positive number, or all."""
    if text == "all":
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a number of candidates or all, not {text!r}")


def parser(doc):
    """evaluate.py's flags; doc: its docstring (first line the description, the rest the epilog)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0], epilog=doc.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    task = ap.add_mutually_exclusive_group(required=True)
    task.add_argument("--tc", dest="task", action="store_const", const="tc",
                      help="triple classification")
    task.add_argument("--lp", dest="task", action="store_const", const="lp",
                      help="filtered link prediction")
    task.add_argument("--predict", dest="task", action="store_const", const="predict",
                      help="top-k completions")
    ap.add_argument("query", nargs="*", metavar="QUERY",
                    help="HEAD RELATION or '?' RELATION TAIL (text:X: new entity)")
    ap.add_argument("--queries",
                    help="--predict: a file of queries, one a line, tab-separated as QUERY")
    ap.add_argument("--data", help=f"{', '.join(graphs.DATASETS)}, or a graph's folder "
                    "(default: the checkpoint's)")
    ap.add_argument("--data-dir",
                    help="folder of the dataset folders (default $PALT_DATA, else ./data)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--ckpt", help="a train.py checkpoint or run folder (best, else ckpt); "
                     "default: the shipped one")
    src.add_argument("--model", help="zero-shot: a base model with a pretrained NSP head (e.g. "
                     "bert-base-uncased)")
    ap.add_argument("--out", help="results JSON (default: beside the checkpoint, or results/); "
                    "--predict: a TSV")
    ap.add_argument("--split", default="test", choices=["test", "dev"],
                    help="--lp: the split ranked")
    ap.add_argument("--candidates", default="split", choices=["split", "all"],
                    help="entities: in any split, or all")
    ap.add_argument("--limit", type=int, help="--lp: a seeded random N test triples (an estimate, "
                    "95%% interval)")
    ap.add_argument("--seed", type=int, default=0, help="--limit: the subset and the bootstrap")
    ap.add_argument("--keep-ranks", action="store_true", help="--lp: a full ranking keeps its "
                    "ranks in OUT.state (else removed once the JSON is written), for "
                    "bench/paired.py")
    ap.add_argument("--raw", action="store_true", help="--lp: print raw (unfiltered) ranks too "
                    "(always in the JSON)")
    ap.add_argument("--per-relation", action="store_true", help="--tc: one threshold per relation; "
                    "--lp: also the relation categories 1-1, 1-N, N-1, N-N, by side")
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--shortlist", type=shortlist_size, help="--predict: score at most N "
                    f"candidates chosen as predict.py says, or all (default where a graph has over "
                    f"{predict.ALL_UP_TO:,}: {predict.SIZE:,})")
    ap.add_argument("--tokens", type=int, help="padded tokens per batch (default 16384 on CPU, "
                    "262144 on GPU)")
    ap.add_argument("--block-rows", type=int, default=1 << 16,
                    help="candidate triples scored per block of queries")
    ap.add_argument("--save-every", type=float, default=60,
                    help="seconds between saves of finished queries")
    ap.add_argument("--text", choices=graphs.TEXTS, help="zero-shot: entity texts (default name)")
    ap.add_argument("--max-seq-length", type=int, help="default: the checkpoint's, else 192")
    ap.add_argument("--dtype", choices=DTYPES, default="auto",
                    help="autocast; auto: bf16 where native, else fp32")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile: ~40 s once, then up to x1.1 on CPU")
    # the tests: stop (state saved), then resume
    ap.add_argument("--stop-after-queries", type=int, help=argparse.SUPPRESS)
    return ap


def parse_args(argv, doc):
    """evaluate.py's flags, each checked: one argparse error naming it."""
    ap = parser(doc)
    args = ap.parse_args(argv)
    if args.task == "predict" and bool(args.query) == bool(args.queries):
        ap.error("--predict needs one query (HEAD RELATION, or '?' RELATION TAIL) or --queries "
                 "FILE")
    try:
        if args.query:
            predict.parse_query(args.query, "--predict")
        if args.task != "predict" and (args.query or args.queries):
            what = " ".join(args.query) or "--queries"
            ap.error(f"unexpected arguments {what} (only --predict takes queries)")
        if args.data and args.data.lower() in graphs.DATASETS:
            args.data = args.data.lower()
        if args.data:
            graphs.dataset(args.data, args.data_dir)  # a benchmark, or a folder with a train split
    except ValueError as e:  # a query that is none; a --data neither a benchmark nor a folder
        ap.error(str(e))
    ints = ("limit", "topk", "tokens", "block_rows", "max_seq_length", "stop_after_queries")
    if args.shortlist is not None and args.task != "predict":
        ap.error("--shortlist is for --predict only: --lp and --tc always score every candidate")
    if args.keep_ranks and args.task != "lp":
        ap.error("--keep-ranks is for --lp only: it keeps a ranking's ranks")
    limits = {k: (1, True) for k in ints} | {"seed": (0, True), "save_every": (0, False)}
    check_limits(ap, args, limits)
    return args


def benchmark(name):
    """A benchmark's name in lower case; None for a graph's folder (the fingerprint decides)."""
    return name.lower() if name.lower() in graphs.DATASETS else None


def resolve_source(args):
    """Fills in args.ckpt (no --ckpt and no --model: the adapter shipped for the dataset) and
    args.data from the checkpoint's metadata alone (returned; None: zero-shot): command-line
    mistakes surface before the model loads."""
    if args.model:
        args.data = args.data or DEFAULT_DATA[args.task]
        return None
    if args.ckpt:
        ckpt = checkpoint_file(args.ckpt)
    else:
        if args.data and args.data.lower() not in graphs.DATASETS:
            raise FlagError(f"--data {args.data}: adapters are shipped for the benchmarks "
                            "only; give --ckpt")
        name = graphs.dataset(args.data or DEFAULT_DATA[args.task])[0]
        # the project's, whatever PALT_WEIGHTS says
        ckpt = files.ROOT / "weights" / f"palt-{name}-minilm.safetensors"
        if not ckpt.is_file():
            raise FlagError(f"no shipped adapter {ckpt}: train one with python train.py "
                            f"--data {name}, then --ckpt runs/{name}-minilm")
    _, meta = read_checkpoint(ckpt, tensors=False)  # the tensors load once, with the model
    if args.data and benchmark(meta["data"]) != benchmark(args.data):
        raise FlagError(f"{ckpt} was trained on {meta['data']}, not {args.data}")
    if args.text not in (None, meta["text"]):
        raise FlagError(f"{ckpt} was trained with --text {meta['text']}, not {args.text}")
    args.ckpt, args.data = str(ckpt), args.data or files.in_project(meta["data"])
    return meta


def results_path(args, shipped):
    """(results JSON, ranking state folder): --out and its .state; else beside the checkpoint, else
    in results/. The state's name leaves --limit out: a rerun with a larger --limit and the same
    seed finds it and grows the estimate."""
    if args.out:
        return Path(args.out), Path(args.out).with_suffix(".state")
    name, ckpt = graphs.dataset(args.data, args.data_dir)[0], Path(args.ckpt or "")
    if args.model:
        folder, stem = Path("results"), f"{name}-zeroshot-{Path(args.model).name}"
    elif shipped:
        folder, stem = Path("results"), f"{name}-{ckpt.stem}"
    else:  # best and ckpt: two files
        folder = ckpt.parent
        stem = f"eval-{name}" + ("" if ckpt.stem == "ckpt" else f"-{ckpt.stem}")
    stem += f"-{args.task}" + (f"-{args.split}" if args.task == "lp" else "")
    limit = f"-limit{args.limit}-seed{args.seed}" if args.limit else ""
    return folder / f"{stem}{limit}.json", folder / f"{stem}-seed{args.seed}.state"


def train_summary(meta):
    """How a checkpoint was trained (None where older ones lack it): enough to rerun it (`recipe`)
    and tell it apart."""
    if meta is None:
        return None
    args, arch = json.loads(meta.get("run", "{}")), meta.get("palt", {})
    for k in ("out", "data_dir", "model", "data"):  # checkpoints before 2026-11-28: as given
        if isinstance(args.get(k), str) and os.path.isabs(args[k]):
            args[k] = files.project_path(args[k])
    method = arch.get("method", "finetune" if arch.get("finetune") else "palt")  # older: a bool
    return {"method": method, "model": meta.get("model"),
            **{k: arch.get(k) for k in ("prompts", "calib_layers", "prompt_encoder", "prompt_mlp")},
            **{k: arch[k] for k in ("lora_rank", "lora_alpha") if method == "lora"},
            **{k: args.get(k) for k in ("lr", "batch", "negatives", "seed")},
            "epochs": meta.get("epoch"), "epochs_scheduled": args.get("epochs"),
            "steps": meta.get("step"), "dtype": meta.get("dtype"),
            "wall_s": meta.get("train_wall_s"),
            "tunable": meta.get("tunable"), "total": meta.get("total"), "dev": meta.get("dev"),
            "best_epoch": meta.get("best_epoch"), "recipe": args or None,
            "search": meta.get("search"),  # the search and trial behind the recipe, if any
            # 'train': negatives redrawn when a train triple; checkpoints before 2026-11-28 lack the
            # key and redrew any train, dev or test fact
            **{k: meta[k] for k in ("negative_filter",) if k in meta}}


def load_model(args, device):
    """(PALT model, tokenizer, info): from the checkpoint, or zero-shot from a base model with a
    pretrained NSP head."""
    if args.ckpt:
        model, meta, loaded = load_checkpoint(args.ckpt)
        # the resume key: these very tensors, on any machine
        identity = files.sha256_file(args.ckpt)
    else:
        model, loaded = palt.build_palt(args.model, palt.PaltConfig(**palt.ZERO_SHOT))
        if loaded.heads_to_train:
            raise FlagError(f"{args.model} has no pretrained NSP head, so zero-shot scores "
                            "would be random; give --ckpt")
        identity = loaded.weights_sha256
        meta = dict(model=args.model, text=args.text or "name", prompts=[0, 0, 0],
                    max_seq_length=192)
    info = dict(model=meta["model"], ckpt=args.ckpt and files.project_path(args.ckpt),
                identity=identity, weights_sha256=loaded.weights_sha256, text=meta["text"],
                prompts=[int(p) for p in meta["prompts"]],
                max_seq_length=args.max_seq_length or int(meta["max_seq_length"]))
    return model.to(device).eval(), loaded.tokenizer, info


def check_graph(args, meta, kg):
    """The graph against the checkpoint and the task."""
    if meta and meta.get("data_fingerprint") not in (None, kg.fingerprint):
        raise DataError(f"{args.ckpt} was trained on other {kg.name} files (fingerprint "
                        f"{meta['data_fingerprint']}, these are {kg.fingerprint})")
    if args.task == "tc" and kg.task != "tc":
        raise DataError(f"{kg.name} has no labelled dev/test negatives; triple "
                        "classification needs wn11, fb13 or a folder whose test split has a 4th "
                        "column (1/-1)")
    need = {"tc": ["dev", "test"], "lp": [args.split]}.get(args.task, [])
    for split in [s for s in need if not len(getattr(kg, s))]:
        raise DataError(f"{kg.split_files[split]}: no such file (--{args.task} "
                        "needs it)")


def check_before_loading(args, shipped):
    """Everything that can be checked without the model, so that a mistake costs seconds, not a
    load: (checkpoint metadata or None, graph, output path or None, ranking state folder or
    None)."""
    meta = resolve_source(args)
    if args.max_seq_length is not None:
        n_prompts = sum(int(p) for p in meta["prompts"]) if meta else 0
        check_seq_length(args.max_seq_length, n_prompts)
    text = meta["text"] if meta else args.text or "name"
    kg = graphs.load_kg(args.data, args.data_dir, text=text)
    check_graph(args, meta, kg)
    for note in kg.notes:
        print(note, file=sys.stderr)
    if args.task == "predict":
        out, state_dir = Path(args.out) if args.out else None, None
    else:
        out, state_dir = results_path(args, shipped)
    if out and out.is_dir():
        raise FlagError(f"--out {out} is a folder; give the path of a file")
    if out:
        files.check_writable(out.parent, f"--out {out}")
    if args.queries:
        files.readable(args.queries, data.DataError)
    if out and args.task == "lp":  # the resumable ranking state
        files.check_writable(state_dir, f"{out}: its ranking state")
    return meta, kg, out, state_dir


def jsonable(x):
    """A float as JSON can hold it: infinities as text."""
    return x if np.isfinite(x) else str(x)


# ----------------------------------------------------------------------------- the report
def bootstrap_interval(r, triples, ks, n_resamples=1000, seed=0):
    """95% percentile-bootstrap interval of the MR, MRR, Hits@k (k in ks) of sampled test triples'
    ranks r (n,) (a triple's two sides in two rows, `triples` naming each row's triple), resampled
    with replacement, both sides of a triple together -> {"mr": [lo, hi], ..., "seed"}."""
    triple, side_of = np.unique(triples, return_inverse=True)

    def per_triple(v):  # the sum over each triple's sides
        return np.bincount(side_of, weights=v, minlength=len(triple))
    sums = {"mr": per_triple(r), "mrr": per_triple(1 / r)}
    sums |= {f"hits@{k}": per_triple(r <= k) for k in ks}
    idx = np.random.default_rng(seed).integers(0, len(triple), size=(n_resamples, len(triple)))
    sides = per_triple(np.ones(len(r)))[idx].sum(1)
    out = {m: [float(x) for x in np.percentile(s[idx].sum(1) / sides, [2.5, 97.5])]
           for m, s in sums.items()}
    return out | {"resamples": n_resamples, "seed": seed}


def chance_note(value, mean, sd, what):
    """The dev line's warning where its metric is within noise (2 sd) of a random scorer's."""
    if value >= mean + 2 * sd:
        return ""
    return (f"; within noise of a random scorer ({what} {mean:.4f} +- {2 * sd:.4f} on these "
            "triples): nothing learned yet, or text that carries nothing (README, Your own graph)")


def tc_metrics(kg, right, theta, by_relation, per_relation):
    """Triple classification's metrics for the results JSON: dev and test accuracy, the
    thresholds, the test error by relation, and each test triple right (1) or wrong (0), in the
    file's order, as packed bits in hex (bench/paired.py compares two models on the same triples
    with them)."""
    rel = kg.test[:, 1]
    table = [dict(relation=kg.rel_text[r], n=int((rel == r).sum()),
                  error=float(1 - right["test"][rel == r].mean())) for r in np.unique(rel)]
    relation_thresholds = {kg.relations[r]: jsonable(t) for r, t in by_relation.items()}
    return dict(dev_accuracy=float(right["dev"].mean()), test_accuracy=float(right["test"].mean()),
                threshold=jsonable(theta), per_relation_thresholds=per_relation,
                relation_thresholds=relation_thresholds or None, test_error_by_relation=table,
                test_right=np.packbits(right["test"]).tobytes().hex())


def quiet_on_broken_pipe(main):
    """main(), ending quietly where `| head` took what it wanted, as other tools do."""
    try:
        main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error on flush
        sys.exit(1)


def data_files(kg) -> list[Path]:
    """The files a graph was read from: its splits and its entity and relation texts."""
    return [*kg.split_files.values(), kg.folder / kg.text_file, kg.folder / "relation2text.txt"]


def report(args, argv, result, state, scorer, kg, info, meta, out, t0, world_size):
    """Prints the metrics and writes the results JSON (its command, data, model, metrics, how the
    checkpoint was trained, the settings); a full ranking's state is removed once written."""
    pad = None
    if scorer.n_tokens:
        pad = round(scorer.n_padded / scorer.n_tokens, 4)
    settings = dict(text=info["text"], text_file=kg.text_file, prompts=info["prompts"],
                    compile=args.compile, max_seq_length=info["max_seq_length"],
                    candidates=args.candidates, limit=args.limit, seed=args.seed,
                    tokens=scorer.tokens, world_size=world_size, device=str(scorer.device),
                    dtype=scorer.precision, padded_per_real_token=pad)
    command = " ".join(["python evaluate.py", *map(str, argv or sys.argv[1:])])
    data = kg.name if benchmark(kg.name) else files.project_path(kg.folder)  # a graph's folder
    # which weights: the checkpoint's own (None for a base model zero-shot) and the base model's
    checkpoint = info["identity"] if info["ckpt"] else None
    # The adapter's size on disk, what a user stores and ships for each graph (None zero-shot).
    size = Path(args.ckpt).stat().st_size if info["ckpt"] else None
    result = dict(command=command, data=data, model=info["model"], ckpt=info["ckpt"],
                  checkpoint_sha256=checkpoint, checkpoint_bytes=size,
                  base_weights_sha256=info["weights_sha256"],
                  data_fingerprint=kg.fingerprint, **result,
                  wall_s=round(time.time() - t0, 2), train=train_summary(meta), settings=settings)
    result["manifest"] = manifest(argv=["evaluate.py", *map(str, argv or sys.argv[1:])],
                                  data_files=data_files(kg), device=scorer.device)
    name = kg.name + (" (estimate)" if result["estimate"] else "")
    row = [name, info["model"], info["ckpt"] or "zero-shot"]
    # shown even if the write fails
    row += print_lp(result, args.raw) if args.task == "lp" else print_tc(result)
    blob = (json.dumps(result, indent=1) + "\n").encode()
    try:
        files.write_atomic(out, lambda f: f.write(blob))
    except OSError as e:
        keep = "the metrics are printed above"
        if state:
            keep = (f"the ranks stay saved in {state.folder}: make room, and the same command "
                    "writes the results without scoring again")
        raise OutputError(f"cannot write {out} ({e.strerror or e}); the previous file is "
                          f"kept, and {keep}") from None
    # a full ranking is written; an estimate's ranks stay for a larger --limit
    if state and not result["estimate"] and not args.keep_ranks:
        shutil.rmtree(state.folder, ignore_errors=True)
    print(f"wrote {out} ({result['wall_s']:.1f} s)")
    print("| " + " | ".join(row) + " |")


def print_lp(result, raw):
    """Prints the metrics; returns the summary row's MR, MRR and Hits@k (an estimate's with their
    95% interval)."""
    c, m = result["counts"], result["metrics"]
    ks = [int(key[5:]) for key in m["filtered"]["both"]["realistic"] if key.startswith("hits@")]
    pad = result["settings"]["padded_per_real_token"]  # None when every query came from the state
    padding = " (all ranks resumed)"
    if pad is not None:
        padding = f" ({pad:.2f} padded tokens per real one)"
    print(f"{result['data']} {result['split']}: {result['note']}, {c['candidates']:,} candidates, "
          f"{c['queries']:,} queries ({c['resumed_queries']:,} resumed), "
          f"{c['scored_triples']:,} triples scored" + padding)
    for setting in ("filtered", "raw") if raw else ("filtered",):
        hits = " ".join(f"{f'H@{k}':>7}" for k in ks)
        print(f"{setting + ', realistic ranks':26} {'MR':>8} {'MRR':>7} " + hits)
        for side in ("head", "tail", "both"):
            r = m[setting][side]["realistic"]
            hits = " ".join(f"{r[f'hits@{k}']:7.4f}" for k in ks)
            print(f"  {side:24} {r['mr']:8.2f} {r['mrr']:7.4f} " + hits)
    b, r, ci = m["filtered"]["both"], m["filtered"]["both"]["realistic"], m["interval95"]
    mrrs = [b[k]["mrr"] for k in ("optimistic", "realistic", "pessimistic", "expected")]
    print("ties: MRR optimistic {:.4f}, realistic {:.4f}, pessimistic {:.4f}, "
          "expected {:.4f}".format(*mrrs))

    def shown(key, fmt=".4f"):
        interval = f" [{ci[key][0]:{fmt}}, {ci[key][1]:{fmt}}]" if ci else ""
        return f"{r[key]:{fmt}}" + interval
    if ci:
        print(f"95% interval, filtered realistic, both sides (bootstrap over the "
              f"{c['ranked_triples']:,} sampled triples, {ci['resamples']:,} resamples, seed "
              f"{ci['seed']}):")
        names = [("MR", "mr"), ("MRR", "mrr")] + [(f"H@{k}", f"hits@{k}") for k in ks]
        print("  " + "  ".join(f"{name} {shown(key, '.2f' if key == 'mr' else '.4f')}"
                               for name, key in names))
    if "by_category" in result:
        categories.print_table(result["by_category"])
    return [f"{r['mr']:.2f}"] + [shown(key) for key in ["mrr"] + [f"hits@{k}" for k in ks]]


def print_tc(result):
    """Prints the accuracies and the test errors by relation; returns the summary row's two
    accuracies."""
    m = result["metrics"]
    how = f"threshold {m['threshold']}"
    if m["per_relation_thresholds"]:
        how = "one threshold per relation"
    print(f"{result['data']}: dev accuracy {m['dev_accuracy']:.4f}, test accuracy "
          f"{m['test_accuracy']:.4f} ({how}, tuned on dev)")
    print("| relation | n | error % |\n|---|---|---|")
    for row in m["test_error_by_relation"]:
        print(f"| {row['relation']} | {row['n']} | {100 * row['error']:.1f} |")
    return [f"{m['dev_accuracy']:.4f}", f"{m['test_accuracy']:.4f}"]


def harmonic(n: np.ndarray) -> np.ndarray:
    """H_n = 1 + 1/2 + ... + 1/n for float64 arrays of n >= 0 (digamma(n + 1) + Euler's gamma)."""
    return torch.special.digamma(torch.from_numpy(n + 1.0)).numpy() + np.euler_gamma


def random_mrr(lpq, tri: np.ndarray, draws: int = 1000,
               seed: int = 0) -> tuple[float, float]:
    """(mean, sd) of the filtered MRR that random triple scores get on the evaluate.LPQueries
    lpq's test triples `tri`, both
    sides. The answer's rank among the n candidates the filter leaves is uniform, so the mean is
    that of H_n / n; its score is shared by its two sides (at quantile u, each other candidate beats
    it with probability 1 - u), so the sd is drawn: `draws` seeded draws of u and the ranks."""
    n = len(lpq.candidates) - np.diff(lpq.filter_ptr)[lpq.triple_query[tri]] + 1  # (T, 2)
    rng = np.random.default_rng(seed)
    u = rng.random((draws, len(tri), 1))  # (draws, T, 1): one quantile for both sides
    rank = 1 + rng.binomial(n - 1, 1 - u)  # (draws, T, 2)
    return float((harmonic(n) / n).mean()), float((1 / rank).mean((1, 2)).std())

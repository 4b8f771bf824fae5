"""Does a cheap dev signal order checkpoints as the exact dev ranking does?

    python evaluate.py --lp --split dev --limit 20 --ckpt CKPT --out results/NAME-dev.json     # exact, resumable
    python bench/devsignal.py CKPT=results/NAME-dev.state CKPT2=results/NAME2-dev.state [--near 8,32]
    python bench/devsignal.py ... --strata-only --near 32 --draw-seeds 3    # the estimates' spread over draws

For every checkpoint (all on one dataset), on the triples every state ranked on both sides (their filtered realistic
ranks against every entity; dev, or test states of one split), this prints the exact MRR and MR beside cheap dev
signals on the same triples: `random` (ranks among the triples' own entities plus --sample seeded random ones,
train.py's --dev-sample; until 2026-11-26 `near N` too, that sample plus the N entities nearest each query's entity,
which ordered checkpoints worse: RESULTS.md) and the stratified estimates below. A signal is good where it orders the checkpoints as the exact MRR does: the last lines count the pairs each signal orders the same way,
all of them and those the exact ranking itself separates (bench/paired.py: 95% paired bootstrap excludes 0).
`strat N` (train.py --dev-near N) estimates the exact ranks instead of ranking within a sample: per query, every hard candidate (the N entities
nearest its entity and the N nearest its answer, and its entity itself) is scored and counts once; --sample uniform
draws from the other candidates each count for (other candidates)/(draws). The estimated rank is unbiased; its
reciprocal is not (a query whose draws miss its few rivals reads as rank 1), so the MRR printed is the expected
reciprocal rank over what the undrawn candidates may hold (bigrank.stratified_ranks); `1/r` columns: the reciprocal of
the estimated rank, as train.py printed it until 2026-11-29.
`typed N` adds a middle stratum, the entities training shows on the query's side of its relation (--range-draws of
them drawn, each counting for the stratum's size over the draws): the answer's rivals are mostly of its type
(on FB15k-237; on WN18RR they are its neighbours: RESULTS.md).
`self wins`: the share of those dev queries whose own entity outscores the answer ((h, r, h) over (h, r, t) for a
tail query): where it is large, self-negatives (train.py --negatives h,r,t,2) have something to fix.
"""
import argparse, itertools, json, sys
from pathlib import Path
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import data, evaluate  # noqa: E402
from support import bigrank, checkpoints, devices, files, graphs  # noqa: E402
from support.near import entity_embeddings, nearest_entities  # noqa: E402
from paired import paired as paired_bootstrap  # noqa: E402  (bench/paired.py)


def ranked_prefix(state, T):
    """(k, rows, settings) of an evaluate.py state folder: the longest prefix k of its seeded permutation ranked on both
    sides (bigrank.select(T, k, seed), the subset rank_split(limit=k) ranks) and its rows."""
    settings = json.loads((Path(state) / "settings.json").read_text())
    rows = np.concatenate([bigrank.read_rows(f, T) for f in sorted(Path(state).glob("rank*.npz"))])
    sides = np.bincount(rows[:, 0], minlength=T)
    perm = np.random.default_rng(settings["seed"]).permutation(T)
    k = int(np.argmin(np.append(sides[perm] == 2, False)))  # the first triple of the permutation not ranked twice
    if not k:
        raise SystemExit(f"error: {state}: no {settings['split']} triple ranked on both sides yet")
    return k, rows, settings


def stratified(scorer, kg, tri, seed, near, draws, split="dev", range_draws=0):
    """(MRR, MR, mean 1/rank) of the stratified rank estimates of the triples `tri` of a split: the expected
    reciprocal rank train.py's dev line prints since 2026-11-29, MR, and the reciprocal of the estimated rank it
    printed before (bigrank.stratified_ranks, which
    train.py --dev-near reports). range_draws: a middle stratum, the entities training shows on the query's side of
    its relation (its type, for most FB15k-237 relations), `range_draws` of them drawn."""
    ranges = {(side, r): np.unique(kg.train[kg.train[:, 1] == r, col])  # entities training puts on that side of r
              for side, col in ((0, 0), (1, 2)) for r in np.unique(kg.train[:, 1])} if range_draws else {}
    middle = (lambda side, r: (ranges.get((side, r), np.zeros(0, np.int64)), range_draws)) if range_draws else None
    ranks, expected, _ = bigrank.stratified_ranks(scorer, evaluate.lp_queries(kg, split), tri, seed, near, draws, middle, posterior=1000)
    return float(expected["mrr"].mean()), float(np.mean(ranks)), float(np.mean(1 / ranks))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="CKPT=STATE", help="a checkpoint and its exact dev ranking state")
    ap.add_argument("--data-dir", help="folder of the dataset folders (default $PALT_DATA, else ./data)")
    ap.add_argument("--sample", type=int, default=100, help="random dev candidates, as train.py's --dev-sample")
    ap.add_argument("--near", default="8,32", help="the strat N values tried, as train.py's --dev-near (at most 32)")
    ap.add_argument("--range-draws", type=int, default=300, help="typed N: draws from the relation's side in train")
    ap.add_argument("--draw-seeds", type=int, default=1, help="strat/typed: the mean of this many seeded draws "
                    "(seed, seed + 1, ...), with their spread (sd)")
    ap.add_argument("--strata-only", action="store_true", help="skip train.py's --dev-sample signal (random)")
    ap.add_argument("--compile", action="store_true", help="as evaluate.py --compile")
    args = ap.parse_args()
    device, dtype = torch.device("cpu"), devices.resolve_dtype("auto", "cpu")
    nears = [int(n) for n in args.near.split(",")]
    pairs = [(ckpt, Path(state)) for ckpt, _, state in (p.partition("=") for p in args.pairs)]
    settings = [json.loads((state / "settings.json").read_text()) for _, state in pairs]
    for k in ("data", "data_fingerprint", "split", "candidates", "seed"):
        if len({str(s.get(k)) for s in settings}) > 1:
            raise SystemExit(f"error: the states differ in {k}: not the same ranking task")
    task = settings[0]
    kg = graphs.load_kg(task["data"], args.data_dir, text=task["text"])
    split, T = task["split"], len(getattr(kg, task["split"]))
    prefixes = [ranked_prefix(state, T) for _, state in pairs]
    k = min(p[0] for p in prefixes)  # the triples every state ranked on both sides: one task for all
    tri = np.sort(np.random.default_rng(task["seed"]).permutation(T)[:k])
    chosen = set(tri.tolist())
    exact = [{(int(t), int(side)): (o + p) / 2 for t, side, o, p, *_ in rows if t in chosen}
             for _, rows, _ in prefixes]  # realistic filtered ranks, as paired.py reads them
    table, near, names = [], None, None
    for (ckpt, state), (_, _, settings), ranks in zip(pairs, prefixes, exact):
        model, meta, loaded = checkpoints.load_checkpoint(ckpt)
        if settings["checkpoint_sha256"] != files.sha256_file(ckpt):
            raise SystemExit(f"error: {state} ranked another checkpoint than {ckpt}")
        if meta["text"] != task["text"]:
            kg = graphs.load_kg(task["data"], args.data_dir, text=meta["text"])
        enc = data.encode(kg, loaded.tokenizer)
        if names != (kg.fingerprint, meta["model"], meta["text"]):  # the frozen encoder: once per data, model, text
            near = nearest_entities(kg, entity_embeddings(model.bert, kg.split_entities, enc, device, dtype), max(nears))
            names = (kg.fingerprint, meta["model"], meta["text"])
        scorer = evaluate.Scorer(model.eval(), enc, meta["prompts"], meta["max_seq_length"], device, dtype,
                                 compile=args.compile)
        r = np.array(list(ranks.values()))
        row = {"ckpt": files.project_path(ckpt), "split": split, "triples": k, "exact": float(np.mean(1 / r)),
               "exact MR": float(r.mean())}
        limit = k if k < T else None  # rank_split ranks select()'s subset: the same triples
        if not args.strata_only:  # train.py's signals: a rank among the sample, not an estimate of the exact one
            row["random"] = evaluate.rank_split(scorer, kg, split, limit, task["seed"], sample=args.sample)["mrr"]
        for name, n, range_draws in [(f"strat {n}", n, 0) for n in [0] + nears] + [(f"typed {n}", n, args.range_draws)
                                                                                 for n in (0, max(nears))]:
            runs = np.array([stratified(scorer, kg, tri, task["seed"] + j, near[:, :n], args.sample, split,
                                        range_draws) for j in range(args.draw_seeds)])  # (draws, [MRR, MR, 1/r])
            row[name], row[f"{name} MR"], row[f"{name} 1/r"] = runs.mean(0).tolist()
            row[f"{name} sd"] = float(runs[:, 0].std())
        triples = getattr(kg, split)[tri]
        answer = scorer(triples).float()
        own = [scorer(triples[:, [0, 1, 0]]).float(), scorer(triples[:, [2, 1, 2]]).float()]  # tail, head
        row["self wins"] = float(torch.cat([o > answer for o in own]).float().mean())
        table.append(row)
        print(json.dumps(row), flush=True)
    stratas = [f"strat {n}" for n in [0] + nears] + [f"typed {n}" for n in (0, max(nears))]
    signals = ([] if args.strata_only else ["random"]) + stratas
    top = f"strat {max(nears)}"
    print(f"\n| checkpoint | {split} triples | exact MRR | exact MR | " + " | ".join(f"{s} MRR" for s in signals)
          + f" | {top} 1/r (before) | {top} MR | self wins |")
    print("|---" * (7 + len(signals)) + "|")
    for r in table:
        print(f"| {r['ckpt']} | {r['triples']} | {r['exact']:.4f} | {r['exact MR']:.0f} | "
              + " | ".join(f"{r[s]:.4f}" for s in signals) + f" | {r[f'{top} 1/r']:.4f} | {r[f'{top} MR']:.0f} | "
              f"{r['self wins']:.2f} |")
    # which pairs the exact ranking itself orders: the paired bootstrap's 95% interval of the difference excludes 0
    pairs = list(itertools.combinations(range(len(table)), 2))
    sure = {"exact": [], "exact MR": []}
    for i, j in pairs:
        res = paired_bootstrap(exact[i], exact[j])["both"]
        for key, m, f in (("exact", "mrr", ".3f"), ("exact MR", "mr", ".0f")):
            _, _, d, (lo, hi) = res[m]
            sure[key].append(lo > 0 or hi < 0)
            print(f"exact: {table[j]['ckpt']} - {table[i]['ckpt']}: {m.upper()} {d:+{f}} [{lo:+{f}}, {hi:+{f}}]"
                  + ("" if sure[key][-1] else " (not separated)"))
    for s in signals + [f"{s} MR" for s in stratas]:
        key = "exact MR" if s.endswith("MR") else "exact"
        agree = [np.sign(table[i][key] - table[j][key]) * np.sign(table[i][s] - table[j][s]) for i, j in pairs]
        on_sure = [a for a, ok in zip(agree, sure[key]) if ok]
        label = "exact MR" if key == "exact MR" else "exact MRR"
        print(f"{s}: orders {agree.count(1)} of {len(pairs)} checkpoint pairs as the {label} does, {agree.count(-1)} "
              f"the other way, {agree.count(0)} tied; {on_sure.count(1)} of the {len(on_sure)} pairs it separates")


if __name__ == "__main__":
    main()

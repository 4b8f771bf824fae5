"""Does a cheap dev signal order checkpoints as the exact dev ranking does? (issue 32, item 4)

    python evaluate.py --lp --split dev --limit 20 --ckpt CKPT --out results/NAME-dev.json     # exact, resumable
    python results/devsignal.py CKPT=results/NAME-dev.state CKPT2=results/NAME2-dev.state [--near 8,32]

For every checkpoint (all on one dataset), on the dev triples its exact state ranked (their filtered realistic
ranks against every entity), this prints the exact dev MRR beside train.py's sampled dev signals on the same triples:
`random` (the triples' own entities plus --sample seeded random ones, train.py's --dev-sample) and `near N` (those,
plus the N entities nearest each query's entity by the frozen encoder, train.py's --dev-near N). A signal is good
where it orders the checkpoints as the exact MRR does: the last lines count the pairs each signal orders the same way.
`self wins`: the share of those dev queries whose own entity outscores the answer ((h, r, h) over (h, r, t) for a
tail query): where it is large, self-negatives (train.py --negatives h,r,t,2) have something to fix.
"""
import argparse, itertools, json, sys
from pathlib import Path
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import bert, data, evaluate, files, palt  # noqa: E402


def exact_mrr(state, T):
    """(MRR of the realistic filtered ranks, the dev triples) of an evaluate.py state folder over the longest prefix of
    its seeded permutation ranked on both sides: evaluate.select(T, k, seed), the subset rank_split(limit=k) ranks."""
    settings = json.loads((Path(state) / "settings.json").read_text())
    if settings.get("split") != "dev":
        raise SystemExit(f"error: {state}: ranks of the {settings.get('split')} split; rank dev (--split dev)")
    rows = np.concatenate([evaluate.read_rows(f, T) for f in sorted(Path(state).glob("rank*.npz"))])
    sides = np.bincount(rows[:, 0], minlength=T)
    perm = np.random.default_rng(settings["seed"]).permutation(T)
    k = int(np.argmin(np.append(sides[perm] == 2, False)))  # the first triple of the permutation not ranked twice
    tri = np.sort(perm[:k])
    if not k:
        raise SystemExit(f"error: {state}: no dev triple ranked on both sides yet")
    rows = rows[np.isin(rows[:, 0], tri)]
    return float((2 / (rows[:, 2] + rows[:, 3])).mean()), tri, settings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="CKPT=STATE", help="a checkpoint and its exact dev ranking state")
    ap.add_argument("--data-dir", help="folder of the dataset folders (default $PALT_DATA, else ./data)")
    ap.add_argument("--sample", type=int, default=100, help="random dev candidates, as train.py's --dev-sample")
    ap.add_argument("--near", default="8,32", help="the --dev-near values tried (at most 32)")
    ap.add_argument("--compile", action="store_true", help="as evaluate.py --compile")
    args = ap.parse_args()
    device, dtype = torch.device("cpu"), bert.resolve_dtype("auto", "cpu")
    nears = [int(n) for n in args.near.split(",")]
    table, near, names = [], None, None
    for pair in args.pairs:
        ckpt, _, state = pair.partition("=")
        model, meta, loaded = palt.load_checkpoint(ckpt)
        kg = data.load_kg(meta["data"], args.data_dir, text=meta["text"])
        exact, tri, settings = exact_mrr(state, len(kg.dev))
        if settings["checkpoint_sha256"] != files.sha256_file(ckpt):
            raise SystemExit(f"error: {state} ranked another checkpoint than {ckpt}")
        enc = data.encode(kg, loaded.tokenizer)
        if near is None or names != (kg.fingerprint, meta["model"]):  # the frozen encoder: once per data and model
            near, names = data.nearest_entities(model.bert, kg, enc, max(nears), device, dtype), (kg.fingerprint,
                                                                                                  meta["model"])
        scorer = evaluate.Scorer(model.eval(), enc, meta["prompts"], meta["max_seq_length"], device, dtype,
                                 compile=args.compile)
        row = {"ckpt": files.project_path(ckpt), "exact": exact, "triples": len(tri)}
        limit = len(tri) if len(tri) < len(kg.dev) else None  # rank_split ranks select()'s subset: the same triples
        row["random"] = evaluate.rank_split(scorer, kg, "dev", limit, settings["seed"], sample=args.sample)["mrr"]
        for n in nears:
            row[f"near {n}"] = evaluate.rank_split(scorer, kg, "dev", limit, settings["seed"], sample=args.sample,
                                                   near=near[:, :n])["mrr"]
        answer = scorer(kg.dev[tri]).float()
        own = [scorer(kg.dev[tri][:, [0, 1, 0]]).float(), scorer(kg.dev[tri][:, [2, 1, 2]]).float()]  # tail, head
        row["self wins"] = float(torch.cat([o > answer for o in own]).float().mean())
        table.append(row)
        print(json.dumps(row), flush=True)
    signals = ["random"] + [f"near {n}" for n in nears]
    print(f"\n| checkpoint | dev triples | exact MRR | " + " | ".join(f"{s} MRR" for s in signals) + " | self wins |")
    print("|---" * (4 + len(signals)) + "|")
    for r in table:
        print(f"| {r['ckpt']} | {r['triples']} | {r['exact']:.4f} | " + " | ".join(f"{r[s]:.4f}" for s in signals)
              + f" | {r['self wins']:.2f} |")
    pairs = list(itertools.combinations(table, 2))
    for s in signals:
        agree = [np.sign(a["exact"] - b["exact"]) * np.sign(a[s] - b[s]) for a, b in pairs]
        print(f"{s}: orders {agree.count(1)} of {len(pairs)} checkpoint pairs as the exact dev MRR does, "
              f"{agree.count(-1)} the other way, {agree.count(0)} tied")


if __name__ == "__main__":
    main()

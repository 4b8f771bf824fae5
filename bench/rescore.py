"""Does this adapter file give the figures a results JSON recorded? Re-scores a few of its triples and compares.

    python bench/rescore.py weights/palt-wn18rr-minilm.safetensors results/palt-wn18rr-minilm.json --triples 2 \
        --tolerance 0.02
    python bench/rescore.py weights/palt-umls-minilm.safetensors results/palt-umls-minilm.json \
        --state results/umls-cpu-trainneg-s1-lp660.state --triples 20
    python bench/rescore.py weights/palt-wn11-minilm.safetensors results/palt-wn11-minilm.json     # the dev split
    ... --write   # where they agree: the JSON gains the adapter's sha256 as checkpoint_sha256

Link prediction: the first --triples of the ranking state's seeded subset (the JSON's own .state, or --state: one made
with the same adapter file, by its checkpoint_sha256) are ranked again with the adapter, in the state's precision where
this CPU has it, and their realistic filtered ranks are compared one by one with the state's (--tolerance: a share of
the recorded rank they may differ by, for bf16 ranks made on another machine). Triple classification:
the whole dev split is scored again and its accuracy at the threshold tuned on it compared with the JSON's dev accuracy
(a near-tie or two may flip across CPUs and thread counts: within --tc-flips triples). Older JSONs name only the base
model's sha256 (weights_sha256); --write adds the adapter's, so that the JSON and weights/README agree by hash.
"""
import argparse, json, sys
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data, evaluate  # noqa: E402
from support import bigrank, checkpoints, devices, evalcli, files, graphs  # noqa: E402


def rescore_lp(model, meta, enc, kg, state, n, dtype, tolerance):
    """(pairs compared, pairs that differ beyond `tolerance` of the recorded rank, pairs not equal): the state's ranks
    of its first n seeded triples against ours."""
    settings = json.loads((state / "settings.json").read_text())
    rows = np.concatenate([bigrank.read_rows(f, len(kg.test)) for f in sorted(state.glob("rank*.npz"))])
    recorded = {(int(t), int(s)): (o + p) / 2 for t, s, o, p, *_ in rows}
    first = np.random.default_rng(settings["seed"]).permutation(len(kg.test))  # --limit's order (bigrank.select)
    tri = np.sort([t for t in first if (t, 0) in recorded and (t, 1) in recorded][:n])
    scorer = evaluate.Scorer(model, enc, meta["prompts"], meta["max_seq_length"], "cpu", dtype)
    lpq = evaluate.lp_queries(kg, settings["split"], settings["candidates"])
    queries = np.unique(lpq.triple_query[tri])
    block = max(1, (1 << 16) // len(lpq.candidates))
    ours = np.concatenate([r for _, r in evaluate.rank_queries(scorer, lpq, tri, queries, block)])
    differ, unequal = [], 0
    for t, s, o, p, *_ in ours:
        rank, was = float((o + p) / 2), float(recorded[int(t), int(s)])
        unequal += rank != was
        if abs(rank - was) > tolerance * was:
            differ.append((int(t), int(s), rank, was))
        print(f"triple {t} side {s}: rank {rank:g}, recorded {was:g}", flush=True)
    return len(ours), differ, unequal


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("adapter")
    ap.add_argument("json")
    ap.add_argument("--state", help="link prediction: a ranking state of this adapter (default: the JSON's .state)")
    ap.add_argument("--triples", type=int, default=3, help="link prediction: how many of the state's triples")
    ap.add_argument("--tc-flips", type=int, default=2, help="triple classification: dev triples that may flip")
    ap.add_argument("--tolerance", type=float, default=0.0, help="link prediction: a rank may differ by this share "
                    "of the recorded one (bf16 made on another machine: near-tied candidates among thousands swap)")
    ap.add_argument("--data-dir", help="default $PALT_DATA, else data/")
    ap.add_argument("--write", action="store_true", help="where they agree, add checkpoint_sha256 to the JSON")
    args = ap.parse_args()
    result = json.loads(Path(args.json).read_text())
    sha = files.sha256_file(args.adapter)
    model, meta, loaded = checkpoints.load_checkpoint(args.adapter)
    model.eval()
    if result.get("train") != evalcli.train_summary(meta):
        raise SystemExit(f"error: {args.json} evaluates another training run than {args.adapter}'s")
    kg = graphs.load_kg(meta["data"], args.data_dir, meta["text"])
    if kg.fingerprint != result["data_fingerprint"]:
        raise SystemExit(f"error: {args.json} was measured on other {kg.name} files")
    enc = data.encode(kg, loaded.tokenizer)
    stored = result["settings"]["dtype"]
    native = devices.resolve_dtype("auto", "cpu")
    dtype = stored if stored == "fp32" or native == "bf16" else "fp32"
    if result["task"] == "lp":
        state = Path(args.state or Path(args.json).with_suffix(".state"))
        made_with = json.loads((state / "settings.json").read_text())["checkpoint_sha256"]
        if made_with != sha:
            raise SystemExit(f"error: {state} ranked another adapter (sha256 {made_with[:12]}), not {args.adapter}")
        n, differ, unequal = rescore_lp(model, meta, enc, kg, state, args.triples, dtype, args.tolerance)
        agree = not differ
        print(f"{n} ranks of {state} re-ranked with {args.adapter} ({dtype}): {n - unequal} equal, "
              f"{unequal - len(differ)} within {args.tolerance:.0%}, {len(differ)} beyond: {differ}")
    else:
        scorer = evaluate.Scorer(model, enc, meta["prompts"], meta["max_seq_length"], "cpu", dtype)
        _, acc = evaluate.best_threshold(scorer.numpy(kg.dev), kg.dev_labels)
        flips = round(abs(acc - result["metrics"]["dev_accuracy"]) * len(kg.dev))
        agree = flips <= args.tc_flips
        print(f"dev accuracy {acc:.6f} with {args.adapter} ({dtype}), recorded "
              f"{result['metrics']['dev_accuracy']:.6f}: {flips} of {len(kg.dev)} dev triples differ")
    if not agree:
        raise SystemExit(f"error: {args.adapter} does not give {args.json}'s figures")
    if args.write:
        result["checkpoint_sha256"] = sha
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"{args.json}: checkpoint_sha256 {sha}")


if __name__ == "__main__":
    main()

"""Paired comparison of two models on the same test triples (link prediction or triple classification): B - A, bootstrapped.

    python bench/paired.py results/wn18rr-noself-lp.state results/palt-wn18rr-minilm.state
    python bench/paired.py results/wn18rr-1ep-lp.state results/palt-wn18rr-minilm.state --by-relation   # + per relation

Each argument is an evaluate.py ranking state folder (settings.json, rank*.npz: rows of test triple, side, filtered
optimistic/pessimistic, raw optimistic/pessimistic). Only the triples ranked on both sides by both are compared; the
bootstrap resamples those triples jointly (one index draw serves A and B and both sides), so the interval is that of
the paired difference, far narrower than two independent intervals when the rankings agree on which triples are hard.
--by-relation adds one row per relation of the compared triples (both sides; the graph read from $PALT_DATA).

    python bench/paired.py results/wn11-palt-3ep-trainneg.json results/wn11-ft-trainneg.json

Two triple-classification results JSONs (evaluate.py --tc; `test_right` in their metrics): test accuracy, each model
at its own threshold tuned on dev, B - A with the interval of a bootstrap over the test triples.
"""
import argparse, json, os, sys
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import graphs  # noqa: E402

METRICS = ("mrr", "mr", "hits@1", "hits@3", "hits@10")


def ranks(folder):
    """{(triple, side): realistic filtered rank} of a state folder, and its settings."""
    folder = Path(folder)
    files = sorted(folder.glob("rank*.npz"))
    if not (folder / "settings.json").is_file() or not files:
        raise SystemExit(f"error: {folder}: not a ranking state folder (settings.json and rank*.npz)")
    rows = np.concatenate([np.load(f, allow_pickle=False)["rows"] for f in files])
    settings = json.loads((folder / "settings.json").read_text())
    return {(int(t), int(s)): (o + p) / 2 for t, s, o, p, *_ in rows}, settings


def metric(r, name):
    if name == "mrr":
        return 1 / r
    return r if name == "mr" else (r <= int(name.split("@")[1])).astype(float)


def paired(a, b, n_resamples=10000, seed=0):
    """{side: {metric: (A, B, B - A, [lo, hi])}} over the triples ranked on both sides by both."""
    triples = sorted({t for t, _ in a} & {t for t, _ in b})
    triples = [t for t in triples if all((t, s) in a and (t, s) in b for s in (0, 1))]
    if not triples:
        raise SystemExit("error: the two states share no triple ranked on both sides")
    ra, rb = (np.array([[d[(t, s)] for s in (0, 1)] for t in triples]) for d in (a, b))  # (n, 2): head, tail
    idx = np.random.default_rng(seed).integers(0, len(triples), size=(n_resamples, len(triples)))
    out = {"triples": len(triples)}
    for side, cols in (("head", [0]), ("tail", [1]), ("both", [0, 1])):
        out[side] = {}
        for m in METRICS:
            va, vb = metric(ra[:, cols], m).mean(1), metric(rb[:, cols], m).mean(1)  # per triple
            d = vb - va
            lo, hi = np.percentile(d[idx].mean(1), [2.5, 97.5])
            out[side][m] = (float(va.mean()), float(vb.mean()), float(d.mean()), [float(lo), float(hi)])
    return out


def rights(path):
    """Each test triple right (True) or wrong, in the file's order, and the results JSON it came from."""
    result = json.loads(Path(path).read_text())
    m = result.get("metrics", {})
    if result.get("task") != "tc" or "test_right" not in m:
        raise SystemExit(f"error: {path}: not a triple-classification result with test_right (evaluate.py --tc "
                         "writes it since 2026-11-29)")
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(m["test_right"]), dtype=np.uint8))
    return bits[:result["counts"]["test"]].astype(bool), result


def paired_accuracy(a, b, n_resamples=10000, seed=0):
    """(A, B, B - A, [lo, hi]): test accuracy of two models on the same triples, bootstrapped jointly."""
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_resamples, len(a)))
    d = b.astype(float) - a
    lo, hi = np.percentile(d[idx].mean(1), [2.5, 97.5])
    return float(a.mean()), float(b.mean()), float(d.mean()), [float(lo), float(hi)]


def main_tc(args):
    """B - A in test accuracy, each model at its own dev-tuned threshold."""
    (a, ra), (b, rb) = rights(args.a), rights(args.b)
    for k in ("data", "data_fingerprint", "counts"):
        if ra.get(k) != rb.get(k):
            raise SystemExit(f"error: the results differ in {k} ({ra.get(k)} vs {rb.get(k)}): not the same test triples")
    va, vb, d, (lo, hi) = paired_accuracy(a, b, args.resamples)
    print(f"B - A on {len(a)} test triples; 95% paired bootstrap ({args.resamples:,} resamples)")
    print(f"A {args.a}\nB {args.b}\n| metric | A | B | B - A [95%] |\n|---|---|---|---|")
    print(f"| accuracy | {100 * va:.2f} | {100 * vb:.2f} | {100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}] |")
    print(f"right only by A: {int((a & ~b).sum())}, only by B: {int((b & ~a).sum())}, by both: {int((a & b).sum())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--by-relation", action="store_true", help="also MRR and Hits@10 per relation (both sides)")
    ap.add_argument("--data-dir", default=os.environ.get("PALT_DATA"), help="with --by-relation (default $PALT_DATA, "
                    "else ../shared/data)")
    args = ap.parse_args()
    if args.a.endswith(".json") and args.b.endswith(".json"):
        return main_tc(args)
    (a, sa), (b, sb) = ranks(args.a), ranks(args.b)
    # the fingerprint covers the text files too: other entity texts (names vs descriptions) rank the same triples
    same_triples = ("data_fingerprint",) if sa.get("text") == sb.get("text") else ()
    for k in ("data", *same_triples, "split", "candidates", "seed"):
        if sa.get(k) != sb.get(k):
            raise SystemExit(f"error: the states differ in {k} ({sa.get(k)} vs {sb.get(k)}): not the same ranking task")
    res = paired(a, b, args.resamples)
    print(f"B - A on {res['triples']} {sa.get('split', 'test')} triples ranked by both; 95% paired bootstrap "
          f"({args.resamples:,} resamples)")
    if not same_triples:
        print(f"entity texts differ ({sa.get('text')} vs {sb.get('text')}): triples matched by their place in the split")
    print(f"A {args.a}\nB {args.b}\n| side | metric | A | B | B - A [95%] |\n|---|---|---|---|---|")
    for side in ("head", "tail", "both"):
        for m, (va, vb, d, (lo, hi)) in res[side].items():
            f = ".1f" if m == "mr" else ".3f"
            print(f"| {side} | {m} | {va:{f}} | {vb:{f}} | {d:+{f}} [{lo:+{f}}, {hi:+{f}}] |")
    if args.by_relation:
        kg = graphs.load_kg(sa["data"], args.data_dir, sa.get("text", "name"))
        rel = getattr(kg, sa.get("split", "test"))[:, 1]  # the relation of each ranked triple, by its place in the split
        print("\n| relation | triples | MRR A | MRR B | B - A [95%] | Hits@10 A | Hits@10 B | B - A [95%] |\n|---|---|---|---|---|---|---|---|")
        for r in np.unique([rel[t] for t, _ in a]):
            ar, br = ({k: v for k, v in d.items() if rel[k[0]] == r} for d in (a, b))
            if not {t for t, _ in ar} & {t for t, _ in br}:
                continue
            res = paired(ar, br, args.resamples)
            (ma, mb, md, (ml, mh)), (ha, hb, hd, (hl, hh)) = res["both"]["mrr"], res["both"]["hits@10"]
            print(f"| {kg.relations[r]} | {res['triples']} | {ma:.3f} | {mb:.3f} | {md:+.3f} [{ml:+.3f}, {mh:+.3f}] "
                  f"| {ha:.3f} | {hb:.3f} | {hd:+.3f} [{hl:+.3f}, {hh:+.3f}] |")


if __name__ == "__main__":
    main()

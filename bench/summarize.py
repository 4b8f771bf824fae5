"""Markdown rows for RESULTS.md from evaluate.py's JSON files, and mean ± sd (sample sd) over them.

    python bench/summarize.py results/umls-iso-bf16-bucket-s*.json      (one row each, then mean ± sd)
The per-epoch dev curve of a run is in its training log (results/NAME.train.log, "dev after epoch" lines).
"""
import argparse, json
import numpy as np

LP = ("mr", "mrr", "hits@1", "hits@3", "hits@10")
TC = ("dev_accuracy", "test_accuracy")


def values(result):
    """The reported figures of one result: filtered realistic ranks (both sides) or dev/test accuracy."""
    m = result["metrics"]
    if result["task"] == "lp":
        r = m["filtered"]["both"]["realistic"]
        return {k: r[k] for k in LP}
    return {k: 100 * m[k] for k in TC}


def fmt(k, v):
    return f"{v:.2f}" if k in ("mr",) + TC else f"{v:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    results = {f: json.load(open(f)) for f in args.files}
    rows = {f: values(r) for f, r in results.items()}
    keys = list(next(iter(rows.values())))
    if any(list(v) != keys for v in rows.values()):
        raise SystemExit("error: the files mix link prediction and triple classification results")
    print("| file | training steps (min) | " + " | ".join(keys) + " |\n|---|---|" + "---|" * len(keys))
    for f, v in rows.items():
        wall = (results[f].get("train") or {}).get("wall_s")
        print(f"| {f} | {wall / 60:.1f} | " if wall else f"| {f} | | ", end="")
        print(" | ".join(fmt(k, v[k]) for k in keys) + " |")
    if len(rows) > 1:
        a = {k: np.array([v[k] for v in rows.values()]) for k in keys}
        print(f"| mean ± sd of {len(rows)} | | " + " | ".join(f"{fmt(k, a[k].mean())} ± {fmt(k, a[k].std(ddof=1))}"
                                                      for k in keys) + " |")


if __name__ == "__main__":
    main()

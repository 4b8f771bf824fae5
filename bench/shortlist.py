"""Measure --predict's shortlist (predict.Shortlist) against the exact ranking: truth, then the list.

    python bench/shortlist.py exact --data fb15k-237 --triples 100      # 200 dev queries (both sides), resumable
    python bench/shortlist.py exact --data wn18rr --triples 25          # 50 queries, ~3 min each on 2 cores
    python bench/shortlist.py measure --data fb15k-237 --sizes 1000,1500,2000    # resumable too
    python bench/shortlist.py table --data fb15k-237                    # -> results/shortlist-fb15k-237.json
    python bench/shortlist.py latency --data fb15k-237 --baseline       # seconds a query, all cores, into that JSON
    python bench/shortlist.py pool --data wn18rr && python bench/shortlist.py variants --data wn18rr   # designs
    python bench/shortlist.py anchors --data wn18rr    # every relation's anchor, shipped in weights/anchors/

`exact` scores every candidate entity (the split's, as --predict does) of each query with the shipped adapter and
keeps the top TOP (indices into kg.split_entities, scores) per query in results/shortlist/DATA-exact/qNNNN.npz,
one file per query as it finishes, so a run stopped anywhere resumes where it stopped and can be committed part-way.
The queries: the first --triples of one seeded permutation of the dev triples, each asked both ways, (h, r, ?) and
(?, r, t): a larger --triples extends a smaller one's set.

`measure` asks each of those queries through predict.Shortlist of each size K as evaluate.py --predict does (train
facts only, so the dev answer gets no help; both rounds timed: the latency after the model loaded;
anchors and embeddings built on the way are timed apart, as --predict reports them), and compares the top 10 with the
exact one: the share of the exact top 10 it recovers, and whether it keeps the dev answer when the exact top 10 has it.
One JSON line per query in results/shortlist/DATA-measure.jsonl; `table` sums them up. Its seconds are those of a
run that shared the CPU with others; `latency` times the chosen size alone, all cores, after the model loaded and
with the anchors cached (the first query of a relation and side builds its anchor: timed apart, as `built_s`).

`pool` scores a generous pool of each measured query (the shipped design's list of --size 2,500, never stopped
early; runs/shortlist-pool/DATA/, resumable, not committed: 2-8 MB, ~15 min for WN18RR and ~40 for FB15k-237 on a
core), so that `variants` can compare other designs (rounds, the best that must stay the same to stop early and for
how many rounds) at each size without scoring: a candidate outside the pool and the exact top 100 cannot be in the
exact top 10, and counts as scored lowest when a round picks its best (`variants` runs predict.Shortlist itself,
its scores looked up).
"""
import argparse, json, sys, time
from pathlib import Path
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data, evaluate  # noqa: E402
from support import checkpoints, devices, evalcli, files, graphs, predict  # noqa: E402
from support.bigrank import select  # noqa: E402
from support.manifest import manifest  # noqa: E402

TOP = 100  # the exact top 10 and a little more (measure reads the top 10)


def dev_queries(kg, n_triples, seed=0):
    """(Q, 4) int64 rows (entity, relation, side, answer): side 1 asks (e, r, ?), side 0 (?, r, e)."""
    tri = kg.dev[select(len(kg.dev), n_triples, seed, ordered=True)]
    q = np.empty((2 * len(tri), 4), np.int64)
    q[0::2] = np.stack([tri[:, 0], tri[:, 1], np.ones(len(tri), np.int64), tri[:, 2]], 1)  # tail queries
    q[1::2] = np.stack([tri[:, 2], tri[:, 1], np.zeros(len(tri), np.int64), tri[:, 0]], 1)  # head queries
    return q


def load(name):
    """(scorer, kg) of the adapter shipped for `name`, in the 'auto' dtype, as evaluate.py --predict builds them."""
    ckpt = files.ROOT / "weights" / f"palt-{name}-minilm.safetensors"
    model, meta, loaded = checkpoints.load_checkpoint(ckpt)
    kg = graphs.load_kg(name, text=meta["text"])
    dtype = devices.resolve_dtype("auto", "cpu")
    scorer = evaluate.Scorer(model, data.encode(kg, loaded.tokenizer), [int(p) for p in meta["prompts"]],
                             int(meta["max_seq_length"]), "cpu", dtype)
    return scorer, kg, ckpt, dtype


def exact(args):
    scorer, kg, ckpt, dtype = load(args.data)
    folder = files.ROOT / "results" / "shortlist" / f"{kg.name}-exact"
    folder.mkdir(parents=True, exist_ok=True)
    queries, cand = dev_queries(kg, args.triples), kg.split_entities
    print(f"{kg.name}: {len(queries)} dev queries x {len(cand):,} candidates, {dtype}, {ckpt.name} -> {folder}")
    numbered = list(enumerate(queries))
    for i, (e, r, side, answer) in reversed(numbered) if args.reverse else numbered:  # a second process: from the end
        path = folder / f"q{i:04d}.npz"
        if path.exists():
            continue
        t0 = time.time()
        s = scorer.numpy(predict.query_triples(e, r, side, cand))
        seconds = time.time() - t0
        top = np.argsort(-s, kind="stable")[:TOP]
        files.write_atomic(path, lambda f: np.savez(f, query=np.array([e, r, side, answer]), top=top.astype(np.int32),
                                                    score=s[top], seconds=seconds, answer_score=s[cand == answer]))
        print(f"q{i:04d} {kg.entities[e]} {kg.relations[r]} side {side}: {seconds:.1f} s", flush=True)


def measure(args):
    scorer, kg, ckpt, dtype = load(args.data)
    folder = files.ROOT / "results" / "shortlist"
    exact_files = sorted((folder / f"{kg.name}-exact").glob("q*.npz"))
    sizes, cand = sorted(args.sizes), kg.split_entities
    short = predict.Shortlist(kg, scorer, cand, files.sha256_file(ckpt), loaded_base_sha(ckpt), max(sizes))
    out = folder / f"{kg.name}-measure.jsonl"
    done = {json.loads(line)["q"] for line in out.read_text().splitlines()} if out.exists() else set()
    print(f"{kg.name}: {len(exact_files)} exact queries, {len(done)} measured; sizes {sizes}; cache {short.folder}")
    for path in exact_files:
        z = np.load(path)
        e, r, side, answer = (int(x) for x in z["query"])
        if path.stem in done:
            continue
        t = time.time()
        short.sources(e, r, side)  # builds what the query's relation and side lack (an anchor), timed apart
        row = dict(q=path.stem, query=[e, r, side, answer], list_s=time.time() - t, built=short.built[:], sizes={})
        short.built.clear()
        exact10 = cand[z["top"][:10]]
        row["answer_in_exact_top10"] = bool(answer in exact10)
        for K in sizes:
            short.size = K
            t = time.time()
            some, s = short(e, r, side)
            top10 = some[np.argsort(-s, kind="stable")[:10]]
            row["sizes"][K] = dict(seconds=time.time() - t, scored=len(some),
                                   recovered=int(np.isin(exact10, top10).sum()), answer_kept=bool(answer in top10))
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(path.stem, " ".join(f"K{K}: {v['recovered']}/10 {v['seconds']:.1f}s" for K, v in row["sizes"].items()),
              "built " + ", ".join(f"{w} {s:.0f}s" for w, s in row["built"]) if row["built"] else "", flush=True)


def loaded_base_sha(ckpt):
    _, meta = checkpoints.read_checkpoint(ckpt, tensors=False)
    return meta["weights_sha256"]


def table(args):
    rows = [json.loads(line) for line in (files.ROOT / "results" / "shortlist" /
                                          f"{args.data}-measure.jsonl").read_text().splitlines()]
    print(f"{args.data}: {len(rows)} dev queries")
    summary = {}
    for K in rows[0]["sizes"]:
        v = [r["sizes"][K] for r in rows]
        held = [r["sizes"][K]["answer_kept"] for r in rows if r["answer_in_exact_top10"]]
        summary[K] = dict(queries=len(rows), recovered=float(np.mean([x["recovered"] for x in v]) / 10),
                          all_ten=float(np.mean([x["recovered"] == 10 for x in v])),
                          answers_in_exact_top10=len(held), answers_kept=float(np.mean(held)) if held else None,
                          seconds_median=float(np.median([x["seconds"] for x in v])),
                          seconds_p90=float(np.percentile([x["seconds"] for x in v], 90)),
                          scored_median=float(np.median([x["scored"] for x in v])))
        m = summary[K]
        print(f"| {args.data} | {K} | {len(rows)} | {100 * m['recovered']:.1f}% | {100 * m['all_ten']:.0f}% | "
              f"{m['answers_kept'] and 100 * m['answers_kept']:.1f}% of {len(held)} | {m['seconds_median']:.2f} s | "
              f"{m['seconds_p90']:.2f} s |")
    built = [s for r in rows for _, s in r["built"]]
    print(f"built on the way (anchors, embeddings): {len(built)} parts, {sum(built) / 60:.1f} min")
    out = files.ROOT / "results" / f"shortlist-{args.data}.json"
    ckpt = f"weights/palt-{args.data}-minilm.safetensors"  # the shipped adapter: how it was trained, below
    result = dict(command="python bench/shortlist.py measure --data " + args.data, data=args.data, ckpt=ckpt,
                  train=evalcli.train_summary(checkpoints.read_checkpoint(files.ROOT / ckpt, tensors=False)[1]),
                  sizes=summary, built_parts=len(built), built_s=sum(built),
                  manifest=manifest(argv=sys.argv, data_files=evalcli.data_files(graphs.load_kg(args.data))))
    if out.exists():  # a latency figure stays
        result |= {k: v for k, v in json.loads(out.read_text()).items() if k == "latency"}
    files.write_atomic(out, lambda f: f.write((json.dumps(result, indent=1) + "\n").encode()))


def latency(args):
    scorer, kg, ckpt, dtype = load(args.data)
    rows = [json.loads(line) for line in (files.ROOT / "results" / "shortlist" /
                                          f"{kg.name}-measure.jsonl").read_text().splitlines()][:args.queries]
    short = predict.Shortlist(kg, scorer, kg.split_entities, files.sha256_file(ckpt), loaded_base_sha(ckpt),
                                args.size)
    short.embeddings()
    seconds, before = [], []
    for row in rows:  # as evaluate.py --predict asks a query: the list, then its scores, then the top 10
        e, r, side, _ = row["query"]
        t = time.time()
        some, s = short(e, r, side)
        some[np.argsort(-s, kind="stable")[:10]]
        seconds.append(time.time() - t)
        print(f"{row['q']}: {seconds[-1]:.2f} s" + (" (built " + ", ".join(w for w, _ in short.built) + ")"
                                                     if short.built else ""), flush=True)
        short.built.clear()
        if args.baseline:  # the earlier design on the same query right after: the speed of the day cancels
            design = short.rounds, short.patience, short.size, evaluate.MIN_ROWS
            short.rounds, short.patience, short.size, evaluate.MIN_ROWS = 5, 0, 1000, 1
            t = time.time()
            short(e, r, side)
            before.append(time.time() - t)
            short.rounds, short.patience, short.size, evaluate.MIN_ROWS = design
    with open("/proc/loadavg") as f:
        loadavg = float(f.read().split()[0])  # the other work on the CPU meanwhile
    out = files.ROOT / "results" / f"shortlist-{kg.name}.json"
    result = json.loads(out.read_text()) if out.exists() else {}
    command = f"python bench/shortlist.py latency --data {kg.name} --size {args.size} --queries {args.queries}"
    result.setdefault("latency", {})[str(args.size)] = dict(
        command=command, size=args.size, queries=len(seconds), threads=torch.get_num_threads(), dtype=dtype,
        load_average_1min=loadavg, median_s=float(np.median(seconds)), p90_s=float(np.percentile(seconds, 90)),
        max_s=float(np.max(seconds)), manifest=manifest(argv=sys.argv, data_files=evalcli.data_files(kg)))
    if before:
        result["latency"][str(args.size)] |= dict(command=command + " --baseline", stop44_median_s=float(np.median(
            before)), stop44_p90_s=float(np.percentile(before, 90)), stop44_design="5 rounds, 1,000, batches of any size")
    print(result["latency"][str(args.size)])
    files.write_atomic(out, lambda f: f.write((json.dumps(result, indent=1) + "\n").encode()))


def pool(args):
    scorer, kg, ckpt, dtype = load(args.data)
    folder = files.ROOT / "runs" / "shortlist-pool" / kg.name
    folder.mkdir(parents=True, exist_ok=True)
    short = predict.Shortlist(kg, scorer, kg.split_entities, files.sha256_file(ckpt), loaded_base_sha(ckpt), args.size)
    short.patience = 0  # the whole list: the pool of every design that stops early
    paths = sorted((files.ROOT / "results" / "shortlist" / f"{kg.name}-exact").glob("q*.npz"))
    for path in paths[::-1] if args.reverse else paths:
        if (folder / path.name).exists():
            continue
        e, r, side, _ = (int(x) for x in np.load(path)["query"])
        t = time.time()
        some, s = short(e, r, side)  # the shipped design at a generous size
        files.write_atomic(folder / path.name, lambda f: np.savez(f, pool=some.astype(np.int32), score=s))
        print(f"{path.stem}: {len(some)} scored, {time.time() - t:.0f} s", flush=True)


class Known:
    """A scorer that looks scores up (the pool's and the exact top 100's) instead of computing them: one that is in
    neither cannot be in the exact top 10, and scores lowest."""

    def __init__(self, known, side):
        self.known, self.column = known, 2 if side else 0  # the candidate's column of the query's triples

    def numpy(self, triples):
        return np.array([self.known.get(int(c), -np.inf) for c in triples[:, self.column]], np.float32)


def variants(args):
    """The shipped predict.Shortlist itself, replayed with other rounds and early stops (the best that must settle,
    for how many rounds; 0: never stops early) on each query's pool: its sources as shipped, its scores looked up."""
    scorer, kg, ckpt, _ = load(args.data)
    cand, folder = kg.split_entities, files.ROOT / "results" / "shortlist"
    short = predict.Shortlist(kg, scorer, cand, files.sha256_file(ckpt), loaded_base_sha(ckpt), max(args.sizes))
    queries = []
    for path in sorted((files.ROOT / "runs" / "shortlist-pool" / kg.name).glob("q*.npz")):
        z, x = np.load(path), np.load(folder / f"{kg.name}-exact" / path.name)
        known = dict(zip(cand[x["top"]].tolist(), x["score"].tolist()))  # entity -> score: the exact top 100
        known |= dict(zip(z["pool"].tolist(), z["score"].tolist()))  # and the pool
        e, r, side = (int(v) for v in x["query"][:3])
        by_size = {}
        for short.size in args.sizes:  # the size decides whether e's train answers come first (at most a quarter)
            by_size[short.size] = short.sources(e, r, side)
        queries.append(((e, r, side), by_size, known, cand[x["top"][:10]]))
    table = {}
    print(f"{kg.name}: {len(queries)} queries; exact top 10 recovered (candidates scored: median) by each design")
    designs = [(5, 15, 0), (10, 15, 0), (10, 10, 2), (10, 15, 1), (10, 15, 2), (10, 15, 3), (10, 20, 2)]
    for short.rounds, short.settle, short.patience in designs:  # (the first: the earlier design, never stopping early)
        row = {}
        for short.size in args.sizes:
            got = []
            for (e, r, side), by_size, known, top in queries:
                short.sources, short.scorer = lambda *_, s=by_size[short.size]: s, Known(known, side)
                chosen, _ = short(e, r, side)
                got.append((np.isin(top, chosen).sum(), len(chosen)))
            recovered, scored = np.array(got).T
            row[short.size] = dict(recovered=float(recovered.mean() / 10), scored_mean=float(scored.mean()),
                                   scored_median=float(np.median(scored)))
        name = f"{short.rounds} rounds, best {short.settle} settled for {short.patience}"
        table[name] = row
        cells = [f"{100 * v['recovered']:.1f}% ({v['scored_median']:.0f})" for v in row.values()]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    out = files.ROOT / "results" / f"shortlist-variants-{kg.name}.json"
    result = dict(command=f"python bench/shortlist.py variants --data {kg.name} --sizes "
                  + ",".join(map(str, args.sizes)), queries=len(queries), ckpt=files.project_path(ckpt),
                  train=evalcli.train_summary(checkpoints.read_checkpoint(ckpt, tensors=False)[1]),
                  shipped=f"{predict.ROUNDS} rounds, best {predict.SETTLE} settled for {predict.PATIENCE}", designs=table,
                  manifest=manifest(argv=sys.argv, data_files=evalcli.data_files(kg)))
    files.write_atomic(out, lambda f: f.write((json.dumps(result, indent=1) + "\n").encode()))


def anchors(args):
    """The anchor of every relation and side (its most asked entity) for the shipped adapter: built into the cache
    where missing, then copied into predict.SHIPPED, which --predict reads where its cache has none."""
    scorer, kg, ckpt, _ = load(args.data)
    short = predict.Shortlist(kg, scorer, kg.split_entities, files.sha256_file(ckpt), loaded_base_sha(ckpt))
    for r in range(len(kg.relations)):
        for side in (0, 1):
            short.anchor(r, side, -1)  # -1: no query entity to avoid
            for what, seconds in short.built:
                print(f"built {what} in {seconds:.0f} s", flush=True)
            short.built.clear()
    target = predict.SHIPPED / short.folder.name
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(short.folder.glob(f"anchor-{short.key}-{scorer.max_seq_length}-{len(short.cand)}-*.npy")):
        files.write_atomic(target / path.name, lambda f, p=path: f.write(p.read_bytes()))
    print(f"{len(list(target.iterdir()))} anchors in {files.project_path(target)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    ex = sub.add_parser("exact", help="the exact top of each dev query (resumable)")
    ex.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    ex.add_argument("--triples", type=int, required=True, help="dev triples, each asked both ways")
    ex.add_argument("--reverse", action="store_true", help="from the last query: a second process shares the work")
    me = sub.add_parser("measure", help="the shortlist's top 10 against the exact one (resumable)")
    me.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    me.add_argument("--sizes", type=lambda x: [int(k) for k in x.split(",")], default=[1000, 1500, 2000])
    ta = sub.add_parser("table", help="sum up measure's lines: results/shortlist-DATA.json")
    ta.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    la = sub.add_parser("latency", help="seconds a query at one size, all cores (into results/shortlist-DATA.json)")
    la.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    la.add_argument("--size", type=int, default=predict.SIZE)
    la.add_argument("--queries", type=int, default=50, help="the first N measured queries")
    la.add_argument("--baseline", action="store_true", help="also the earlier design (5 rounds of 1,000, batches of "
                    "any size) on each query, one after the other")
    po = sub.add_parser("pool", help="score a pool of each measured query, for variants (resumable)")
    po.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    po.add_argument("--size", type=int, default=2500, help="the shipped design's list of N")
    po.add_argument("--reverse", action="store_true", help="from the last query: a second process shares the work")
    va = sub.add_parser("variants", help="other shortlist designs, simulated on the pools")
    va.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr", "umls"])
    va.add_argument("--sizes", type=lambda x: [int(k) for k in x.split(",")], default=[1000, 1500, 2000])
    an = sub.add_parser("anchors", help="every relation's anchor for the shipped adapter, into weights/anchors/")
    an.add_argument("--data", required=True, choices=["fb15k-237", "wn18rr"])
    args = ap.parse_args(argv)
    steps = dict(exact=exact, measure=measure, table=table, latency=latency, pool=pool, variants=variants,
                 anchors=anchors)
    steps[args.step](args)


if __name__ == "__main__":
    main()

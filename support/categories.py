"""Link prediction by relation category, as the KGE literature reports it (TransH, Wang et al. 2014;
PyKEEN's relation categories): a relation is 1-1, 1-N, N-1 or N-N by its train triples' mean
tails per head (tph) and heads per tail (hpt), each against 1.5. "N" on the tail side means a head
has several tails (tph >= 1.5), so predicting the tail is the harder query; "N" on the head side
likewise for hpt. evaluate.py --lp --per-relation reports each category's triples, queries, MRR
and Hits@1/10, by side, from the filtered realistic ranks."""
import numpy as np

THRESHOLD = 1.5  # TransH's and PyKEEN's
CATEGORIES = ("1-1", "1-N", "N-1", "N-N")
SIDES = ("head", "tail", "both")  # side 0 ranks the head (the query (?, r, t)), side 1 the tail
KS = (1, 10)


def relation_categories(train: np.ndarray, n_relations: int) -> tuple[np.ndarray, np.ndarray]:
    """(categories (R,) of CATEGORIES' names, '' for a relation without train triples; (R, 2)
    float tph and hpt, NaN there) of (N, 3) train triples. A fact listed twice counts once."""
    names = np.full(n_relations, "", dtype=object)
    ratios = np.full((n_relations, 2), np.nan)
    pairs = np.unique(np.asarray(train, np.int64).reshape(-1, 3), axis=0)  # distinct facts
    for rel in np.unique(pairs[:, 1]):
        facts = pairs[pairs[:, 1] == rel]
        tph = len(facts) / len(np.unique(facts[:, 0]))  # facts over distinct heads
        hpt = len(facts) / len(np.unique(facts[:, 2]))  # facts over distinct tails
        ratios[rel] = tph, hpt
        names[rel] = f"{'N' if hpt >= THRESHOLD else '1'}-{'N' if tph >= THRESHOLD else '1'}"
    return names, ratios


def realistic(optimistic: np.ndarray, pessimistic: np.ndarray) -> dict:
    """MR, MRR and Hits@1/10 of the realistic ranks (the mean of the optimistic and pessimistic
    ones: ties broken at random, as evaluate.rank_metrics names them); None for no ranks."""
    if not len(optimistic):
        return None
    r = (np.asarray(optimistic, np.float64) + np.asarray(pessimistic, np.float64)) / 2
    return {"mr": float(r.mean()), "mrr": float((1 / r).mean()),
            **{f"hits@{k}": float((r <= k).mean()) for k in KS}}


def by_category(
    relation: np.ndarray,
    side: np.ndarray,
    triple: np.ndarray,
    query: np.ndarray,
    optimistic: np.ndarray,
    pessimistic: np.ndarray,
    categories: np.ndarray,
) -> dict:
    """{category: {"relations", "triples", "head" | "tail" | "both": {"ranks", "queries", mr, mrr,
    hits@1, hits@10}}} of ranked rows, one a test triple and side: each row's relation, side (0
    head, 1 tail), test triple, query and filtered optimistic and pessimistic ranks (n,);
    categories (R,) from relation_categories. Rows of a relation without train triples fall in no
    category (the results' "uncategorised" says how many)."""
    of_row = categories[relation]
    out = {}
    for name in CATEGORIES:
        rows = of_row == name
        entry = {"relations": int(len(np.unique(relation[rows]))),
                 "triples": int(len(np.unique(triple[rows])))}
        for side_name, at in zip(SIDES, (rows & (side == 0), rows & (side == 1), rows)):
            entry[side_name] = {"ranks": int(at.sum()), "queries": int(len(np.unique(query[at]))),
                                "metrics": realistic(optimistic[at], pessimistic[at])}
        out[name] = entry
    out["uncategorised"] = {"ranks": int((of_row == "").sum())}
    return out


def report(kg, lpq, rows: np.ndarray) -> dict:
    """evaluate.py --lp --per-relation's results: each relation's category, tails per head and
    heads per tail, and by_category of the ranked rows (n, 4): test triple, side, filtered
    optimistic and pessimistic rank (lpq: evaluate.LPQueries, whose triples the rows rank)."""
    names, ratios = relation_categories(kg.train, len(kg.relations))
    triple, side, optimistic, pessimistic = rows.T
    table = by_category(
        relation=lpq.queries[lpq.triple_query[triple, 0], 1],  # the relation of a head query
        side=side,
        triple=triple,
        query=lpq.triple_query[triple, side],
        optimistic=optimistic,
        pessimistic=pessimistic,
        categories=names,
    )
    relations = {kg.relations[r]: {"category": names[r], "tails_per_head": float(ratios[r, 0]),
                                   "heads_per_tail": float(ratios[r, 1])}
                 for r in range(len(kg.relations)) if names[r]}
    return {"relation_categories": relations, "by_category": table}


def print_table(table: dict) -> None:
    """The categories' filtered realistic MRR and Hits@1/10 by side, one line a category."""
    print(f"by relation category (train's tails per head and heads per tail against {THRESHOLD}), "
          "filtered realistic ranks:")
    print(f"  {'category':9} {'rels':>5} {'triples':>8}" + "".join(
        f" | {side + ' queries':>13} {'MRR':>7} {'H@1':>7} {'H@10':>7}" for side in SIDES[:2]))
    for name in CATEGORIES:
        entry = table[name]
        cells = ""
        for side in SIDES[:2]:
            m = entry[side]["metrics"] or {"mrr": np.nan, "hits@1": np.nan, "hits@10": np.nan}
            cells += (f" | {entry[side]['queries']:13,} {m['mrr']:7.4f} {m['hits@1']:7.4f} "
                      f"{m['hits@10']:7.4f}")
        print(f"  {name:9} {entry['relations']:5} {entry['triples']:8,}" + cells)

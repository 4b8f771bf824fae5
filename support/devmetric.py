"""The dev point's figure and its log line (train.py's dev_point): accuracy at a threshold tuned on
dev itself, or the filtered MRR of seeded dev triples (exact, against a sample, or estimated), with
a warning where it is within noise of a random scorer's."""
import numpy as np

import evaluate
from evaluate import best_threshold


def dev_metric(model, kg, enc, run, device, dtype, near=None):
    """(metric, its log line): accuracy at the threshold tuned on dev itself (an upper estimate), or
    the filtered MRR of the same seeded dev_limit dev triples every epoch, against all entities or a
    sample; with dev_near, their estimated MR and a signal (no MRR: RESULTS.md, FB15k-237)."""
    scorer = evaluate.Scorer(model, enc, run.prompts, run.max_seq_length, device, dtype)
    if kg.task == "tc":
        scores = scorer.numpy(kg.dev)
        acc = best_threshold(scores, kg.dev_labels)[1]
        chance = chance_accuracy(scores, kg.dev_labels)
        dev = {"metric": "accuracy", "value": acc, "random": chance[0]}
        return dev, f"accuracy {acc:.4f}" + chance_note(acc, *chance, "accuracy")
    near = near[:, :run.dev_near] if run.dev_near else None
    m = evaluate.rank_split(scorer, kg, "dev", run.dev_limit, sample=run.dev_sample, near=near)
    triples = min(run.dev_limit or len(kg.dev), len(kg.dev))
    if "estimate" in m:  # the big graphs: MR, and a signal that orders checkpoints, but no MRR
        dev = {"metric": "signal", "value": m["signal"], "mr": m["mr"], "triples": triples,
               "candidates": m["candidates"], "sampled": False, "estimate": True}
        return dev, (f"signal {m['signal']:.4f}, MR {m['mr']:.2f} on {triples} dev triples "
                     f"(stratified estimate, {m['candidates']:,} candidates scored a query: MR "
                     "unbiased; the signal, the mean of 1 / an estimated rank, orders checkpoints "
                     "as the exact MRR does but runs ~2x it: not an MRR)")
    sampled = bool(run.dev_sample and m["candidates"] < len(kg.split_entities))
    dev = {"metric": "mrr", "value": m["mrr"], "mr": m["mr"], "hits@10": m["hits@10"],
           "triples": triples, "candidates": m["candidates"], "sampled": sampled,
           "estimate": False, "random": m["random_mrr"][0]}
    against = f"against {m['candidates']:,} {'sampled ' if sampled else ''}candidates"
    line = (f"mrr {m['mrr']:.4f}, MR {m['mr']:.2f}, Hits@10 {m['hits@10']:.4f} on "
            f"{triples} dev triples {against}")
    return dev, line + chance_note(m["mrr"], *m["random_mrr"], "MRR")


def chance_note(value, mean, sd, what):
    """The dev line's warning where its metric is within noise (2 sd) of a random scorer's."""
    if value >= mean + 2 * sd:
        return ""
    return (f"; within noise of a random scorer ({what} {mean:.4f} +- {2 * sd:.4f} on these "
            "triples): nothing learned yet, or text that carries nothing (README, Your own graph)")


def chance_accuracy(scores, labels, n=20, seed=0):
    """(mean, sd) of best_threshold's accuracy when the labels are shuffled (`n` seeded
    permutations): what a threshold tuned on scores that carry nothing reaches on these triples."""
    rng = np.random.default_rng(seed)
    acc = [best_threshold(scores, rng.permutation(labels))[1] for _ in range(n)]
    return float(np.mean(acc)), float(np.std(acc))

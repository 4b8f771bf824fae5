"""--predict: the top-k completions of a query or of a file of them (resumable), and on big graphs
the shortlist that makes a query take seconds (its agreement with the exact ranking is measured by
bench/shortlist.py, RESULTS.md).

The shortlist of a query (e, r, side) is scored in up to ten rounds of equal parts, its sources
competing: the best of an anchor query's exact scores (the same relation and side asked of another
entity: what the model puts first for this relation whatever the entity), the entities nearest e by
the frozen encoder's text embedding, those nearest e's train answers, the relation's train type by
frequency, and the entities nearest the best 20 scored so far. Each round takes from them in turns,
as many a turn from each as the square of how many of the best 10 so far it supplied (the first
round one each; following the best as many as the best source): FB15k-237's best come from all of
them, WN18RR's mostly from near e. e's train answers come first where they are few (at most a
quarter of the list). The rounds stop early once the best 15 stayed the same for PATIENCE rounds
(after at least MIN_SHARE of the list): most queries settle within about half of it, and the list's
size is what the hard ones may take. Anchor scores and embeddings are computed once (minutes on a
big graph, with progress lines) and cached on disk (devices.cache_dir), keyed by the checkpoint, the
base weights and the data; the shipped WN18RR adapter's anchors ship in weights/anchors/. --lp and
--tc never use it: their metrics score every candidate.
"""
import difflib
import sys
import time
from pathlib import Path

import numpy as np
import torch

import data
from data import DataError
from support import files
from support.bigrank import Progress, scored_pieces
from support.devices import cache_dir
from support.files import OutputError
from support.near import entity_embeddings

# candidates scored a query at most, by bench/shortlist.py's table (RESULTS.md); the rounds, the
# best followed, the best whose sources count; the early stop: the best that must stay the same (a
# margin over the top 10, whose 10th may tie the 11th), for how many rounds, and the share of SIZE
# scored first
SIZE = 1500
ROUNDS, FOLLOW, BEST = 10, 20, 10
SETTLE, PATIENCE, MIN_SHARE = 15, 2, 0.4
# graphs with at most this many candidates score them all: a shortlist would save little
ALL_UP_TO = 5000
KEEP = 4096  # an anchor's best candidates kept in its cache file
# the shipped adapters' anchors (bench/shortlist.py anchors), read-only
SHIPPED = files.ROOT / "weights" / "anchors"
# a top k whose scores (NSP logit margins) span less is flagged: a margin of 0.05 moves the
# probability of "true" by about 1%, and a trained adapter's true and false triples lie ~10 apart
TIED_SPAN = 0.05


def query_triples(e, r, side, cand):
    """(len(cand), 3) triples of the query: (e, r, c) for side 1 (tails ranked), (c, r, e) for side
    0."""
    fixed, rel = np.full(len(cand), e), np.full(len(cand), r)
    return np.stack([fixed, rel, cand] if side else [cand, rel, fixed], 1)


class Shortlist:
    # (bench/shortlist.py variants)
    rounds, follow, best, settle, patience = ROUNDS, FOLLOW, BEST, SETTLE, PATIENCE

    def __init__(self, kg, scorer, cand, key, base_key, size=SIZE):
        """kg's train facts give the answers and types; scorer scores the anchors (over the
        candidates `cand`); key names the checkpoint (its sha256) and base_key the frozen encoder
        (weights sha256) in the cache."""
        self.kg, self.scorer, self.cand, self.size = kg, scorer, cand, size
        self.folder = cache_dir() / f"{kg.name}-{kg.fingerprint}-{kg.text}"
        self.key, self.base_key, self.emb = key[:16], base_key[:16], None
        h, r, t = kg.train.T
        # side -> (query entity, relation, answer) of every train fact
        self.train = {1: (h, r, t), 0: (t, r, h)}
        self.pos = np.full(len(kg.entities), -1)  # entity -> its index in cand
        self.pos[cand] = np.arange(len(cand))
        self.built = []  # (what, seconds) of the cached parts computed for the queries so far

    def __call__(self, e, r, side):
        """(candidates, their scores) of the query (e, r, side), at most `size` of `cand`: e's train
        answers where few, then up to `rounds` rounds, each taking from the sources (and the nearest
        of the best `follow` so far) in turns weighted by what each supplied to the best `best` so
        far, and scoring what it took; it stops when the best `settle` stayed the same for
        `patience` rounds (0: never) and MIN_SHARE of `size` is scored."""
        first, sources = self.sources(e, r, side)
        # origin: the source a candidate came from (-1: answers)
        chosen, origin = first, np.full(len(first), -1)
        scores = self.scorer.numpy(query_triples(e, r, side, chosen))
        weights = np.ones(len(sources) + 1, np.int64)
        weights[-1] = 0  # following the best: once there is a best
        # rounds the best stayed the same for; the best (a set of candidates)
        settled, top = 0, None
        for left in range(self.rounds, 0, -1):  # the rounds still to come, this one included
            best = chosen[:0]  # none before a first score: no nearest pass wasted
            if weights[-1]:
                best = chosen[np.argsort(-scores, kind="stable")[:self.follow]]
            lists = sources + [self.nearest(best)]
            n_more = -(-(self.size - len(chosen)) // left)  # ceil: the rest over the rounds left
            more, came = interleave(lists, weights, chosen, n_more)
            chosen, origin = np.concatenate([chosen, more]), np.concatenate([origin, came])
            scores = np.concatenate([scores, self.scorer.numpy(query_triples(e, r, side, more))])
            order = np.argsort(-scores, kind="stable")
            came = origin[order[:self.best]]
            # the sources of the best: more turns
            weights = np.bincount(came[came >= 0], minlength=len(lists)) ** 2
            # the nearest of the best as many as the best source
            weights[-1] = max(weights.max(), 1)
            now = set(chosen[order[:self.settle]].tolist())
            settled = settled + 1 if now == top else 0
            top = now
            if self.patience and settled >= self.patience and len(chosen) >= MIN_SHARE * self.size:
                break
        return chosen, scores

    def sources(self, e, r, side):
        """e's train answers where few, and the sources in order: the anchor's best, the nearest to
        e and to its answers, and the relation's train type by frequency (candidates only)."""
        q, rel, ans = self.train[side]
        answers = np.unique(ans[(q == e) & (rel == r)])
        kinds, counts = np.unique(ans[rel == r], return_counts=True)
        sources = [self.anchor(r, side, e), self.nearest([e]), self.nearest(answers),
                   kinds[np.argsort(-counts, kind="stable")]]
        # thousands (a gender's people): no
        first = answers if len(answers) <= self.size // 4 else answers[:0]
        return first[self.pos[first] >= 0], [s[self.pos[s] >= 0] for s in sources]

    def anchor(self, r, side, e):
        """The candidates by the exact score of (a, r, ?) (side 1) or (?, r, a): a the entity most
        often asked this way in train, other than e; computed once and cached."""
        q, rel, _ = self.train[side]
        asked, n = np.unique(q[rel == r], return_counts=True)
        if not len(asked) or asked.tolist() == [e]:
            return np.empty(0, np.int64)
        a = asked[asked != e][np.argmax(n[asked != e])]
        msl = self.scorer.max_seq_length
        path = self.folder / f"anchor-{self.key}-{msl}-{len(self.cand)}-r{r}-s{side}-e{a}.npy"
        best = load(path)
        if best is None:  # shipped beside the adapter: a WN18RR relation's first query saves ~100 s
            best = load(SHIPPED / self.folder.name / path.name)
        if best is not None:
            return best
        t = time.time()
        what = f"anchor ({self.kg.entities[a]}, {self.kg.relations[r]}, side {side})"
        # Every candidate is scored: minutes on a big graph, said now and then once a minute.
        print(f"the shortlist's {what}: scoring all {len(self.cand):,} candidates once (cached in "
              f"{self.folder})", file=sys.stderr, flush=True)
        progress = Progress(len(self.cand), f"candidates scored for the {what}")
        s = np.concatenate(scored_pieces(self.scorer.numpy, query_triples(a, r, side, self.cand),
                                         progress))
        progress.end()
        best = self.cand[np.argsort(-s, kind="stable")[:KEEP]]
        save(path, best)
        self.built.append((what, time.time() - t))
        return best

    def nearest(self, entities):
        """The `size` candidates nearest any of `entities` (max cosine of the frozen encoder's
        embeddings), best first; an entity new to the graph (text:...) is embedded on the spot."""
        if not len(entities):
            return np.empty(0, np.int64)
        entities = np.asarray(entities)
        inside = entities < len(self.pos)
        inside[inside] = self.pos[entities[inside]] >= 0
        emb, s = self.embeddings(), self.scorer
        vec = emb[self.pos[entities[inside]]]
        if not inside.all():
            new = entity_embeddings(s.model.bert, entities[~inside], s.enc, s.device, s.precision)
            vec = torch.cat([vec, new])
        sim = (emb @ vec.T).max(1).values
        return self.cand[sim.topk(min(self.size, len(sim))).indices.numpy()]

    def embeddings(self):
        if self.emb is None:
            path = self.folder / f"embeddings-{self.base_key}-{len(self.cand)}.npy"
            self.emb = load(path)
            if self.emb is not None:
                self.emb = torch.from_numpy(self.emb).float()
            else:
                t, s = time.time(), self.scorer
                # Minutes on a big graph: said now, before the progress lines begin.
                print(f"the shortlist's entity embeddings: embedding all {len(self.cand):,} "
                      f"candidates once (cached in {self.folder})", file=sys.stderr, flush=True)
                emb = entity_embeddings(s.model.bert, self.cand, s.enc, s.device, s.precision)
                self.emb = emb.cpu()
                save(path, self.emb.half().numpy())
                self.built.append(("entity embeddings", time.time() - t))
        return self.emb


def interleave(lists, weights, taken, n):
    """The first n entries of `lists` not in `taken`, in turns: weights[k] from lists[k] a turn
    (none at weight 0); and the list each came from (the first that holds it)."""
    turn, source, items = [], [], []
    for k, (entries, w) in enumerate(zip(lists, weights)):
        if w:
            entries = entries[~np.isin(entries, taken)][:n]
            turn.append(np.arange(len(entries)) // w)
            source.append(np.full(len(entries), k))
            items.append(entries)
    if not items:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    turn, source, items = np.concatenate(turn), np.concatenate(source), np.concatenate(items)
    # by turn, then by source (a list's own order kept: lexsort is stable)
    order = np.lexsort((source, turn))
    # an entity in two lists: where it comes first
    _, once = np.unique(items[order], return_index=True)
    keep = order[np.sort(once)][:n]
    return items[keep], source[keep]


def load(path):
    """A cached array, or None where there is none or it is damaged (then it is computed again)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None


def save(path, array):
    """Into the cache; where it cannot be written (read-only, full), the next run computes it again:
    said, not fatal."""
    try:
        files.write_atomic(path, lambda f: np.save(f, array))
    except OSError as e:
        print(f"note: cannot cache {path} ({e.strerror or e}); set PALT_CACHE to a writable "
              "folder", file=sys.stderr)


# ----------------------------------------------------------------------------- queries
def find(ids, texts, query, what, where=None):
    """Index of the entity/relation with this id, else this text (any case), else the one id or text
    ending in it. where: the FILE:LINE the query came from, which the errors name."""
    at = f"{where}: " if where else ""
    q = query.lower()
    for match in (lambda i, t: i == query, lambda i, t: t.lower() == q,
                  lambda i, t: t.lower().endswith(" " + q) or i.lower().endswith("/" + q)):
        hits = [k for k, (i, t) in enumerate(zip(ids, texts)) if match(i, t)]
        if len(hits) == 1:
            return hits[0]
        if hits:
            shown = ", ".join(f"{ids[k]} ({texts[k]})" for k in hits[:5])
            if len(hits) > 5:
                shown += " ..."
            raise DataError(f"{at}{what} {query!r} is ambiguous: {shown}; give the id")
    near = difflib.get_close_matches(q, [t.lower() for t in texts], n=3, cutoff=0.6)
    new = ", or text:... for an entity that is not in the graph" if what == "entity" else ""
    raise DataError(f"{at}no {what} {query!r} (by id or text)" + (
                    f"; did you mean {', '.join(repr(t) for t in near)}?" if near else "") + new)


def parse_query(parts, where):
    """HEAD RELATION [?] -> (HEAD, RELATION, 1): tails ranked; ? RELATION TAIL -> (TAIL, RELATION,
    0): heads."""
    if len(parts) == 2 and "?" not in parts:
        return parts[0], parts[1], 1
    if len(parts) == 3 and parts.count("?") == 1 and parts[1] != "?":
        return (parts[0], parts[1], 1) if parts[2] == "?" else (parts[2], parts[1], 0)
    raise ValueError(f"{where}: expected HEAD RELATION, HEAD RELATION ? or ? RELATION TAIL, got "
                     f"{' '.join(parts)!r}")


def read_queries(args):
    """[(entity, relation, side, where)] as typed: the one on the command line (where: None), or one
    a line of --queries (tab-separated; where: FILE:LINE)."""
    if not args.queries:
        return [(*parse_query(args.query, "--predict"), None)]
    text = files.read_text(args.queries, data.DataError)[1]
    queries = []
    try:
        for i, line in enumerate(text.splitlines()):
            where = f"{args.queries}:{i + 1}"
            if line.strip():
                queries.append((*parse_query([p.strip() for p in line.split("\t")], where), where))
    except ValueError as e:  # a line that is no query
        raise DataError(str(e)) from None
    if not queries:
        raise DataError(f"{args.queries}:1: no queries")
    return queries


def finished_queries(partial, stamp):
    """{query number: its TSV rows} that a stopped --queries run wrote to `partial`, whose first
    line must be `stamp` (the same checkpoint and settings); a query cut off by the stop is left
    out, and asked again."""
    if not partial.exists():
        partial.write_text(stamp + "\n")
        return {}
    text = partial.read_text()
    lines = text.splitlines()
    if lines[:1] != [stamp]:
        first = lines[0] if lines else "empty"
        raise OutputError(f"{partial} holds a stopped run of other settings ({first}, not "
                          f"{stamp}); delete it, or choose another --out")
    done = {}
    for line in lines[1:]:
        number, row = line.split("\t", 1)
        done.setdefault(int(number), []).append(row)
    if done and not text.endswith("\n"):  # killed while writing its rows
        done.pop(max(done))
    return done


def predict(args, scorer, kg, tokenizer, info):
    """The top-k completions of each query (E, r, ?) or (?, r, E); a text:... entity need not be in
    the graph. On a big graph a shortlist is scored (Shortlist), said in each header. A --queries
    run with --out resumes."""
    E = len(kg.entities)
    resolved, new = resolve(args, kg)
    if new:  # the new texts are tokenised after the graph's own entities: indices E, E+1, ...
        scorer.enc = data.encode(kg, tokenizer, new)
    ent_text = kg.ent_text + new  # entity i's text, the new ones included
    cand = kg.split_entities if args.candidates == "split" else np.arange(E)
    size = shortlist_size(args, cand)
    short = None
    if size and size < len(cand):
        short = Shortlist(kg, scorer, cand, info["identity"], info["weights_sha256"], size)
    # one line of rows a query, as it ends
    partial = Path(str(args.out) + ".partial") if args.queries and args.out else None
    done = {}
    if partial:
        stamp = (f"# {info['identity'][:16]} queries {files.sha256_file(args.queries)[:16]} topk "
                 f"{args.topk} candidates {args.candidates} shortlist {size or 'all'}")
        done = finished_queries(partial, stamp)
    if done:
        print(f"resumed: {len(done)} of {len(resolved)} queries done in {partial}", file=sys.stderr)
    progress = Progress(len(resolved), "queries", enabled=len(resolved) > 1)
    rows = ["query\trank\tentity\ttext\tscore\tknown"]
    for number, (e, r, side) in enumerate(resolved):
        q = f"(?, {kg.rel_text[r]}, {ent_text[e]})"
        if side:
            q = f"({ent_text[e]}, {kg.rel_text[r]}, ?)"
        if number not in done:
            done[number] = top_k(args, scorer, kg, cand, short, q, e, r, side)
            if partial:
                with open(partial, "a") as f:
                    f.write("".join(f"{number}\t{row}\n" for row in done[number]))
        rows += done[number]
        progress.update(1)
    progress.update(0, force=True)
    if args.out:
        files.write_atomic(args.out, lambda f: f.write(("\n".join(rows) + "\n").encode()))
        print(f"wrote {args.out} ({len(rows) - 1} rows)")
        if partial:
            partial.unlink()


def resolve(args, kg):
    """([(entity, relation, side)] as indices, [new entity texts]): a text:... entity is the next
    index after the graph's; an unknown one is refused, naming FILE:LINE for --queries."""
    E, new, resolved = len(kg.entities), [], []
    for e, r, side, where in read_queries(args):
        if e.startswith("text:"):
            new.append(e[5:].strip())
            e = E + len(new) - 1
        else:
            e = find(kg.entities, kg.ent_text, e, "entity", where)
        resolved.append((e, find(kg.relations, kg.rel_text, r, "relation", where), side))
    return resolved, new


def shortlist_size(args, cand):
    """How many candidates a query scores: --shortlist, else SIZE on a graph of over ALL_UP_TO;
    None: all."""
    if args.shortlist == "all":
        return None
    if args.shortlist:
        return args.shortlist
    return SIZE if len(cand) > ALL_UP_TO else None


def top_k(args, scorer, kg, cand, short, q, e, r, side):
    """Scores one query's candidates (or its shortlist), prints its top k, returns them as TSV
    rows."""
    t = time.time()
    some = cand
    if short:
        some, s = short(e, r, side)
    else:
        s = scorer.numpy(query_triples(e, r, side, cand))
    triples = query_triples(e, r, side, some)
    top = np.argsort(-s, kind="stable")[:args.topk]
    known = kg.is_known(triples[top]) & (e < len(kg.entities))  # a new entity is in no fact
    over = f"{len(cand):,} candidates"
    if short:
        # once per graph, or relation and side: cached on disk
        for what, seconds in short.built:
            print(f"built {what} in {seconds:.0f} s, cached in {short.folder}")
        short.built.clear()
        over = (f"a shortlist of {len(some):,} of {len(cand):,} candidates (anchor, nearest, type "
                "and the nearest of the best, in rounds until the best settle: --shortlist all "
                "scores every one)")
    print(f"{q} over {over}, {time.time() - t:.1f} s; score = NSP logit margin; * = a known fact "
          "(train/dev/test)")
    rows = []
    for place, (c, score, k) in enumerate(zip(some[top], s[top], known), 1):
        print(f"{place:4} {score:9.4f} {'*' if k else ' '} {kg.entities[c]:24} {kg.ent_text[c]}")
        rows.append(f"{q}\t{place}\t{kg.entities[c]}\t{kg.ent_text[c]}\t{score:.6f}\t{int(k)}")
    span = float(s[top].max() - s[top].min()) if len(top) > 1 else np.inf
    if span < TIED_SPAN:
        print(f"note: the top {len(top)} scores span {span:.4f} (under {TIED_SPAN}): "
              f"indistinguishable, their order is noise; all {len(some):,} scored span "
              f"{float(s.max() - s.min()):.4f}. A model that tells these apart barely: text that "
              "carries nothing (README, Your own graph)?")
    return rows

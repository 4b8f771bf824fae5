"""Pictures of PALT: where a model's attention goes on one triple, and how a training run went.

    python plot.py attention "evening clothes" "type of" attire --data wn11
    python plot.py attention virus causes disease --compare minilm   (beside plain MiniLM)
    python plot.py curve runs/umls-minilm results/palt-umls-minilm.train.log --out curve.png
    python plot.py methods --out results/figures/methods.png

attention: the triple's sequence [CLS] P*b head relation P*m [SEP] tail P*e [SEP] goes through
the model's own forward, PALT.forward(..., return_attention=True), which hands back each layer's
weights softmax(q k^T / sqrt(d) + mask) from that layer's own q and k: the weights its
scaled_dot_product_attention applies (tests/test_plot.py holds weights @ v to it). Layers are
numbered from 0, as PALT and train.py's --calib number them; the default --layers are the first
and the two PALT calibrates by default, the middle and the last (palt.default_calib_layers: 0, 3
and 5 of MiniLM). Drawn: the attention of [CLS] (--token: another token's) per head, or with
--matrices every head's whole matrix. Entities and relations by id or text, as --predict takes
them; --data, --ckpt and --model as evaluate.py takes them (default: umls and its shipped
adapter). --compare: a second checkpoint or run folder, or a base model (minilm,
bert-base-uncased, a model folder) zero-shot, drawn beside.
curve: a run folder's metrics.jsonl (train.py writes it; older run folders: their log.txt), or a
train log (results/*.train.log): the train loss as logged (the mean since the epoch's start or a
resume) and the dev metric against steps, the best dev point starred, several runs overlaid.
methods: UMLS test MRR and WN11 test accuracy (means over seeds, sd bars) against tunable
parameters (log scale), a panel a graph with finals, one labelled point per method, from the finals
in results/methods/ as support/tables.py reads them.
--out: the PNG to write; by default one named after what it draws, in the current folder
(attention-HEAD-RELATION-TAIL.png, curve-RUN.png, methods.png). matplotlib is optional:
pip install matplotlib.
"""
import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import data
import palt
from support.errors import ERRORS
from support import evalcli, files, graphs, hub, predict, runlog
from support.flags import FlagError

DPI = 100
PART_COLOURS = {"[CLS]": "grey", "[SEP]": "grey", "prompt": "darkorange", "head": "black",
                "relation": "green", "head+relation": "black", "tail": "royalblue"}
DEV_KINDS = {"sampled": "dev: sampled candidates", "all": "dev: all candidates",
             "estimate": "dev: stratified estimate (its 1 / rank runs ~2x the MRR)",
             "accuracy": "dev accuracy"}
NO_MATPLOTLIB = "plot.py needs matplotlib: pip install matplotlib"


# ------------------------------------------------------------------------- models and the triple
@dataclass
class Source:
    """A model to draw, with what it needs to build its sequence: graph, tokenizer, prompts."""
    name: str  # short: in the line of scores
    label: str  # above its panels
    model: palt.PALT
    kg: data.KG
    tokenizer: object
    prompts: tuple
    max_seq_length: int
    note: str = ""  # under its label, e.g. that a zero-shot NSP head is random


def source_run(args, ckpt, model):
    """The namespace evaluate.py's checks and loaders read, for one model on args' data."""
    return argparse.Namespace(task="predict", ckpt=ckpt, model=model, data=args.data,
                              data_dir=args.data_dir, text=args.text, max_seq_length=None,
                              queries=None, out=args.out, split=None)


def compare_spec(spec):
    """(ckpt, model) of --compare: an existing file or run folder is a checkpoint; a base model's
    name or folder (one holding model.safetensors) runs zero-shot."""
    p = Path(spec)
    if p.is_file() or (p.is_dir() and not (p / "model.safetensors").is_file()):
        return spec, None
    if not p.exists() and spec != "minilm" and spec not in hub.HUB_MODELS:
        raise FlagError(f"--compare {spec}: no such checkpoint, run folder or base model "
                        f"(minilm, {', '.join(hub.HUB_MODELS)}, or a model folder)")
    return None, spec


def check_source(args):
    """(checkpoint metadata or None, graph): evaluate.py's checks before any model loads, so that
    a mistake costs seconds."""
    meta, kg, _, _ = evalcli.check_before_loading(args, args.ckpt is None and args.model is None)
    return meta, kg


def load_source(args, meta, kg):
    """The Source of checked arguments: a checkpoint as evaluate.py loads it, or a base model
    zero-shot. A base model without an NSP head (minilm) gets BERT's random initialisation of it,
    seeded: its attention is the plain encoder's, its score means nothing, and its note says so."""
    if args.model is None:
        model, tokenizer, info = evalcli.load_model(args, "cpu")
        label = f"{files.project_path(args.ckpt)} (PALT, trained on {meta['data']})"
        return Source(Path(args.ckpt).stem, label, model, kg, tokenizer, tuple(info["prompts"]),
                      info["max_seq_length"])
    torch.manual_seed(0)
    model, loaded = palt.build_palt(args.model, palt.PaltConfig(**palt.ZERO_SHOT))
    note = "zero-shot NSP"
    if loaded.heads_to_train:
        note = "no NSP head: a random one, so its score means nothing"
    return Source(f"{args.model} (plain)", f"{args.model} (plain, no PALT)", model.eval(), kg,
                  loaded.tokenizer, (0, 0, 0), 192, note)


def resolve_triple(kg, head, relation, tail):
    """(h, r, t, new entity texts) by id or text, as --predict finds them; text:... is an entity
    that is not in the graph."""
    new, ids = [], []
    for what, query in (("entity", head), ("relation", relation), ("entity", tail)):
        if what == "entity" and query.startswith("text:"):
            new.append(query[5:].strip())
            ids.append(len(kg.entities) + len(new) - 1)
        elif what == "entity":
            ids.append(predict.find(kg.entities, kg.ent_text, query, "entity"))
        else:
            ids.append(predict.find(kg.relations, kg.rel_text, query, "relation"))
    return (*ids, new)


def token_parts(src, enc, triple, batch):
    """(token labels, the part of each position): [CLS], prompt, head, relation (head+relation
    where the text was cut), [SEP], tail; prompt slots are labelled P1, P2, ..."""
    ids, prompt_index = batch["input_ids"][0].tolist(), batch["prompt_index"][0].tolist()
    types = batch["token_type_ids"][0].tolist()
    n_head = int(enc.ent_off[triple[0] + 1] - enc.ent_off[triple[0]])
    n_rel = int(enc.rel_off[triple[1] + 1] - enc.rel_off[triple[1]])
    n_tail = int(enc.ent_off[triple[2] + 1] - enc.ent_off[triple[2]])
    specials = (enc.cls_id, enc.sep_id)
    n_text = sum(1 for i, k in zip(ids, prompt_index) if k < 0 and i not in specials)
    whole = n_text == n_head + n_rel + n_tail  # nothing cut: head and relation can be told apart
    labels, parts, seen = [], [], 0
    for pos, (i, k, segment) in enumerate(zip(ids, prompt_index, types)):
        if k >= 0:
            labels.append(f"P{k + 1}")
            parts.append("prompt")
            continue
        labels.append(src.tokenizer.id_to_token(i))
        if pos == 0:
            parts.append("[CLS]")
        elif i == enc.sep_id:
            parts.append("[SEP]")
        elif segment:
            parts.append("tail")
        elif not whole:
            parts.append("head+relation")
        else:
            parts.append("head" if seen < n_head else "relation")
            seen += 1
    return labels, parts


def triple_view(src, head, relation, tail, layers, token="[CLS]"):
    """What one column of panels shows: {text, score, labels, parts, layers (from 0), n_layers,
    calibrated (the layers PALT calibrates), token (the attending position: a label such as [CLS]
    or P1, its first occurrence, or a position from 0), weights (chosen layers, n_head, L, L)}."""
    h, r, t, new = resolve_triple(src.kg, head, relation, tail)
    enc = data.encode(src.kg, src.tokenizer, new)
    batch = data.build_batch(enc, [(h, r, t)], src.prompts, src.max_seq_length)
    n_layers = src.model.bert.config.num_hidden_layers
    chosen = layers or sorted({0, *palt.default_calib_layers(n_layers)})
    for i in chosen:
        if not 0 <= i < n_layers:
            raise FlagError(f"--layers {i}: {src.name} has layers 0 to {n_layers - 1}")
    with torch.inference_mode():
        logits, weights = src.model.eval()(**batch, return_attention=True)
    labels, parts = token_parts(src, enc, (h, r, t), batch)
    if token not in labels and not (token.isdigit() and int(token) < len(labels)):
        raise FlagError(f"--token {token}: not in {src.name}'s sequence "
                        f"({' '.join(labels)}); give a token or a position from 0")
    position = labels.index(token) if token in labels else int(token)
    names = src.kg.ent_text + new
    return {"text": f"({names[h]}, {src.kg.rel_text[r]}, {names[t]})",
            "score": float(palt.score(logits)[0]), "labels": labels, "parts": parts,
            "layers": chosen, "n_layers": n_layers, "calibrated": src.model.calib_layers,
            "token": position,
            "weights": torch.stack([weights[i][0] for i in chosen]).numpy()}


def part_shares(view, layer_row):
    """{part: the mean over heads of the chosen token's attention on that part}, and {part: the
    heads whose largest part it is}."""
    row = view["weights"][layer_row][:, view["token"], :]  # (n_head, L)
    names = list(dict.fromkeys(view["parts"]))
    share = np.stack([row[:, [p == name for p in view["parts"]]].sum(1) for name in names], 1)
    top = np.bincount(share.argmax(1), minlength=len(names))  # share: (n_head, parts)
    return dict(zip(names, share.mean(0))), dict(zip(names, top))


# ------------------------------------------------------------------------- train logs
STEP_LINE = re.compile(r"^epoch (\d+)/(\d+) step (\d+)/(\d+) loss (\S+)")
DEV_LINE = re.compile(r"^dev (?:after epoch (\d+)|at step (\d+) \(epoch ([\d.]+)\)): (.*)$")
# A resumed segment's line; logs before 2026-12-02 do not name the machine ("on ...").
RESUMED_LINE = re.compile(r"^resumed from .*: epoch (\d+), step (\d+)(?:, on .*)?$")
NUMBERS = {"mrr": r"\bmrr ([\d.]+)", "mr": r"\bMR ([\d.]+)", "hits@10": r"Hits@10 ([\d.]+)",
           "accuracy": r"\baccuracy ([\d.]+)",
           # logs before 2026-12-07 name the inverse rank "signal"
           "inverse_rank": r"^(?:inverse rank|signal) ([\d.]+)"}


@dataclass
class Curve:
    """A run's points as its log wrote them: (step, loss), and dev points {step, epoch, metric,
    value, kind, and mrr, mr, hits@10 or accuracy as logged}."""
    name: str
    loss: list = field(default_factory=list)
    dev: list = field(default_factory=list)
    total: int = 0  # the steps the run was scheduled for
    restarts: list = field(default_factory=list)  # steps where the logged mean starts again

    def cut(self, step):
        """Forget the points after `step`: a resumed run does them again (and a new run appended
        to an old log starts again)."""
        self.loss = [p for p in self.loss if p[0] <= step]
        self.dev = [d for d in self.dev if d["step"] <= step]
        self.restarts = [r for r in self.restarts if r < step]

    def loss_line(self):
        """(steps, losses), with a NaN wherever the logged mean starts again: the line breaks."""
        xs, ys = [], []
        for k, (step, loss) in enumerate(self.loss):
            if k and any(self.loss[k - 1][0] <= r < step for r in self.restarts):
                xs.append(step)
                ys.append(float("nan"))
            xs.append(step)
            ys.append(loss)
        return xs, ys

    def kind(self):
        """How its dev metric was measured, by its last dev line: sampled candidates, a stratified
        estimate of the full ranking, all candidates, or accuracy; '' without dev points."""
        return self.dev[-1]["kind"] if self.dev else ""


def dev_kind(rest):
    """How a dev line's MRR was measured: 'estimate', 'sampled', 'all', or '' where it does not
    say (the oldest logs' 'mrr 0.27' lines)."""
    if "estimate" in rest:
        return "estimate"
    if "sampled" in rest:
        return "sampled"
    return "all" if " on " in rest else ""


def dev_point(step, epoch, rest):
    """A dev point from the rest of a dev line ('mrr 0.85, MR 1.81, Hits@10 0.99 on 300 ...')."""
    point = {"step": step, "epoch": epoch}
    for name, pattern in NUMBERS.items():
        m = re.search(pattern, rest)
        if m:
            point[name] = float(m.group(1))
    if "accuracy" in point:
        point.update(metric="accuracy", value=point["accuracy"], kind="accuracy")
    elif "inverse_rank" in point:  # a big graph's estimate since 2026-11-29: MR, no MRR
        point.update(metric="inverse_rank", value=point["inverse_rank"], kind="estimate")
    elif "mrr" in point:
        point.update(metric="mrr", value=point["mrr"], kind=dev_kind(rest))
    return point


def parse_log(text, name):
    """The Curve of train.py's log text: step lines give the loss; 'dev after epoch E' is at the
    epoch's last step (always logged), 'dev at step S' at S; a resume forgets what followed its
    step (those steps are done again), and the logged mean starts again at a resume or an epoch."""
    curve, step, epoch = Curve(name), 0, None
    for line in text.splitlines():
        line = line.strip()
        m = STEP_LINE.match(line)
        if m:
            s, total, loss = m.group(3, 4, 5)
            if curve.loss and int(s) <= curve.loss[-1][0]:  # resumed, unsaid (older logs)
                curve.cut(int(s) - 1)
                curve.restarts.append(curve.loss[-1][0] if curve.loss else 0)
            elif curve.loss and m.group(1) != epoch:  # a new epoch's mean starts afresh
                curve.restarts.append(curve.loss[-1][0])
            step, curve.total, epoch = int(s), int(total), m.group(1)
            curve.loss.append((step, float(loss)))
            continue
        m = RESUMED_LINE.match(line)
        if m:
            step = int(m.group(2))
            curve.cut(step)
            curve.restarts.append(step)
            continue
        m = DEV_LINE.match(line)
        if m:
            after, at, fraction, rest = m.groups()
            if at:
                point = dev_point(int(at), float(fraction), rest)
            else:
                point = dev_point(step, float(after), rest)
            if "metric" in point:
                curve.dev.append(point)
    for d in curve.dev:  # the oldest logs' first lines lack the candidates: the later ones tell
        d["kind"] = d["kind"] or curve.dev[-1]["kind"]
    return curve


def metrics_curve(folder, name):
    """The Curve of a run folder's metrics.jsonl (runlog.Metrics wrote it)."""
    train, dev, starts = runlog.read_metrics(folder)
    curve = Curve(name, total=train[-1]["total_steps"] if train else 0, restarts=starts)
    curve.loss = [(r["step"], r["loss"]) for r in train]
    curve.restarts += [a["step"] for a, b in zip(train, train[1:]) if b["epoch"] != a["epoch"]]
    for r in dev:
        kind = "estimate" if r.get("estimate") else "sampled" if r.get("sampled") else "all"
        curve.dev.append(r | {"kind": "accuracy" if r["metric"] == "accuracy" else kind})
    return curve


def read_curve(path, name=None):
    """The Curve of a run folder (its metrics.jsonl, else its log.txt) or of a train log; named
    after the run folder, or after the log's file name."""
    p = Path(path)
    if not p.exists():
        raise data.DataError(f"{p}: no such run folder or train log")
    if p.is_dir() and (p / runlog.METRICS).is_file():
        curve = metrics_curve(p, name or p.resolve().name)
        if not curve.loss:
            raise data.DataError(f"{p / runlog.METRICS}: no training records yet")
        return curve
    log = p / "log.txt" if p.is_dir() else p
    if not log.is_file():
        raise data.DataError(f"{p}: a folder without log.txt (give a run folder of train.py, "
                             "or its log)")
    default = re.sub(r"(\.train)?\.(log|txt)$", "", log.name)
    if log.name == "log.txt":
        default = log.resolve().parent.name
    curve = parse_log(files.read_text(log, data.DataError)[1], name or default)
    if not curve.loss:
        raise data.DataError(f"{log}: no training lines ('epoch E/N step S/T loss X ...', as "
                             "train.py writes them)")
    return curve


# ------------------------------------------------------------------------- drawing
def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no window); None where matplotlib is not
    installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def need_pyplot():
    """pyplot(), else the one-line error that says how to install it."""
    plt = pyplot()
    if plt is None:
        raise ModuleNotFoundError(NO_MATPLOTLIB)
    return plt


def save_png(plt, fig, out):
    """The figure as a PNG, written atomically (a failure leaves no partial file); then closed."""
    try:
        files.write_atomic(out, lambda f: fig.savefig(f, format="png", dpi=DPI))
    finally:
        plt.close(fig)


def mark_tokens(ax, view):
    """The tokens under the x axis, coloured by part; white lines frame each [SEP]; a blue bar
    above the axes over segment B's text (token type 1: the tail)."""
    ax.set_xticks(range(len(view["labels"])), view["labels"], rotation=90, fontsize=7)
    for label, part in zip(ax.get_xticklabels(), view["parts"]):
        label.set_color(PART_COLOURS[part])
        label.set_fontweight("bold" if part in ("[CLS]", "[SEP]", "prompt") else "normal")
    for pos in [i for i, p in enumerate(view["parts"]) if p == "[SEP]"]:
        ax.axvline(pos - 0.5, color="white", lw=1.5)
        ax.axvline(pos + 0.5, color="white", lw=1.5)
    tail = [i for i, p in enumerate(view["parts"]) if p == "tail"]
    if tail:
        ax.plot([tail[0] - 0.5, tail[-1] + 0.5], [1.02, 1.02], color="royalblue", lw=4,
                clip_on=False, transform=ax.get_xaxis_transform())


def draw_attention(plt, views, sources, matrices=False):
    """One column per model, one row per chosen layer: per head (rows) the chosen token's
    attention over the tokens; with matrices, every head's whole L x L map instead. The triple
    and each model's score on top."""
    if matrices:
        fig = draw_matrices(plt, views, sources)
        legend = "rows attend to columns (0 to 1); white lines at the prompt slots and [SEP]"
    else:
        fig = draw_token_rows(plt, views, sources)
        legend = ("tokens: prompt slots orange, head black, relation green, tail blue (segment B, "
                  "bar), [CLS]/[SEP] grey; white lines frame [SEP]")
    scores = "; ".join(f"{s.name}: score {v['score']:+.2f}" for v, s in zip(views, sources))
    fig.suptitle(f"{views[0]['text']}   {scores} (NSP logit margin)\n{legend}", fontsize=10)
    fig.tight_layout()
    return fig


def draw_token_rows(plt, views, sources):
    """Per model (column) and chosen layer (row) a heads x tokens map of the chosen token's
    attention, with its colour scale."""
    n_rows = max(len(v["layers"]) for v in views)
    n_head = max(v["weights"].shape[1] for v in views)
    L = max(len(v["labels"]) for v in views)
    size = (max(10, len(views) * (1.5 + 0.22 * L)), n_rows * (0.25 * n_head + 1.9) + 1.2)
    fig, axes = plt.subplots(n_rows, len(views), figsize=size, squeeze=False)
    for col, (view, src) in enumerate(zip(views, sources)):
        for row, layer in enumerate(view["layers"]):
            ax = axes[row, col]
            w = view["weights"][row][:, view["token"], :]  # (n_head, L): the chosen token's row
            image = ax.imshow(w, cmap="viridis", vmin=0, aspect="auto")
            fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01)
            ax.set_yticks(range(len(w)), [f"h{k + 1}" for k in range(len(w))], fontsize=7)
            mark_tokens(ax, view)
            note = f"\n({src.note})" if src.note else ""
            calibrated = ", calibrated after it" if layer in view["calibrated"] else ""
            ax.set_title(f"{src.label}{note}\nlayer {layer} of 0..{view['n_layers'] - 1}"
                         f"{calibrated}: attention of {view['labels'][view['token']]} per head",
                         fontsize=9, pad=16)
    return fig


def draw_matrices(plt, views, sources):
    """Every head's whole attention matrix (rows attend to columns): a row of heads per model and
    chosen layer; white lines at the prompt slots and [SEP]."""
    n_rows = sum(len(v["layers"]) for v in views)
    n_head = max(v["weights"].shape[1] for v in views)
    size = (max(10, 1.4 * n_head), 1.6 * n_rows + 1.2)
    fig, axes = plt.subplots(n_rows, n_head, figsize=size, squeeze=False)
    row = 0
    for view, src in zip(views, sources):
        lines = [i for i, p in enumerate(view["parts"]) if p in ("[SEP]", "prompt")]
        for layer, w in zip(view["layers"], view["weights"]):
            for k, ax in enumerate(axes[row]):
                ax.set_xticks([])
                ax.set_yticks([])
                if k >= len(w):  # a model with fewer heads than the other
                    continue
                ax.imshow(w[k], cmap="viridis", vmin=0, vmax=1)
                ax.set_title(f"h{k + 1}", fontsize=7)
                for pos in lines:
                    ax.axvline(pos, color="white", lw=0.3)
                    ax.axhline(pos, color="white", lw=0.3)
            axes[row, 0].set_ylabel(f"{src.name}\nlayer {layer}", fontsize=7)
            row += 1
    return fig


def draw_curves(plt, curves, logx=False):
    """Train loss, the dev metric (MRR or accuracy) and dev Hits@10 (where logged) against steps;
    a colour per run, its best dev point starred; a sampled dev metric dashed (it flatters: not
    the scale of an estimate of the full ranking)."""
    hits = any("hits@10" in d for c in curves for d in c.dev)
    fig, axes = plt.subplots(1, 3 if hits else 2, figsize=(15 if hits else 11, 4.6), squeeze=False)
    axes = axes[0]
    metrics = sorted({d["metric"] for c in curves for d in c.dev})
    runs = []  # the loss lines: the legend's entries, one a run
    for k, c in enumerate(curves):
        colour = f"C{k}"
        kind = DEV_KINDS.get(c.kind(), "no dev points")
        runs += axes[0].plot(*c.loss_line(), color=colour, lw=1, label=f"{c.name} ({kind})")
        if not c.dev:
            continue
        style = "o--" if c.kind() == "sampled" else "o-"
        steps = [d["step"] for d in c.dev]
        axes[1].plot(steps, [d["value"] for d in c.dev], style, color=colour, ms=3, lw=1,
                     label=kind)
        best = max(c.dev, key=lambda d: d["value"])
        axes[1].plot(best["step"], best["value"], "*", color=colour, ms=14, mec="black")
        axes[1].annotate(f"{best['value']:.3f}", (best["step"], best["value"]), fontsize=8,
                         textcoords="offset points", xytext=(-9, 5), ha="right", color=colour)
        with_hits = [d for d in c.dev if "hits@10" in d]
        if hits and with_hits:
            axes[2].plot([d["step"] for d in with_hits], [d["hits@10"] for d in with_hits], style,
                         color=colour, ms=3, lw=1)
    axes[0].set_ylabel("train loss as logged\n(mean since the epoch's start or a resume)")
    names = {"mrr": "MRR", "inverse_rank": "1 / estimated rank"}
    axes[1].set_ylabel("dev " + " / ".join(names.get(m, m) for m in metrics))
    if any(c.dev for c in curves):
        axes[1].legend(fontsize=8, loc="lower right")
    if hits:
        axes[2].set_ylabel("dev Hits@10")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if logx:
            ax.set_xscale("log")
    fig.suptitle("training curves (star: the best dev point)", fontsize=10)
    fig.legend(handles=runs, loc="upper center", bbox_to_anchor=(0.5, 0.95), fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93 - 0.045 * len(curves)))
    return fig


def write_curve(run_folder):
    """run_folder/curve.png from run_folder/log.txt (train.py calls it at each dev point): the
    path written; None where matplotlib is not installed, the log has no training line yet, or
    the file cannot be written (said on stderr: a picture never stops a training run)."""
    plt = pyplot()
    log = Path(run_folder) / "log.txt"
    if plt is None or not log.is_file():
        return None
    curve = parse_log(log.read_text(errors="replace"), Path(run_folder).resolve().name)
    if not curve.loss:
        return None
    out = Path(run_folder) / "curve.png"
    try:
        save_png(plt, draw_curves(plt, [curve]), out)
    except OSError as e:
        print(f"note: cannot write {out} ({e.strerror or e})", file=sys.stderr)
        return None
    return out


# ------------------------------------------------------------------------- command line
def layer_list(text):
    """--layers 0,3,5 (from 0, as PALT and --calib number them) -> [0, 3, 5]."""
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layers like 0,3,5, not {text!r}") from None
    if min(layers) < 0:
        raise argparse.ArgumentTypeError(f"layers count from 0, not {text!r}")
    return sorted(set(layers))


def png_name(kind, parts):
    """A default --out, in the current folder: kind-part-part.png, each part's characters other
    than ASCII letters, digits, '.', '_', '+' and '-' turned to '_'."""
    safe = [re.sub(r"[^A-Za-z0-9._+-]+", "_", p).strip("._-") for p in parts]
    return "-".join([kind, *safe]) + ".png"


def parse_args(argv=None):
    """The two commands and their flags."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    att = sub.add_parser("attention", help="a triple's attention at chosen layers, per head")
    att.add_argument("triple", nargs=3, metavar="HEAD RELATION TAIL",
                     help="ids or texts (text:X: an entity not in the graph)")
    att.add_argument("--data", help=f"{', '.join(graphs.DATASETS)}, or a graph's folder "
                     "(default: the checkpoint's)")
    att.add_argument("--data-dir", help="folder of the dataset folders ($PALT_DATA, else ./data)")
    src = att.add_mutually_exclusive_group()
    src.add_argument("--ckpt", help="a checkpoint or run folder (default: the shipped adapter)")
    src.add_argument("--model", help="a base model, zero-shot (minilm: its NSP head is random)")
    att.add_argument("--compare", help="beside it: a checkpoint, run folder or base model")
    att.add_argument("--text", choices=graphs.TEXTS, help="zero-shot: entity texts (default name)")
    att.add_argument("--layers", type=layer_list, help="layers from 0, as --calib numbers them "
                     "(default: the first, the middle and the last)")
    att.add_argument("--token", default="[CLS]", help="the attending token: a label (P1: the "
                     "first prompt slot) or a position from 0 (default [CLS])")
    att.add_argument("--matrices", action="store_true", help="every head's whole matrix")
    att.add_argument("--out", help="the PNG to write (default: attention-HEAD-RELATION-TAIL.png "
                     "here)")
    cur = sub.add_parser("curve", help="train loss and dev metric against steps, runs overlaid")
    cur.add_argument("runs", nargs="+", metavar="RUN_FOLDER_OR_TRAIN_LOG")
    cur.add_argument("--names", help="legend names, comma-separated, one a run (default: the "
                     "folder's or the file's)")
    cur.add_argument("--logx", action="store_true", help="steps on a log scale")
    cur.add_argument("--out", help="the PNG to write (default: curve-RUN.png here, the runs' "
                     "names joined by +)")
    met = sub.add_parser("methods", help="test figures against tunable parameters, per method")
    met.add_argument("--out", default="methods.png", help="the PNG to write (default: methods.png "
                     "here)")
    args = ap.parse_args(argv)
    if args.command == "attention" and not args.out:
        args.out = png_name("attention", args.triple)
    if args.out and (not args.out.lower().endswith(".png") or Path(args.out).is_dir()):
        ap.error(f"--out {args.out}: give the path of a .png file")
    if args.command == "curve" and args.names and len(args.names.split(",")) != len(args.runs):
        ap.error(f"--names gives {len(args.names.split(','))} names for {len(args.runs)} runs")
    if args.command == "attention" and args.data and args.data.lower() in graphs.DATASETS:
        args.data = args.data.lower()
    return args


def attention(args):
    """plot.py attention: check both models' sources and the triple (seconds), then that
    matplotlib is there; load, run the triple, draw, write; print where the attention goes."""
    if args.data:  # a benchmark, or a folder with train.tsv (DataError: one line)
        graphs.dataset(args.data, args.data_dir)
    first = source_run(args, args.ckpt, args.model)
    checked = [(first, *check_source(first))]
    if args.compare:
        ckpt, model = compare_spec(args.compare)
        other = source_run(args, ckpt, model)
        other.data = first.data  # the first model's graph (a checkpoint of another: an error)
        if model:  # zero-shot: the entity texts the first model reads
            other.text = args.text or (checked[0][1] or {}).get("text")
        checked.append((other, *check_source(other)))
    for _, _, kg in checked:  # a bad entity or relation, before any model loads
        resolve_triple(kg, *args.triple)
    plt = need_pyplot()
    sources = [load_source(*c) for c in checked]
    views = [triple_view(s, *args.triple, args.layers, args.token) for s in sources]
    for view, src in zip(views, sources):
        print(f"{src.label}: {view['text']} score {view['score']:+.4f} (NSP logit margin)")
        for row, layer in enumerate(view["layers"]):
            mean, top = part_shares(view, row)
            shares = ", ".join(f"{p} {s:.2f}" for p, s in mean.items())
            heads = ", ".join(f"{p} {n}" for p, n in top.items() if n)
            print(f"  layer {layer}: {view['labels'][view['token']]}'s attention, mean over "
                  f"heads: {shares}; heads by their largest part: {heads}")
    save_png(plt, draw_attention(plt, views, sources, args.matrices), Path(args.out))
    print(f"wrote {args.out}")


def curve(args):
    """plot.py curve: read every run first (the default --out is named after them), then draw and
    write."""
    names = args.names.split(",") if args.names else [None] * len(args.runs)
    curves = [read_curve(path, name) for path, name in zip(args.runs, names)]
    args.out = args.out or png_name("curve", ["+".join(c.name for c in curves)])
    files.check_writable(Path(args.out).parent, f"--out {args.out}")
    plt = need_pyplot()
    for c in curves:
        summary = f"{c.name}: {len(c.loss)} loss points to step {c.loss[-1][0]:,} of {c.total:,}"
        summary += f", {len(c.dev)} dev points"
        if c.dev:
            best = max(c.dev, key=lambda d: d["value"])
            summary += f", best {best['metric']} {best['value']:.4f} at step {best['step']:,}"
        print(summary)
    save_png(plt, draw_curves(plt, curves, args.logx), Path(args.out))
    print(f"wrote {args.out}")


METHOD_AXES = {"umls": "UMLS test MRR", "wn11": "WN11 test accuracy (points)"}  # one panel each


def draw_methods(plt, found: dict[str, list[tuple[str, int, float, float, list[int]]]]):
    """Each graph's test figure against tunable parameters on a log axis, one panel a graph with
    finals, sd bars over seeds, each point labelled."""
    fig, axes = plt.subplots(1, len(found), figsize=(6.4 * len(found), 4.4), squeeze=False)
    for ax, (graph, points) in zip(axes[0], found.items()):
        for method, tunable, mean, sd, seeds in points:
            ax.errorbar([tunable], [mean], yerr=[sd], fmt="o", capsize=4, color="royalblue")
            ax.annotate(f"{method} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})",
                        (tunable, mean), textcoords="offset points", xytext=(6, 6), fontsize=9)
        ax.set_xscale("log")
        ax.margins(x=0.25, y=0.1)  # room for the labels right of the outermost points
        ax.set_xlabel("tunable parameters (log scale)")
        ax.set_ylabel(f"{METHOD_AXES[graph]}, mean ± sd over seeds")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("Methods at equal budgets: results/methods/")
    fig.tight_layout()
    return fig


def methods(args) -> None:
    """plot.py methods: the finals support/tables.py reads (one line where there are none), then
    matplotlib, then the picture."""
    from support import tables
    found = {g: points for g in METHOD_AXES if (points := tables.method_points(g))}
    if not found:
        raise SystemExit(f"error: no finals with parameter counts in "
                         f"{files.project_path(tables.RESULTS / tables.METHODS_FOLDER)}/ yet "
                         f"(umls-METHOD-sSEED.json, wn11-METHOD-sSEED.json): nothing to draw")
    files.check_writable(Path(args.out).parent, f"--out {args.out}")
    plt = need_pyplot()
    for graph, points in found.items():
        for method, tunable, mean, sd, seeds in points:
            print(f"{method}: {tunable:,} tunable parameters, {METHOD_AXES[graph]} {mean:.4f} "
                  f"± {sd:.4f} (seeds {', '.join(map(str, seeds))})")
    save_png(plt, draw_methods(plt, found), Path(args.out))
    print(f"wrote {args.out}")


def main(argv=None):
    """Parse and run the command; the library's errors become one line."""
    args = parse_args(argv)
    try:
        if args.command == "attention":
            attention(args)
        elif args.command == "methods":
            methods(args)
        else:
            curve(args)
    except ERRORS as e:
        raise SystemExit(f"error: {e}") from None
    except ModuleNotFoundError as e:  # matplotlib: the message says how to install it
        raise SystemExit(str(e)) from None
    except OSError as e:  # the PNG could not be written (disk full, permissions): no partial file
        raise SystemExit(f"error: cannot write {args.out} ({e.strerror or e})") from None


if __name__ == "__main__":
    main()

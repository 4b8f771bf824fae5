"""train.py's command line: `Run` (each setting, its flag, default, help and bounds in one place),
parse_args (PRESETS fill what is left open, then every flag is checked before anything loads), the
checks that train.py and evaluate.py share, and a run's first lines."""
import argparse
import math
import os
import re
import shutil
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from data import DataError
from palt import METHODS, param_report
from support.errors import FlagError
from support.graphs import DATASETS, TEXTS, dataset
from support.devices import DTYPES
from support.files import project_path
from support.hub import has_nsp_head

# The settings that a recipe may set and otherwise take these values.
FALLBACKS = {"hard_negatives": 0.0, "warmup": 0.1, "adam_beta2": 0.999, "adam_eps": 1e-8,
             "either_side": False, "head_input": "cls", "method": "palt"}
# --method lora's rank and alpha where not given: alpha = 2 x rank, a common choice (the LoRA
# paper's GPT-3 runs set alpha to the first rank they tried and left it).
LORA_FALLBACKS = {"lora_rank": 8, "lora_alpha": 16.0}
# --method prompt's prompt tokens where neither the command line nor the recipe gives any: the
# paper's counts.
PROMPT_TUNING_PROMPTS = (10, 10, 10)
# --hard-negatives draw from each entity's NEAR nearest entities; --dev-near takes the first
NEAR = 32


def int_list(s, n=()):
    """'2,0,0' -> (2, 0, 0): n (allowed counts) non-negative integers, or without n any number, and
    'none' -> ()."""
    try:
        t = tuple(int(x) for x in s.split(",")) if s != "none" or n else ()
    except ValueError:
        t = (-1,)
    if (n and len(t) not in n) or min(t, default=0) < 0:
        what = "layer numbers from 0 like 3,5, or none"
        if n:
            what = f"{' or '.join(map(str, n))} non-negative integers like 2,0,0"
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return t


def setting(default=None, help="", low=None, high=None, parse=None, choices=None):
    """A Run field and its --flag: one home for the default, the help, the bounds (low: (value,
    allowed itself); high: (value, what it is)), the text's parser and the choices. None:
    PRESETS[recipe][data] fills it."""
    meta = dict(help=help, low=low, high=high, parse=parse, choices=choices)
    return field(default=default, metadata=meta)


def negatives_list(s):
    return int_list(s, (3, 4))


def prompts_list(s):
    return int_list(s, (3,))


@dataclass
class Run:
    data: str = setting(help=f"{', '.join(DATASETS)}, or a folder with train.tsv (README)")
    recipe: str | None = setting(help="PRESETS[recipe][data] fills every setting left open "
                                 "(default: tuned for a model without a pretrained NSP head, "
                                 "MiniLM; paper for BERT)")
    method: str | None = setting(help="what trains: palt (default); finetune, the whole LM; lora, "
                                 "low-rank updates of attention's q and v; bitfit, the encoder's "
                                 "biases; prompt, prompt tokens alone; probe, the head alone",
                                 choices=METHODS)
    model: str = setting("minilm", "minilm, bert-base-cased, ..., or a folder with a BERT "
                         "model.safetensors")
    data_dir: str | None = setting(help="folder holding the datasets (default $PALT_DATA, else "
                                   "data/)")
    text: str = setting("name", "entity texts: names, long (umls, fb13), description (fb15k-237)",
                        choices=TEXTS)
    out: str | None = setting(help="checkpoint and log folder (default runs/<data>-<model>)")
    epochs: int | None = setting(low=(1, True), help="passes over the train triples")
    max_steps: int | None = setting(low=(1, True), help="stop (and schedule the lr) as if training "
                                    "ended here")
    lr: float | None = setting(low=(0, False), help="peak learning rate")
    head_lr: float | None = setting(low=(0, False), help="lr of the heads without NSP pretraining "
                                    "(MiniLM's pooler and NSP head); default --lr")
    batch: int | None = setting(low=(1, True), help="positive triples per step over all processes")
    negatives: tuple | None = setting(parse=negatives_list, help="corruptions of head, relation, "
                                      "tail per positive [, self-negatives (h, r, h), (t, r, t)], "
                                      "e.g. 1,0,1,2")
    either_side: bool | None = setting(help="one corruption a positive, of its head or of its "
                                       "tail (p = .5; the authors' scripts): with --negatives "
                                       "1,0,1")
    prompts: tuple | None = setting(parse=prompts_list, help="b,m,e prompt tokens, e.g. 2,0,0")
    calib: tuple | None = setting(parse=int_list, help="calibrated layers from 0, e.g. 3,5, or "
                                  "none (default: the middle and the last)")
    no_wp: bool = setting(False, "ablation: no prompt encoder W_p")
    prompt_mlp: bool = setting(False, "re-parametrise the prompts through an MLP")
    finetune: bool = setting(False, "--method finetune: the whole LM trains (KG-BERT's row)")
    lora_rank: int | None = setting(low=(1, True), help="--method lora: the updates' rank "
                                    f"(default {LORA_FALLBACKS['lora_rank']})")
    lora_alpha: float | None = setting(low=(0, False), help="--method lora: the updates scale by "
                                       "alpha / rank (default "
                                       f"{LORA_FALLBACKS['lora_alpha']:g})")
    head_input: str | None = setting(help="what the NSP head reads: [CLS] (default), or the mean "
                                     "of the last layer (the state MiniLM was trained to "
                                     "produce; a new NSP head)", choices=("cls", "mean"))
    dtype: str = setting("auto", "autocast: auto = bf16 on a GPU, and on a CPU with native bf16 "
                         "where it times faster (once, cached), else fp32", choices=DTYPES)
    compile: bool | None = setting(help="torch.compile the step (recipe gpu does; on CPU it needs "
                                   "g++)")
    cudagraphs: bool = setting(False, "with --compile on one GPU: replay each padded length's step "
                               "as a CUDA graph (torch.compile's reduce-overhead), not as hundreds "
                               "of launches")
    max_seq_length: int = setting(192, "every position the model sees, prompts included",
                                  low=(4, True))
    dev_limit: int | None = setting(low=(1, True), help="link prediction: dev triples ranked at "
                                    "each dev point")
    dev_sample: int | None = setting(low=(1, True), help="... against a seeded sample of N "
                                     "entities, not all")
    dev_every: int | None = setting(low=(1, True), help="also a dev point and a resume state every "
                                    "N steps")
    patience: int | None = setting(low=(1, True), help="stop once dev has not risen for N dev "
                                   "points in a row (at an epoch's end; best.safetensors stays)")
    dev_near: int | None = setting(low=(1, True), high=(NEAR, "the nearest entities found once per "
                                   "run"), help="... or estimate the exact ranks: the N nearest "
                                   "scored, --dev-sample draws")
    hard_negatives: float | None = setting(None, "the share of entity corruptions drawn from the "
                                           "replaced one's nearest (default: the recipe's, else 0)",
                                           low=(0, True), high=(1, "a share of the entity "
                                                                "corruptions"))
    warmup: float | None = setting(None, "linear warm-up, a fraction of the steps (default 0.1)",
                                   low=(0, True), high=(1, "a fraction of the steps"))
    weight_decay: float = setting(0.01, "AdamW's, on matrices only", low=(0, True))
    adam_beta2: float | None = setting(None, "AdamW's beta2 (default 0.999; the authors' scripts "
                                       "0.98)", low=(0, True))
    adam_eps: float | None = setting(None, "AdamW's epsilon (default 1e-8; the authors' scripts "
                                     "1e-6)", low=(0, False))
    grad_clip: float = setting(1.0, "gradient norm clipping", low=(0, False))
    seed: int = setting(42, "order, negatives, a random NSP head and dropout", low=(0, True))
    log_every: int = setting(20, "steps between log lines", low=(1, True))
    resume: bool = setting(False, "continue the run in --out from its last saved state")
    tensorboard: bool = setting(False, "also write TensorBoard event files in --out (the "
                                "tensorboard package: pip install tensorboard)")
    search: str | None = setting(None, "the search and trial that chose these settings, kept in "
                                 "the checkpoint (default: the recipe's, if any)")


def recorded(run):
    """The run as checkpoints record it: --out, --data-dir and a folder given as --data or --model
    named by files.project_path, so that no record depends on where the command ran."""
    d = asdict(run)
    del d["tensorboard"]  # how a run is watched, not what it trains: no checkpoint records it
    del d["search"]  # where the settings came from: the checkpoint's own key, search
    for k in ("out", "data_dir"):
        if d[k]:
            d[k] = project_path(d[k])
    if d["data"].lower() not in DATASETS:
        d["data"] = project_path(d["data"])
    if Path(d["model"]).is_dir():
        d["model"] = project_path(d["model"])
    return d


def flag(name):
    """'dev_every' -> '--dev-every'."""
    return "--" + name.replace("_", "-")


def parser(description, presets):
    """An argparse parser with one flag per Run field: type, default, help (recipe: presets' keys).
    """
    ap = argparse.ArgumentParser(description=description)
    # '-1,0,0' and '-1e-3' are values (refused below with their own message), not unknown options
    ap._negative_number_matcher = re.compile(r"^-\.?\d")
    for f in fields(Run):
        m = f.metadata
        kind = next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))
        choices = tuple(presets) if f.name == "recipe" else m["choices"]
        # a switch; a None default (the recipe decides) also takes --no-FLAG
        if kind is bool and f.default is False:
            ap.add_argument(flag(f.name), action="store_true", help=m["help"])
        elif kind is bool:
            ap.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, help=m["help"])
        else:
            ap.add_argument(flag(f.name), type=m["parse"] or kind, default=f.default,
                            choices=choices, help=m["help"], required=f.name == "data")
    return ap


def parse_args(argv, presets, description):
    """The Run of a command line: PRESETS[recipe][data] (data: a benchmark, else 'own') fills every
    setting left open; every flag is checked here, before anything loads."""
    ap = parser(description, presets)
    run = Run(**vars(ap.parse_args(argv)))
    check_method(ap, run)  # on the flags as given, before a recipe fills the rest
    try:
        name = dataset(run.data, run.data_dir)[0]  # a benchmark's name, or a folder with train.tsv
    except DataError as e:
        ap.error(str(e))
    if run.data.lower() in DATASETS:
        run.data = name
    run.recipe_note = None  # not a setting: why a run without --recipe took its recipe
    if run.recipe is None:
        run.recipe, run.recipe_note = default_recipe(run.model, run.method or "palt", presets)
    given = {k for k, v in vars(run).items() if v is not None}
    for k, v in presets[run.recipe][run.data if run.data in DATASETS else "own"].items():
        # A recipe's one-of-head-or-tail goes with its own negatives, not with the ones given.
        if getattr(run, k) is None and not (k == "either_side" and "negatives" in given):
            setattr(run, k, v)
    fallbacks = FALLBACKS | (LORA_FALLBACKS if run.method == "lora" else {})
    for k, v in fallbacks.items():  # what neither the command line nor the recipe set
        if getattr(run, k) is None:
            setattr(run, k, v)
    check_run(ap, run)
    # Every method but PALT leaves PALT's parts out; prompt tuning keeps the prompt tokens.
    if run.method != "palt":
        run.calib, run.no_wp = (), True
    if run.method not in ("palt", "prompt"):
        run.prompts, run.prompt_mlp = (0, 0, 0), False
    if run.method == "prompt" and not sum(run.prompts):  # the recipe has none: the paper's
        run.prompts = PROMPT_TUNING_PROMPTS
    run.finetune = run.method == "finetune"  # the alias, as the record shows it
    check_seq_length(run.max_seq_length, sum(run.prompts))
    run.out = run.out or f"runs/{name}-{Path(run.model).name}"
    return run


def default_recipe(model: str, method: str, presets: dict) -> tuple[str, str]:
    """(recipe, why in one line) of a run without --recipe: paper for a model with a pretrained
    NSP head (the paper's BERT); for one without (MiniLM), what our searches found for it: the
    method's own tuned recipe where there is one (tuned-finetune), else PALT's (tuned)."""
    name = Path(model).name
    if has_nsp_head(model):
        return "paper", f"recipe paper: {name} has a pretrained NSP head, the paper's setting"
    recipe = f"tuned-{method}" if f"tuned-{method}" in presets else "tuned"
    return recipe, (f"recipe {recipe}: {name} has no pretrained NSP head, so it takes what our "
                    "searches found for MiniLM (--recipe paper: the paper's BERT settings)")


# What each method trains beside the heads a model without an NSP head must train.
METHOD_TRAINS = {"finetune": "the whole LM", "lora": "low-rank updates of q and v",
                 "bitfit": "the encoder's biases", "prompt": "prompt tokens alone",
                 "probe": "the head alone"}


def check_method(ap, run):
    """--method against the flags given with it, in one argparse error: --finetune is its alias;
    PALT's parts (--prompts, --calib, --prompt-mlp) go with palt alone (prompts and their MLP with
    prompt tuning too); --lora-rank and --lora-alpha with lora."""
    if run.finetune and run.method not in (None, "finetune"):
        ap.error(f"--finetune is --method finetune: give one method, not --method {run.method} "
                 "too")
    if run.finetune:
        run.method = "finetune"
    method = run.method or "palt"
    if method != "lora" and (run.lora_rank is not None or run.lora_alpha is not None):
        ap.error(f"--lora-rank and --lora-alpha shape --method lora's updates: not --method "
                 f"{method}")
    if method == "palt":
        return
    given = []
    if sum(run.prompts or ()) and method != "prompt":
        given.append("--prompts")
    if run.calib:
        given.append("--calib")
    if run.prompt_mlp and method != "prompt":
        given.append("--prompt-mlp")
    if given:
        which = "--finetune" if run.finetune else f"--method {method}"
        ap.error(f"{which} trains {METHOD_TRAINS[method]} and none of PALT's parts: drop "
                 + ", ".join(given[:-1]) + (" and " if len(given) > 1 else "") + given[-1])
    if method == "prompt" and run.prompts is not None and not sum(run.prompts):
        ap.error("--method prompt trains prompt tokens alone: --prompts 0,0,0 leaves none")


def check_run(ap, run):
    """The bounds beside each field, and the flags that do not go together: one argparse error."""
    check_limits(ap, run, {f.name: f.metadata["low"] for f in fields(Run) if f.metadata["low"]})
    for f in fields(Run):
        high, value = f.metadata["high"], getattr(run, f.name)
        if high and value is not None and value > high[0]:
            ap.error(f"{flag(f.name)}: at most {high[0]} ({high[1]}), not {value}")
    if sum(run.negatives) == 0:
        ap.error("--negatives 0,0,0 leaves no false triples to learn from: give at least one "
                 "corruption per positive")
    if run.negatives[3:] > (2,):
        ap.error(f"--negatives: at most 2 self-negatives, (h, r, h) and (t, r, t), not "
                 f"{run.negatives[3]}")
    if run.either_side and tuple(run.negatives) != (1, 0, 1):
        ap.error(f"--either-side draws one head or tail corruption a positive: it goes with "
                 f"--negatives 1,0,1, not {','.join(map(str, run.negatives))}")
    if run.adam_beta2 >= 1:
        ap.error(f"--adam-beta2 must be below 1, not {run.adam_beta2}")
    if run.cudagraphs and not run.compile:
        ap.error("--cudagraphs replays the compiled step: it needs --compile (or --recipe gpu)")


def check_limits(ap, args, limits):
    """Numeric flags against their lower bounds {name: (low, low itself allowed)}: one argparse
    error naming it."""
    for k, (low, inclusive) in limits.items():
        v = getattr(args, k)
        if v is None:
            continue
        above = v >= low if inclusive else v > low
        if above and math.isfinite(v):
            continue
        bound = "at least" if inclusive else "more than"
        finite = "" if math.isfinite(v) else " and finite"
        ap.error(f"{flag(k)} must be {bound} {low}{finite}, not {v}")


def check_seq_length(max_seq_length, n_prompts, positions=None, model=None):
    """--max-seq-length counts every position the model sees: the prompts, [CLS], two [SEP] and
    some text."""
    if max_seq_length < 4 + n_prompts:
        raise FlagError(f"--max-seq-length {max_seq_length} leaves no room for text: the "
                        f"{n_prompts} prompt tokens, [CLS] and two [SEP] take {3 + n_prompts}")
    if positions is not None and max_seq_length > positions:
        raise FlagError(f"--max-seq-length {max_seq_length} (prompts included) exceeds the "
                        f"{positions} positions of {model}")


def check_model(run, model, loaded):
    """What only the loaded model tells: its positions hold --max-seq-length, something trains."""
    positions = loaded.config.max_position_embeddings
    check_seq_length(run.max_seq_length, sum(run.prompts), positions, loaded.path.name)
    if not any(p.requires_grad for p in model.parameters()):
        raise FlagError("nothing to train (zero-shot needs no training: use evaluate.py "
                        "--model)")


def check_devices(run, device, ddp, world_size, print0):
    """train.py's flags that depend on where the run is: before anything loads."""
    # DDP's gradient all-reduce runs inside the backward a graph captures
    if run.cudagraphs and ddp:
        raise FlagError("--cudagraphs trains on one GPU without DDP: leave it out under "
                        "torchrun")
    check_compiler(run.compile, device)
    if run.cudagraphs and device.type != "cuda":
        print0(f"--cudagraphs: CUDA graphs exist on a GPU only; on {device.type} the step is "
               "compiled without them")
    if run.batch % world_size:
        raise FlagError(f"--batch {run.batch} is not divisible by the {world_size} "
                        "processes")


def check_compiler(compile, device):
    """torch.compile on a CPU builds C++ kernels: without a compiler, one line before the model
    loads."""
    if compile and device.type == "cpu" and not shutil.which(os.environ.get("CXX", "g++")):
        raise FlagError("--compile on CPU needs a C++ compiler (g++, or $CXX): none found")


def total_steps(run, n_train):
    """The steps the run takes: --epochs of n_train // --batch steps, or --max-steps if fewer."""
    steps_per_epoch = n_train // run.batch
    if steps_per_epoch == 0:
        raise FlagError(f"--batch {run.batch} is larger than the {n_train} train "
                        "triples")
    return min(run.epochs * steps_per_epoch, run.max_steps or run.epochs * steps_per_epoch)


def announce(run, kg, model, where, print0, presets):
    """The run's first lines: the graph, the model's tunable parameters, where it trains; for a
    graph of one's own the settings it got; what the graph lacks."""
    r = param_report(model)
    print0(f"{kg.name}: {len(kg.train):,} train triples, {len(kg.entities):,} entities, text "
           f"{kg.text_file} | {Path(run.model).name}: tunable {r['tunable']:,} of {r['total']:,} "
           f"({r['percent']:.2f}%) {r['parts']} | {where}")
    if getattr(run, "recipe_note", None):
        print0(run.recipe_note)
    if run.data not in DATASETS:
        own = ", ".join(f"{k} {getattr(run, k)}" for k in presets[run.recipe]["own"])
        print0(f"settings for a graph of one's own (PRESETS['{run.recipe}']['own'], flags win): "
               + own)
    notes = list(kg.notes)
    if len(kg.dev) == 0:
        notes.append(f"{kg.folder}: no {kg.split_files['dev'].name}, so no dev points and no "
                     "best.safetensors; ckpt.safetensors is the last epoch")
    for note in notes:
        print0(note)

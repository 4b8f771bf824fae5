"""train.py's recipes: PRESETS[recipe][graph] holds the settings that a recipe gives a graph, one
setting a line with its source ('own': a graph of one's own). The command line's flags win; what
neither sets takes flags.FALLBACKS or the flag's own default. No recipe sets the model (--model).

  paper  BERT-base on GPUs: the paper's appendix, and the authors' scripts where it is silent
  cpu    ours for MiniLM on a few CPU cores, set by hand
  gpu    the cpu recipe compiled; the big graphs for 10 epochs with self-negatives
  tuned  the best trial of our dev searches for MiniLM (results/tune-GRAPH-palt/)
  tuned-finetune  the same for finetuning (results/tune-GRAPH-finetune/)

Without --recipe, a model with a pretrained NSP head (BERT) takes paper and one without (MiniLM)
takes tuned-METHOD where there is one, else tuned: flags.default_recipe.
"""

# ----------------------------------------------------------------------------- paper
# The authors' scripts are github.com/yuanyehome/PALT: scripts/*.sh and model/trainer.py. Where they
# disagree with the paper, the paper's value stays: the scripts draw one head-or-tail negative on
# WN11, FB13 and FB15k-237 (256, 64 and 128 sequences a step), WN18RR at lr 3e-5, FB13 with
# BERT-large for 10 epochs.
PAPER_ALL = dict(
    adam_beta2=0.98,  # model/trainer.py
    adam_eps=1e-6,  # model/trainer.py
)
PAPER_LP = dict(  # the link-prediction graphs
    batch=8,  # the appendix: positives a step
    prompts=(10, 10, 10),  # the appendix
    negatives=(5, 5, 5),  # the appendix: corruptions of head, relation and tail
    epochs=10,  # the appendix
)
PAPER = {
    "wn11": PAPER_ALL | dict(
        lr=1.5e-4,  # the appendix
        batch=32,  # the appendix
        prompts=(2, 0, 0),  # the appendix
        negatives=(1, 1, 1),  # the appendix
        epochs=40,  # the appendix
        warmup=0.025,  # WN11.sh: 880 of 35,200 steps
    ),
    "fb13": PAPER_ALL | dict(
        lr=1.5e-5,  # the appendix
        batch=32,  # the appendix
        prompts=(10, 10, 10),  # the appendix
        negatives=(1, 1, 1),  # the appendix
        epochs=40,  # the appendix
    ),
    "fb15k-237": PAPER_ALL | PAPER_LP | dict(
        lr=1e-4,  # the appendix
        dev_limit=50,  # ours: dev ranks of 50 triples...
        dev_sample=100,  # ... against 100 sampled entities, or a dev point takes hours
        dev_near=32,  # ours: and the 32 nearest entities scored, so the ranks are estimated
    ),
    "wn18rr": PAPER_ALL | PAPER_LP | dict(
        lr=1e-5,  # the appendix
        warmup=0.3,  # WN18RR.sh: 32,563 of 108,540 steps
        dev_limit=50,  # as FB15k-237
        dev_sample=100,  # as FB15k-237
        dev_near=32,  # as FB15k-237
    ),
    "umls": PAPER_ALL | PAPER_LP | dict(
        lr=5e-5,  # umls.sh
        warmup=0.092,  # umls.sh: 600 of 6,520 steps
        dev_limit=100,  # ours: 100 dev triples ranked at each dev point
    ),
    "own": PAPER_ALL | PAPER_LP | dict(
        lr=5e-5,  # umls.sh, the scripts' one small graph
        warmup=0.092,  # umls.sh
        dev_limit=100,  # ours
        dev_sample=1000,  # ours: a big graph of one's own ranks dev against 1,000 entities
    ),
}

# ----------------------------------------------------------------------------- cpu
CPU_ALL = dict(
    lr=1e-3,  # ours: the trainable part is small and starts at zero
    batch=32,  # ours
    prompts=(2, 0, 0),  # WN11's prompts in the paper, the cheapest of its settings
    negatives=(1, 1, 1),  # ours: one corruption of each part, 4 sequences a positive
)
CPU_BIG = CPU_ALL | dict(  # FB15k-237 and WN18RR: one epoch, estimated dev ranks
    negatives=(1, 0, 1),  # ours: these relations are few, their corruptions teach little
    epochs=1,  # ours: an epoch takes hours on a CPU
    dev_limit=50,  # as paper's
    dev_sample=100,  # as paper's
    dev_every=500,  # ours: a dev point and a resume state every 500 steps
    dev_near=32,  # as paper's
)
CPU = {
    "wn11": CPU_ALL | dict(epochs=3),  # ours
    "fb13": CPU_ALL | dict(epochs=1),  # ours: 316k positives an epoch
    "umls": CPU_ALL | dict(
        epochs=8,  # ours: dev MRR flattens after 8
        dev_limit=100,  # ours
    ),
    "fb15k-237": CPU_BIG,
    "wn18rr": CPU_BIG,
    "own": CPU_ALL | dict(
        epochs=5,  # ours
        dev_limit=100,  # ours
        dev_sample=1000,  # as paper's
    ),
}

# ----------------------------------------------------------------------------- gpu
GPU = {name: CPU[name] | dict(compile=True) for name in CPU}  # torch.compile the step
GPU["fb15k-237"] = GPU["fb15k-237"] | dict(
    negatives=(5, 5, 5, 2),  # the paper's, and both self-negatives (h, r, h) and (t, r, t)
    epochs=10,  # the paper's
    dev_every=2500,  # ours: a GPU step is quick
)
GPU["wn18rr"] = GPU["wn18rr"] | dict(
    negatives=(1, 0, 1, 2),  # ours: with both self-negatives
    epochs=10,  # the paper's
    dev_every=2500,  # ours
    hard_negatives=0.5,  # ours: half the corruptions from the replaced entity's nearest
)

# ----------------------------------------------------------------------------- tuned
# The best trial of a dev search (python -m support.tune; results/tune-GRAPH-palt/trials.tsv).
TUNED_WN11 = dict(  # WN11 PALT search (12,800 positives a trial), trial 19
    lr=4.53e-4,  # trial 19
    head_lr=2.65e-4,  # trial 19
    batch=8,  # trial 19
    negatives=(1, 0, 1),  # trial 19: one corruption a positive...
    either_side=True,  # ... of its head or of its tail
    prompts=(0, 0, 0),  # trial 19
    head_input="mean",  # trial 19
    warmup=8.01e-4,  # trial 19
    adam_beta2=0.98,  # trial 19
    adam_eps=1e-8,  # trial 19
    hard_negatives=0.0,  # the search's
    patience=3,  # ours: dev rose for 18 of 20 epochs; a plateau of 3 ends the run
)
TUNED = CPU | {
    "wn11": TUNED_WN11 | dict(epochs=20),  # the shipped WN11 adapter: dev flattens at 18
    "fb13": TUNED_WN11 | dict(epochs=5),  # the shipped FB13 adapter: dev flat from epoch 3
    "umls": dict(  # UMLS PALT search (at most 4 epochs a trial), trial 17
        lr=7.8e-4,  # trial 17
        head_lr=2.05e-3,  # trial 17
        batch=16,  # trial 17
        negatives=(1, 1, 1),  # trial 17
        prompts=(0, 0, 0),  # trial 17
        head_input="mean",  # trial 17
        warmup=0.113,  # trial 17
        adam_beta2=0.999,  # trial 17
        adam_eps=1e-6,  # trial 17
        hard_negatives=0.0,  # the search's
        epochs=8,  # the cpu recipe's: dev still rose at the search's 4
        dev_limit=200,  # the search's
    ),
}

# The best finetuning trials: --method finetune on MiniLM takes them unless told otherwise.
TUNED_FINETUNE_WN11 = dict(  # WN11 finetuning search (12,800 positives a trial), trial 10
    lr=2.4e-4,  # trial 10
    batch=32,  # trial 10
    negatives=(1, 0, 1),  # trial 10: one corruption a positive...
    either_side=True,  # ... of its head or of its tail
    head_input="mean",  # trial 10
    warmup=0.102,  # trial 10
    adam_beta2=0.999,  # trial 10
    adam_eps=1e-8,  # trial 10
    hard_negatives=0.0,  # the search's
)
TUNED_FINETUNE = CPU | {
    "wn11": TUNED_FINETUNE_WN11 | dict(epochs=1),  # the epoch PALT's tuned recipe was compared at
    "fb13": TUNED_FINETUNE_WN11 | dict(epochs=2),  # results/fb13-ft-tuned-s42
    "umls": dict(  # UMLS finetuning search (at most 4 epochs a trial), trial 12
        lr=2.49e-4,  # trial 12
        batch=16,  # trial 12
        negatives=(5, 5, 5),  # trial 12
        head_input="cls",  # trial 12
        warmup=0.0901,  # trial 12
        adam_beta2=0.98,  # trial 12
        adam_eps=1e-6,  # trial 12
        hard_negatives=0.0,  # the search's
        epochs=8,  # as PALT's tuned recipe: the methods compare at 8 epochs
        dev_limit=200,  # the search's
    ),
}

PRESETS = {"paper": PAPER, "cpu": CPU, "gpu": GPU, "tuned": TUNED, "tuned-finetune": TUNED_FINETUNE}

# The search and trial behind a tuned recipe's settings, recorded in each checkpoint it trains.
SEARCHES = {
    "tuned": {"umls": "results/tune-umls-palt trial 17", "wn11": "results/tune-wn11-palt trial 19",
              "fb13": "results/tune-wn11-palt trial 19"},
    "tuned-finetune": {"umls": "results/tune-umls-finetune trial 12",
                       "wn11": "results/tune-wn11-finetune trial 10",
                       "fb13": "results/tune-wn11-finetune trial 10"},
}


def search_of(recipe: str, data: str) -> str | None:
    """The search and trial behind recipe's settings for the graph `data`; None for a recipe set
    by hand (or the paper's)."""
    return SEARCHES.get(recipe, {}).get(data)

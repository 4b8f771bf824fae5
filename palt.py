"""PALT: a frozen BERT scores triples through its NSP head, with a few trainable parts (Shen et al., 2022).

  prompts      P: b + m + e virtual tokens in the sentence pair   [CLS] P*b h r P*m [SEP] t P*e [SEP]
  Eq. 1        e' = W_p e + b_p + e   on the input token embeddings  (knowledge prompt encoder)
  Eq. 2        h' = W_c h + b_c + h   after the attention sublayer of chosen layers  (knowledge calibration)
W_p and W_c start at zero, so an untrained PALT without prompts computes exactly what BERT computes.
"""
import json, math, os, shutil, sys
from dataclasses import asdict, dataclass
import torch
import torch.distributed as dist
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save

from bert import CheckpointError, attention_mask_bias, cpu_has_native_bf16, resolve_dtype
from files import readable, write_atomic
from hub import load_bert


class ConfigError(ValueError):
    """A PALT configuration that cannot work with this model (one line)."""


@dataclass(frozen=True)
class PaltConfig:
    prompts: tuple = (10, 10, 10)  # b, m, e: prompt tokens at the start, middle and end
    calib_layers: tuple | None = None  # None: the middle and the last layer (6 and 11 of BERT-base)
    prompt_encoder: bool = True  # W_p of Eq. 1
    # Off: on WN11 dev the reference code's prompt MLP did not help (MiniLM, 400 steps: 79.2% with, 79.5% without)
    prompt_mlp: bool = False  # re-parametrise the prompts through an MLP: 2*d_h*d_h more parameters (RESULTS.md)
    finetune: bool = False  # train the whole LM and no PALT part: the paper's "Finetuning" row (KG-BERT)


def zero_linear(d):
    lin = nn.Linear(d, d)
    nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin


class PALT(nn.Module):
    def __init__(self, bert, cfg: PaltConfig, new_heads=()):
        super().__init__()
        H, n_layers = bert.config.hidden_size, bert.config.num_hidden_layers
        if cfg.finetune and (sum(cfg.prompts) or cfg.calib_layers or cfg.prompt_encoder or cfg.prompt_mlp):
            raise ConfigError("--finetune trains the plain LM: use it with --prompts 0,0,0 --calib none --no-wp")
        calib = (n_layers // 2, n_layers - 1) if cfg.calib_layers is None else tuple(cfg.calib_layers)
        if any(not 0 <= i < n_layers for i in calib):
            raise ConfigError(f"calibration layers {calib} outside 0..{n_layers - 1}")
        self.bert, self.cfg, self.calib_layers, self.new_heads = bert, cfg, calib, tuple(new_heads)
        n_p = sum(cfg.prompts)
        self.prompts = nn.Parameter(torch.randn(n_p, H) * bert.config.initializer_range) if n_p else None
        self.prompt_mlp = nn.Sequential(nn.Linear(H, H), nn.ReLU(), nn.Linear(H, H)) if cfg.prompt_mlp and n_p else None
        self.W_p = zero_linear(H) if cfg.prompt_encoder else None
        self.calib = nn.ModuleDict({str(i): zero_linear(H) for i in calib})
        # Freeze every pretrained tensor; a head the checkpoint lacked (MiniLM's pooler and NSP head) must train.
        for name, p in bert.named_parameters():
            p.requires_grad = cfg.finetune or name.split(".")[0] in self.new_heads

    def forward(self, input_ids, token_type_ids, attention_mask, prompt_index):
        bert = self.bert
        x = bert.embeddings.word(input_ids)  # (B, L, H)
        if self.prompts is not None:
            P = self.prompts if self.prompt_mlp is None else self.prompt_mlp(self.prompts)  # (n_p, H)
            # the prompt slots (prompt_index k >= 0) take the k-th prompt vector: one vectorised select
            x = torch.where(prompt_index[..., None] >= 0, P[prompt_index.clamp(min=0)], x)
        if self.W_p is not None:
            x = x + self.W_p(x)  # Eq. 1
        h = bert.embeddings(inputs_embeds=x, token_type_ids=token_type_ids)
        mask = attention_mask_bias(attention_mask)
        for i, layer in enumerate(bert.layers):
            h = layer.attention(h, mask)
            if i in self.calib_layers:
                h = h + self.calib[str(i)](h)  # Eq. 2
            h = layer.feed_forward(h)
        nsp_logits, _ = bert.head(h)
        return nsp_logits  # (B, 2); class 0 = true triple


def score(logits):
    """The triple score: NSP logit margin, never a saturated softmax probability."""
    return logits[:, 0].float() - logits[:, 1].float()


def param_report(model):
    """Tunable vs total parameters, and the tunable ones by part."""
    parts = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            path = name.split(".")  # group by module: prompts, W_p, calib, bert.pooler, bert.nsp (or all of bert)
            part = ".".join(path[:2]) if path[0] == "bert" and not model.cfg.finetune else path[0]
            parts[part] = parts.get(part, 0) + p.numel()
    tunable, total = sum(parts.values()), sum(p.numel() for p in model.parameters())
    return {"tunable": tunable, "total": total, "percent": 100 * tunable / total, "parts": parts}


def build_palt(model_name_or_path, cfg: PaltConfig):
    loaded = load_bert(model_name_or_path)
    return PALT(loaded.model, cfg, loaded.new_heads), loaded


# ------------------------------------------------------------------------- checkpoints: trainable tensors only
def trainable_state(model):
    return {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(path, model, meta):
    """Trainable tensors as safetensors; config, base model identity and data fingerprint in the metadata."""
    save_atomic(path, trainable_state(model), {"kind": "checkpoint", **meta, "palt": palt_meta(model)})


def palt_meta(model):
    return asdict(model.cfg) | {"calib_layers": list(model.calib_layers)}


def save_atomic(path, tensors, meta):
    write_atomic(path, lambda f: f.write(save({n: t.contiguous() for n, t in tensors.items()},
                                              metadata={"meta": json.dumps(meta)})))


def read_checkpoint(path, kind="checkpoint", tensors=True):
    """(tensors, meta) of a PALT checkpoint (kind 'checkpoint') or of train.py's resume state (kind 'train-state');
    tensors=False reads the metadata alone ({} for the tensors): the checks made before anything loads."""
    name = readable(path, CheckpointError)  # missing or unreadable, in one line (safetensors says "not found" to both)
    try:
        with safe_open(name, framework="pt") as f:
            meta = json.loads((f.metadata() or {})["meta"])
            tensors = {k: f.get_tensor(k) for k in f.keys()} if tensors else {}
    except Exception as e:  # a truncated or foreign file: say so in one line
        raise CheckpointError(f"{path}: not a PALT {kind} ({type(e).__name__}: {e})") from None
    if meta.get("kind", "checkpoint") != kind:  # checkpoints written before 'kind' existed are checkpoints
        hint = (" (train.py's resume state: give ckpt.safetensors, best.safetensors or the run folder)"
                if meta.get("kind") == "train-state" else "")
        raise CheckpointError(f"{path}: a {meta.get('kind')}, not a PALT {kind}{hint}")
    keys = ("model", "weights_sha256", "data", "data_fingerprint", "text", "prompts", "max_seq_length", "palt")
    missing = [k for k in keys if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: not a PALT {kind} (its metadata lacks {', '.join(missing)})")
    return tensors, meta


def load_checkpoint(path, model=None):
    """(PALT, meta, Loaded): rebuild the base model, check it is the one trained on, fill the trainable tensors."""
    tensors, meta = read_checkpoint(path)
    loaded = load_bert(model or meta["model"])
    if loaded.weights_sha256 != meta["weights_sha256"]:
        raise CheckpointError(f"{path}: trained on {meta['model']} (sha256 {meta['weights_sha256'][:12]}), but "
                              f"{loaded.path} has sha256 {loaded.weights_sha256[:12]}: wrong base model")
    c = meta["palt"]
    cfg = PaltConfig(prompts=tuple(c["prompts"]), calib_layers=tuple(c["calib_layers"]),
                     prompt_encoder=c["prompt_encoder"], prompt_mlp=c["prompt_mlp"], finetune=c["finetune"])
    palt = PALT(loaded.model, cfg, loaded.new_heads)
    expected = {n: tuple(t.shape) for n, t in trainable_state(palt).items()}
    got = {n: tuple(t.shape) for n, t in tensors.items()}
    if got != expected:
        diff = sorted(set(got.items()) ^ set(expected.items()))[:3]
        raise CheckpointError(f"{path}: tensors do not match this PALT configuration (e.g. {diff})")
    palt.load_state_dict(palt.state_dict() | tensors, strict=True)
    return palt, meta, loaded


# ------------------------------------------------------------------------- shared by train.py and evaluate.py
def init_distributed(dtype_choice):
    """(ddp_rank, ddp_local_rank, world_size, device, dtype): a process group under torchrun (nccl on GPU, gloo on CPU),
    else one process; dtype is the resolved autocast precision."""
    cuda = torch.cuda.is_available()
    ddp_rank, ddp_local_rank, world_size = 0, 0, 1
    if "RANK" in os.environ:
        ddp_local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(ddp_local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
        ddp_rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{ddp_local_rank}" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 runs on GPU tensor cores
    dtype = resolve_dtype(dtype_choice, device)
    if dtype == "bf16" and not cuda and not cpu_has_native_bf16() and ddp_rank == 0:  # measured: ~100x slower than fp32
        print("warning: this CPU has no native bf16 (AVX512_BF16/AMX): --dtype bf16 is emulated and far slower than "
              "fp32 (--dtype auto picks fp32 here)", file=sys.stderr)
    return ddp_rank, ddp_local_rank, world_size, device, dtype


def check_compiler(compile, device):
    """torch.compile on a CPU builds C++ kernels: without a compiler, one line before the model loads."""
    if compile and device.type == "cpu" and not shutil.which(os.environ.get("CXX", "g++")):
        raise SystemExit("error: --compile on CPU needs a C++ compiler (g++, or $CXX): none found")


def check_limits(ap, args, limits):
    """Numeric flags against their lower bounds {name: (low, low itself allowed)}: one argparse error naming it."""
    for k, (low, inclusive) in limits.items():
        v = getattr(args, k)
        if v is not None and not ((v >= low if inclusive else v > low) and math.isfinite(v)):
            ap.error(f"--{k.replace('_', '-')} must be {'at least' if inclusive else 'more than'} {low}"
                     f"{'' if math.isfinite(v) else ' and finite'}, not {v}")


def check_seq_length(max_seq_length, n_prompts, positions=None, model=None):
    """--max-seq-length counts every position the model sees: the prompts, [CLS], two [SEP] and some text."""
    if max_seq_length < 4 + n_prompts:
        raise SystemExit(f"error: --max-seq-length {max_seq_length} leaves no room for text: the {n_prompts} prompt "
                         f"tokens, [CLS] and two [SEP] take {3 + n_prompts}")
    if positions is not None and max_seq_length > positions:
        raise SystemExit(f"error: --max-seq-length {max_seq_length} (prompts included) exceeds the {positions} "
                         f"positions of {model}")

"""PALT (Shen et al., 2022): a frozen BERT scores triples through its NSP head, with a few
trainable parts.

  prompts   P: b + m + e virtual tokens in the sentence pair   [CLS] P*b h r P*m [SEP] t P*e [SEP]
  Eq. 1     e' = W_p e + b_p + e   the knowledge prompt encoder: re-parametrises the input token
            embeddings, here every one of the sequence (prompt vectors and text tokens alike)
  Eq. 2     h' = W_c h + b_c + h   knowledge calibration, after the attention sublayer of the
            chosen layers
W_p and W_c start at zero, so an untrained PALT without prompts computes exactly what BERT computes.

The methods it is compared with train other parts of the same model (PaltConfig.method):
  finetune  every weight of the LM (KG-BERT; the paper's Finetuning row)
  lora      W x + (alpha / r) B A x on attention's q and v (Hu et al., 2021), B starting at zero
  bitfit    the encoder's biases (Ben Zaken et al., 2022)
  prompt    prompt tokens alone, no W_p and no calibration (prompt tuning, Lester et al., 2021)
  probe     the head alone: the pooler and NSP head on a frozen encoder (the paper's "w/o encoder")
A model without a pretrained NSP head (MiniLM) trains its pooler and a new NSP head under every
method. LoRA is written here in a few lines rather than taken from PEFT: it wraps two of our own
linear maps, and an adapter stays a plain dict of the tensors that train.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert import sdpa_mask
from support.configs import check_config
from support.hub import LoadedBert, load_bert

METHODS = ("palt", "finetune", "lora", "bitfit", "prompt", "probe")


@dataclass(frozen=True)
class PaltConfig:
    method: str = "palt"  # what trains: one of METHODS
    # b, m, e: how many prompt tokens at the start, middle and end; None: (10, 10, 10), the paper's,
    # for palt and prompt, else none
    prompts: tuple | None = None
    calib_layers: tuple | None = None  # from 0; None: default_calib_layers for palt, else none
    prompt_encoder: bool | None = None  # W_p of Eq. 1; None: on for palt, else off
    # Re-parametrise the prompt vectors through an MLP (2*d_h*d_h more parameters). It is off
    # because on WN11 dev the reference code's prompt MLP did not help (RESULTS.md, Ablations).
    prompt_mlp: bool = False
    # What the NSP head reads: "cls", [CLS]'s last state as BERT's pretrained head does, or "mean",
    # the mean of the last layer over the real tokens, the state a sentence-embedding model such as
    # MiniLM was trained to produce (a choice for a model whose NSP head is new).
    head_input: str = "cls"
    lora_rank: int = 8  # --method lora: the rank r of B A
    lora_alpha: float = 16.0  # --method lora: the update scales by alpha / r

    def __post_init__(self):
        palt = self.method == "palt"
        if self.prompts is None:
            object.__setattr__(self, "prompts", (10, 10, 10) if self.method in ("palt", "prompt")
                               else (0, 0, 0))
        if self.prompt_encoder is None:
            object.__setattr__(self, "prompt_encoder", palt)
        if self.calib_layers is None and not palt:
            object.__setattr__(self, "calib_layers", ())


def default_calib_layers(n_layers: int) -> tuple[int, int]:
    """The layers PALT calibrates unless told: the middle and the last (6, 11 of BERT-base)."""
    return (n_layers // 2, n_layers - 1)


# A plain BERT, none of PALT's parts, scores zero-shot with its pretrained NSP head.
ZERO_SHOT = dict(prompts=(0, 0, 0), calib_layers=(), prompt_encoder=False, prompt_mlp=False)


def zero_linear(d: int) -> nn.Linear:
    """A d x d linear map that starts at zero: x + zero_linear(x) is x until it trains."""
    lin = nn.Linear(d, d)
    nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)
    return lin


class LoRA(nn.Module):
    """A frozen linear map plus a trainable low-rank update: W x + b + (alpha / r) B A x. B starts
    at zero, so the map computes what the frozen one does until it trains."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's init, as LoRA's code
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.A.T) @ self.B.T * self.scale


def trains(name: str, method: str, heads_to_train: tuple) -> bool:
    """Whether the base model's parameter `name` trains under `method`: a model without an NSP
    head always trains its heads (pooler, new NSP head); a probe trains the heads of any model."""
    module = name.split(".")[0]
    if module in heads_to_train or (method == "probe" and module in ("pooler", "nsp")):
        return True
    return method == "finetune" or (method == "bitfit" and name.endswith("bias"))


class PALT(nn.Module):
    def __init__(self, bert: nn.Module, cfg: PaltConfig, heads_to_train: tuple = ()):
        super().__init__()
        H, n_layers = bert.config.hidden_size, bert.config.num_hidden_layers
        check_config(cfg, n_layers, METHODS)  # one line on what cannot work
        layers = tuple(cfg.calib_layers or ())
        if cfg.calib_layers is None:
            layers = default_calib_layers(n_layers)
        self.bert, self.cfg, self.calib_layers = bert, cfg, layers
        self.heads_to_train = tuple(heads_to_train)
        n_prompts = sum(cfg.prompts)
        self.P, self.prompt_mlp = None, None  # P: the prompt vectors, (n_prompts, H)
        if n_prompts:
            self.P = nn.Parameter(torch.randn(n_prompts, H) * bert.config.initializer_range)
        if n_prompts and cfg.prompt_mlp:
            self.prompt_mlp = nn.Sequential(nn.Linear(H, H), nn.ReLU(), nn.Linear(H, H))
        self.W_p = zero_linear(H) if cfg.prompt_encoder else None
        self.W_c = nn.ModuleDict({str(i): zero_linear(H) for i in layers})  # Eq. 2, by layer
        # Freeze every pretrained tensor but what the method trains (trains()).
        for name, p in bert.named_parameters():
            p.requires_grad = trains(name, cfg.method, self.heads_to_train)
        if cfg.method == "lora":  # after the freeze: A and B train, the wrapped q and v do not
            for layer in bert.layers:
                layer.q = LoRA(layer.q, cfg.lora_rank, cfg.lora_alpha)
                layer.v = LoRA(layer.v, cfg.lora_rank, cfg.lora_alpha)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, prompt_index: torch.Tensor,
                return_attention: bool = False) -> torch.Tensor | tuple[torch.Tensor, list]:
        """NSP logits (B, 2), class 0 a true triple; with return_attention, (those, each layer's
        attention weights (B, n_head, L, L)), as Layer.attention applies them."""
        bert = self.bert
        x = bert.embeddings.word(input_ids)  # (B, L, H)
        if self.P is not None:
            P = self.P if self.prompt_mlp is None else self.prompt_mlp(self.P)  # (n_prompts, H)
            # The prompt slots (prompt_index k >= 0) take the k-th vector in one select, looked up
            # by F.embedding, whose backward on a CPU is the cheaper of the two (RESULTS.md).
            P_at = F.embedding(prompt_index.clamp(min=0), P)  # (B, L, H)
            x = torch.where(prompt_index[..., None] >= 0, P_at, x)
        if self.W_p is not None:
            x = x + self.W_p(x)  # Eq. 1, on every input embedding: prompts and text tokens
        h = bert.embeddings(inputs_embeds=x, token_type_ids=token_type_ids)
        mask, weights = sdpa_mask(attention_mask), []
        for i, layer in enumerate(bert.layers):
            h, w = layer.attention(h, mask, return_attention)
            weights.append(w)
            if i in self.calib_layers:
                h = h + self.W_c[str(i)](h)  # Eq. 2
            h = layer.feed_forward(h)
        x = h[:, 0]  # [CLS]
        if self.cfg.head_input == "mean":
            keep = torch.ones_like(h[..., 0]) if attention_mask is None else attention_mask.to(h)
            x = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)  # (B, H), real tokens
        nsp_logits, _ = bert.nsp_head(x)
        return (nsp_logits, weights) if return_attention else nsp_logits


def score(logits: torch.Tensor) -> torch.Tensor:
    """The triple score: NSP logit margin, never a saturated softmax probability."""
    return logits[:, 0].float() - logits[:, 1].float()


def param_report(model: PALT) -> dict:
    """Tunable vs total parameters, and the tunable ones by part: P, W_p, W_c, bert.pooler,
    bert.nsp, and the method's share of the encoder (bert: finetuning's; lora; biases)."""
    in_encoder = {"finetune": "bert", "lora": "lora", "bitfit": "biases"}.get(model.cfg.method)
    parts = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        path = name.split(".")
        part = path[0]
        if path[0] == "bert":
            part = ".".join(path[:2]) if path[1] in ("pooler", "nsp") else in_encoder
        parts[part] = parts.get(part, 0) + p.numel()
    tunable, total = sum(parts.values()), sum(p.numel() for p in model.parameters())
    return {"tunable": tunable, "total": total, "percent": 100 * tunable / total, "parts": parts}


def build_palt(model_name_or_path: str, cfg: PaltConfig) -> tuple[PALT, LoadedBert]:
    """(PALT on a freshly loaded base model, the LoadedBert)."""
    loaded = load_bert(model_name_or_path)
    return PALT(loaded.model, cfg, loaded.heads_to_train), loaded

"""Each entity's nearest entities by the frozen encoder's text embeddings: the hard negatives
(--hard-negatives), the dev MRR estimate (--dev-near) and --predict's shortlist draw from them."""
import time

import numpy as np
import torch

from bert import autocast
from data import fill_rows
from support.bigrank import Progress, master


@torch.inference_mode()
def entity_embeddings(bert, S, enc, device="cpu", dtype="fp32", tokens=1 << 14):
    """(len(S), H) unit vectors: the frozen encoder's mean-pooled [CLS] text [SEP] states of the
    entities S, whose cosines find the near entities (hard negatives, the dev estimate, --predict's
    shortlist); a progress line at least once a minute (a big graph's take minutes)."""
    n = np.minimum(np.diff(enc.ent_off)[S], 62) + 2  # [CLS] text [SEP], at most 64 tokens
    order = np.argsort(-n, kind="stable")
    emb = torch.empty(len(S), bert.config.hidden_size)
    progress = Progress(len(S), "entities embedded", master())
    i = 0
    while i < len(S):  # longest first, batches of at most `tokens` tokens
        idx = order[i:i + max(1, tokens // int(n[order[i]]))]
        B, L = len(idx), int(n[idx].max())
        ids = np.full((B, L), enc.pad_id, dtype=np.int64)
        ids[:, 0] = enc.cls_id
        ids[np.arange(B), n[idx] - 1] = enc.sep_id
        fill_rows(ids, enc.ent_ids, enc.ent_off[S[idx]], np.ones(B, np.int64), n[idx] - 2)
        mask = torch.from_numpy(np.arange(L)[None, :] < n[idx][:, None]).to(device)
        with autocast(dtype, device):
            ids = torch.from_numpy(ids).to(device)
            out = bert(ids, None, mask.long(), output_hidden_states=True)
        h = out.hidden_states[-1]  # (B, L, H)
        emb[idx] = ((h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).cpu()
        i += B
        progress.update(B)
    progress.end()
    return torch.nn.functional.normalize(emb, dim=-1)


def nearest_entities(kg, emb, k=32):
    """(E, k) int64: the k split entities nearest each one by the cosine of their embeddings
    (entity_embeddings of kg.split_entities), itself excluded (outside the splits: itself): the hard
    cases random draws from 40k miss."""
    S = kg.split_entities
    near = np.repeat(np.arange(len(kg.entities))[:, None], k, axis=1)
    progress = Progress(len(S), "entities' nearest found", master())
    for s in range(0, len(S) if len(S) > 1 else 0, 1024):  # (1024, |S|) similarities at a time
        sim = emb[s:s + 1024] @ emb.T
        sim[torch.arange(len(sim)), torch.arange(s, s + len(sim))] = -torch.inf  # not itself
        top = sim.topk(min(k, len(S) - 1), dim=1).indices.numpy()
        # fewer than k others: repeated
        near[S[s:s + 1024]] = S[top[:, np.arange(k) % top.shape[1]]]
        progress.update(len(sim))
    progress.end()
    return near


def nearest_of_each(model, kg, enc, device, dtype, n, print0):
    """(E, n) train.py's nearest entities of each entity by the frozen encoder (hard negatives, the
    dev estimate), and a line saying how long they took."""
    t = time.time()
    emb = entity_embeddings(model.bert, kg.split_entities, enc, device, dtype)
    near = nearest_entities(kg, emb, n)
    print0(f"nearest {n} entities of each entity by the frozen encoder: {time.time() - t:.0f} s")
    return near

#!/usr/bin/env python3
"""Independent PyTorch references for cadence's per-clip Ditto networks (engines/src/ditto/lmdm.rs,
engines/src/ditto/hubert.rs): the LMDM MotionDecoder with its DDIM sampler, and HuBERT.

LMDM: written from the module description of ditto-talkinghead (core/models/modules/LMDM.py,
lmdm_modules/{model,utils,rotary_embedding_torch}.py), not copied; the attribute names are the
published ones so that `state_dict()` has the keys of `lmdm_v0.4_hubert.pth`'s
`model_state_dict`. Built at a reduced size with seeded weights (LayerNorm and the null
embeddings randomised), it writes the weights, one guided step (unconditional and conditional
forwards, x_start, pred_noise) and a 4-step DDIM sample with the noise injected.

HuBERT: the real `transformers.HubertModel` with a small `HubertConfig` of the large model's kind
(stable layer norm, layer-normalised convolutions, weight-normalised positional convolution),
saved under the CTC checkpoint's `hubert.` prefix.

The LMDM reference was checked once against ditto-talkinghead's own MotionDecoder and LMDM
sampler (commit e9191cf, with einops): the state dict loads strictly and every output here is
bit-identical.

Run once (needs torch, transformers and safetensors):
    python3 scripts/ditto_reference_clip.py fixtures/ditto
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(4321)
torch.set_num_threads(1)


# ---------------------------------------------------------------- LMDM (Ditto)
class Rotary(nn.Module):
    """Interleaved rotary positions over the whole feature width; `freqs` is a buffer."""

    def __init__(self, dim, theta=10000):
        super().__init__()
        self.register_buffer("freqs", 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim)))

    def rotate(self, t):
        n = t.shape[-2]
        ang = torch.arange(n).float()[:, None] * self.freqs[None, :]
        ang = ang.repeat_interleave(2, dim=-1)
        pairs = t.reshape(*t.shape[:-1], -1, 2)
        half = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).reshape(t.shape)
        return t * ang.cos() + half * ang.sin()


class Film(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.block = nn.Sequential(nn.Mish(), nn.Linear(d, 2 * d))

    def forward(self, t):
        scale, shift = self.block(t)[:, None, :].chunk(2, dim=-1)
        return scale, shift


def affine(x, ss):
    return (ss[0] + 1) * x + ss[1]


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ff, rotary):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.linear1 = nn.Linear(d, ff)
        self.linear2 = nn.Linear(ff, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.rotary = rotary

    def forward(self, x):
        h = self.norm1(x)
        qk = self.rotary.rotate(h)
        x = x + self.self_attn(qk, qk, h, need_weights=False)[0]
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, ff, rotary):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.linear1 = nn.Linear(d, ff)
        self.linear2 = nn.Linear(ff, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)
        self.film1 = Film(d)
        self.film2 = Film(d)
        self.film3 = Film(d)
        self.rotary = rotary

    def forward(self, x, mem, t):
        h = self.norm1(x)
        qk = self.rotary.rotate(h)
        x = x + affine(self.self_attn(qk, qk, h, need_weights=False)[0], self.film1(t))
        h = self.norm2(x)
        a = self.multihead_attn(self.rotary.rotate(h), self.rotary.rotate(mem), mem, need_weights=False)[0]
        x = x + affine(a, self.film2(t))
        return x + affine(self.linear2(F.gelu(self.linear1(self.norm3(x)))), self.film3(t))


class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.stack = nn.ModuleList(layers)


def sinusoidal(times, dim):
    half = dim // 2
    emb = math.log(10000) / (half - 1)
    emb = torch.exp(torch.arange(half) * -emb)
    emb = times[:, None] * emb[None, :]
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class MotionDecoder(nn.Module):
    def __init__(self, nfeats, seq_len, d, ff, layers, heads, cond_dim):
        super().__init__()
        self.d = d
        self.rotary = Rotary(d)
        self.time_mlp = nn.Sequential(nn.Identity(), nn.Linear(d, 4 * d), nn.Mish())
        self.to_time_cond = nn.Sequential(nn.Linear(4 * d, d))
        self.to_time_tokens = nn.Sequential(nn.Linear(4 * d, 2 * d))
        self.null_cond_embed = nn.Parameter(torch.randn(1, seq_len, d))
        self.null_cond_hidden = nn.Parameter(torch.randn(1, d))
        self.norm_cond = nn.LayerNorm(d)
        self.input_projection = nn.Linear(2 * nfeats, d)
        self.cond_encoder = nn.Sequential(*[EncoderLayer(d, heads, ff, self.rotary) for _ in range(2)])
        self.cond_projection = nn.Linear(cond_dim, d)
        self.non_attn_cond_projection = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.seqTransDecoder = Stack([DecoderLayer(d, heads, ff, self.rotary) for _ in range(layers)])
        self.final_layer = nn.Linear(d, nfeats)

    def forward(self, x, cond_frame, cond, times, keep):
        x = torch.cat([x, cond_frame[:, None, :].repeat(1, x.shape[1], 1)], -1)
        x = self.input_projection(x)
        if keep:
            tokens = self.cond_projection(cond)
            for layer in self.cond_encoder:
                tokens = layer(tokens)
            hidden = self.non_attn_cond_projection(tokens.mean(dim=-2))
        else:
            tokens = self.null_cond_embed
            hidden = self.null_cond_hidden
        t_hidden = self.time_mlp[2](self.time_mlp[1](sinusoidal(times, self.d)))
        t = self.to_time_cond(t_hidden) + hidden
        t_tokens = self.to_time_tokens(t_hidden).reshape(x.shape[0], 2, self.d)
        mem = self.norm_cond(torch.cat((tokens, t_tokens), dim=-2))
        for layer in self.seqTransDecoder.stack:
            x = layer(x, mem, t)
        return self.final_layer(x)


def cosine_alphas_cumprod(n=1000, s=8e-3):
    steps = torch.arange(n + 1, dtype=torch.float64) / n + s
    a = torch.cos(steps / (1 + s) * np.pi / 2).pow(2)
    a = a / a[0]
    betas = np.clip(1 - a[1:] / a[:-1], a_min=0, a_max=0.999).numpy()
    return torch.cumprod(1.0 - torch.Tensor(betas), dim=0)  # f32, as Ditto's buffer


def time_pairs(steps, total=1000):
    times = list(reversed(torch.linspace(-1, total - 1, steps=steps + 1).int().tolist()))
    return list(zip(times[:-1], times[1:]))


def guided_step(model, ac, x, cond_frame, cond, time, weight=2.0):
    tc = torch.full((1,), time, dtype=torch.long)
    unc = model(x, cond_frame, cond, tc, keep=False)
    con = model(x, cond_frame, cond, tc, keep=True)
    x_start = unc + (con - unc) * weight
    a = torch.sqrt(1.0 / (1.0 - ac))[time]
    b = torch.sqrt(1.0 / ac - 1)[time]
    return unc, con, x_start, a * x - x_start / b


def ddim(model, ac, x, cond_frame, cond, steps, noises):
    i = 0
    for time, time_next in time_pairs(steps):
        _, _, x_start, pred_noise = guided_step(model, ac, x, cond_frame, cond, time)
        if time_next < 0:
            x = x_start
            continue
        alpha, alpha_next = ac[time], ac[time_next]
        sigma = ((1 - alpha / alpha_next) * (1 - alpha_next) / (1 - alpha)).sqrt()
        c = (1 - alpha_next - sigma**2).sqrt()
        x = x_start * alpha_next.sqrt() + c * pred_noise + sigma * noises[i]
        i += 1
    return x


def lmdm_fixture(out_dir):
    # nfeats 10 (265), seq 12 (80), latent 32 (512), ff 48 (1024), 2 layers (8), 4 heads (8),
    # condition 24 (1103).
    nfeats, seq, d, cond_dim = 10, 12, 32, 24
    model = MotionDecoder(nfeats, seq, d, 48, 2, 4, cond_dim).eval()
    with torch.no_grad():
        for k, v in model.named_parameters():
            if "norm" in k and v.dim() == 1:
                v.uniform_(0.5, 1.5) if k.endswith("weight") else v.uniform_(-0.2, 0.2)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    # As in the published checkpoint, the shared rotary buffer is in the state dict under every
    # layer that holds the rotary module (`rotary.freqs`, `cond_encoder.0.rotary.freqs`, ...).
    assert "seqTransDecoder.stack.1.rotary.freqs" in sd
    torch.save({"model_state_dict": sd, "epoch": 3}, os.path.join(out_dir, "lmdm.pth"))

    ac = cosine_alphas_cumprod()
    x = torch.randn(1, seq, nfeats)
    cond_frame = torch.randn(1, nfeats)
    cond = torch.randn(1, seq, cond_dim)
    steps = 4
    x_init = torch.randn(1, seq, nfeats)
    noises = torch.randn(steps - 1, 1, seq, nfeats)
    with torch.no_grad():
        unc, con, x_start, pred_noise = guided_step(model, ac, x, cond_frame, cond, 499)
        x0_t0 = guided_step(model, ac, x, cond_frame, cond, 0)[2]
        sample = ddim(model, ac, x_init, cond_frame, cond, steps, noises[:, 0])
    pairs = {}
    for s in [1, 3, 4, 7, 50, 1000]:
        pairs[f"times.{s}"] = torch.tensor([p[0] for p in time_pairs(s)], dtype=torch.int64)
    save_file(
        {
            "in.x": x,
            "in.cond_frame": cond_frame,
            "in.cond": cond,
            "out.unc": unc,
            "out.cond": con,
            "out.x_start": x_start,
            "out.pred_noise": pred_noise,
            "out.x_start_t0": x0_t0,
            "in.x_init": x_init,
            "in.noise": noises[:, 0].contiguous(),
            "out.sample": sample,
            "alphas_cumprod": ac.contiguous(),
            **pairs,
        },
        os.path.join(out_dir, "lmdm_io.safetensors"),
    )


# ---------------------------------------------------------------- HuBERT (transformers)
def ditto_wav2feat(model, audio, chunksize=(3, 5, 2)):
    """Ditto's offline pairing (core/atomic_components/wav2feat.py, Wav2FeatHubert.wav2feat),
    with the encoder's last_hidden_state standing for its ONNX `encoding_out`."""
    num_f = math.ceil(len(audio) / 16000 * 25)
    split_len = int(sum(chunksize) * 0.04 * 16000) + 80
    pad = torch.cat([torch.zeros(split_len - int(sum(chunksize[1:]) * 0.04 * 16000)), audio, torch.zeros(split_len)])
    res, i = [], 0
    while i < num_f:
        s = int(i * 0.04 * 16000)
        enc = model(pad[s : s + split_len][None]).last_hidden_state[0]
        valid = enc[-sum(chunksize[1:]) * 2 : -chunksize[2] * 2]
        res.append(valid.reshape(chunksize[1], 2, -1).mean(1))
        i += chunksize[1]
    return torch.cat(res, 0)[:num_f]


def hubert_fixture(out_dir):
    from transformers import HubertConfig, HubertModel

    # As hubert-large-ls960-ft (stable layer norm, layer-normalised convolutions with bias,
    # weight-normalised grouped positional convolution, exact GELU), narrower and shallower.
    cfg = HubertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16,) * 7,
        conv_stride=(5, 2, 2, 2, 2, 2, 2),
        conv_kernel=(10, 3, 3, 3, 3, 2, 2),
        conv_bias=True,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        hidden_act="gelu",
        feat_extract_activation="gelu",
    )
    model = HubertModel(cfg).eval()
    with torch.no_grad():
        for k, v in model.named_parameters():
            if "norm" in k and v.dim() == 1:
                v.uniform_(0.5, 1.5) if k.endswith("weight") else v.uniform_(-0.2, 0.2)
    audio = 0.3 * torch.randn(1, 6480)
    clip = 0.3 * torch.randn(8000)  # 0.5 s: 13 frames at 25 fps, three chunks
    with torch.no_grad():
        out = model(audio, output_hidden_states=True)
        feats = ditto_wav2feat(model, clip)
    sd = {}
    for k, v in model.state_dict().items():
        # The weight-norm parametrization's names as the published (older) files have them.
        k = k.replace("parametrizations.weight.original0", "weight_g").replace("parametrizations.weight.original1", "weight_v")
        sd[f"hubert.{k}"] = v.contiguous()
    sd["lm_head.weight"] = torch.randn(5, 32)  # the CTC head, which the encoder ignores
    save_file(sd, os.path.join(out_dir, "hubert_weights.safetensors"))
    save_file(
        {
            "in.audio": audio,
            "out.last_hidden_state": out.last_hidden_state.contiguous(),
            # The first layer's output (hidden_states[1] in transformers 4.x and 5.x alike).
            "out.hidden_state_1": out.hidden_states[1].contiguous(),
            "in.clip": clip,
            "out.ditto_features": feats.contiguous(),
        },
        os.path.join(out_dir, "hubert_io.safetensors"),
    )


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    lmdm_fixture(out_dir)
    hubert_fixture(out_dir)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/ditto")

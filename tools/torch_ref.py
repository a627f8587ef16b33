#!/usr/bin/python3
"""Independent PyTorch reference forward pass for the model families Cascadia supports.

Reads a Hugging Face directory (config.json + model.safetensors or a sharded index; f32/f16/bf16)
and writes the teacher-forced logits of every position as float32 [positions x vocab].
Written from the HF transformers modelling code's maths (not from our C code), in float64, so it
is a reference for our float32 engine:
  Llama (incl. rope_scaling llama3 / linear), Mistral (sliding window), Qwen2 (q/k/v biases),
  Qwen3 (per-head q/k RMSNorm, explicit head_dim).
usage: torch_ref.py MODEL_DIR --ids 1,2,3 --out FILE
"""
import argparse, json, math, os, struct
import numpy as np
import torch

DT = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, v in hdr.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        buf = raw[base + a:base + b]
        if v["dtype"] == "BF16":
            u16 = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=DT[v["dtype"]]).astype(np.float32)
        out[name] = torch.from_numpy(arr.reshape(v["shape"]).copy()).double()
    return out


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    idx = os.path.join(d, "model.safetensors.index.json")
    W = {}
    if os.path.exists(idx):
        for f in sorted(set(json.load(open(idx))["weight_map"].values())):
            W.update(read_safetensors(os.path.join(d, f)))
    else:
        W = read_safetensors(os.path.join(d, "model.safetensors"))
    return cfg, W


def inv_freq(cfg, hd):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(is_mid, mid, scaled)
    elif kind == "linear":
        inv = inv / rs["factor"]
    return inv


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rot_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def forward(cfg, W, toks):
    T = len(toks)
    D, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or D // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    mt = cfg["model_type"]
    window = cfg.get("sliding_window") if mt == "mistral" else None
    x = W["model.embed_tokens.weight"][toks]
    fr = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg, hd))
    emb = torch.cat([fr, fr], -1)
    cos, sin = emb.cos(), emb.sin()
    i = torch.arange(T).view(-1, 1)
    j = torch.arange(T).view(1, -1)
    allowed = j <= i
    if window:
        allowed &= j > i - window
    mask = torch.where(allowed, 0.0, float("-inf")).double()
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)

        def proj(name, heads):
            y = h @ W[p + f"self_attn.{name}_proj.weight"].T
            b = W.get(p + f"self_attn.{name}_proj.bias")
            if b is not None:
                y = y + b
            return y.view(T, heads, hd)

        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        if p + "self_attn.q_norm.weight" in W:
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        k = k.repeat_interleave(nh // nkv, 0)
        v = v.repeat_interleave(nh // nkv, 0)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, -1) @ v
        x = x + a.transpose(0, 1).reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in W:  # attention_bias: true (Llama, Qwen3)
            x = x + W[p + "self_attn.o_proj.bias"]
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
        x = x + g @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg, W = load(a.model_dir)
    toks = [int(t) for t in a.ids.split(",")]
    with torch.no_grad():
        logits = forward(cfg, W, toks)
    logits.float().numpy().astype("<f4").tofile(a.out)


if __name__ == "__main__":
    main()

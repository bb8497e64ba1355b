#!/usr/bin/python3
"""External check of ptc against PyTorch.

Builds the model of a .ptm file (gpt2*, llama* or moe*) by hand in PyTorch, gives ptc and PyTorch the
same initial weights and the same token batches, trains both for a few AdamW steps and compares,
per step, the loss and every parameter's gradient, and after the last step every weight.

    /usr/bin/python3 tests/torch/compare.py --ptc build/tools/ptc --model examples/gpt2_tiny.ptm \
        [--backend ref|cpu|jit] [--steps 3] [--workdir DIR] [-D NAME=VALUE ...] [--verbose]

Exit status: 0 every quantity within the tolerance, 1 a mismatch (or ptc failed to compile or
run), 2 bad usage, 77 torch is not importable (ctest's skip code).

Run it with Debian's python (/usr/bin/python3), which has torch; nothing beyond torch and numpy is
needed (safetensors and the llm.c token format are read and written by hand here).
"""

import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

try:
    import numpy as np
    import torch
except ImportError as e:  # ctest treats 77 as "skipped"
    print(f"compare.py: skipped: cannot import torch/numpy ({e}); run with /usr/bin/python3",
          file=sys.stderr)
    sys.exit(77)

TOL = 1e-4  # the fp32 tolerance, for every quantity below


# ---------------------------------------------------------------------------------------------
# Reading the .ptm: consts, a few op attributes and the optimizer line
# ---------------------------------------------------------------------------------------------

def strip_comments(text):
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def parse_consts(text, overrides):
    """`const NAME = EXPR` lines, evaluated in order (EXPR may use earlier consts and sqrt)."""
    consts = {}
    for m in re.finditer(r"^\s*const\s+([A-Za-z_]\w*)\s*=\s*(.+?)\s*$", strip_comments(text),
                         re.M):
        name, expr = m.group(1), m.group(2)
        if name in overrides:
            consts[name] = overrides[name]
            continue
        value = eval(expr, {"__builtins__": {}, "sqrt": math.sqrt}, dict(consts))
        if isinstance(value, float) and value.is_integer() and "/" in expr:
            value = int(value)  # the language's exact integer division
        consts[name] = value
    for name in overrides:
        if name not in consts:
            sys.exit(f"compare.py: -D {name}: the model has no such const")
    return consts


def op_attr(text, op, key, default):
    """The value of KEY= in the first call of OP in the file (e.g. layernorm's eps), or default."""
    m = re.search(r"\b" + op + r"\s*\(([^)]*)\)", strip_comments(text))
    if m:
        a = re.search(r"\b" + key + r"\s*=\s*([^,\s)]+)", m.group(1))
        if a:
            return float(a.group(1))
    return default


def parse_optimizer(text):
    """The `optimizer adamw(...)` line with the language's defaults for what it leaves out."""
    opt = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    m = re.search(r"^\s*optimizer\s+(\w+)\s*\(([^)]*)\)", strip_comments(text), re.M)
    if m:
        if m.group(1) != "adamw":
            sys.exit(f"compare.py: only adamw is compared, the model uses {m.group(1)}")
        for kv in filter(None, (s.strip() for s in m.group(2).split(","))):
            k, v = (s.strip() for s in kv.split("=", 1))
            opt[k] = float(v)
    return opt


# ---------------------------------------------------------------------------------------------
# The ops, written from the exact semantics of the language reference (ptm-language.md)
# ---------------------------------------------------------------------------------------------

def gelu(x):  # the tanh approximation of GPT-2
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x * torch.sigmoid(x)


def layernorm(x, g, b, eps):  # biased variance over the last axis
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * g + b


def rmsnorm(x, g, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def attention(q, k, v, heads, kv_heads):
    """Causal attention; q [B,S,H*dh], k and v [B,S,G*dh]; query head i uses kv head i/(H/G)."""
    B, S, _ = q.shape
    dh = q.shape[-1] // heads
    q = q.view(B, S, heads, dh).transpose(1, 2)  # [B,H,S,dh]
    k = k.view(B, S, kv_heads, dh).transpose(1, 2)  # [B,G,S,dh]
    v = v.view(B, S, kv_heads, dh).transpose(1, 2)
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # head i -> kv head i // (H/G)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    future = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [B,H,S,dh]
    return out.transpose(1, 2).reshape(B, S, heads * dh)


def rope(x, heads, base):
    """Meta's pairing: the adjacent pair (2j, 2j+1) of each head at position p is rotated by the
    angle p * base^(-2j/dh)."""
    B, S, D = x.shape
    dh = D // heads
    j = torch.arange(dh // 2, dtype=torch.float64)
    p = torch.arange(S, dtype=torch.float64)
    angle = p[:, None] * base ** (-2.0 * j / dh)[None, :]  # [S, dh/2]
    cos = torch.cos(angle).to(x.dtype)[None, :, None, :]
    sin = torch.sin(angle).to(x.dtype)[None, :, None, :]
    pairs = x.view(B, S, heads, dh // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.reshape(B, S, D)


def cross_entropy(logits, targets):  # mean over all positions
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1).long())


def expert_capacity(c, tokens, top_k, experts):
    """ceil(c * top_k * tokens / experts) on the decimal number c is written as (Fraction of its
    shortest repr: 1.1 is 11/10), at most tokens (an expert takes a token once); c = 0: tokens."""
    if c == 0:
        return tokens
    return min(tokens, math.ceil(Fraction(repr(float(c))) * top_k * tokens / experts))


def moe(x, router, w_up, w_down, top_k, capacity, normalize, act):
    """The language's moe, written from its page ("Mixture of experts"): the gate in f32, the
    top_k experts of every token by p (torch.topk), weights renormalised over the chosen or raw,
    places in an expert given to all first choices in token order, then all second choices, ...;
    y[t] the sum over t's kept choices of weight * act(x @ w_up[e]) @ w_down[e]; aux the Switch
    Transformer loss E * sum_e f_e P_e, f_e the fraction of choices (before capacity) and P_e
    the mean of p[:, e], with no gradient through f."""
    B, S, d = x.shape
    E, N = router.shape[1], B * S
    xf = x.reshape(N, d)
    p = torch.softmax(xf.float() @ router.float(), dim=-1)
    weight, chosen = torch.topk(p, top_k, dim=-1)
    if normalize:
        weight = weight / weight.sum(-1, keepdim=True)
    C = expert_capacity(capacity, N, top_k, E)
    keep = torch.zeros(N, top_k, dtype=torch.bool)
    taken = [0] * E
    for j in range(top_k):  # first choices first, then second choices, in token order
        for t in range(N):
            e = int(chosen[t, j])
            keep[t, j] = taken[e] < C
            taken[e] += 1
    y = torch.zeros_like(xf)
    for e in range(E):
        t, j = torch.nonzero((chosen == e) & keep, as_tuple=True)
        if len(t) == 0:
            continue
        h = xf[t] @ w_up[e]
        if act == "swiglu":
            f = h.shape[-1] // 2
            a = silu(h[:, :f]) * h[:, f:]
        else:
            a = {"gelu": gelu, "relu": torch.relu, "silu": silu}[act](h)
        y = y.index_add(0, t, weight[t, j, None].to(x.dtype) * (a @ w_down[e]))
    frac = torch.bincount(chosen.reshape(-1), minlength=E).to(p.dtype) / (N * top_k)
    aux = E * (frac * p.mean(0)).sum()
    return y.reshape(B, S, d), aux, int((~keep).sum())


# ---------------------------------------------------------------------------------------------
# The models. Each has a parameter list (full ptc name, shape, kind) and a forward over a dict of
# tensors keyed by those names. Weights are used as in the .ptm: `x @ w` with w [in, out].
# kind: "matrix" (rank >= 2), "gain" (norm gains) or "bias": it only picks the initial values.
# ---------------------------------------------------------------------------------------------

class GPT2:
    """examples/gpt2*.ptm: learned positions, pre-LayerNorm blocks, fused qkv, GELU MLP, tied
    head."""

    def __init__(self, text, c):
        self.vocab, self.ctx, self.d = c["vocab"], c["ctx"], c["d"]
        self.heads, self.layers = c["heads"], c["layers"]
        self.batch, self.seq = c["batch"], c["seq"]
        self.eps = op_attr(text, "layernorm", "eps", 1e-5)

    def params(self):
        d = self.d
        p = [("wte", [self.vocab, d], "matrix"), ("wpe", [self.ctx, d], "matrix")]
        for i in range(self.layers):
            h = f"h.{i}."
            p += [(h + "ln_1.g", [d], "gain"), (h + "ln_1.b", [d], "bias"),
                  (h + "attn.w_qkv", [d, 3 * d], "matrix"), (h + "attn.b_qkv", [3 * d], "bias"),
                  (h + "attn.w_o", [d, d], "matrix"), (h + "attn.b_o", [d], "bias"),
                  (h + "ln_2.g", [d], "gain"), (h + "ln_2.b", [d], "bias"),
                  (h + "mlp.w_fc", [d, 4 * d], "matrix"), (h + "mlp.b_fc", [4 * d], "bias"),
                  (h + "mlp.w_proj", [4 * d, d], "matrix"), (h + "mlp.b_proj", [d], "bias")]
        p += [("ln_f.g", [d], "gain"), ("ln_f.b", [d], "bias")]
        return p

    def loss(self, P, tokens, targets):
        return cross_entropy(self.logits(P, tokens), targets)

    def logits(self, P, tokens):
        x = P["wte"][tokens.long()] + P["wpe"][: self.seq]
        for i in range(self.layers):
            h = f"h.{i}."
            a = layernorm(x, P[h + "ln_1.g"], P[h + "ln_1.b"], self.eps)
            q, k, v = (a @ P[h + "attn.w_qkv"] + P[h + "attn.b_qkv"]).split(self.d, dim=-1)
            x = x + attention(q, k, v, self.heads, self.heads) @ P[h + "attn.w_o"] \
                + P[h + "attn.b_o"]
            m = layernorm(x, P[h + "ln_2.g"], P[h + "ln_2.b"], self.eps)
            x = x + gelu(m @ P[h + "mlp.w_fc"] + P[h + "mlp.b_fc"]) @ P[h + "mlp.w_proj"] \
                + P[h + "mlp.b_proj"]
        x = layernorm(x, P["ln_f.g"], P["ln_f.b"], self.eps)
        return x @ P["wte"].T


class Llama:
    """examples/llama*.ptm: RMSNorm, rope on q and k, grouped-query attention, SwiGLU MLP,
    untied lm_head. Parameter names as Meta's checkpoints (layers.0.attention.wq, ...)."""

    def __init__(self, text, c):
        self.vocab, self.d = c["vocab"], c["d"]
        self.heads, self.kv_heads = c["heads"], c["kv_heads"]
        self.ffn, self.layers = c["ffn"], c["n_layers"]
        self.batch, self.seq = c["batch"], c["seq"]
        self.head_dim = c.get("head_dim", self.d // self.heads)
        self.eps = op_attr(text, "rmsnorm", "eps", 1e-6)
        self.base = op_attr(text, "rope", "base", 10000.0)

    def params(self):
        d, f = self.d, self.ffn
        qd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        p = [("tok_embeddings", [self.vocab, d], "matrix")]
        for i in range(self.layers):
            h = f"layers.{i}."
            p += [(h + "attention_norm.g", [d], "gain"),
                  (h + "attention.wq", [d, qd], "matrix"), (h + "attention.wk", [d, kvd], "matrix"),
                  (h + "attention.wv", [d, kvd], "matrix"), (h + "attention.wo", [qd, d], "matrix"),
                  (h + "ffn_norm.g", [d], "gain"),
                  (h + "feed_forward.w1", [d, f], "matrix"),
                  (h + "feed_forward.w3", [d, f], "matrix"),
                  (h + "feed_forward.w2", [f, d], "matrix")]
        p += [("norm.g", [d], "gain"), ("lm_head", [d, self.vocab], "matrix")]
        return p

    def loss(self, P, tokens, targets):
        return cross_entropy(self.logits(P, tokens), targets)

    def logits(self, P, tokens):
        x = P["tok_embeddings"][tokens.long()]
        for i in range(self.layers):
            h = f"layers.{i}."
            a = rmsnorm(x, P[h + "attention_norm.g"], self.eps)
            q = rope(a @ P[h + "attention.wq"], self.heads, self.base)
            k = rope(a @ P[h + "attention.wk"], self.kv_heads, self.base)
            v = a @ P[h + "attention.wv"]
            x = x + attention(q, k, v, self.heads, self.kv_heads) @ P[h + "attention.wo"]
            m = rmsnorm(x, P[h + "ffn_norm.g"], self.eps)
            ff = h + "feed_forward."
            x = x + (silu(m @ P[ff + "w1"]) * (m @ P[ff + "w3"])) @ P[ff + "w2"]
        x = rmsnorm(x, P["norm.g"], self.eps)
        return x @ P["lm_head"]


class MoE:
    """examples/moe_tiny.ptm (and tests/torch/moe_*.ptm): the Llama block with a mixture of
    experts in place of the MLP (router, w_up, w_down per layer, written in the repeat), and the
    loss cross_entropy + aux_weight * the sum of the layers' auxiliary losses. The moe call's
    act and normalize are read from the file, top_k and capacity from its consts."""

    def __init__(self, text, c):
        self.vocab, self.d = c["vocab"], c["d"]
        self.heads, self.kv_heads = c["heads"], c["kv_heads"]
        self.ffn, self.layers = c["ffn"], c["n_layers"]
        self.experts, self.top_k = c["experts"], c["top_k"]
        self.capacity, self.aux_weight = c["capacity_factor"], c["aux_weight"]
        self.batch, self.seq = c["batch"], c["seq"]
        self.head_dim = c.get("head_dim", self.d // self.heads)
        self.eps = op_attr(text, "rmsnorm", "eps", 1e-6)
        self.base = op_attr(text, "rope", "base", 10000.0)
        src = strip_comments(text)
        start = re.search(r"\bmoe\s*\(", src).end()
        depth, end = 1, start
        while depth:  # the call's arguments, nested calls included
            depth += {"(": 1, ")": -1}.get(src[end], 0)
            end += 1
        call = src[start:end - 1]
        act = re.search(r"\bact\s*=\s*(\w+)", call)  # the language's defaults otherwise
        self.act = act.group(1) if act else "swiglu"
        norm = re.search(r"\bnormalize\s*=\s*(\w+)", call)
        self.normalize = norm is None or norm.group(1) == "true"

    def params(self):
        d, f, E = self.d, self.ffn, self.experts
        qd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        up = 2 * f if self.act == "swiglu" else f
        p = [("tok_embeddings", [self.vocab, d], "matrix")]
        for i in range(self.layers):
            h = f"layers.{i}."
            p += [(h + "attention_norm.g", [d], "gain"),
                  (h + "attention.wq", [d, qd], "matrix"), (h + "attention.wk", [d, kvd], "matrix"),
                  (h + "attention.wv", [d, kvd], "matrix"), (h + "attention.wo", [qd, d], "matrix"),
                  (h + "ffn_norm.g", [d], "gain"), (h + "router", [d, E], "matrix"),
                  (h + "w_up", [E, d, up], "matrix"), (h + "w_down", [E, f, d], "matrix")]
        p += [("norm.g", [d], "gain"), ("lm_head", [d, self.vocab], "matrix")]
        return p

    def loss(self, P, tokens, targets):
        x = P["tok_embeddings"][tokens.long()]
        aux_sum, dropped = 0, 0
        for i in range(self.layers):
            h = f"layers.{i}."
            a = rmsnorm(x, P[h + "attention_norm.g"], self.eps)
            q = rope(a @ P[h + "attention.wq"], self.heads, self.base)
            k = rope(a @ P[h + "attention.wk"], self.kv_heads, self.base)
            v = a @ P[h + "attention.wv"]
            x = x + attention(q, k, v, self.heads, self.kv_heads) @ P[h + "attention.wo"]
            m = rmsnorm(x, P[h + "ffn_norm.g"], self.eps)
            y, aux, n = moe(m, P[h + "router"], P[h + "w_up"], P[h + "w_down"], self.top_k,
                            self.capacity, self.normalize, self.act)
            x = x + y
            aux_sum = aux_sum + aux
            dropped += n
        # the fraction of all choices dropped, which ptc logs for the step
        self.dropped = dropped / (self.layers * self.batch * self.seq * self.top_k)
        x = rmsnorm(x, P["norm.g"], self.eps)
        return cross_entropy(x @ P["lm_head"], targets) + self.aux_weight * aux_sum


# ---------------------------------------------------------------------------------------------
# Files: safetensors (by hand; the pip package is not needed) and llm.c token files
# ---------------------------------------------------------------------------------------------

def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name}: dtype {info['dtype']}, expected F32")
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"]).copy()
    return out


def write_tokens(path, tokens):
    """llm.c's format: 256 int32 header (magic 20240520, version 1, token count), uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def batch_at(tokens, k, B, T):
    """llm.c's loader, in order: batch k is the B*T+1 tokens from k*B*T, inputs and next tokens."""
    w = torch.from_numpy(tokens[k * B * T: (k + 1) * B * T + 1].astype(np.int64))
    return w[:-1].view(B, T), w[1:].view(B, T)


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def tensor_error(a, b):
    """max|a - b| / max|b| over the tensor (b is PyTorch's), and where the largest |a - b| is.

    Why not elementwise relative error: in fp32 each element of a matmul, a reduction or a
    backward pass carries a rounding error proportional to the magnitudes of the terms summed
    into it (about 1e-7 times their size times a small factor), not to the size of the result.
    An element that comes out near zero by cancellation keeps an absolute error of the size of
    its terms, so its elementwise relative error is arbitrarily large even when both programs are
    right. Dividing by the tensor's scale (its largest magnitude) measures every element's error
    against the precision the tensor is actually computed at, and a wrong rule (a missing term, a
    transposed index, a wrong scale) still shows as an error of order 1."""
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    if not np.all(np.isfinite(a)):
        return math.inf, "non-finite"
    i = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    worst = float(diff[i]) if diff.size else 0.0
    err = worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)
    return err, "[" + ",".join(str(int(x)) for x in i) + "]"


class Report:
    def __init__(self, tol):
        self.tol, self.rows, self.ok = tol, [], True

    def add(self, quantity, err, where, gate=True):
        """A row; with gate=False it is reported ("info: pass/fail") but does not decide."""
        passed = err <= self.tol
        if gate:
            self.ok &= passed
        status = ("PASS" if passed else "FAIL") if gate else ("info: " + ("pass" if passed
                                                                          else "over"))
        self.rows.append((quantity, err, where, status))

    def fail(self, quantity, why):
        self.ok = False
        self.rows.append((quantity, math.inf, why, "FAIL"))

    def print(self):
        w = max(len(r[0]) for r in self.rows)
        print(f"{'quantity':<{w}}  {'worst error':>11}  {'status':<10}  where")
        for q, err, where, status in self.rows:
            print(f"{q:<{w}}  {err:11.3e}  {status:<10}  {where}")


def compare_tensors(report, quantity, ptc, ref, verbose, gate=True):
    """Adds one row: the worst tensor of ptc against ref, by name. A missing or extra name, or a
    shape that differs, fails the whole check (returns False)."""
    missing = sorted(set(ref) - set(ptc))
    extra = sorted(set(ptc) - set(ref))
    if missing or extra:
        report.fail(quantity, f"names differ: ptc lacks {missing[:4]}, has extra {extra[:4]}")
        return False
    worst = (-1.0, "")
    for name in ref:
        if ptc[name].shape != ref[name].shape:
            report.fail(quantity, f"{name}: shape {list(ptc[name].shape)} vs "
                                  f"{list(ref[name].shape)}")
            return False
        err, where = tensor_error(ptc[name], ref[name])
        if verbose:
            print(f"  {quantity:<18} {name:<28} {err:10.3e} at {where}"
                  f"  (max|ref| {np.max(np.abs(ref[name])):.3e})")
        if err > worst[0] or math.isnan(err):
            worst = (err, f"{name}{where}")
    report.add(quantity, worst[0], worst[1], gate)
    return True


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


# ---------------------------------------------------------------------------------------------

def run(cmd, what):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        prog = os.path.basename(sys.argv[0])  # also used by bench/cpu_train.py
        print(f"{prog}: {what} failed (exit {r.returncode}):\n  {' '.join(cmd)}\n{r.stdout}",
              file=sys.stderr)
        sys.exit(1)
    return r.stdout


def initial_weights(params, seed):
    """Non-trivial values everywhere so that every gradient path is exercised: matrices
    0.05*N(0,1) (a bit above GPT-2's 0.02 so that attention is far from uniform), norm gains
    1 + 0.1*N(0,1), biases 0.02*N(0,1)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, kind in params:
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        w = {"matrix": 0.05 * z, "gain": 1.0 + 0.1 * z, "bias": 0.02 * z}[kind]
        out[name] = w.to(torch.float32).numpy()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptc", required=True, help="the ptc compiler")
    ap.add_argument("--model", required=True, help="a gpt2*.ptm, llama*.ptm or moe*.ptm file")
    ap.add_argument("--backend", default="ref", choices=["ref", "cpu", "jit"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234, help="seed of the weights and tokens")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="override a const (passed to ptc too)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="precision of the PyTorch side (default float32)")
    ap.add_argument("--free-running", action="store_true",
                    help="compare gradients and final weights along PyTorch's own trajectory "
                         "(default: along ptc's, see README.md)")
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="then generate N bytes greedily (--temperature 0) from the final "
                         "weights with the executable's --sample, and PyTorch the same way: "
                         "the texts must be equal (gpt2 and llama models)")
    ap.add_argument("--verbose", action="store_true", help="print every tensor's error")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    text = open(args.model).read()
    overrides = {}
    for d in args.defines:
        k, v = d.split("=", 1)
        overrides[k] = float(v) if re.search(r"[.eE]", v) else int(v)
    consts = parse_consts(text, overrides)
    opt = parse_optimizer(text)
    base = os.path.basename(args.model)
    if base.startswith("gpt2"):
        model = GPT2(text, consts)
    elif base.startswith("llama"):
        model = Llama(text, consts)
    elif base.startswith("moe"):
        model = MoE(text, consts)
    else:
        sys.exit(f"compare.py: {base}: no PyTorch model for it (the name must start with gpt2, "
                 f"llama or moe)")
    B, T, steps = model.batch, model.seq, args.steps

    tmp = None
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        wd = args.workdir
    else:
        tmp = tempfile.TemporaryDirectory(prefix="ptc-torch-")
        wd = tmp.name

    # Inputs shared by both sides.
    params = model.params()
    init = initial_weights(params, args.seed)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, model.vocab, size=steps * B * T + 1).astype(np.uint16)
    save_safetensors(os.path.join(wd, "init.safetensors"), init)
    write_tokens(os.path.join(wd, "data.bin"), tokens)

    # ptc.
    exe = os.path.join(wd, "exe")
    run([args.ptc] + [x for d in args.defines for x in ("-D", d)] + [args.model, "-o", exe],
        "ptc")
    log = os.path.join(wd, "log.jsonl")
    grads_dir = os.path.join(wd, "grads")
    run([exe, "--init-from", os.path.join(wd, "init.safetensors"),
         "--data", os.path.join(wd, "data.bin"), "--steps", str(steps), "--lr", repr(args.lr),
         "--schedule", "constant", "--warmup", "0", "--grad-clip", "0", "--seed", "1",
         "--backend", args.backend, "--log", log, "--dump-grads", grads_dir,
         "--save", os.path.join(wd, "final.safetensors"), "--quiet"], "the compiled model")
    logged = {}
    for line in open(log):
        rec = json.loads(line)
        if "loss" in rec:
            logged[rec["step"]] = rec

    # PyTorch, the same steps. Two copies of the weights, both from init:
    #  - `follow` is trained by PyTorch's AdamW on ptc's own dumped gradients, so that at every
    #    step it holds ptc's weights (up to the optimizer's fp32 rounding, ~1e-7 relative). The
    #    loss and gradients of each step are compared at that point, and its final weights check
    #    ptc's optimizer (moments, bias correction, decay groups, lr) with nothing else mixed in.
    #  - `free` is trained by PyTorch alone (its own gradients): the plain side-by-side run. Its
    #    final weights are reported, and gate the result only with --free-running, because AdamW
    #    divides each gradient element by its own magnitude: an element whose true gradient is
    #    ~0 (GPT-2's key biases have exactly zero gradient, softmax being invariant to adding
    #    q.b_k to every score) is pure fp32 rounding noise in both programs, and AdamW turns that
    #    noise into an update of up to lr per step, of either sign. So the trajectories part by
    #    ~lr in a few elements even when every gradient agrees to 1e-6 (see README.md).
    #    With --free-running the gradients are compared along this trajectory instead.
    follow, opt_follow = torch_state(init, params, opt, args.lr, dtype)
    free, opt_free = torch_state(init, params, opt, args.lr, dtype)
    report = Report(TOL)
    mode = "free-running" if args.free_running else "following ptc's weights"
    print(f"{base}: backend {args.backend}, {steps} steps, batch {B}x{T}, "
          f"{sum(int(np.prod(s)) for _, s, _ in params)} parameters, PyTorch {torch.__version__} "
          f"{args.dtype}, adamw(lr={args.lr:g}, betas=({opt['beta1']:g}, {opt['beta2']:g}), "
          f"eps={opt['eps']:g}, weight_decay={opt['weight_decay']:g}); gradients compared "
          f"{mode}")
    for step in range(1, steps + 1):
        inputs, targets = batch_at(tokens, step - 1, B, T)
        path = os.path.join(grads_dir, f"grads_step_{step:08d}.safetensors")
        ptc_grads = load_safetensors(path) if os.path.exists(path) else None
        for P, optim in ((follow, opt_follow), (free, opt_free)):
            optim.zero_grad()
            loss = model.loss(P, inputs, targets)
            loss.backward()
            if (P is free) != args.free_running:  # not the trajectory compared: just step
                if P is follow and ptc_grads is not None:
                    for n in P:
                        P[n].grad = torch.tensor(ptc_grads[n], dtype=dtype)
                optim.step()
                continue
            if step not in logged:
                report.fail(f"loss step {step}", "no line for this step in the log")
            else:
                report.add(f"loss step {step}", rel(logged[step]["loss"], loss.item()),
                           f"ptc {logged[step]['loss']:.7f} torch {loss.item():.7f}")
                norm = math.sqrt(sum(float((P[n].grad.double() ** 2).sum()) for n in P))
                report.add(f"grad_norm step {step}", rel(logged[step]["grad_norm"], norm),
                           f"ptc {logged[step]['grad_norm']:.7f} torch {norm:.7f}")
                if hasattr(model, "dropped"):  # the same choices dropped, and some if capacity
                    got = logged[step].get("dropped", -1.0)
                    report.add(f"dropped step {step}", abs(got - model.dropped),
                               f"ptc {got:.6f} torch {model.dropped:.6f}")
                    if model.capacity and not model.dropped:
                        report.fail(f"dropped step {step}", "a capacity that drops nothing "
                                    "tests nothing: raise the batch or lower the capacity")
            if ptc_grads is None:
                report.fail(f"grads step {step}", f"{path} was not written")
                return report_done(report, wd, args)
            ref = {n: P[n].grad.detach().to(torch.float32).numpy() for n in P}
            if not compare_tensors(report, f"grads step {step}", ptc_grads, ref, args.verbose):
                return report_done(report, wd, args)
            if P is follow:
                for n in P:  # the step ptc took: its own gradients
                    P[n].grad = torch.tensor(ptc_grads[n], dtype=dtype)
            optim.step()

    final = load_safetensors(os.path.join(wd, "final.safetensors"))
    compare_tensors(report, f"weights after {steps}, AdamW on ptc's grads", final,
                    numpy_weights(follow), args.verbose, gate=not args.free_running)
    compare_tensors(report, f"weights after {steps}, free-running", final, numpy_weights(free),
                    args.verbose, gate=args.free_running)
    if args.sample:
        compare_sample(report, model, exe, os.path.join(wd, "final.safetensors"), final, args)
    return report_done(report, wd, args)


def compare_sample(report, model, exe, path, weights, args):
    """Greedy text from the executable's sampling program (--sample, temperature 0) against the
    same greedy loop on PyTorch's forward pass. PyTorch pads the window after the context with
    zeros, ptc with the last byte: a causal model reads neither, so the texts agree only if the
    sampling program is causal as well as right. The smallest gap between the two likeliest
    bytes is printed: a gap near fp32 rounding would make the comparison fragile."""
    if not hasattr(model, "logits"):
        report.fail("sample", "no logits for this model type in compare.py")
        return
    prompt = b"The quick brown fox "
    cmd = [exe, "--init-from", path, "--sample", str(args.sample), "--temperature", "0",
           "--prompt", prompt.decode(), "--quiet", "--backend", args.backend]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        report.fail("sample", f"{' '.join(cmd)} failed (exit {r.returncode}): "
                              f"{r.stderr.decode(errors='replace')}")
        return
    got = r.stdout
    P = {n: torch.tensor(weights[n], dtype=torch.float64) for n in weights}
    T, ctx, gap = model.seq, list(prompt), float("inf")
    with torch.no_grad():
        for _ in range(args.sample):
            window = ctx[-T:]
            row = torch.zeros(1, T, dtype=torch.int32)
            row[0, :len(window)] = torch.tensor(window, dtype=torch.int32)
            logits = model.logits(P, row)[0, len(window) - 1, :256]
            top = torch.topk(logits, 2)
            gap = min(gap, float(top.values[0] - top.values[1]))
            ctx.append(int(top.indices[0]))
    want = bytes(ctx) + b"\n"
    same = got == want
    print(f"sample: {args.sample} greedy bytes {'equal' if same else 'DIFFER'}; smallest gap "
          f"between the two likeliest logits {gap:.3g}")
    if not same:
        report.fail("sample", f"ptc {got!r}\n  torch {want!r}")


def torch_state(init, params, opt, lr, dtype):
    """The weights as leaf tensors and PyTorch's AdamW over them, with the language's decay
    groups: weight decay on parameters of rank >= 2 only."""
    P = {name: torch.tensor(init[name], dtype=dtype, requires_grad=True) for name, _, _ in params}
    decay = [P[n] for n, _, _ in params if P[n].dim() >= 2]
    no_decay = [P[n] for n, _, _ in params if P[n].dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=lr, betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    return P, optim


def numpy_weights(P):
    return {n: P[n].detach().to(torch.float32).numpy() for n in P}


def report_done(report, wd, args):
    report.print()
    print(f"{'PASS' if report.ok else 'FAIL'} (tolerance {TOL:g}; files in "
          f"{wd if args.workdir else 'a temporary directory, keep them with --workdir'})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

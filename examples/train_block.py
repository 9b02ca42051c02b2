"""Train a small transformer with iosim's attention kernels and with PyTorch's SDPA, from one seed.

    python examples/train_block.py [--steps 300] [--out examples/results/loss_curves.json]   (GPU)
    python examples/train_block.py --plot examples/results/loss_curves.json               (anywhere)

The task needs attention: sequences of random tokens whose second half repeats the first, so after the midpoint
each token is predictable only by looking back half a sequence (an induction head). Two pre-norm blocks (8 heads
of 64, causal), parameters in fp32, attention's q, k, v in bf16 (our kernels take fp16 or bf16), AdamW. The same
seed gives both runs the same initial weights and the same batches; only the attention call differs:
`gpu_kernels.ops.attention(q, k, v, "flash2", is_causal=True)` (forward and backward our CUDA kernels, through
autograd) against `F.scaled_dot_product_attention(q, k, v, is_causal=True)`. The losses of the second half
(the predictable tokens) are stored for both, with the largest gap between the curves; `--plot` draws them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB, SEQ, WIDTH, HEADS, LAYERS, BATCH = 64, 512, 512, 8, 2, 32


def train(attention_fn, steps: int, seed: int = 0) -> list[float]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

        def forward(self, x):
            b, n, _ = x.shape
            qkv = self.qkv(self.n1(x)).view(b, n, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
            q, k, v = (t.to(torch.bfloat16).contiguous() for t in qkv)
            a = attention_fn(q, k, v).float().transpose(1, 2).reshape(b, n, WIDTH)
            x = x + self.proj(a)
            return x + self.mlp(self.n2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.out = nn.Linear(WIDTH, VOCAB)

        def forward(self, t):
            x = self.tok(t) + self.pos(torch.arange(t.shape[1], device=t.device))
            for blk in self.blocks:
                x = blk(x)
            return self.out(x)

    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    data = torch.Generator(device="cuda").manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        half = torch.randint(0, VOCAB, (BATCH, SEQ // 2), device="cuda", generator=data)
        seq = torch.cat([half, half], 1)
        logits = model(seq[:, :-1])
        # the predictable tokens: the second half's
        loss = F.cross_entropy(logits[:, SEQ // 2 - 1:].reshape(-1, VOCAB), seq[:, SEQ // 2:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run(steps: int, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    from gpu_kernels.measure import provenance
    from gpu_kernels.ops import attention

    runs = {
        "iosim flash2": lambda q, k, v: attention(q, k, v, "flash2", is_causal=True),
        "PyTorch SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    curves = {name: train(fn, steps) for name, fn in runs.items()}
    a, b = curves.values()
    gap = max(abs(x - y) for x, y in zip(a, b))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "what": "training loss (second-half tokens) of a 2-block transformer on a copy task, iosim's attention "
                "kernels vs PyTorch SDPA, same seed, same batches",
        "command": " ".join(["python3", "examples/train_block.py", *sys.argv[1:]]),
        "model": {"vocab": VOCAB, "seq": SEQ, "width": WIDTH, "heads": HEADS, "layers": LAYERS, "batch": BATCH,
                  "attention_dtype": "bf16", "optimizer": "AdamW lr 1e-3"},
        "device": torch.cuda.get_device_name(), "provenance": provenance(), "steps": steps,
        "max_abs_gap": gap, "losses": curves}, indent=1))
    print(f"{steps} steps: final loss " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in curves.items())
          + f"; largest gap between the curves {gap:.4f}")


def plot(path: Path) -> Path:
    import plotly.graph_objects as go
    rec = json.loads(path.read_text())
    fig = go.Figure()
    for name, ys in rec["losses"].items():
        fig.add_trace(go.Scatter(y=ys, name=name, mode="lines", line={"dash": "dot" if "SDPA" in name else "solid"}))
    fig.update_layout(title=f"Copy task, 2 blocks, causal: loss with iosim's attention kernels and with SDPA "
                            f"(largest gap {rec['max_abs_gap']:.3f})",
                      xaxis_title="step", yaxis_title="cross-entropy of the second half", template="plotly_white")
    html = path.with_suffix(".html")
    fig.write_html(html, include_plotlyjs="cdn")
    return html


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path("examples/results/loss_curves.json"))
    ap.add_argument("--plot", type=Path, default=None, help="draw a stored result (HTML beside it); no GPU needed")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    args = ap.parse_args()
    if args.plot:
        print(plot(args.plot))
        return
    if not 1 <= args.steps <= 100_000:
        sys.exit("train_block: error: --steps must be in 1..100000")
    if args.out.exists() and not args.force:
        sys.exit(f"train_block: error: {args.out} exists (a stored run); pass --force to overwrite it")
    run(args.steps, args.out)


if __name__ == "__main__":
    main()

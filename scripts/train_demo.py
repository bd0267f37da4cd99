"""Train the demo network (bnfold.demo.model.DigitNet) on scikit-learn's digits and save its checkpoint.

    .venv/bin/python scripts/train_demo.py            # writes src/bnfold/demo/digitnet.pt

Fixed seed, fixed held-out split (bnfold.demo.data), one CPU thread so the
run is reproducible.  The held-out split is never used for training or model
selection; its accuracy is printed and stored in the checkpoint's metadata.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bnfold.demo.data import SPLIT_SEED, TEST_FRACTION, load_split
from bnfold.demo.model import DigitNet

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "bnfold" / "demo" / "digitnet.pt"


def shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Augmentation: move each image by up to one pixel (zero fill)."""
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    dy, dx = torch.randint(0, 3, (2,), generator=gen).tolist()
    return padded[:, :, dy : dy + 8, dx : dx + 8]


def train(epochs: int, seed: int, batch: int = 64, lr: float = 3e-3) -> tuple[DigitNet, dict]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x_train, y_train, x_test, y_test = load_split()
    model = DigitNet()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * ((len(y_train) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(y_train), generator=gen)
        total = 0.0
        for i in range(0, len(perm), batch):
            idx = perm[i : i + batch]
            loss = torch.nn.functional.cross_entropy(model(shift(x_train[idx], gen)), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if (epoch + 1) % 10 == 0 or epoch == epochs - 1:
            print(f"epoch {epoch + 1:3d}  train loss {total / len(y_train):.4f}")
    model.eval()
    with torch.no_grad():
        train_acc = float((model(x_train).argmax(1) == y_train).double().mean())
        test_acc = float((model(x_test).argmax(1) == y_test).double().mean())
    meta = {
        "epochs": epochs,
        "seed": seed,
        "split_seed": SPLIT_SEED,
        "test_fraction": TEST_FRACTION,
        "train_samples": len(y_train),
        "test_samples": len(y_test),
        "train_accuracy": train_acc,
        "test_accuracy": test_acc,
        "torch": str(torch.__version__),
    }
    return model, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, meta = train(args.epochs, args.seed)
    print(
        f"train accuracy {meta['train_accuracy']:.4f}  held-out accuracy {meta['test_accuracy']:.4f}  "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    torch.save({"state_dict": model.state_dict(), "meta": meta}, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()

"""Lightning with AsyncTrackerLogger: a small classifier on MNIST-shaped synthetic digits, on
CPU in a few seconds; then what the run recorded, shown with the command line.

Run it from the repository root (needs the lightning extra):

    pip install -e '.[lightning]' && python examples/lightning_mnist_like.py [--dir tracker_runs]

The data are made here (28x28 images: one noisy template per class), so nothing is
downloaded. The logger records the hyperparameters as metadata, every logged value as a
metric, and the best and last checkpoints as artifacts (log_model=True); finalize() closes
the run when fit() ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from async_tracker.init_run import store_dir
from async_tracker.integrations.lightning import AsyncTrackerLogger

CLASSES = 10


def digits(n: int, seed: int) -> TensorDataset:
    """``n`` images of 28x28: a fixed random template per class, plus noise."""
    templates = torch.rand(CLASSES, 28, 28, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    images = templates[labels] + 1.5 * torch.randn(n, 28, 28, generator=g)
    return TensorDataset(images, labels)


class Classifier(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, hidden: int = 64, lr: float = 0.05, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()  # what the logger records as metadata
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
        )

    def step(self, batch: Any, stage: str) -> torch.Tensor:
        images, labels = batch
        logits = self.net(images)
        loss = nn.functional.cross_entropy(logits, labels)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=on_step, on_epoch=not on_step)
        self.log(f"{stage}_acc", accuracy, on_step=on_step, on_epoch=not on_step)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def async_tracker(config: Path, *args: str) -> None:
    """`async-tracker ARGS` on the store the run was written to."""
    print("$ async-tracker " + " ".join(args), flush=True)
    command = [sys.executable, "-m", "async_tracker", "--tracker", "fsspec", "--config"]
    subprocess.run([*command, str(config), *args], check=True)
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir",
        default=store_dir(),
        help="where the runs are stored (default: $ASYNC_TRACKER_DIR, else ./tracker_runs, "
        "which `async-tracker` reads when given no --store)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    root = store = Path(args.dir).resolve()
    # Noise here: Lightning's advice about DataLoader workers, and a torch deprecation that
    # Lightning's own code triggers.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*isinstance\\(treespec, LeafSpec\\).*")
    pl.seed_everything(0, verbose=False)

    logger = AsyncTrackerLogger(project="mnist-like", dir=store, log_model=True)
    trainer = pl.Trainer(
        logger=logger,
        max_epochs=args.epochs,
        accelerator="cpu",
        log_every_n_steps=4,
        default_root_dir=root / ".lightning",
        enable_progress_bar=False,
        enable_model_summary=False,
        # The best checkpoint by validation loss, and the last one: both become artifacts.
        callbacks=[ModelCheckpoint(monitor="val_loss", save_last=True)],
    )
    trainer.fit(
        Classifier(),
        DataLoader(digits(2048, seed=1), batch_size=64, shuffle=True),
        DataLoader(digits(512, seed=2), batch_size=256),
    )
    run_id = logger.run_id
    assert run_id is not None
    print(f"\nrun {run_id}: val_acc {float(trainer.callback_metrics['val_acc']):.3f}\n")

    # The CLI reads the store through an fsspec config, as a torchx job's tracker would.
    config = root / "fsspec.cfg"
    config.write_text(f"protocol=file\nroot_path={store}\n")
    async_tracker(config, "list", "metadata", run_id)
    async_tracker(config, "list", "artifacts", run_id)
    async_tracker(config, "list", "metrics", run_id)
    if importlib.util.find_spec("matplotlib") is not None:
        async_tracker(config, "plot", run_id, "-o", str(root / "lightning_curves.png"))
    else:
        print("(pip install 'async-tracker[plot]' and `async-tracker plot` draws the curves)")


if __name__ == "__main__":
    main()

"""A Hugging Face Trainer with AsyncTrackerCallback: a tiny BERT built from a local config,
trained on CPU in a few seconds on synthetic sentences; then what the run recorded, shown with
the command line.

Run it from the repository root (needs the transformers extra):

    pip install -e '.[transformers]' && python examples/hf_trainer.py [--dir tracker_runs]

Nothing is downloaded: the model is a 1-layer BertConfig, and a sentence is random token ids
labelled by whether token 7 occurs in it. The callback records the TrainingArguments and the
model config as metadata, the Trainer's logs as metrics at each global step, and each saved
checkpoint folder as an artifact; it closes the run when training ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from async_tracker.init_run import store_dir
from async_tracker.integrations.transformers import AsyncTrackerCallback

VOCAB = 32
LENGTH = 12
MARKER = 7  # the label says whether this token occurs


class Sentences(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
        # Half the sentences get the marker at a random place.
        marked = torch.rand(n, generator=g) < 0.5
        where = torch.randint(0, LENGTH, (n,), generator=g)
        self.ids[~marked] = torch.where(self.ids[~marked] == MARKER, 1, self.ids[~marked])
        self.ids[marked, where[marked]] = MARKER
        self.labels = marked.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": self.labels[i]}


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
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    root = store = Path(args.dir).resolve()
    torch.manual_seed(0)

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2,
    )  # fmt: skip
    callback = AsyncTrackerCallback(project="hf-trainer", dir=store)
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=TrainingArguments(
            output_dir=str(root / ".hf"),
            max_steps=args.steps,
            learning_rate=3e-3,
            per_device_train_batch_size=32,
            logging_steps=10,
            eval_strategy="steps",
            eval_steps=40,
            save_steps=40,
            metric_for_best_model="eval_loss",
            report_to=[],  # no other tracker integration
            use_cpu=True,
            disable_tqdm=True,
        ),
        train_dataset=Sentences(2048, seed=1),
        eval_dataset=Sentences(256, seed=2),
        callbacks=[callback],
    )
    trainer.train()  # the callback closes its run at the end
    assert callback.run is not None
    run_id = callback.run.id
    print(f"\nrun {run_id}: eval_loss {trainer.state.best_metric:.4f} at best\n")

    # The CLI reads the store through an fsspec config, as a torchx job's tracker would.
    cfg = root / "fsspec.cfg"
    cfg.write_text(f"protocol=file\nroot_path={store}\n")
    async_tracker(cfg, "list", "artifacts", run_id)
    async_tracker(cfg, "list", "metrics", run_id)
    if importlib.util.find_spec("matplotlib") is not None:
        metrics = ["loss", "eval_loss", "learning_rate", "grad_norm"]
        plot = ["plot", run_id, *[a for m in metrics for a in ("--metric", m)]]
        async_tracker(cfg, *plot, "-o", str(root / "hf_curves.png"))
    else:
        print("(pip install 'async-tracker[plot]' and `async-tracker plot` draws the curves)")
    print(f"(and the {len(callback.run.metadata())} arguments and config values: "
          f"async-tracker list metadata {run_id})")  # fmt: skip


if __name__ == "__main__":
    main()

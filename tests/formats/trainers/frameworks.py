"""Real training-framework checkpoints, made by the frameworks themselves (tests only).

Each maker trains a tiny randomly initialised model on CPU for one or two steps and
saves what the framework saves; nothing is downloaded. The test module calls them from a
session fixture and skips with a reason where a framework is not installed.
"""

from __future__ import annotations

import os
from typing import Any


def make_hf_trainer(root: str) -> str:
    """``transformers.Trainer``, 2 steps, ``save_steps=1``: returns ``<root>/checkpoint-2``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = BertForSequenceClassification(cfg)

    class DS(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": torch.arange(6) % 64, "labels": torch.tensor(i % 2)}

    args = TrainingArguments(
        output_dir=root,
        max_steps=2,
        save_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )
    Trainer(model=model, args=args, train_dataset=DS()).train()
    return os.path.join(root, "checkpoint-2")


def make_accelerate(root: str) -> str:
    """``accelerate.Accelerator.save_state`` after one step: returns the folder."""
    import torch
    from accelerate import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    model, opt, sched = acc.prepare(model, opt, sched)
    loss = model(torch.randn(3, 4)).sum()
    acc.backward(loss)
    opt.step()
    sched.step()
    out = os.path.join(root, "accel_state")
    acc.save_state(out)
    return out


def make_lightning(root: str) -> str:
    """``lightning.Trainer(max_steps=1)`` with checkpointing: returns the ``.ckpt`` path."""
    import lightning as L
    import torch

    torch.manual_seed(0)

    class Tiny(L.LightningModule):
        def __init__(self, width: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.parameters(), lr=1e-2)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    data = torch.utils.data.TensorDataset(torch.randn(4, 4), torch.randn(4, 1))
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    found = [os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs if f.endswith(".ckpt")]
    assert len(found) == 1, found
    return found[0]

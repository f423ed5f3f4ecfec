"""Ray Train's Transformers quickstart, as a user would run it (imported by the tests that
need it, so that collecting the suite does not import Transformers)."""

from __future__ import annotations

import ray.train.huggingface.transformers
import torch
import transformers

from ray_ormas.demo import load_digits

from .loops import nan_on_rank

# Ray Train's Hugging Face Transformers quickstart ("Get Started with Distributed Training using
# Hugging Face Transformers"), unchanged but for the model (a tiny BERT built from a config) and
# the data (token ids made from the digits' pixel levels).


class DigitsAsTokens(torch.utils.data.Dataset):
    def __init__(self):
        x, y, _, _ = load_digits(0)
        self.ids = (x.flatten(1) * 7).round().long().clamp(0, 15) + 1  # 64 tokens of 16 levels
        self.y = y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.y[i]}


def transformers_train_func():
    # Datasets
    small_train_dataset = DigitsAsTokens()
    # Model
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=10,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    # Hugging Face Trainer
    training_args = transformers.TrainingArguments(
        output_dir="test_trainer",
        save_strategy="epoch",
        report_to="none",
        num_train_epochs=2,
        per_device_train_batch_size=64,
        learning_rate=1e-3,
        use_cpu=True,
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_dataset,
    )
    # [2] Report Metrics and Checkpoints to Ray Train
    callback = ray.train.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)
    # [3] Prepare Transformers Trainer
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
    # Start Training
    trainer.train()


def transformers_train_func_nan_on_rank_1(config):
    """The quickstart, unchanged, with rank 1's loss NaN at its step `config["nan_at"]` (the
    callback attaches the monitor at the first step: the loop's forward k is its step k)."""
    nan_on_rank(1, "BertForSequenceClassification", at_forward=config["nan_at"])
    transformers_train_func()

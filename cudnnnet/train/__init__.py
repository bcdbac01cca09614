"""Training from a config: setup, the Trainer, its checks, evaluation, outputs, curves, and
several GPUs (``distributed``)."""

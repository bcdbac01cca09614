"""Optimisers (SGD, Adam), learning-rate schedules and fp16's dynamic loss scaling."""

"""Command-line tools: cudnnnet-train, cudnnnet-predict, cudnnnet-evaluate (also scripts/*.py)."""

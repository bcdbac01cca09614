"""Files on disk: atomic writes, checkpoints, and the caches of decoded data and measured plans."""

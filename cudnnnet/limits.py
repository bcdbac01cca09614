"""The largest integer any setting, count or stored counter may hold, and the most layers a model may
have (no NumPy here: the command-line tools read configs before they import it)."""

MAX_INTEGER = 2**31 - 1  # every integer setting: cuBLAS and cuDNN take 32-bit sizes, and no count needs more
MAX_LAYERS = 10_000  # layers of one model: a config's model list (a few aliases make thousands), Network.add_layer


def too_many_layers(count: int) -> str | None:
    """What is wrong with a model of ``count`` layers (more than MAX_LAYERS), None where nothing is: the one
    rule and message a config's model list and Network.add_layer share, each raising its own error with it."""
    return f"a model holds at most {MAX_LAYERS} layers, got {count}" if count > MAX_LAYERS else None

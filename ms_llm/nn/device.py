"""The device the model is built for. Fast paths are chosen once, when a Cell is constructed (never
inside `construct`), so model code stays the same on every backend: the session calls `configure`
before building the model; the default is the portable composition."""

_state = {"target": None, "layer_reuse": True}


def configure(target, layer_reuse=True):
    """`layer_reuse=False` when an outer Cell is reused instead (the pipeline's per-micro-batch loss)."""
    _state["target"], _state["layer_reuse"] = target, layer_reuse


def layer_reuse():
    return _state["layer_reuse"]


def target():
    return _state["target"]


def is_ascend():
    return _state["target"] == "Ascend"

"""The device the model is built for. Fast paths are chosen once, when a Cell is constructed (never
inside `construct`), so model code stays the same on every backend: the session calls `configure`
before building the model; the default is the portable composition."""

_state = {"target": None}


def configure(target):
    _state["target"] = target


def target():
    return _state["target"]


def is_ascend():
    return _state["target"] == "Ascend"

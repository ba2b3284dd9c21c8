"""Other frameworks' files in and out: Hugging Face checkpoints, MindFormers configs and checkpoints.

Reads `checkpoint`, `config` and `model_zoo`; never imports `train`.
"""

"""Other frameworks' files in and out: Hugging Face checkpoints, MindFormers configs and checkpoints; which
transformers module matches which ms_llm module (hf_modules.py); and torch_dump.py, the PyTorch side of a
layer-by-layer comparison, which imports only torch and numpy.

Reads `checkpoint`, `config` and `model_zoo`; never imports `train`.
"""

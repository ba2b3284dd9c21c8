"""ms_llm: a MindSpore-native framework for training large language models."""
__version__ = "0.1.0"

"""ms_llm: a MindSpore-native framework for training large language models."""
from ms_llm import lean_import

__version__ = "0.1.0"
lean_import.install()

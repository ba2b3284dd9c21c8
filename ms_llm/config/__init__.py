from ms_llm.config.loader import load_config, save_config, to_dict, from_dict, apply_override
from ms_llm.config.schema import Config
from ms_llm.config.validate import check_against_dataset

__all__ = ["Config", "load_config", "save_config", "to_dict", "from_dict", "apply_override", "check_against_dataset"]

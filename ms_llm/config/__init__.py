from ms_llm.config.loader import (apply_override, config_from_dict, from_dict, load_config, save_config, to_dict,
                                  with_overrides)
from ms_llm.config.schema import Config
from ms_llm.config.validate import check_against_dataset

__all__ = ["Config", "load_config", "save_config", "to_dict", "from_dict", "config_from_dict", "with_overrides",
           "apply_override", "check_against_dataset"]

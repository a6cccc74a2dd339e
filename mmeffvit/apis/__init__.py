"""Finding mmeffvit's models by name and running them (see :mod:`.model_index`)."""
from .model_index import (get_model_config, get_model_info, index_root, init_inferencer,
                          list_models)

__all__ = ['get_model_config', 'get_model_info', 'index_root', 'init_inferencer', 'list_models']

"""mmeffvit: efficient-attention vision transformers as OpenMMLab 2.x backbones.

Importing the package (``custom_imports=dict(imports=['mmeffvit'])`` in a config) registers every
component and makes mmengine checkpoints loadable under torch's ``weights_only`` default.
"""
from .version import __version__  # noqa: F401
from .utils import allow_mmengine_checkpoints, install_registry_hints

allow_mmengine_checkpoints()
install_registry_hints()

from . import models  # noqa: E402,F401  (registers the components)
from .registry import MODELS  # noqa: E402,F401

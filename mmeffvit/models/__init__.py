from .backbones import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .detectors import *  # noqa: F401,F403
from .heads import *  # noqa: F401,F403
from .timm_models import BackboneClassifier  # noqa: F401  (registers the timm entry points)

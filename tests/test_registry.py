"""Registration: names listed, helpful errors for misspelt types in mmdet, mmseg and mmpretrain
(every backbone builds by plain and scoped name: ``test_backbone_contract.py``)."""
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmeffvit  # noqa: F401
from mmeffvit.registry import mmeffvit_model_names

SCOPES = ['mmdet', 'mmseg', 'mmpretrain']


def registry_of(scope):
    module = __import__(f'{scope}.registry', fromlist=['MODELS'])
    return module.MODELS


def test_names_listed():
    assert 'FLattenPVT' in mmeffvit_model_names()


@pytest.mark.parametrize('scope', SCOPES)
def test_misspelt_type_lists_mmeffvit_names_closest_first(scope):
    init_default_scope(scope)
    with pytest.raises(KeyError) as err:
        registry_of(scope).build(dict(type='FlattenPVTT'))
    msg = str(err.value)
    assert 'not in the' in msg and 'mmeffvit registers (closest first): FLattenPVT' in msg
    # printed as written: a real line break, no literal backslash-n, no repr quotes
    assert '\n' + 'mmeffvit registers' in msg and '\\n' not in msg and msg[0] != '"'


def test_misspelt_backbone_inside_a_detector_config():
    cfg = Config.fromfile('configs/mask_rcnn_flatten_pvt_t_1x.py')
    cfg.model.backbone.type = 'FLatenPVT'
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    with pytest.raises(KeyError, match='mmeffvit registers .*FLattenPVT'):
        MODELS.build(cfg.model)


def test_unrelated_registry_errors_untouched():
    from mmengine.registry import OPTIMIZERS
    with pytest.raises(KeyError) as err:
        OPTIMIZERS.build(dict(type='NoSuchOptimizer', params=[]))
    assert 'mmeffvit' not in str(err.value)

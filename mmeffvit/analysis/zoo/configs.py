"""Reading the configs of ``configs/<family>/`` without building them, for the model zoo.

``read_config`` evaluates a config file as Python literals (``dict(...)`` calls, names, and
``_base_.pop('key')``, which mmengine binds to the merged bases in a config's code), merged over
its local ``_base_`` files; toolbox bases (``mmdet::...``) are not followed, only named. It takes
milliseconds where mmengine's ``Config.fromfile`` takes about a second per config;
``tests/test_model_zoo.py`` compares the two. A config's name tells its model, backbone,
schedule and dataset (``<model>_<backbone>_<schedule>_<dataset>``, checked by
``tests/test_configs.py``), which :func:`parse_name` decodes.
"""
import ast
import glob
import os.path as osp
import re

#: what a config's model part builds: toolbox scope, the architecture after the backbone, and
#: the tasks its results are reported for
MODEL_KINDS = {
    'mask_rcnn': dict(scope='mmdet', architecture=['FPN', 'Mask R-CNN'],
                      tasks=['Object Detection', 'Instance Segmentation']),
    'cascade_mask_rcnn': dict(scope='mmdet', architecture=['FPN', 'Cascade Mask R-CNN'],
                              tasks=['Object Detection', 'Instance Segmentation']),
    'retinanet': dict(scope='mmdet', architecture=['FPN', 'RetinaNet'],
                      tasks=['Object Detection']),
    'fpn': dict(scope='mmseg', architecture=['Semantic FPN'], tasks=['Semantic Segmentation']),
    'upernet': dict(scope='mmseg', architecture=['UPerNet'], tasks=['Semantic Segmentation']),
    'cls': dict(scope='mmpretrain', architecture=['Global Average Pooling', 'Linear Head'],
                tasks=['Image Classification']),
}
#: dataset name part -> (metafile name, input (H, W) at which the backbone is counted)
DATASETS = {'coco': ('COCO', (800, 1333)), 'ade20k': ('ADE20K', (512, 512)),
            'in1k': ('ImageNet-1k', (224, 224))}
_NAME = re.compile(r'^(?P<model>{})_(?P<backbone>[a-z0-9_]+?)_(?P<schedule>\d+x|\d+k|\d+e)_'
                   r'(?P<dataset>{})$'.format('|'.join(sorted(MODEL_KINDS, key=len, reverse=True)),
                                              '|'.join(DATASETS)))


def parse_name(stem):
    """``dict(model, backbone, schedule, dataset)`` of a config stem; ValueError otherwise."""
    match = _NAME.match(stem)
    if match is None:
        raise ValueError(f'config {stem!r} does not follow <model>_<backbone>_<schedule>_'
                         f'<dataset> with model in {sorted(MODEL_KINDS)}, schedule 1x/3x/<N>k/'
                         f'<N>e and dataset in {sorted(DATASETS)} (configs/README.md)')
    return match.groupdict()


def schedule_metadata(schedule):
    """Metafile ``Epochs`` / ``Iterations`` of a schedule name (1x = 12 COCO epochs)."""
    if schedule.endswith('x'):
        return {'Epochs': 12 * int(schedule[:-1])}
    if schedule.endswith('k'):
        return {'Iterations': 1000 * int(schedule[:-1])}
    return {'Epochs': int(schedule[:-1])}


def _literal(node, names, bases=None):
    """Value of a config expression made of literals, ``dict(...)`` calls, known names and
    ``_base_.pop('key')`` (in a config's code mmengine binds ``_base_`` to its merged bases)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.List):
        return [_literal(e, names, bases) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, names, bases) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_literal(k, names, bases): _literal(v, names, bases)
                for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        out = {}
        for arg in node.args:  # dict(mapping, key=value): a copy with those keys replaced
            value = _literal(arg, names, bases)
            out.update(value if isinstance(value, dict) else {})
        out.update({kw.arg: _literal(kw.value, names, bases) for kw in node.keywords if kw.arg})
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == '_base_' \
            and node.func.attr == 'pop' and bases is not None and node.args \
            and isinstance(node.args[0], ast.Constant):
        return bases.pop(node.args[0].value, None)
    return None


def _merge(base, new):
    """mmengine's dict inheritance: recursive update, ``_delete_=True`` replaces."""
    if not isinstance(base, dict) or not isinstance(new, dict) or new.get('_delete_'):
        return {k: v for k, v in new.items() if k != '_delete_'} if isinstance(new, dict) else new
    out = dict(base)
    for key, value in new.items():
        out[key] = _merge(base.get(key), value) if key in base else value
    return out


def _assignments(path):
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    return [(stmt.targets[0].id, stmt.value) for stmt in tree.body
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)]


def _bases(assigns):
    bases = next((_literal(value, {}) for key, value in assigns if key == '_base_'), None) or []
    return [bases] if isinstance(bases, str) else list(bases)


def read_config(path):
    """Top-level names of a config file merged over its local ``_base_`` files (not ``pkg::``)."""
    assigns = _assignments(path)
    merged = {}
    for base in _bases(assigns):
        if isinstance(base, str) and '::' not in base:
            merged = _merge(merged, read_config(osp.normpath(osp.join(osp.dirname(path), base))))
    names = {}
    for key, value in assigns:
        if key != '_base_':
            names[key] = _literal(value, names, merged)
    for key, value in names.items():
        merged[key] = _merge(merged.get(key), value) if key in merged else value
    return merged


def toolbox_bases(path):
    """The ``pkg::`` bases a config inherits, directly or through its local bases, in order."""
    out = []
    for base in _bases(_assignments(path)):
        if '::' in base:
            out.append(base)
        else:
            out += toolbox_bases(osp.normpath(osp.join(osp.dirname(path), base)))
    return out


def family_config_paths(config_dir):
    """Config files of the family folders (not ``_base_/``, ``demo/`` or the top-level entry
    points, which inherit a family config unchanged), sorted."""
    return [path for path in sorted(glob.glob(osp.join(config_dir, '*', '*.py')))
            if osp.basename(osp.dirname(path)) not in ('_base_', 'demo')]


def config_index(config_dir):
    """``[(config name, backbone dict, checkpoint)]`` of every family config, named
    ``<family>/<file stem>``."""
    out = []
    for path in family_config_paths(config_dir):
        folder = osp.basename(osp.dirname(path))
        cfg = read_config(path)
        backbone = (cfg.get('model') or {}).get('backbone') or {}
        init = backbone.get('init_cfg') if isinstance(backbone.get('init_cfg'), dict) else {}
        ckpt = cfg.get('pretrained') or init.get('checkpoint')
        out.append((f'{folder}/{osp.splitext(osp.basename(path))[0]}', backbone, ckpt))
    return out


def entry_point_aliases(config_dir):
    """``{family config name: [top-level entry point stems]}``: each file at the top of
    ``configs/`` is one ``_base_`` line over a family config (configs/README.md)."""
    out = {}
    for path in sorted(glob.glob(osp.join(config_dir, '*.py'))):
        bases = _bases(_assignments(path))
        if len(bases) == 1 and '::' not in bases[0]:
            target = osp.relpath(osp.normpath(osp.join(config_dir, bases[0])), config_dir)
            name = osp.splitext(target)[0].replace(osp.sep, '/')
            out.setdefault(name, []).append(osp.splitext(osp.basename(path))[0])
    return out

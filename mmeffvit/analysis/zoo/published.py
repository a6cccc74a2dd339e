"""Results the authors published, as data: the only source of the results tables in the family
READMEs and of the ``Results`` in the metafiles (``tools/analysis/model_zoo.py`` renders both).

Each :class:`Table` copies one published table with its source. A row names the mmeffvit config
of exactly that setting (``config``: backbone, detector, schedule and dataset all the same) or,
for ImageNet rows, the model zoo variant (``variant``, which a classification config of that
variant picks up); only such rows of tables with ``verified=True`` become metafile ``Results``.
Nothing here was measured by mmeffvit, which has trained none of these models. What the
reference notes mark as third-party (``/work/shared/reference``: ``[3p]``) is kept out of the
metafiles and labelled as such in the README.
"""
import re

FLATTEN_CODE = 'https://github.com/LeapLabTHU/FLatten-Transformer'
CARE_CODE = 'https://github.com/zhouyuan888888/CARE-Transformer'
L2VIT_CODE = 'https://github.com/ChuanyangZheng/L2ViT'
FOCAL_CODE = 'https://github.com/microsoft/Focal-Transformer'


class Table:
    """One published table.

    Args:
        title (str): What the table shows.
        source (str): Where it was published (markdown allowed).
        columns (Sequence[str]): Column titles of the cells, in order.
        rows (list[dict]): ``cells`` (one per column; ``None`` for a dash) and optionally
            ``config`` (config stem) or ``variant`` (model zoo variant name).
        metrics (dict): ``column -> (task, dataset, metric name)`` of the columns that are results.
        verified (bool): False for numbers that did not come from the authors.
    """

    def __init__(self, title, source, columns, rows, metrics, verified=True):
        self.title, self.source, self.columns = title, source, tuple(columns)
        self.rows, self.metrics, self.verified = rows, metrics, verified
        for row in rows:
            if len(row['cells']) != len(self.columns):
                raise ValueError(f'{title}: row {row} has {len(row["cells"])} cells for '
                                 f'{len(self.columns)} columns')

    def results(self, row):
        """``[(task, dataset, {metric: value})]`` of a row, grouped by task, in column order."""
        grouped = {}
        for column, value in zip(self.columns, row['cells']):
            if column in self.metrics and value is not None:
                task, dataset, metric = self.metrics[column]
                grouped.setdefault((task, dataset), {})[metric] = value
        return [(task, dataset, metrics) for (task, dataset), metrics in grouped.items()]


def row(*cells, config=None, variant=None):
    return dict(cells=list(cells), config=config, variant=variant)


_TOP1 = {'top-1 (%)': ('Image Classification', 'ImageNet-1k', 'Top 1 Accuracy'),
         'top-5 (%)': ('Image Classification', 'ImageNet-1k', 'Top 5 Accuracy')}
_BOX_MASK = {'box AP': ('Object Detection', 'COCO', 'box AP'),
             'mask AP': ('Instance Segmentation', 'COCO', 'mask AP')}
_MIOU = {'mIoU': ('Semantic Segmentation', 'ADE20K', 'mIoU'),
         'mIoU (ms)': ('Semantic Segmentation', 'ADE20K', 'mIoU(ms)')}

FLATTEN_IN1K = Table(
    'ImageNet-1k classification (224², Swin-B also 384²), the released checkpoints',
    f'official README ([LeapLabTHU/FLatten-Transformer]({FLATTEN_CODE})); top-5 from the '
    'evaluation logs released with the checkpoints',
    ('model', 'resolution', 'top-1 (%)', 'top-5 (%)'),
    [row('FLatten-PVT-T', '224²', 77.8, 93.9, variant='FLatten-PVT-T'),
     row('FLatten-PVTv2-B0', '224²', 71.1, 90.6, variant='FLatten-PVTv2-B0'),
     row('FLatten-Swin-T', '224²', 82.1, 95.9, variant='FLatten-Swin-T'),
     row('FLatten-Swin-S', '224²', 83.5, None, variant='FLatten-Swin-S'),
     row('FLatten-Swin-B', '224²', 83.8, None, variant='FLatten-Swin-B'),
     row('FLatten-Swin-B', '384²', 85.0, None, variant='FLatten-Swin-B@384'),
     row('FLatten-CSWin-T', '224²', 83.1, 96.4, variant='FLatten-CSWin-T')],
    _TOP1)

LAVIT_SOURCE = ('numbers of the paper\'s Tables 2-4 as extracted by a third party '
                '(heedless-backbones), **not verified against the paper**; LaViT-B has no '
                'detection or segmentation entry, LaViT-T no segmentation entry')
LAVIT_IN1K = Table(
    'ImageNet-1k classification, 224², 300 epochs', LAVIT_SOURCE,
    ('model', 'params', 'FLOPs', 'top-1 (%)'),
    [row('LaViT-T', '10.9M', '1.6G', 79.2, variant='LaViT-T'),
     row('LaViT-S', '22.4M', '3.3G', 82.6, variant='LaViT-S'),
     row('LaViT-B', '39.6M', '6.1G', 83.1, variant='LaViT-B')],
    _TOP1, verified=False)
LAVIT_COCO = Table(
    'COCO val2017, RetinaNet', LAVIT_SOURCE,
    ('backbone', 'schedule', 'box AP', 'AP50', 'AP75', 'APs', 'APm', 'APl', 'FLOPs'),
    [row('LaViT-T', '1x', 46.2, 67.2, 49.1, 29.6, 50.2, 61.3, '202G',
         config='retinanet_lavit_t_1x_coco'),
     row('LaViT-T', '3x', 48.4, 69.9, 51.7, 31.8, 52.2, 64.1, '202G',
         config='retinanet_lavit_t_3x_coco'),
     row('LaViT-S', '1x', 46.7, 68.3, 49.7, 29.9, 50.7, 61.7, '290G',
         config='retinanet_lavit_s_1x_coco'),
     row('LaViT-S', '3x', 48.9, 70.3, 52.2, 33.1, 52.6, 65.4, '290G',
         config='retinanet_lavit_s_3x_coco')],
    {'box AP': _BOX_MASK['box AP']}, verified=False)
LAVIT_ADE = Table(
    'ADE20K val, 512² crops', LAVIT_SOURCE,
    ('backbone', 'head', 'schedule', 'mIoU', 'mIoU (ms)', 'FLOPs'),
    [row('LaViT-S', 'Semantic FPN', '80k', 44.1, None, '122G', config='fpn_lavit_s_80k_ade20k'),
     row('LaViT-S', 'UperNet', '160k', 47.2, 49.5, '920G', config='upernet_lavit_s_160k_ade20k')],
    _MIOU, verified=False)

CARE_IN1K = Table(
    'ImageNet-1k classification, 224²',
    f'official README ([zhouyuan888888/CARE-Transformer]({CARE_CODE})); latency of the README\'s '
    'benchmark (iPhone 13, Intel i9, RTX 4090)',
    ('model', 'params', 'GMACs', 'top-1 (%)', 'latency ms (iPhone / i9 / 4090)'),
    [row('CARE-S0', '7.3M', '0.7', 78.4, '1.1 / 4.3 / 9.8', variant='CARE-S0'),
     row('CARE-S1', '9.6M', '1.0', 80.1, '1.4 / 6.6 / 14.2', variant='CARE-S1'),
     row('CARE-S2', '19.5M', '1.9', 82.1, '2.0 / 9.4 / 20.4', variant='CARE-S2')],
    _TOP1)

L2VIT_IN1K = Table(
    'ImageNet classification',
    f'official README ([ChuanyangZheng/L2ViT]({L2VIT_CODE}))',
    ('model', 'pre-training', 'resolution', 'params', 'FLOPs', 'top-1 (%)'),
    [row('L2ViT-T', 'ImageNet-1k', '224²', '29M', '4.7G', 83.1, variant='L2ViT-T'),
     row('L2ViT-S', 'ImageNet-1k', '224²', '50M', '9.0G', 84.1, variant='L2ViT-S'),
     row('L2ViT-B', 'ImageNet-1k', '224²', '89M', '15.9G', 84.4, variant='L2ViT-B'),
     row('L2ViT-B', 'ImageNet-22k', '224²', '89M', '15.9G', 86.0),
     row('L2ViT-B', 'ImageNet-22k', '384²', '89M', '47.5G', 87.0)],
    _TOP1)

FOCAL_SOURCE = f'official README ([microsoft/Focal-Transformer]({FOCAL_CODE}))'
FOCAL_IN1K = Table(
    'ImageNet-1k classification, 224²', FOCAL_SOURCE,
    ('model', 'patch embedding', 'params', 'FLOPs', 'top-1 (%)', 'top-5 (%)'),
    [row('Focal-T', 'linear', '28.9M', '4.9G', 82.2, 95.9, variant='Focal-T'),
     row('Focal-T', 'conv', '30.8M', '5.2G', 82.7, 96.1, variant='Focal-T-conv'),
     row('Focal-S', 'linear', '51.1M', '9.4G', 83.6, 96.2, variant='Focal-S'),
     row('Focal-S', 'conv', '53.1M', '9.7G', 83.8, 96.5, variant='Focal-S-conv'),
     row('Focal-B', 'linear', '89.8M', '16.4G', 84.0, 96.5, variant='Focal-B'),
     row('Focal-B', 'conv', '93.3M', '16.8G', 84.2, 97.1, variant='Focal-B-conv')],
    _TOP1)


def _focal_det(framework, size, schedule, params, flops, box, mask=None, config=None):
    return row(framework, f'Focal-{size}', schedule, params, flops, box, mask, config=config)


FOCAL_COCO = Table(
    'COCO val2017, ImageNet-1k pre-trained backbones', FOCAL_SOURCE,
    ('framework', 'backbone', 'schedule', 'params', 'FLOPs', 'box AP', 'mask AP'),
    [_focal_det('Mask R-CNN', size, sched, params, flops, box, mask,
                f'mask_rcnn_focal_{size.lower()}_{sched}_coco')
     for size, params, flops, results in (
         ('T', '49M', '291G', ((44.8, 41.0), (47.2, 42.7))),
         ('S', '71M', '401G', ((47.4, 42.8), (48.8, 43.8))),
         ('B', '110M', '533G', ((47.8, 43.2), (49.0, 43.7))))
     for sched, (box, mask) in zip(('1x', '3x'), results)]
    + [_focal_det('RetinaNet', size, sched, params, flops, box,
                  config=f'retinanet_focal_{size.lower()}_{sched}_coco')
       for size, params, flops, boxes in (('T', '39M', '265G', (43.7, 45.5)),
                                          ('S', '62M', '367G', (45.6, 47.3)),
                                          ('B', '101M', '514G', (46.3, 46.9)))
       for sched, box in zip(('1x', '3x'), boxes)]
    + [_focal_det('Cascade Mask R-CNN', 'T', '3x', '87M', '770G', 51.5,
                  config='cascade_mask_rcnn_focal_t_3x_coco'),
       _focal_det('ATSS', 'T', '3x', '37M', '239G', 49.5),
       _focal_det('RepPointsV2', 'T', '3x', '45M', '491G', 51.2),
       _focal_det('Sparse R-CNN', 'T', '3x', '111M', '196G', 49.0)],
    _BOX_MASK)

FOCAL_ADE = Table(
    'ADE20K val, UperNet, 160k iterations', FOCAL_SOURCE,
    ('backbone', 'pre-training', 'crop', 'params', 'FLOPs', 'mIoU', 'mIoU (ms)'),
    [row('Focal-T', 'ImageNet-1k', '512²', '62M', '998G', 45.8, 47.0,
         config='upernet_focal_t_160k_ade20k'),
     row('Focal-S', 'ImageNet-1k', '512²', '85M', '1130G', 48.0, 50.0,
         config='upernet_focal_s_160k_ade20k'),
     row('Focal-B', 'ImageNet-1k', '512²', '126M', '1354G', 49.0, 50.5,
         config='upernet_focal_b_160k_ade20k'),
     row('Focal-L', 'ImageNet-22k', '640²', '240M', '3376G', 54.0, 55.4)],
    _MIOU)

#: what is (not) published beyond the tables, per family folder
NOTES = {
    'flatten': 'The paper reports COCO (Mask R-CNN, Cascade Mask R-CNN) and ADE20K (Semantic FPN, '
               'UperNet) results, but its tables could not be read for this project and the '
               'official repository publishes no detection or segmentation number, code or '
               'weights; so no downstream number is listed (an aggregator\'s unattributed '
               'figures are not used). Only FLatten-PVT-T, PVTv2-B0, Swin-T/S/B (and B at 384²) '
               'and CSWin-T have released ImageNet weights.',
    'lavit': 'No official code or weights exist; the architecture is a reconstruction (see '
             '"Reconstruction notes" below), so these numbers are targets at best, and they are '
             'not in the metafile.',
    'care': 'The paper reports COCO (Mask R-CNN) and ADE20K (Semantic FPN) results, but its '
            'tables could not be read for this project and the official repository publishes '
            'no detection or segmentation number, code or weights; none is listed.',
    'l2vit': 'The paper reports COCO and ADE20K results, but its tables could not be read for '
             'this project, and the official detection / segmentation configs and README carry '
             'no AP or mIoU; none is listed.',
    'focal': 'The authors\' detection and segmentation code follows Swin\'s and was never '
             'released, nor were those weights; mmeffvit\'s configs port Swin\'s recipes, so '
             'these are the numbers they aim at, not numbers mmeffvit measured. The official '
             'ImageNet weight links are dead (issues #8, #20, #24, #27).',
}

TABLES = {
    'flatten': [FLATTEN_IN1K],
    'lavit': [LAVIT_IN1K, LAVIT_COCO, LAVIT_ADE],
    'care': [CARE_IN1K],
    'l2vit': [L2VIT_IN1K],
    'focal': [FOCAL_IN1K, FOCAL_COCO, FOCAL_ADE],
}


def _matching(family, **match):
    """``(table, row)`` of the verified rows whose ``config`` / ``variant`` is ``match``."""
    (field, value), = match.items()
    return [(table, r) for table in TABLES.get(family, []) if table.verified
            for r in table.rows if r[field] == value]


def plain_source(table):
    """The source without markdown links (``[text](url)`` -> ``url``), for the metafiles."""
    return re.sub(r'\[([^\]]+)\]\(([^)]+)\)', r'\2', table.source)


def config_results(family, stem):
    """``([(task, dataset, {metric: value})], [source])`` published for a config stem."""
    found = _matching(family, config=stem)
    return ([res for table, r in found for res in table.results(r)],
            sorted({plain_source(table) for table, _ in found}))


def variant_results(family, variant_name):
    """The same for a model zoo variant's ImageNet rows (for classification configs)."""
    found = _matching(family, variant=variant_name)
    return ([res for table, r in found for res in table.results(r)],
            sorted({plain_source(table) for table, _ in found}))

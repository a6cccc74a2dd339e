"""tools/image_demo.py and the sample photos; end to end (``-m e2e``) on checkpoints trained here,
together with tools/analysis/plot_logs.py, mmdet's analyze_logs.py and the demo's curves."""
import glob
import importlib.util
import json
import os.path as osp
import re
import shutil
import subprocess
import sys

import mmcv
import numpy as np
import pytest
import torch
from PIL import Image

from mmeffvit.utils import SAMPLE_PHOTOS, sample_photo

# the runs det_run and seg_run are trained once per session by conftest.py
from e2e_runs import DET_CFG, SEG_CFG, run

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _load_tool(*parts):
    path = osp.join(ROOT, 'tools', *parts)
    spec = importlib.util.spec_from_file_location('_tool_' + parts[-1][:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_demo = _load_tool('image_demo.py')


# ---- sample photos -----------------------------------------------------------------------------

@pytest.mark.parametrize('name', sorted(SAMPLE_PHOTOS))
def test_sample_photos_are_colour_pictures(name):
    img = mmcv.imread(sample_photo(name))
    assert img.ndim == 3 and img.shape[2] == 3 and min(img.shape[:2]) >= 300
    assert np.abs(img[..., 0].astype(int) - img[..., 2]).mean() > 5  # not grey


def test_sample_photo_errors(monkeypatch):
    with pytest.raises(KeyError, match="'astronot'; choose one of: astronaut"):
        sample_photo('astronot')
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    with pytest.raises(ModuleNotFoundError, match='pip install scikit-image=='):
        sample_photo('astronaut')


# ---- inputs and options ------------------------------------------------------------------------

def test_collect_images(tmp_path, capsys):
    shutil.copy(sample_photo('chelsea'), tmp_path / 'cat.png')
    (tmp_path / 'broken.jpg').write_bytes(b'not a jpeg')
    (tmp_path / 'notes.txt').write_text('not a picture')
    assert image_demo.collect_images(str(tmp_path)) == [str(tmp_path / 'cat.png')]
    assert 'skipping' in capsys.readouterr().err
    assert len(image_demo.collect_images('sample:all')) == len(SAMPLE_PHOTOS)
    assert image_demo.collect_images('sample:coffee') == [sample_photo('coffee')]
    for spec, message in [(str(tmp_path / 'broken.jpg'), 'not a readable picture'),
                          (str(tmp_path / 'missing.png'), 'neither a picture, a folder'),
                          ('sample:nope', 'choose one of'),
                          (str(tmp_path / 'notes.txt'), 'not a readable picture')]:
        with pytest.raises(image_demo.ImageDemoError, match=message):
            image_demo.collect_images(spec)
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(image_demo.ImageDemoError, match='no readable picture'):
        image_demo.collect_images(str(empty))


@pytest.mark.parametrize('argv, message', [
    (['sample:coffee', SEG_CFG, '--score-thr', '0.5'], 'detection .mmdet. configs only'),
    (['sample:coffee', DET_CFG, 'missing.pth'], 'checkpoint missing.pth not found'),
    (['sample:coffee', 'configs/nope.py'], 'config configs/nope.py not found'),
    (['sample:coffee', SEG_CFG, '--opacity', '2'], 'not in \\[0, 1\\]'),
    (['sample:coffee', DET_CFG, '--palette', 'ade20k'], "mmdet knows 'random', 'coco'"),
])
def test_option_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        image_demo.main(argv)
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_other_scope_is_refused(tmp_path, capsys):
    cfg = tmp_path / 'cls.py'
    cfg.write_text("default_scope = 'mmpretrain'\nmodel = dict(type='ImageClassifier')\n")
    with pytest.raises(SystemExit):
        image_demo.main(['sample:coffee', str(cfg)])
    assert "default_scope 'mmpretrain'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without GPU')
def test_cuda_without_gpu_is_refused():
    with pytest.raises(image_demo.ImageDemoError, match='torch sees no GPU'):
        image_demo.resolve_device('cuda:0')


def test_checkpoint_mismatch_names_the_problem():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    good = {'state_dict': {f'module.{k}': v for k, v in model.state_dict().items()}}
    assert image_demo.checkpoint_mismatch(model, good) is None
    partial = {'state_dict': {'0.weight': torch.zeros(3, 2)}}
    assert '3 of the model\'s 4 weights are missing' in image_demo.checkpoint_mismatch(
        model, partial)
    misshapen = dict(model.state_dict(), **{'1.weight': torch.zeros(2, 3)})
    assert '1 have another shape (first: 1.weight (2, 3) vs (1, 3))' in \
        image_demo.checkpoint_mismatch(model, misshapen)
    official = {'model': {'patch_embed.proj.weight': torch.zeros(1)}}
    assert 'backbone' in image_demo.checkpoint_mismatch(model, official)


def test_seg_palettes():
    assert image_demo.seg_palette('random', 3) == image_demo.seg_palette('random', 3)
    assert len(image_demo.seg_palette('ade20k', 5)) == 5
    with pytest.raises(image_demo.ImageDemoError, match='has 19 colours, the model 30'):
        image_demo.seg_palette('cityscapes', 30)
    with pytest.raises(image_demo.ImageDemoError, match="--palette 'nope'"):
        image_demo.seg_palette('nope', 3)


def test_random_weights_are_announced_and_stamped(tmp_path, capsys):
    """No checkpoint: a banner on stderr, a red strip on the picture, classes of the config."""
    out = tmp_path / 'out'
    assert image_demo.main(['sample:chelsea', SEG_CFG, '--out-dir', str(out)]) == 0
    captured = capsys.readouterr()
    assert 'RANDOM WEIGHTS (no checkpoint)' in captured.err
    assert 'RANDOM WEIGHTS (no checkpoint)' in captured.out
    # the shapes config's class names, not the toolbox's Cityscapes default
    assert any(c in captured.out for c in ('circle', 'square', 'triangle', 'star', 'background'))
    picture = mmcv.imread(str(out / 'vis' / 'chelsea.png'))
    strip = picture[:300 // 16 - 2]
    assert picture.shape[0] == 300 + 300 // 16 and picture.shape[1] == 451
    red = (strip[..., 2] > 150) & (strip[..., 0] < 60)
    white = strip.min(-1) > 200  # the text
    assert red.mean() > 0.5 and white.any()
    label_map = np.asarray(Image.open(out / 'pred' / 'chelsea.png'))
    assert label_map.shape == (300, 451) and label_map.max() < 5


# ---- end to end, on checkpoints trained by the tests -------------------------------------------

def _demo(args, **kw):
    return run([sys.executable, 'tools/image_demo.py'] + args, **kw)


@pytest.mark.e2e
def test_det_checkpoint_on_shapes_and_photo(det_run, e2e_shapes, tmp_path):
    val_img = sorted((e2e_shapes / 'coco' / 'val2017').glob('*.jpg'))[0]
    folder = tmp_path / 'pictures'
    folder.mkdir()
    shutil.copy(val_img, folder / val_img.name)
    shutil.copy(sample_photo('astronaut'), folder / 'astronaut.png')
    out = tmp_path / 'out'
    text = _demo([str(folder), DET_CFG, osp.join(det_run, 'iter_2.pth'), '--out-dir', str(out),
                  '--score-thr', '0.0', '--device', 'cpu'])
    assert 'RANDOM WEIGHTS' not in text
    for name, source in ((val_img.name, val_img), ('astronaut.png', folder / 'astronaut.png')):
        drawn = mmcv.imread(str(out / 'vis' / name))
        assert drawn.shape == mmcv.imread(str(source)).shape  # drawn at the picture's size
        preds = json.loads((out / 'preds' / (osp.splitext(name)[0] + '.json')).read_text())
        assert set(preds) >= {'labels', 'scores', 'bboxes', 'masks'} and preds['labels']
        assert max(preds['labels']) < 4  # the shapes classes of the checkpoint's meta
        assert f'{name}: ' in text
    # drawn with a score threshold of 0: every prediction's box is on the picture
    assert 'star' in text or 'circle' in text or 'square' in text or 'triangle' in text


@pytest.mark.e2e
def test_det_inferencer_holds_the_checkpoint_weights(det_run):
    from mmengine.config import Config
    ckpt = osp.join(det_run, 'iter_2.pth')
    inferencer = image_demo.build_inferencer(Config.fromfile(osp.join(ROOT, DET_CFG)), ckpt,
                                             'cpu')
    saved = torch.load(ckpt, map_location='cpu', weights_only=False)['state_dict']
    state = inferencer.model.state_dict()
    assert state.keys() == saved.keys()
    for key in saved:
        torch.testing.assert_close(state[key], saved[key], rtol=0, atol=0, msg=key)
    assert inferencer.model.dataset_meta['classes'] == ('circle', 'square', 'triangle', 'star')


@pytest.mark.e2e
def test_seg_checkpoint_on_photo(seg_run, tmp_path):
    out = tmp_path / 'out'
    text = _demo(['sample:rocket', SEG_CFG, osp.join(seg_run, 'iter_2.pth'), '--out-dir',
                  str(out), '--palette', 'ade20k'])
    assert 'rocket.jpg: pixels:' in text and 'RANDOM WEIGHTS' not in text
    assert mmcv.imread(str(out / 'vis' / 'rocket.jpg')).shape == (427, 640, 3)
    label_map = np.asarray(Image.open(out / 'pred' / 'rocket.png'))
    assert label_map.shape == (427, 640) and label_map.max() < 5


@pytest.mark.e2e
def test_wrong_or_corrupt_checkpoint_is_refused(det_run, seg_run, tmp_path):
    proc = subprocess.run(
        [sys.executable, 'tools/image_demo.py', 'sample:coffee', DET_CFG,
         osp.join(seg_run, 'iter_2.pth'), '--out-dir', str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert 'the checkpoint does not fit the config\'s model' in proc.stderr
    cut = tmp_path / 'cut.pth'
    data = open(osp.join(det_run, 'iter_2.pth'), 'rb').read()
    cut.write_bytes(data[:len(data) // 2])
    proc = subprocess.run(
        [sys.executable, 'tools/image_demo.py', 'sample:coffee', DET_CFG, str(cut),
         '--out-dir', str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and 'corrupt or truncated' in proc.stderr, proc.stderr[-2000:]


@pytest.mark.e2e
def test_curves_of_trained_runs(det_run, seg_run, tmp_path):
    out = tmp_path / 'curves.png'
    text = run([sys.executable, 'tools/analysis/plot_logs.py', det_run, seg_run, '--out',
                str(out)])
    assert 'loss_mask' in text and 'decode.loss_ce' in text
    assert 'coco/bbox_mAP best' in text and 'mIoU best' in text
    assert Image.open(out).format == 'PNG'
    # mmdet's own analyze_logs.py runs with the pinned seaborn
    import mmdet
    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'analysis_tools',
                      'analyze_logs.py')
    log = sorted(p for p in glob.glob(osp.join(det_run, '*', 'vis_data', '*.json'))
                 if not p.endswith('scalars.json'))[0]
    run([sys.executable, script, 'plot_curve', log, '--keys', 'loss', '--out',
         str(tmp_path / 'mmdet.png')])
    assert Image.open(tmp_path / 'mmdet.png').format == 'PNG'


@pytest.mark.e2e
def test_demo_writes_curves(tmp_path):
    work = tmp_path / 'demo'
    text = run([sys.executable, 'tools/demo.py', '--task', 'seg', '--iters', '2',
                '--num-train', '4', '--num-val', '2', '--data-root', str(tmp_path / 'data'),
                '--work-dir', str(work)])
    assert f'training curves: {work / "seg" / "curves.png"}' in text
    assert Image.open(work / 'seg' / 'curves.png').format == 'PNG'
    summary = json.loads((work / 'summary.json').read_text())
    assert summary[0]['curves'] == str(work / 'seg' / 'curves.png')


@pytest.mark.e2e
def test_toolbox_inferencers_alone_load_mmeffvit_through_the_config(det_run, seg_run, tmp_path):
    """A user's own script: only the config's custom_imports brings in mmeffvit (models, scope,
    checkpoint loader), while the inferencers set their default scope themselves."""
    script = tmp_path / 'infer.py'
    script.write_text(
        'import sys\n'
        'from mmdet.apis import DetInferencer\n'
        'from mmseg.apis import MMSegInferencer\n'
        'cfg_det, ckpt_det, cfg_seg, ckpt_seg, img, out = sys.argv[1:]\n'
        "assert 'mmeffvit' not in sys.modules\n"
        "det = DetInferencer(cfg_det, weights=ckpt_det, device='cpu', show_progress=False)\n"
        "assert 'mmeffvit' in sys.modules\n"
        'res = det(img, out_dir=out)\n'
        "print('det', len(res['predictions'][0]['scores']), det.model.dataset_meta['classes'])\n"
        "seg = MMSegInferencer(cfg_seg, weights=ckpt_seg, device='cpu')\n"
        "print('seg', seg(img)['predictions'].shape)\n")
    text = run([sys.executable, str(script), osp.join(ROOT, DET_CFG),
                osp.join(det_run, 'iter_2.pth'), osp.join(ROOT, SEG_CFG),
                osp.join(seg_run, 'iter_2.pth'), sample_photo('coffee'), str(tmp_path / 'o')])
    assert re.search(r"det \d+ \('circle', 'square', 'triangle', 'star'\)", text), text[-3000:]
    assert 'seg (400, 600)' in text

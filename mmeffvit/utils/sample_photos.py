"""Colour photographs for demos, read from the scikit-image wheel (no download at run time).

scikit-image ships a few natural photos inside its wheel (``skimage/data``); its ``data`` module
only downloads the larger ones. The files are found through the installed package's location,
so ``import skimage`` (and its lazy loaders) is never run.
"""
import importlib.util
import os.path as osp

from .suggest import unknown_choice_error

# name -> (file in skimage/data, what it shows); every one is an RGB photograph
SAMPLE_PHOTOS = {
    'astronaut': ('astronaut.png', 'astronaut Eileen Collins, 512x512'),
    'chelsea': ('chelsea.png', 'a cat on a couch, 451x300'),
    'coffee': ('coffee.png', 'a cup of coffee on a saucer, 600x400'),
    'motorcycle': ('motorcycle_left.png', 'a motorcycle in a garage, 741x500'),
    'rocket': ('rocket.jpg', 'a rocket on its launch pad, 640x427'),
}
PINNED = 'scikit-image==0.26.0'  # requirements/pins.txt


def sample_photo(name):
    """Path of the sample photograph ``name`` (one of :data:`SAMPLE_PHOTOS`).

    Raises:
        KeyError: ``name`` is not a sample photo (the message lists them, closest first).
        ModuleNotFoundError: scikit-image is not installed.
        FileNotFoundError: the installed scikit-image lacks the file.
    """
    if name not in SAMPLE_PHOTOS:
        raise unknown_choice_error('sample photo', name, SAMPLE_PHOTOS)
    spec = importlib.util.find_spec('skimage')
    if spec is None or not spec.origin:
        raise ModuleNotFoundError(
            f'the sample photos come from scikit-image, which is not installed: pip install '
            f'{PINNED} (or run tools/install.sh)', name='skimage')
    path = osp.join(osp.dirname(spec.origin), 'data', SAMPLE_PHOTOS[name][0])
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} is missing from the installed scikit-image; '
                                f'reinstall {PINNED}')
    return path

"""Drawing of the shapes data sets (:mod:`mmeffvit.datasets.shapes`, detection and
segmentation; :mod:`mmeffvit.datasets.shapes_cls`, classification): a shape rasterised into a
mask, a background with a gradient, a shape colour that stands out, the JPEG quality."""
import cv2
import numpy as np

JPEG_QUALITY = 95


def random_background(rng, h, w):
    """A random base colour with a mild linear gradient (float32, BGR)."""
    base = rng.uniform(30, 225, size=3)
    grad_x, grad_y = rng.uniform(-40, 40, size=(2, 3))
    ys = np.linspace(-0.5, 0.5, h, dtype=np.float32)[:, None, None]
    xs = np.linspace(-0.5, 0.5, w, dtype=np.float32)[None, :, None]
    return (base + xs * grad_x + ys * grad_y).astype(np.float32), base


def pick_colour(rng, background, used):
    """A colour far from the background and reasonably far from earlier shapes' colours."""
    for _ in range(50):
        colour = rng.integers(0, 256, size=3).astype(np.float64)
        if (np.linalg.norm(colour - background) >= 120
                and all(np.linalg.norm(colour - c) >= 80 for c in used)):
            break
    return colour


def draw_shape(name, shape, centre, size, theta, aspect=0.55):
    """Rasterise one shape into a full ``(H, W)`` uint8 mask (1 inside).

    Args:
        name (str): ``circle``, ``square`` (side ``size``), ``triangle``, ``star`` (the detection
            and segmentation classes) or ``hexagon``, ``cross``, ``ring``, ``ellipse`` (further
            classification classes).
        shape (tuple[int, int]): ``(H, W)`` of the mask.
        centre (tuple[float, float]): ``(x, y)`` of the centre in pixels.
        size (float): Diameter-like extent in pixels.
        theta (float): Rotation in radians (circles and rings ignore it).
        aspect (float): Minor / major axis of an ellipse.
    """
    h, w = shape
    cx, cy = centre
    mask = np.zeros((h, w), np.uint8)
    centre_px = (int(round(cx)), int(round(cy)))
    if name in ('circle', 'ring'):
        cv2.circle(mask, centre_px, int(round(size / 2)), 1, -1)
        if name == 'ring':
            cv2.circle(mask, centre_px, int(round(size / 4)), 0, -1)
        return mask
    if name == 'ellipse':
        axes = (int(round(size / 2)), int(round(size / 2 * aspect)))
        cv2.ellipse(mask, centre_px, axes, float(np.degrees(theta)), 0, 360, 1, -1)
        return mask
    if name == 'square':  # side length == size
        radii = [size / np.sqrt(2)] * 4
    elif name == 'triangle':
        radii = [0.6 * size] * 3
    elif name == 'star':  # alternating outer and inner vertices
        radii = [0.55 * size, 0.25 * size] * 5
    elif name == 'hexagon':
        radii = [0.5 * size] * 6
    elif name == 'cross':  # a plus sign of arm width size / 3: 12 vertices at two radii
        arm, reach = size / 6, size / 2
        corners = np.array([(arm, reach), (-arm, reach), (-arm, arm), (-reach, arm),
                            (-reach, -arm), (-arm, -arm), (-arm, -reach), (arm, -reach),
                            (arm, -arm), (reach, -arm), (reach, arm), (arm, arm)])
        rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
        pts = corners @ rot.T + (cx, cy)
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
        return mask
    else:
        raise ValueError(f'unknown shape {name!r}')
    angles = theta + np.arange(len(radii)) * 2 * np.pi / len(radii)
    pts = np.stack([cx + np.cos(angles) * radii, cy + np.sin(angles) * radii], axis=1)
    cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    return mask

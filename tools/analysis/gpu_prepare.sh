#!/usr/bin/env bash
# Prepares, on a machine that can download packages, what tools/analysis/gpu_check.sh needs on a
# lent GPU machine that has torch but no OpenMMLab packages and no network: .devpkgs/wheels
# (mmengine, mmdet, mmseg, mmpretrain and their dependencies, built for the device's Python) and
# .devpkgs/py/mmcv (this machine's mmcv Python package with its compiled ops replaced by a stub
# that raises if called: PyPI has no mmcv wheel for the device's torch, and no backbone of the
# benchmark calls an mmcv op). .devpkgs is git-excluded; pass it to the device in `carry`.
#
#   DEVICE_PYTHON=3.12 bash tools/analysis/gpu_prepare.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py=${PYTHON:-python}
dest=.devpkgs
pins=requirements/pins.txt
pin() { grep -E "^$1==" "$pins" | head -n1; }
rm -rf "$dest" && mkdir -p "$dest/wheels" "$dest/py"
pkgs=()
for name in mmengine mmdet mmsegmentation mmpretrain; do
  spec=$(pin "$name" || true)
  pkgs+=("${spec:-$name}")
done
# pure-Python dependencies of the four, and the two binary ones the imports reach
pkgs+=(addict ftfy model-index modelindex ordered-set prettytable termcolor terminaltables \
       wcwidth yapf pycocotools shapely platformdirs)
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$dest/wheels" \
  --python-version "${DEVICE_PYTHON:-3.12}" --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pkgs[@]}"
src=$("$py" -c 'import mmcv, os; print(os.path.dirname(mmcv.__file__))')
cp -r "$src" "$dest/py/mmcv"
find "$dest/py/mmcv" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
cat >"$dest/py/mmcv/_ext.py" <<'EOF'
"""Stand-in for mmcv's compiled ops on the device machine (mmcv's wheel for this torch is not
on PyPI): mmcv.ops imports, and any compiled op that is actually called raises."""


def __getattr__(name):
    def missing(*args, **kwargs):
        raise RuntimeError(f'mmcv._ext.{name}: mmcv ops are not built on this machine')
    return missing
EOF
grep -qx '/.devpkgs/' .git/info/exclude 2>/dev/null || echo '/.devpkgs/' >>.git/info/exclude
du -sh "$dest"
ls "$dest/wheels"

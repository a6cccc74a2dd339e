#!/usr/bin/env bash
# Install the pinned mmeffvit stack into the active Python environment, then mmeffvit itself.
#
#   bash tools/install.sh            # idempotent: a second run with everything present takes seconds
#
# Every version comes from requirements/pins.txt. mmcv 2.1.0 (the newest release mmdet 3.3.0 and
# mmseg 1.2.2 accept) ships no wheel for torch 2.14, so it is built once from its PyPI sdist with
# ops and the wheel is cached in $MMEFFVIT_CACHE (default ~/.cache/mmeffvit/wheels). The build
# needs three changes to mmcv's defaults: setuptools in [77, 82) (its setup.py imports
# pkg_resources, torch needs >= 77), --no-build-isolation (setup.py imports torch), and C++20
# instead of its hard-coded -std=c++17 (torch 2.14 headers reject C++17).
# CUDA ops are built when torch sees a GPU or FORCE_CUDA=1 (honouring TORCH_CUDA_ARCH_LIST).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pins="$here/requirements/pins.txt"
cache=${MMEFFVIT_CACHE:-$HOME/.cache/mmeffvit/wheels}
py=${PYTHON:-python}
pipi() { "$py" -m pip install --disable-pip-version-check --no-input "$@"; }
log() { printf '[mmeffvit install] %s\n' "$*"; }

# pins in one section of requirements/pins.txt
section() { awk -v s="[$1]" '/^\[/{on=($0==s); next} on && !/^#/ && NF' "$pins"; }

# true when every requirement of a section is already satisfied (pip would change nothing)
satisfied() {
  "$py" - "$@" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
for line in sys.argv[1:]:
    req = Requirement(line)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        sys.exit(1)
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        sys.exit(1)
EOF
}

ensure() {  # ensure SECTION [pip args]: install the section's pins unless already satisfied
  local name=$1; shift
  mapfile -t reqs < <(section "$name")
  if "$py" -c 'import packaging' 2>/dev/null && satisfied "${reqs[@]}"; then
    log "$name: already satisfied"
  else
    log "$name: installing ${reqs[*]}"
    pipi "$@" "${reqs[@]}"
  fi
}

ensure build
ensure torch
ensure mmengine

# ---- mmcv with ops -----------------------------------------------------------------------------
mmcv_req=$(section mmcv-sdist)
mmcv_ver=${mmcv_req#*==}
mmcv_ok() {
  "$py" - "$mmcv_ver" <<'EOF' 2>/dev/null
import sys, mmcv
assert mmcv.__version__ == sys.argv[1], mmcv.__version__
from mmcv.ops import nms, RoIAlign  # noqa: F401  (needs the compiled mmcv._ext)
EOF
}
if mmcv_ok; then
  log "mmcv $mmcv_ver with ops: already installed"
else
  flavour=$("$py" - <<'EOF'
import os, torch
cuda = torch.cuda.is_available() or os.environ.get('FORCE_CUDA') == '1'
tag = f"torch{torch.__version__.split('+')[0]}-py{__import__('sys').version_info[0]}{__import__('sys').version_info[1]}"
print(tag + ('-cu' + str(torch.version.cuda).replace('.', '') + '-' + os.environ.get('TORCH_CUDA_ARCH_LIST', 'auto').replace(' ', '_').replace(';', '_') if cuda else '-cpu'))
EOF
)
  wheel_dir="$cache/$flavour"
  wheel=$(ls "$wheel_dir"/mmcv-"$mmcv_ver"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    log "building mmcv $mmcv_ver with ops ($flavour); this takes ~17 min on 2 cores, once"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$py" -m pip download --disable-pip-version-check --no-deps --no-binary :all: -d "$work" "$mmcv_req"
    tar -xzf "$work"/mmcv-"$mmcv_ver".tar.gz -C "$work"
    src="$work/mmcv-$mmcv_ver"
    sed -i 's/-std=c++17/-std=c++20/g' "$src/setup.py"
    grep -q -- '-std=c++20' "$src/setup.py" || { log "mmcv setup.py has no -std flag to raise"; exit 1; }
    mkdir -p "$wheel_dir"
    (cd "$src" && MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
      "$py" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps -w "$wheel_dir" .)
    wheel=$(ls "$wheel_dir"/mmcv-"$mmcv_ver"-*.whl | head -n1)
  else
    log "using cached $wheel"
  fi
  pipi --no-deps "$wheel"
  # mmcv's own runtime dependencies (addict, yapf, opencv, ...), without touching torch
  pipi addict 'yapf' 'opencv-python' 'Pillow' 'pyyaml' 'numpy'
  mmcv_ok || { log "mmcv installed but mmcv.ops does not import"; exit 1; }
fi

ensure toolboxes
ensure tools
ensure deploy
ensure tools-nodeps --no-deps

# ---- mmeffvit ----------------------------------------------------------------------------------
# checked from / so that the current directory cannot make an uninstalled checkout importable
if [ -z "${MMEFFVIT_REBUILD:-}" ] && (cd / && "$py" - "$here/mmeffvit") <<'EOF' 2>/dev/null
import os, sys, mmeffvit
sys.exit(os.path.realpath(os.path.dirname(mmeffvit.__file__)) != os.path.realpath(sys.argv[1]))
EOF
then
  log "mmeffvit: editable install of this checkout present (MMEFFVIT_REBUILD=1 reinstalls)"
else
  log "mmeffvit: pip install -e ."
  (cd "$here" && pipi --no-build-isolation --no-deps --use-pep517 -e .)
fi
# mim finds a package at its distribution's location; a PEP 660 editable install records
# site-packages, so `mim search mmeffvit` run from the checkout needs the checkout's own egg-info
# (egg_info also links mmeffvit/.mim/ to configs/, tools/ and model-index.yml)
(cd "$here" && "$py" setup.py -q egg_info >/dev/null 2>&1) ||
  log "WARNING: setup.py egg_info failed; mim search mmeffvit will not find the model index"
# the compiled ops (mmeffvit._ext): rebuilt in place only when missing or older than a source
# or than setup.py (its compile flags)
ext=$(ls "$here"/mmeffvit/_ext*.so 2>/dev/null | head -n1 || true)
if [ "${MMEFFVIT_WITH_OPS:-1}" != 0 ] && { [ -z "$ext" ] ||
    [ -n "$(find "$here/mmeffvit/ops/csrc" "$here/setup.py" -type f -newer "$ext" | head -n1)" ]; }; then
  log "mmeffvit: building the C++/CUDA ops (python setup.py build_ext --inplace)"
  # a failed build is not fatal: every op falls back to its PyTorch reference
  (cd "$here" && MAX_JOBS=${MAX_JOBS:-$(nproc)} "$py" setup.py build_ext --inplace) ||
    log "WARNING: building mmeffvit._ext failed; the PyTorch reference ops will be used"
else
  log "mmeffvit: compiled ops up to date"
fi
"$py" -c 'import mmeffvit; print("[mmeffvit install] ok: mmeffvit", mmeffvit.__version__)'

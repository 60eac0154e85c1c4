#!/usr/bin/env bash
# The GPU check: what only a GPU exercises, in one command that fits 8 minutes on one GPU with no network
# and a preinstalled torch/transformers of whatever versions (scripts/gpu_check.py lists the parts).
#
#   bash scripts/gpu_check.sh --prepare       # beforehand, with network: the pure-Python dependencies as
#                                             # wheels in .gpu_check_wheels/ (gitignored; carry it along)
#   bash scripts/gpu_check.sh [--out DIR]     # on the GPU machine, offline: venv, install, every part
#   bash scripts/gpu_check.sh --cpu-dry-run   # the same path on the CPU with tiny sizes (no GPU figures)
#
# The venv sees the machine's own packages (--system-site-packages), so its torch, transformers, numpy,
# tokenizers and safetensors are used as they are; the carried wheels add the pinned pure-Python ones and
# the project itself is installed with --no-deps. Figures: DIR/gpu_check.json and DIR/gpu_check.md
# (default runs/gpu_check/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.gpu_check_wheels}
VENV=${GPU_CHECK_VENV:-/tmp/agentgym-opd-gpu-check-venv}
# pure-Python (py3-none-any) pins of the project and what they need beyond a torch + transformers stack;
# psutil (accelerate, peft) and faiss-cpu (LOPD's experience bank) are abi3 wheels that fit any CPython
# >= 3.10 on x86-64 Linux
PURE="gymnasium==1.4.0 cloudpickle==3.1.1 farama-notifications==0.0.4 peft==0.21.2 accelerate==1.16.0 gguf==0.19.0
      tqdm==4.67.1 setuptools==80.9.0"
ABI3="psutil==7.0.0 faiss-cpu==1.15.1"

if [ "${1:-}" = "--prepare" ]; then
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  $PY -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" $PURE
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d "$WHEELS" $ABI3
  du -sh "$WHEELS" && ls "$WHEELS"
  exit 0
fi
if [ ! -d "$WHEELS" ] || [ -z "$(ls "$WHEELS"/*.whl 2>/dev/null)" ]; then
  echo "no carried wheels in $WHEELS: run 'bash scripts/gpu_check.sh --prepare' on a machine with network first" >&2
  exit 2
fi

started=$SECONDS
$PY -c "import torch, transformers" || { echo "the GPU check needs a preinstalled torch and transformers" >&2; exit 2; }
rm -rf "$VENV"
if $PY -m venv --system-site-packages "$VENV" 2>/dev/null; then
  PIP=("$VENV/bin/python" -m pip)
else  # a Python without ensurepip (Debian's python3 without python3-venv): the machine's pip drives the venv
  rm -rf "$VENV"
  $PY -m venv --without-pip --system-site-packages "$VENV"
  PIP=($PY -m pip --python "$VENV/bin/python")
fi
# a python3 that is itself a venv (the GPU image's /opt/torch/.venv): --system-site-packages reaches only the
# base interpreter's packages, so a .pth file adds the parent venv's (after the venv's own: carried wheels win)
$PY -c "import site, sys; print('\n'.join(site.getsitepackages()) if sys.prefix != sys.base_prefix else '')" \
  > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_parent_venv.pth"
"${PIP[@]}" install -q --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl
# the project, --no-deps and offline; setuptools comes from the carried wheels (no build isolation needed)
"${PIP[@]}" install -q --no-index --no-deps --no-build-isolation -e .
rm -rf agentgym_opd.egg-info  # a metadata copy in the source tree would shadow the installed entry points
echo "[gpu_check] venv and install: $((SECONDS - started)) s"
# 8 minutes in all on the GPU: whatever the install took comes off the parts' share (the CPU dry run is
# slower by nature and gets 30 minutes)
budget=470
case " $* " in *" --cpu-dry-run "*) budget=1800 ;; esac
exec timeout --kill-after=10 $((budget - (SECONDS - started))) "$VENV/bin/python" scripts/gpu_check.py "$@"

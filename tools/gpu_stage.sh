#!/usr/bin/env bash
# Run the GPU check on an offline machine that has Python and a CUDA torch but not this project's packages.
#
# Usage, from the repository root, with wheelhouse/ (make wheelhouse PY=<its Python>) and build/tatoeba
# (make data) copied over:
#
#     OUT=/some/dir bash tools/gpu_stage.sh [further tools/gpu_check.py options]
#
# It makes a venv that sees the machine's own packages (torch first), installs every wheel of wheelhouse/
# (pip --no-index --no-deps; `make wheelhouse WHEEL_SKIP=...` leaves out what the machine already has, e.g. its
# numpy), onmt-ext (editable) and onmt-ext's start-up hook, then runs tools/gpu_check.py --out "$OUT"/gpu.  spaCy and
# fasttext are not in the wheelhouse; if `import onmt` still asked for them, one-line stand-in modules are put on
# PYTHONPATH for the check.  Variables: PYTHON (default python3), WHEELS (default wheelhouse), OUT (default
# results), STAGE (default build/gpu-stage: the venv and stand-ins).  Exit status: gpu_check.py's, or 2 when
# staging fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-wheelhouse}
OUT=${OUT:-results}
STAGE=${STAGE:-build/gpu-stage}
VENV=$STAGE/venv

fail() { echo "gpu_stage.sh: error: $*" >&2; exit 2; }

[ -d "$WHEELS" ] || fail "$WHEELS/ is missing (make wheelhouse PY=<this machine's Python version>)"
[ -f build/tatoeba/vocab.en ] || fail "build/tatoeba is missing (make data, then copy it here)"
"$PYTHON" -c "import torch" 2>/dev/null || fail "'import torch' fails with $PYTHON; install the machine's CUDA torch first"

mkdir -p "$STAGE"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV" 2>/dev/null ||
    "$PYTHON" -m venv --system-site-packages --without-pip "$VENV" ||
    fail "could not create a venv with $PYTHON"
fi
VPY=$VENV/bin/python
if "$VPY" -m pip --version >/dev/null 2>&1; then
  pip_install() { "$VPY" -m pip install -q --disable-pip-version-check --no-index --no-deps "$@"; }
else  # a venv without its own pip: the machine's pip installs into it
  pip_install() { "$PYTHON" -m pip --python "$VPY" install -q --disable-pip-version-check --no-index --no-deps "$@"; }
fi
"$VPY" -c "import torch" 2>/dev/null || fail "the venv $VENV does not see the machine's torch"

# every wheel of the wheelhouse (make wheelhouse WHEEL_SKIP=... leaves out what the machine has)
wheels=("$WHEELS"/*.whl)
[ -e "${wheels[0]}" ] || fail "$WHEELS/ holds no wheels"
echo "== gpu_stage: installing ${#wheels[@]} wheel(s) from $WHEELS into $VENV"
pip_install "${wheels[@]}" || fail "pip could not install the wheels of $WHEELS"
pip_install --no-build-isolation -e . || fail "pip could not install onmt-ext (editable)"
"$VPY" -m onmt_ext.hook install

# stand-ins for spaCy and fasttext, only if `import onmt` asks for them
STUBS=$STAGE/stand-ins
for attempt in 1 2 3; do
  missing_module=$({ "$VPY" -c "import onmt" 2>&1 || true; } | sed -n "s/^ModuleNotFoundError: No module named '\([a-z_]*\)'.*/\1/p" | head -n1)
  [ -z "$missing_module" ] && break
  case "$missing_module" in
    spacy|fasttext)
      mkdir -p "$STUBS"
      echo "\"\"\"Stand-in for $missing_module, which gpu_stage.sh does not install; unusable.\"\"\"" > "$STUBS/$missing_module.py"
      export PYTHONPATH="$PWD/$STUBS${PYTHONPATH:+:$PYTHONPATH}"
      echo "== gpu_stage: import onmt needs $missing_module: a stand-in module is on PYTHONPATH"
      ;;
    *) fail "import onmt needs $missing_module, which is not in $WHEELS" ;;
  esac
done
"$VPY" -c "import onmt, onmt_ext.plugin as p; assert p.is_active()" || fail "onmt-ext does not load in $VENV"

mkdir -p "$OUT"
exec "$VPY" tools/gpu_check.py --out "$OUT/gpu" "$@"

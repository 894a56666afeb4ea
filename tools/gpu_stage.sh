#!/usr/bin/env bash
# Run the GPU check on an offline machine that has Python and a CUDA torch but not this project's packages.
#
# Usage, from the repository root, with wheelhouse/ and build/tatoeba copied over (docs/install.md, "Running
# the GPU check on a bare offline machine", says how to make both small):
#
#     OUT=/some/dir bash tools/gpu_stage.sh [further python -m tools.gpu_check options]
#     bash tools/gpu_stage.sh --stage-only     (or GPU_STAGE_ONLY=1): stage, then stop before the check
#     bash tools/gpu_stage.sh --help           this text
#
# tools/stage_venv.py makes a venv that sees the machine's own packages, with the torch of $PYTHON: when that
# Python is itself a venv (as on many GPU machines), that venv's site-packages are added through a .pth file;
# a conda environment's are seen as they are.  It says which torch (version, path) the venv uses.  Then every
# wheel of wheelhouse/ is installed (pip --no-index --no-deps; `make wheelhouse WHEEL_HAVE=<list>` leaves out
# what the machine already has), onmt-ext (editable) and onmt-ext's start-up hook.  build/tatoeba/
# signal_tagger.zh.pt need not be copied: the checked configs use the rule splitter, and if it is missing it
# is trained here from build/tatoeba/train.zh (a few seconds, as `make data` does) when the check runs section
# a (--part props or all), since the test suite's data check asks for it.  spaCy and fasttext are not in the
# wheelhouse; if `import onmt` still asked for them, one-line stand-in modules are put on PYTHONPATH for the
# check.  Last, python -m tools.gpu_check --out "$OUT"/gpu runs; with GPU_STAGE_PACK=1 its operator tables and
# work logs are also packed into one file,
# "$OUT"/gpu-check-files.tgz (its --pack, for machines that hand back few files).  Variables: PYTHON (default python3),
# WHEELS (default wheelhouse), OUT (default results), STAGE (default build/gpu-stage: the venv and stand-ins),
# GPU_STAGE_ONLY, GPU_STAGE_PACK.  Exit status: gpu_check.py's, or 2 when staging fails (one line,
# "gpu_stage.sh: error: ...").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-wheelhouse}
OUT=${OUT:-results}
STAGE=${STAGE:-build/gpu-stage}
VENV=$STAGE/venv
TAGGER=build/tatoeba/signal_tagger.zh.pt

fail() { echo "gpu_stage.sh: error: $*" >&2; exit 2; }

case "${1:-}" in
  -h|--help) sed -n '2,/^set -/{/^set -/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
  --stage-only) GPU_STAGE_ONLY=1; shift ;;
esac

[ -d "$WHEELS" ] || fail "$WHEELS/ is missing (make wheelhouse PY=<this machine's Python version>)"
[ -f build/tatoeba/vocab.en ] || fail "build/tatoeba is missing (make data, then copy it here)"
command -v "$PYTHON" >/dev/null || fail "PYTHON=$PYTHON is not a command"

mkdir -p "$STAGE"
"$PYTHON" -m tools.stage_venv --prog gpu_stage.sh --var STAGE --allow-without-pip "$VENV" || exit 2
VPY=$VENV/bin/python
if "$VPY" -m pip --version >/dev/null 2>&1; then
  pip_install() { "$VPY" -m pip install -q --disable-pip-version-check --no-index --no-deps "$@"; }
else  # a venv without its own pip: the machine's pip installs into it
  pip_install() { "$PYTHON" -m pip --python "$VPY" install -q --disable-pip-version-check --no-index --no-deps "$@"; }
fi

# every wheel of the wheelhouse (make wheelhouse WHEEL_HAVE=<list> leaves out what the machine has)
wheels=("$WHEELS"/*.whl)
[ -e "${wheels[0]}" ] || fail "$WHEELS/ holds no wheels"
echo "== gpu_stage: installing ${#wheels[@]} wheel(s) from $WHEELS into $VENV"
pip_install "${wheels[@]}" || fail "pip could not install the wheels of $WHEELS"
pip_install --no-build-isolation -e . || fail "pip could not install onmt-ext (editable)"
"$VPY" -m onmt_ext.hook install

# stand-ins for spaCy and fasttext, only if `import onmt` asks for them; asked of stock OpenNMT-py
# (ONMT_EXT_DISABLE=1), which imports every transform's package, for the check's stock control row
STUBS=$STAGE/stand-ins
case "$STUBS" in /*) ;; *) STUBS=$PWD/$STUBS ;; esac
for attempt in 1 2 3; do
  missing_module=$({ ONMT_EXT_DISABLE=1 "$VPY" -c "import onmt" 2>&1 || true; } | sed -n "s/^ModuleNotFoundError: No module named '\([a-z_]*\)'.*/\1/p" | head -n1)
  [ -z "$missing_module" ] && break
  case "$missing_module" in
    spacy|fasttext)
      mkdir -p "$STUBS"
      echo "\"\"\"Stand-in for $missing_module, which gpu_stage.sh does not install; unusable.\"\"\"" > "$STUBS/$missing_module.py"
      export PYTHONPATH="$STUBS${PYTHONPATH:+:$PYTHONPATH}"
      echo "== gpu_stage: import onmt needs $missing_module: a stand-in module is on PYTHONPATH"
      ;;
    *) fail "import onmt needs $missing_module, which is not in $WHEELS" ;;
  esac
done
"$VPY" -c "import onmt, onmt_ext.integration.plugin as p; assert p.is_active()" || fail "onmt-ext does not load in $VENV"

needs_tagger() {  # whether the check runs section a, whose test suite's data check asks for the tagger
  local part=all sections=abc previous=
  for arg in "$@"; do
    case "$previous" in --part) part=$arg ;; --sections) sections=$arg ;; esac
    case "$arg" in --part=*) part=${arg#--part=} ;; --sections=*) sections=${arg#--sections=} ;; esac
    previous=$arg
  done
  [ "$part" = props ] || { [ "$part" = all ] && [[ "$sections" == *a* ]]; }
}

if [ ! -f "$TAGGER" ] && ! needs_tagger "$@"; then
  echo "== gpu_stage: $TAGGER was not copied, and this part does not need it (only section a's tests read it)"
elif [ ! -f "$TAGGER" ]; then  # not copied: the same command as `make data`
  echo "== gpu_stage: training $TAGGER from build/tatoeba/train.zh (it was not copied)"
  "$VPY" -m tools.train_signal_tagger --lang zh --input build/tatoeba/train.zh --output "$TAGGER" \
    >"$STAGE/tagger.log" 2>&1 ||
    fail "could not train $TAGGER ($(tail -n1 "$STAGE/tagger.log"); log: $STAGE/tagger.log)"
fi

echo "== gpu_stage: staged in ${SECONDS} s"
if [ -n "${GPU_STAGE_ONLY:-}" ]; then
  echo "== gpu_stage: staged in $VENV; the check would run: $VPY -m tools.gpu_check --out $OUT/gpu${*:+ $*}"
  exit 0
fi
mkdir -p "$OUT"
pack=()
[ -n "${GPU_STAGE_PACK:-}" ] && pack=(--pack "$OUT/gpu-check-files.tgz")
exec "$VPY" -m tools.gpu_check --out "$OUT/gpu" ${pack[@]+"${pack[@]}"} "$@"

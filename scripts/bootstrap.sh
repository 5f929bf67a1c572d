#!/usr/bin/env bash
# Set up .venv for this checkout: once, and again only when the dependency files change.
#   scripts/bootstrap.sh [EXTRAS]     e.g. scripts/bootstrap.sh bench,test
# torch: a torch already importable by $PYTHON (e.g. your CUDA build) is kept and shared into the venv;
# otherwise torch==2.13.0 is installed (never an open range, which could pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-bench,test}

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "bootstrap: Python >= 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 2
}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c 'import torch' 2>/dev/null; then
    echo "bootstrap: reusing the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
stamp=".venv/.installed-$(cat pyproject.toml setup.py 2>/dev/null | sha256sum | cut -c1-16)-${EXTRAS//,/_}"
if [ ! -f "$stamp" ]; then
  log=.venv/install.log
  if ! .venv/bin/pip install --quiet -e ".[${EXTRAS}]" >"$log" 2>&1; then
    grep -v "WARNING: Location" "$log" | tail -40 >&2
    echo "bootstrap: installing the project failed (full log: $log)" >&2
    exit 1
  fi
  # from outside the checkout, so this proves the install, not the source tree on sys.path
  (cd / && "$OLDPWD/.venv/bin/python" -c 'import superoffload.cli.main, grace_adam, baselines') || {
    echo "bootstrap: the installed packages do not import" >&2; exit 1; }
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The project's bytecode, written now: where PYTHONDONTWRITEBYTECODE is set (CI images, some sandboxes) no
# run writes it, and every process (a test's subprocess, a rank, a Snakemake job) compiles the modules it
# imports again, ~0.25 s of each start on a 2-core machine. A .pyc whose source changed since is not used.
.venv/bin/python -m compileall -q -j 0 superoffload baselines grace_adam reports workflows/scripts tests >/dev/null || true

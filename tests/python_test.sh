#!/usr/bin/env bash
# Runs the Python package's pytest suite (tests/python) on the package the CMake build assembled
# (BUILD/python), with numpy and pytest from PyPI in a throw-away virtual environment in the build
# tree (made once, reused), beside the CLI of the same build.
#   python_test.sh BUILD_DIR SQUEEZEKV_BINARY VENV_DIR [pytest args]
set -euo pipefail
build="$(cd "$1" && pwd)"; bin="$(realpath "$2")"; venv="$3"; shift 3
here="$(cd "$(dirname "$0")" && pwd)"
if ! "$venv/bin/python" -c "import numpy, pytest" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "numpy>=1.22,<3" "pytest>=7,<9"
fi
export PYTHONPATH="$build/python" SQUEEZEKV_CLI="$bin"
export SQUEEZEKV_MODEL="${SQUEEZEKV_MODEL:-$here/../models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export SQUEEZEKV_TEST_SHARED="${SQUEEZEKV_TEST_SHARED:-$here/../../shared}"
cd "$here/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .

#!/usr/bin/env bash
# The Python package as a user installs it: `pip install SRC` into a fresh virtual environment
# (scikit-build-core and pybind11 from PyPI build the engine into the wheel), then, from another
# folder, the README's one-liner prints what `squeezekv generate` prints for the same prompt.
#   pip_install_test.sh SRC SQUEEZEKV_BINARY
set -euo pipefail
src="$1"; bin="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
export SQUEEZEKV_MODEL="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
python3 -m venv "$tmp/venv"
t0=$(date +%s)
"$tmp/venv/bin/pip" install -q --disable-pip-version-check "$src" > "$tmp/pip.log" 2>&1 || { tail -30 "$tmp/pip.log"; echo "0 passed, 1 failed"; exit 1; }
echo "pip install: $(( $(date +%s) - t0 )) s"
cd "$tmp"
got="$("$tmp/venv/bin/python" -c "import squeezekv; print(squeezekv.load(threads=2).generate('The capital of France is', max_tokens=8, temperature=0).text)")"
want="$("$bin" generate -t 2 -p "The capital of France is" -n 8 --temp 0 2>/dev/null)"
echo "python: The capital of France is$got"
echo "cli:    $want"
# the wheel carries the library: nothing of the build tree is loaded
"$tmp/venv/bin/python" -c "import squeezekv, pathlib; p = pathlib.Path(squeezekv.__file__).parent; assert (p / 'libsqueezekv.so').exists(), list(p.iterdir()); assert (p / 'py.typed').exists()"
[ "The capital of France is$got" = "$want" ] && echo "1 passed, 0 failed" || { echo "0 passed, 1 failed"; exit 1; }

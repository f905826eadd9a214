#!/usr/bin/env bash
# Create .venv and install qace with its test extras. Idempotent: re-running only updates.
# torch: a torch already in .venv is kept (install your CUDA build first if you want one); otherwise
# torch==2.13.0 is installed, which on machines with a local CPU wheel takes that wheel.
# --no-compile, then compileall on every core: pip byte-compiles one file after another (about 100 s of
# the install on a 2-core host, against 55 s this way). The bytecode must be there before the tests: where
# PYTHONDONTWRITEBYTECODE is set, every process would compile what it imports anew.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q --no-compile torch==2.13.0
.venv/bin/python -m pip install -q --no-compile -e '.[test]'
# OpenRLHF's reward clients, tested as they ship (tests/serve/test_openrlhf_clients.py): without their
# dependencies (deepspeed, vLLM, flash-attn), each release in its own folder
for v in 0.11.2 0.8.11; do
  [ -d ".venv/openrlhf/$v/openrlhf" ] || .venv/bin/python -m pip install -q --no-compile --no-deps --target ".venv/openrlhf/$v" "openrlhf==$v"
done
# qace, its benchmarks and tests too (each test process imports them). Files that do not compile on this
# Python (torch's 3.12-only test helpers) stay as they are, as pip leaves them.
.venv/bin/python -m compileall -q -j 0 .venv/lib .venv/openrlhf qace benchmarks tests > /dev/null || true
echo "qace installed in .venv"

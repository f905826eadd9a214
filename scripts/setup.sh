#!/usr/bin/env bash
# Create .venv and install qace with its test extras. Idempotent: re-running only updates.
# torch: a torch already in .venv is kept (install your CUDA build first if you want one); otherwise
# torch==2.13.0 is installed, which on machines with a local CPU wheel takes that wheel.
# --no-compile: pip byte-compiles nothing at install (two thirds of the install's time on a 2-core host);
# Python compiles each module when first imported and keeps that.
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
echo "qace installed in .venv"

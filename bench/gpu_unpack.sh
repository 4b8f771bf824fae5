#!/bin/bash
# On the GPU machine: the parts from bench/gpu_pack.sh, gathered in /tmp/m, -> MiniLM in /tmp/pk, data in /tmp/data.
set -euo pipefail
mkdir -p /tmp/u /tmp/pk /tmp/data
cat /tmp/m/part-* | tar -x -C /tmp/u
tar -xf /tmp/u/minilm.tar -C /tmp/pk
tar -xJf /tmp/u/data.tar.xz -C /tmp/data
if [ -d /tmp/u/wheels ]; then  # optuna and its needs (WHEELS=1): import them with PYTHONPATH=/tmp/pk:/tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/u/wheels/*.whl
fi
echo "unpacked: $(du -sh /tmp/pk | cut -f1) MiniLM, $(ls /tmp/data | tr '\n' ' ')"

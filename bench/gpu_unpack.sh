#!/bin/bash
# On the GPU machine: the parts from bench/gpu_pack.sh, gathered in /tmp/m, -> MiniLM in /tmp/pk, data in /tmp/data.
set -euo pipefail
mkdir -p /tmp/u /tmp/pk /tmp/data
cat /tmp/m/part-* | tar -x -C /tmp/u
tar -xf /tmp/u/minilm.tar -C /tmp/pk
tar -xJf /tmp/u/data.tar.xz -C /tmp/data
echo "unpacked: $(du -sh /tmp/pk | cut -f1) MiniLM, $(ls /tmp/data | tr '\n' ' ')"

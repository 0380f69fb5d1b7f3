#!/usr/bin/env bash
# Makes the peer venv (.venv-peers) for benchmarks/bench_peers.py: CPU-only torch, fbgemm-gpu-cpu
# and torchrec, pinned in benchmarks/requirements-peers.txt. Idempotent: does nothing when the
# venv's stamp matches the requirements file; otherwise remakes the venv from scratch.
#
#   bash benchmarks/setup_peers.sh        # PEERS_VENV=DIR to put the venv elsewhere
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQS="$ROOT/benchmarks/requirements-peers.txt"
VENV="${PEERS_VENV:-$ROOT/.venv-peers}"
STAMP="$VENV/.requirements-peers.sha256"
PYTHON="${PYTHON:-python3}"

fail() { echo "setup_peers.sh: $*" >&2; exit 1; }

want="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup_peers.sh: $VENV is up to date"
  exit 0
fi

version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  || fail "cannot run $PYTHON"
[[ "$version" == "3.11" ]] || fail "needs Python 3.11 (the CPU torch wheel is cp311), got $version"

start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" || fail "python -m venv $VENV failed"
"$VENV/bin/pip" install --no-deps --find-links /opt/wheels -r "$REQS" \
  || fail "pip install failed. torch==2.13.0+cpu comes from /opt/wheels (this kind of machine's
disk); PyPI has no CPU-only torch for Linux x86_64 (see $REQS)"

"$VENV/bin/python" - <<'EOF' || fail "the peer venv does not import (see above)"
import importlib.metadata as md
import torch
import torchrec.modules.embedding_configs  # noqa: F401
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
    SplitTableBatchedEmbeddingBagsCodegen)
assert torch.version.cuda is None, "torch is a CUDA build: %s" % torch.__version__
nvidia = [d.metadata["Name"] for d in md.distributions()
          if d.metadata["Name"].lower().startswith("nvidia")]
assert not nvidia, "nvidia packages in the venv: %s" % nvidia
print("peer venv: torch %s, torchrec and fbgemm_gpu import" % torch.__version__)
EOF

echo "$want" > "$STAMP"
echo "setup_peers.sh: made $VENV in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1)"

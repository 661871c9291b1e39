#!/usr/bin/env bash
# Install scalelab (editable) and its dependencies without ever pulling a multi-GB CUDA torch onto
# a CPU-only machine.
#   bash scripts/install.sh          # runtime dependencies
#   bash scripts/install.sh dev      # plus test/lint tools, transformers (HF parity), lm-eval (the
#                                    # adapter's test), triton, boto3 + moto's S3 server (s3:// stores), and
#                                    # (as root, with apt-get) Chromium for the report's browser test
# Torch: kept if already importable; on a GPU machine (nvidia-smi present) the default PyPI build;
# otherwise the CPU build of torch 2.13.0 (a local wheel where the machine has one, else PyTorch's
# CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip"
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install "torch>=2.6"
  else
    if $PIP install --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1; then
      $PIP install "torch==2.13.0"  # the local CPU wheel is in place; this adds its dependencies
    else
      $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
extras=""
if [ "${1:-}" = "dev" ]; then
  extras="[dev,triton,s3]"  # s3: boto3 for s3:// stores; dev brings moto's S3 server for their tests
  # tests/test_report.py renders the HTML report in headless Chromium; under CI=true it fails
  # when /usr/bin/chromium is missing, so CI installs it here.
  if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
  fi
fi
$PIP install -q -e ".${extras}"

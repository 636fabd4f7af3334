#!/usr/bin/env bash
# The development environment that writes the real-library fixtures
# (tools/export_real_fixtures.py) and runs the XLA comparison
# (tools/xla_plan_check.py): shardplan plus the pinned jax, flax, optax and
# HF transformers (the last release with Flax models) in .venv-dev.
# CI does not need it: the generated files are committed.
#
#     tools/dev_env.sh && .venv-dev/bin/python tools/export_real_fixtures.py
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-dev
.venv-dev/bin/pip install -q --upgrade pip
.venv-dev/bin/pip install -q -e '.[test]' jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 transformers==4.57.6
.venv-dev/bin/python -c "import jax, flax, optax, transformers; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'transformers', transformers.__version__)"

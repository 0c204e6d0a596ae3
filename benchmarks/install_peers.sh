#!/usr/bin/env bash
# Install the peer libraries the benchmarks compare against into the project's virtualenv,
# without replacing its torch or transformers: several peers pin other torch releases, and a
# plain `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
PY=${PY:-.venv/bin/python}
pins=$(mktemp)
"$PY" -c "import numpy, torch, transformers
print(f'torch=={torch.__version__}\ntransformers=={transformers.__version__}')
print(f'numpy=={numpy.__version__}')" > "$pins"
"$PY" -m pip install -q -c "$pins" nnsight "transformer-lens<4" sae-lens eai-sparsify pydmd \
    psutil scikit-learn numba
# pykoopman pins torch~=2.1 and imports pkg_resources; the EDMDc path runs on any torch.
"$PY" -m pip install -q -c "$pins" --no-deps pykoopman optht derivative lightning \
    lightning-utilities torchmetrics "setuptools<81"
# anatome and torch-cka declare torchvision, which their CKA/CCA code does not use.
"$PY" -m pip install -q --no-deps ultimate-anatome torch-cka
rm -f "$pins"

#!/usr/bin/env bash
# Issue 17: rerun every benchmark touched by the performance work, in one go, on an IDLE
# machine (about 37 minutes on 2 cores). Each run prints the load average and records it in
# its results.json; check it before reading the ratios.
#   bash benchmarks/run_issue17.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
step() { echo; echo "== $1  ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"; }
step "koopman: EDMDc statistics vs pykoopman and the GEMM bound (~3 min)"
"$PY" benchmarks/koopman/run.py --repeats 2
step "koopman: the statistics pass in row lanes, on one lane, on one core (~1.5 min)"
"$PY" benchmarks/koopman/run.py --lanes --repeats 10
step "jacobian: exact E[JᵀJ] vs a per-direction backward loop (~1.5 min)"
"$PY" benchmarks/jacobian/run.py
step "similarity: CKA/SVCCA at n = 100k vs anatome and torch-cka, best of 3 (~10 min)"
"$PY" benchmarks/similarity/run.py --headline --repeats 3
step "capture: 150 sites vs a bare forward, TransformerLens and nnsight (~3 min)"
"$PY" benchmarks/capture/run.py --prompts 16 --repeats 3
step "scale: Ray start-up vs steady state, 1 and 2 workers (~6 min)"
"$PY" benchmarks/scale/run.py --windows 16 --repeats 2
step "sae: CPU training throughput vs sparsify and SAELens (~4 min)"
"$PY" benchmarks/sae/run.py --repeats 3 --settings '{"steps": 16}'
step "done"

"""Calibration of structlens's decision rules and intervals on planted structure.

Each calibration generates instances whose answer is known, runs them through the production
stages (the same functions ``structlens analyze`` and the replications call) and records how
often a rule says yes and how often a nominal 95% interval covers the truth.  ``python -m
structlens.calibration`` (or ``structlens calibrate``) writes ``docs/calibration.md`` and
``docs/calibration.json``.
"""

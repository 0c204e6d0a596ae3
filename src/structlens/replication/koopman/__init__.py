"""Replication of the Koopman spectral-identifiability claims on SmolLM2."""

"""Replication of the causal-dimensionality claims (Sarkar & Deka) on SmolLM2."""

"""Replication of the NDM paper's claims (Huang & Hahn) on SmolLM2."""

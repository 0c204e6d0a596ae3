"""Replication of the interpretive-equivalence scenario table (Sun & Toneva)."""

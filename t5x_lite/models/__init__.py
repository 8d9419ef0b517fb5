"""Flax linen model families and their losses."""

"""Decompositions (see rules_elementwise)."""

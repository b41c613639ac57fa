"""Verdicts over recorded runs: compare, parity, freeze and cards, golden values, the one notion of "best"."""

"""Quantization: statistics -> ranges -> the integer model, its golden interpreter and QDQ export.

Kept free of heavy imports so BUILD validation can read METHODS.
"""

METHODS = ("minmax", "percentile", "kl", "mse")

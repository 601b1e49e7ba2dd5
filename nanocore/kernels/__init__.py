"""Triton kernels, each beside its torch reference."""

"""Triton kernels of fp4cli, installed as `fp4cli.kernels`.

Rule for everything here: each kernel has a pure-PyTorch reference in `fp4cli.quant` (the
definition of correct) and is tested bit-exact against it, under TRITON_INTERPRET=1 in CI.
"""

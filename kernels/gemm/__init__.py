"""The GEMM kernels, installed as `fp4cli.kernels.gemm`: MXFP4 in exact tiers on INT8 / FP8
tensor cores (`launch` drives `prep`, `int8`, `fp8`, `window`, `scaled`), and NVFP4 (`nvfp4_launch`
drives `nvfp4`, `nvfp4_decoded`). Their references and contracts are in `fp4cli.gemm`.
"""

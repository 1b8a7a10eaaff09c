"""The quantize, pair and dequantize kernels and their launchers (`launch`, `launch_pair`,
`launch_amax`)."""

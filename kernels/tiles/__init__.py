"""Device functions on one register tile, shared by the quantize kernels: elements, Philox,
the SR pre-scale, two-level scales, four-over-six, MS-EDEN, loads and stores."""

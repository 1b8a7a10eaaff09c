"""Analysis of what the run store holds: reports, oscillation, quantization error, plots."""

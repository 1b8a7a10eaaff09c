"""Wang et al.'s vector-wise kernels: row, column and tensor scales, the outlier clamp's order
statistics, DGE's factor."""

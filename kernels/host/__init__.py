"""The launchers' shared host side: `launch`, seeds, tile arithmetic and the constexprs a
QuantSpec gives the kernels (`spec_constants`)."""

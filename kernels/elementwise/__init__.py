"""Elementwise passes of the quantized Linear: its gradients' casts and Q-EMA's update."""

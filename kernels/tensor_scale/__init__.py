"""Two-level scaling's tensor amax passes and encode tables."""

"""Device code: one module per kernel variant, plus the helpers they share."""

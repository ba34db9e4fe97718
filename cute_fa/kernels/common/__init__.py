"""The device pieces every kernel shares: per-thread MMA state, GEMM loops, the online softmax,
masks, tile loads, epilogues and launch options."""

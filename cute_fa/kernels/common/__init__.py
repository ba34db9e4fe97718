"""The device pieces every kernel shares: per-thread MMA state, GEMM loops, the online softmax,
masks, tile loads, epilogues, bulk reductions and launch options."""

"""The backward's kernels: D = rowsum(dO * O) (`preprocess`), dK, dV and dQ's float32 sums
(`sm80`), dQ converted (`postprocess`)."""

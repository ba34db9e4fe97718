"""Compiling kernels: keys (`keys`), the registry of kernel families and their arguments
(`registry`), fake arguments (`fake`), `cute.compile` (`build`), the memory and disk cache
(`cache`, named by `fingerprint`) and ptxas resource counts (`ptxas`). Nothing here imports torch;
the DSL is imported only to compile."""

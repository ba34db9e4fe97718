"""Device code. `common/`: the pieces every kernel shares (MMA state per thread, the GEMM loops,
the online softmax, masks, loads, epilogues, launch options); `sched/`: the work decomposition
(tile scheduler, one entry's lengths and rows, the key blocks a query block visits); `fwd/`: the
forward kernels over one skeleton (`fwd/base.py`) and the split-KV merge; `bwd/`: the backward's
three kernels; `tile_probe.py`: the one-tile probe the introspection checks itself against;
`mod_probe.py`: a traced attention mod's device code (`common/mods.py`) at given elements."""

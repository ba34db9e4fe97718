"""Launch options shared by every kernel."""


def occupancy_options(ctas_per_sm: int) -> dict:
    """`.launch` keywords that make ptxas fit `ctas_per_sm` CTAs in an SM's register file
    (.minnctapersm); none for 0.

    The shared-memory carveout is given as the largest (100%) because the DSL otherwise
    asks the GPU for its shared memory per SM while compiling, and kernels are compiled on
    machines without one. These kernels keep their operands in shared memory and use L1
    only for the few values ptxas spills, so the smaller L1 costs them nothing."""
    if ctas_per_sm <= 0:
        return {}
    return {"min_blocks_per_mp": ctas_per_sm, "preferred_smem_carveout": 100}

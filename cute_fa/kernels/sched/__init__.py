"""The work decomposition: which tile a CTA computes (`tile_scheduler`), one batch entry's lengths
and rows (`seqlen`), and which key blocks a query block visits (`block_info`)."""

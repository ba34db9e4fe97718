"""The forward kernels: the skeleton every variant shares (`base`), the cp.async kernel with
decode (`sm80`), the TMA kernel (`tma`), the warp-specialized Hopper kernel (`sm90`) and the
merge of split-KV partials (`merge`)."""

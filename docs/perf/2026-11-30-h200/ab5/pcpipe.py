import dataclasses
from cute_fa import compiler, tuning
from cute_fa.kernels import fwd_tma
orig = fwd_tma.FlashFwdTma.__init__
def init(self, *a, **k):
    orig(self, *a, **k); self.pipelined = True
fwd_tma.FlashFwdTma.__init__ = init
for dt in ("bfloat16", "float16"):
    for c in (False, True):
        key = dataclasses.replace(tuning.kernel_key("sm_90a", dt, 64, c, "tma", lazy_rescale=False), ctas_per_sm=0)
        compiler.get_kernel(key); print(key.tile.block_m, key.kv_stages, c, flush=True)
compiler.wait_for_saves()

"""One forward call per kernel profiled in docs/perf/README.md (bf16, S=8k, 16k tokens,
hidden 2048), for Nsight Compute on the H200:

sections-87de26f.txt:
    ncu -k 'regex:kernel_cutlass|flash_fwd' --section WarpStateStats --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section Occupancy --metrics \
        sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
        sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,\
        smsp__issue_active.avg.pct_of_peak_sustained_active,\
        l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,\
        launch__registers_per_thread,... python profile.py
stalls-*.txt:
    ncu -k 'regex:kernel_cutlass|flash_fwd' --metrics \
        'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',\
        launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,... \
        python profile.py
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import cute_fa

S = 8192
for backend, head_dim, causal in [("sm80", 64, False), ("sdpa_flash", 64, False),
                                  ("sm80", 64, True), ("tma", 64, False), ("sm80", 128, False),
                                  ("tma", 128, False), ("sdpa_flash", 128, False)]:
    B, H = 16384 // S, 2048 // head_dim
    q, k, v = (torch.randn(B, S, H, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    if backend == "sdpa_flash":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    else:
        cute_fa.forward(q, k, v, causal=causal, backend=backend)
    torch.cuda.synchronize()
    print("ran", backend, head_dim, causal, flush=True)

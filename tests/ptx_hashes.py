"""The PTX of a fixed set of kernels, for checking that a refactor did not change generated code:
run `dump` before and after it, then `compare` (the CPU compiles; no GPU needed).

    python tests/ptx_hashes.py [WORKERS]                   sha256 of each kernel's PTX
    python tests/ptx_hashes.py dump DIR [WORKERS]          each kernel's PTX, a file per kernel
    python tests/ptx_hashes.py compare OLD_DIR NEW_DIR     kernel by kernel: identical or not

The kernels are those of tests/test_compile_forward.py (the sm80 kernel on sm_80, sm_90a and
sm_120a and the TMA kernel on sm_90a and sm_120a, for every head_dim class, dtype and
causality of the tile tables, plus the padded and eager cases), the wgmma kernel's shipped
configurations on sm_90a (tests/test_compile_sm90.py), the backward's kernels of
tests/test_compile_bwd.py, then a sample of feature and decode kernels (windows, softcap,
ragged batches, small-grid tiles, the persistent TMA kernel and wgmma backward, the wgmma
long-call tile, GQA packing in decode and in the wgmma prefill, paged caches (pages looked up
at issue and a round ahead), seqused_k caches, split-KV in two launches and in one, the merge,
the deterministic and ragged backward). A kernel's file is named by its key's fields, which a
move of its class does not change; its symbol is replaced, since it spells the kernel class's
module path and argument types.

`compare` also accepts, as the same code, a kernel whose new PTX lacks one parameter that the
old PTX declared and never read (an argument its key does not use, no longer passed).
"""

import dataclasses
import hashlib
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# the cute_fa of the checkout this file is in, not whichever one an editable install names:
# `dump` in a second worktree (the tree before a change) must compile that tree's kernels
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cute_fa.compile.build import compile_kernel  # noqa: E402
from cute_fa.compile.keys import MergeKey  # noqa: E402
from cute_fa.tuning import decode_key, kernel_key, tma_persistent  # noqa: E402
from cute_fa.tuning_bwd import bwd_keys  # noqa: E402
from test_compile_bwd import PLAIN as BWD_PLAIN  # noqa: E402
from test_compile_forward import ARCHS, CASES, TMA_CASES  # noqa: E402
from test_compile_sm90 import PLAIN  # noqa: E402


def _feature_keys() -> list:
    out = []
    for arch in ("sm_90a", "sm_80"):
        for d, causal, (local, softcap, varlen) in [
                (128, True, (True, False, False)), (64, False, (False, True, False)),
                (128, False, (False, False, True)), (128, True, (True, True, True)),
                (256, True, (False, True, False))]:
            for backend in ("sm80", "tma", "sm90") if arch == "sm_90a" else ("sm80",):
                out.append(kernel_key(arch, "bfloat16", d, causal, backend, local=local,
                                      softcap=softcap, varlen=varlen))
    out.append(kernel_key("sm_90a", "bfloat16", 128, True, "auto", small_grid=True,
                          seqlen_q=512))
    out.append(kernel_key("sm_90a", "bfloat16", 64, True, "auto", seqlen_q=1))
    out.append(kernel_key("sm_90a", "bfloat16", 64, True, "auto", seqlen_q=4096))  # long tile
    for arch, d, causal in [("sm_90a", 128, True), ("sm_90a", 64, False),
                            ("sm_120a", 128, False)]:  # the persistent TMA kernel
        out.append(tma_persistent(kernel_key(arch, "bfloat16", d, causal, "tma"), 264))
    for d, causal, seqlen_q, group in [(64, True, 1000, 4), (64, False, 1000, 8),
                                       (64, True, 3000, 8), (128, True, 1000, 4)]:  # packed GQA
        out.append(kernel_key("sm_90a", "bfloat16", d, causal, "sm90", seqlen_q=seqlen_q,
                              pack_gqa=group))
    for arch in ("sm_90a", "sm_80"):
        for d, sq, group, page, seqused, split, local, softcap, vq, vk in [
                (128, 1, 4, 0, False, False, False, False, False, False),
                (128, 1, 4, 0, True, True, False, False, False, False),
                (128, 4, 8, 64, True, True, False, False, False, False),
                (64, 1, 8, 256, True, False, True, True, False, False),
                (128, 16, 4, 0, True, False, False, False, False, False),
                (128, 17, 1, 64, True, False, False, False, True, False),
                (128, 17, 1, 0, True, False, False, False, True, True),
                (256, 2, 2, 0, False, True, False, True, False, False)]:
            out.append(decode_key(arch, "bfloat16", d, True, seqlen_q=sq, group=group,
                                  page_size=page, seqused_k=seqused, split_kv=split,
                                  local=local, softcap=softcap, varlen_q=vq, varlen_k=vk))
        out.append(dataclasses.replace(decode_key(  # split-KV in one launch
            arch, "bfloat16", 128, True, seqlen_q=1, group=4, page_size=64, seqused_k=True,
            split_kv=True), fused_merge=True))
        for d, sq, group, page in [(128, 4, 8, 64), (64, 1, 8, 16)]:  # pages a round ahead
            out.append(dataclasses.replace(decode_key(
                arch, "bfloat16", d, True, seqlen_q=sq, group=group, page_size=page,
                seqused_k=True, split_kv=True), page_prefetch=True))
        out.append(MergeKey(arch, 128, "float32", "bfloat16"))
        out.append(MergeKey(arch, 64, "bfloat16", "bfloat16"))
        for d, causal, local, softcap, varlen, det in [
                (128, True, False, False, False, True), (64, False, True, True, False, False),
                (128, True, False, False, True, True), (128, False, True, True, True, False)]:
            out += bwd_keys(arch, "bfloat16", d, causal, local=local, softcap=softcap,
                            varlen=varlen, deterministic=det)
    for d, causal in [(64, True), (128, False), (256, True)]:  # the persistent wgmma backward
        out.append(dataclasses.replace(bwd_keys("sm_90a", "bfloat16", d, causal)[1],
                                       persistent=132))
    return out


def keys() -> list:
    """Every kernel checked, each once, in a fixed order."""
    out = [kernel_key(arch, dtype, head_dim, causal, "sm80")
           for arch in ARCHS for head_dim, causal, dtype in CASES]
    out += [kernel_key(arch, dtype, head_dim, causal, "tma", lazy_rescale=lazy)
            for arch, head_dim, causal, dtype, lazy in TMA_CASES]
    out += [kernel_key("sm_90a", dtype, head_dim, causal, "sm90")
            for head_dim, dtype, causal in PLAIN]
    out += [key for arch, head_dim, dtype, causal in BWD_PLAIN
            for key in bwd_keys(arch, dtype, head_dim, causal)]
    return list(dict.fromkeys(out + _feature_keys()))


def describe(key) -> str:
    """The key's backend and its fields, those at their default value left out: the same
    across a move of the kernel's class, and across a new key field whose default keeps the
    old kernels (so `compare` pairs a dump from before such a field with one from after)."""
    fields = {f.name: getattr(key, f.name) for f in dataclasses.fields(key)
              if f.default is dataclasses.MISSING or getattr(key, f.name) != f.default}
    return key.backend + " " + repr(sorted((k, repr(v)) for k, v in fields.items()))


def ptx(key) -> str:
    """The key's PTX with the kernel's symbol replaced by KERNEL."""
    text = compile_kernel(key, keep_ptx=True).__ptx__
    for name in set(re.findall(r"\.entry\s+([A-Za-z0-9_$]+)", text)):
        text = text.replace(name, "KERNEL")
    return text


def _file_name(key) -> str:
    return hashlib.sha256(describe(key).encode()).hexdigest()[:20] + ".ptx"


def _dump(args) -> str:
    key, folder = args
    Path(folder, _file_name(key)).write_text(describe(key) + "\n" + ptx(key))
    return _file_name(key)


def ptx_hash(key) -> str:
    return hashlib.sha256(ptx(key).encode()).hexdigest()[:16]


_PARAM = re.compile(r"^\s*\.param (\.\S+(?: \.\S+)*) KERNEL_param_(\d+)")


def _same_but_one_unread_param(old: list, new: list) -> bool:
    """new is old without one declared parameter that old never reads, the later parameters
    renumbered down by one."""
    declared = [(m.group(1), int(m.group(2))) for line in old if (m := _PARAM.match(line))]
    kept = [m.group(1) for line in new if (m := _PARAM.match(line))]
    for i, (_, number) in enumerate(declared):
        if [t for j, (t, _) in enumerate(declared) if j != i] != kept:
            continue
        if any(f"[KERNEL_param_{number}]" in line for line in old):
            continue  # read: dropping it would change the code
        renumbered = [re.sub(r"KERNEL_param_(\d+)", lambda m: "KERNEL_param_" + str(
            int(m.group(1)) - (int(m.group(1)) > number)), line).rstrip(",")
            for line in old if not ((m := _PARAM.match(line)) and int(m.group(2)) == number)]
        if renumbered == [line.rstrip(",") for line in new]:
            return True
    return False


def compare(old_dir: str, new_dir: str) -> int:
    old, new = sorted(p.name for p in Path(old_dir).iterdir()), \
        sorted(p.name for p in Path(new_dir).iterdir())
    if old != new:
        print("the folders hold other kernels:", sorted(set(old) ^ set(new)))
        return 1
    same, dropped, different = 0, 0, []
    for name in old:
        a = Path(old_dir, name).read_text().splitlines()
        b = Path(new_dir, name).read_text().splitlines()
        if a == b:
            same += 1
        elif _same_but_one_unread_param(a[1:], b[1:]):
            dropped += 1
        else:
            different.append(a[0])
    print(f"{len(old)} kernels: {same} byte-identical, {dropped} identical but for one unread "
          f"parameter no longer passed, {len(different)} different")
    for line in different:
        print("different:", line)
    return 1 if different else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    dump = sys.argv[1:2] == ["dump"]
    rest = sys.argv[3:] if dump else sys.argv[1:]
    workers = int(rest[0]) if rest else 2
    all_keys = keys()
    with ProcessPoolExecutor(workers) as pool:
        if dump:
            Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
            for name in pool.map(_dump, [(k, sys.argv[2]) for k in all_keys]):
                print(name, flush=True)
        else:
            for key, digest in zip(all_keys, pool.map(ptx_hash, all_keys)):
                print(digest, describe(key), flush=True)

"""Decode tuning variants tried on the H200, and how to apply one to cute_fa/tuning.py."""
import re, sys
VARIANTS = {
    "v0": dict(t128="[(64, 64, 128)]", t64="[(64, 128, 128), (64, 64, 128)]", stages=2, ctas="{128: 2}"),
    "v1": dict(t128="[(64, 64, 128)]", t64="[(64, 128, 128), (64, 64, 128)]", stages=0, ctas="{128: 2}"),
    "v2": dict(t128="[(16, 64, 32), (64, 64, 128)]", t64="[(16, 64, 32), (64, 64, 128)]", stages=0, ctas="{}"),
    "v3": dict(t128="[(16, 64, 32), (64, 64, 128)]", t64="[(16, 64, 32), (64, 64, 128)]", stages=2, ctas="{}"),
}

def apply(tuning, name):
    """Set the module's constants (in memory)."""
    v = VARIANTS[name]
    tuning.DECODE_TILES[128] = eval(v["t128"]); tuning.DECODE_TILES[64] = eval(v["t64"])
    tuning.DECODE_KV_STAGES = v["stages"]
    tuning.DECODE_CTAS_PER_SM.clear(); tuning.DECODE_CTAS_PER_SM.update(eval(v["ctas"]))

def rewrite(path, name):
    """Write the variant into tuning.py's source."""
    v = VARIANTS[name]
    s = open(path).read()
    s = re.sub(r"DECODE_TILES = \{64: \[.*?\], 128: \[.*?\],", f"DECODE_TILES = {{64: {v['t64']}, 128: {v['t128']},", s, flags=re.S)
    s = re.sub(r"^DECODE_KV_STAGES = \d+", f"DECODE_KV_STAGES = {v['stages']}", s, flags=re.M)
    s = re.sub(r"^DECODE_CTAS_PER_SM = \{.*?\}", f"DECODE_CTAS_PER_SM = {v['ctas']}", s, flags=re.M)
    open(path, "w").write(s)

if __name__ == "__main__":
    rewrite(sys.argv[1], sys.argv[2])

"""GPU architectures: the one place an arch string is parsed and what cute_fa knows of each.

An arch is named the way `cute.compile` targets it and the way `forward` looks kernels up on
that GPU: 'sm_80', 'sm_86', ..., 'sm_90a', 'sm_120a' ('a': the arch-specific target of sm90 and
newer, which the DSL compiles for).
"""

from __future__ import annotations

from dataclasses import dataclass

# usable dynamic shared memory per CTA, by arch name
SMEM_BYTES = {
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_87": 163 * 1024,
    "sm_89": 99 * 1024,
    "sm_90a": 227 * 1024,
    "sm_100a": 227 * 1024,
    "sm_120a": 99 * 1024,
}
ARCHS = tuple(SMEM_BYTES)


def _suffix(major: int) -> str:
    return "a" if major in (9, 10, 12) else ""


@dataclass(frozen=True)
class Arch:
    """One GPU architecture, by compute capability."""

    major: int
    minor: int

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}{_suffix(self.major)}"

    @property
    def has_tma(self) -> bool:
        """TMA (cp.async.bulk.tensor) exists from sm90 on."""
        return self.major >= 9

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory a CTA may use (99 KB where the arch is not in the table)."""
        return SMEM_BYTES.get(self.name, 99 * 1024)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text) -> Arch:
        """'sm_90a', 'sm_90', 'sm90' or 'SM90' -> Arch(9, 0); anything that is not one of
        ARCHS raises, naming them."""
        if isinstance(text, Arch):
            return text
        if not isinstance(text, str):
            raise TypeError(f"arch must be a str such as 'sm_90a', got {type(text).__name__}")
        spelled = text.strip().lower().replace("sm_", "sm", 1)
        digits = spelled[2:].rstrip("a")
        if spelled.startswith("sm") and digits.isdigit() and len(digits) >= 2:
            arch = cls(int(digits[:-1]), int(digits[-1]))
            if arch.name in SMEM_BYTES and (arch.name.endswith("a") or not spelled.endswith("a")):
                return arch
        raise ValueError(f"arch must be one of {', '.join(ARCHS)} (or the same without '_' or "
                         f"'a'), got {text!r}")

    @classmethod
    def of_name(cls, name: str) -> Arch:
        """The Arch of a name this module produced (no checks: GPUs outside ARCHS too)."""
        digits = name[3:].rstrip("a")
        return cls(int(digits[:-1]), int(digits[-1]))

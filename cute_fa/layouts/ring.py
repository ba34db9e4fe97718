"""The TMA kernel's K/V ring: which stage and mbarrier phase a round uses, and where the
mbarriers sit. Plain Python (no DSL import): `ring_slot` runs on Python ints (introspection,
notebooks) and on DSL integers (kernel) alike.
"""

from dataclasses import dataclass


def ring_slot(round_index, stages: int):
    """(stage, phase) of K/V round `round_index` in a ring of `stages` buffers.

    Round i fills stage i % stages; each stage's mbarrier completes once per lap,
    so the phase to wait for flips every lap: (i // stages) % 2.
    """
    return round_index % stages, (round_index // stages) % 2


@dataclass(frozen=True)
class RingBarriers:
    """Where the TMA kernel's mbarriers sit in its array: Q's, then one per stage for K
    landed, V landed, and "empty" (every thread has read the stage)."""

    stages: int
    q = 0
    k = 1

    @property
    def v(self) -> int:
        return 1 + self.stages

    @property
    def empty(self) -> int:
        return 1 + 2 * self.stages

    @property
    def count(self) -> int:
        return 1 + 3 * self.stages

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


def ring_round(i, base=None):
    """The ring round of a tile's round i: i in a one-tile CTA (base None); base + i in a
    persistent one, whose rounds run on across its tiles (base: those of its earlier tiles)."""
    return i if base is None else base + i


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

    def addresses(self, mbar) -> tuple:
        """(Q, K, V, empty): the first mbarrier of each kind, from the array's address."""
        return tuple(mbar + i for i in (self.q, self.k, self.v, self.empty))


@dataclass(frozen=True)
class PipelineBarriers:
    """Where the wgmma kernel's mbarriers sit: Q's; per stage K full and V full (the TMA bytes
    have landed; one arrival, the producer's expect_tx), then K empty and V empty (every
    consumer warp is done reading; one arrival per consumer warp). K and V have their own
    "empty" so that the producer can refill a stage's K while its V is still being read (the
    intra-warpgroup overlap reads K one round ahead of V). Stage and phase of round i:
    `ring_slot`, for both kinds; the producer waits for the "empty" of round i - stages.
    q_empty (a persistent kernel's): one more, after them, on which every consumer warp
    releases Q once its tile's wgmmas have read it, so that the producer loads the next
    tile's; Q's two barriers then complete once per tile, phase (tile's index) % 2."""

    stages: int
    q_empty: bool = False
    q = 0
    k_full = 1

    @property
    def v_full(self) -> int:
        return 1 + self.stages

    @property
    def k_empty(self) -> int:
        return 1 + 2 * self.stages

    @property
    def v_empty(self) -> int:
        return 1 + 3 * self.stages

    @property
    def q_released(self) -> int:
        """q_empty's index (only where it is one of the barriers)."""
        if not self.q_empty:
            raise ValueError("these barriers have no q_empty (not a persistent kernel's)")
        return 1 + 4 * self.stages

    @property
    def count(self) -> int:
        return 1 + 4 * self.stages + int(self.q_empty)

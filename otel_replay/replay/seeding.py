"""The `rng` a policy gets: `random.Random(f"{seed}:{position}")`, seeded only when first used."""

from __future__ import annotations

import random
from typing import Any

_NOTHING = object()


def _seed_now(rng: random.Random) -> None:
    pending = rng.__dict__.pop("_seed_on_use", _NOTHING)
    if pending is not _NOTHING:
        rng.__class__ = random.Random
        seed, position = pending
        random.Random.seed(rng, f"{seed}:{position}")


class SeededOnUse(random.Random):
    """`random.Random(seed)`, seeded on its first use.

    Seeding from a string costs ~6 µs (sha512, then the 624-word state), more than a whole
    replayed step, and most policies never draw. The first draw (or any state access) seeds it
    and turns it into a plain `random.Random`, so it gives exactly the draws `random.Random(seed)`
    gives. It defines `getrandbits`, so `_randbelow` is the same method as `random.Random`'s.
    """

    __slots__ = ()  # the same layout as random.Random, so the class can be switched in place
    gauss_next = None  # read by gauss() before its first draw, as after seed()

    def __new__(cls, seed: Any = None, position: Any = None) -> SeededOnUse:
        return super().__new__(cls)  # Python 3.10's C Random.__new__ takes at most one argument

    def __init__(self, seed: Any = None, position: Any = None) -> None:  # no super().__init__: it seeds now
        self._seed_on_use = (seed, position)

    def random(self) -> float:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.random(self)

    def getrandbits(self, k: int) -> int:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.getrandbits(self, k)

    def randbytes(self, n: int) -> bytes:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.randbytes(self, n)

    def getstate(self) -> Any:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.getstate(self)

    def seed(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop("_seed_on_use", None)
        # ignore: the instance becomes a plain Random on purpose (no more seeding on use); mypy types __class__ fixed
        self.__class__ = random.Random  # type: ignore[assignment]
        random.Random.seed(self, *args, **kwargs)

    def setstate(self, state: Any) -> None:
        self.__dict__.pop("_seed_on_use", None)
        # ignore: the instance becomes a plain Random on purpose (no more seeding on use); mypy types __class__ fixed
        self.__class__ = random.Random  # type: ignore[assignment]
        random.Random.setstate(self, state)

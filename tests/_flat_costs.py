"""Pass costs for tests of speculative decoding that need drafts sent whatever the machine's
timings say (on a loaded machine measured costs could make any draft look unprofitable)."""

from __future__ import annotations

from pyinfer.lookup import PassCosts


class FlatCosts(PassCosts):
    """Passes that cost the same at any row count, and stay so: every candidate is sent."""

    def observe(self, rows: int, seconds: float) -> None:
        pass

    def ratio(self, rows: int) -> float:
        return 1.0

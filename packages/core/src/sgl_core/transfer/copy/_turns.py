"""The callers' side of a real-call trial (``_decide``): a timed turn, and a per-layer load
step that takes turns while its key is confirmed (docs/design.md, "Copy threads,
calibrated").
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Protocol

__all__ = ["Confirming", "confirm_call", "offered_turn", "timed_turn"]


class Confirming(Protocol):
    """What ``confirm_call`` asks of a calibrator (``Calibrator``, which imports this
    module, is one)."""

    @property
    def timer(self) -> Callable[[], float]: ...
    def turn(self, key: str) -> str | None: ...
    def current(self, key: str) -> str | None: ...
    def withdraw(self, key: str, name: str) -> None: ...
    def observe(self, key: str, nbytes: int, seconds: float, ran: str | None = None) -> bool: ...
    def confirming(self) -> tuple[list[str], int]: ...


def offered_turn(cal: Confirming, key: str, offered: Container[str]) -> str | None:
    """``key``'s turn for this call (None: run the choice); a contender the call does not
    offer (not built, no streaming copy for these rows) is withdrawn, and the trial goes
    on without it while this call runs the choice."""
    ran = cal.turn(key)
    if ran is not None and ran not in offered:
        cal.withdraw(key, ran)
        return None
    return ran


def timed_turn(cal: Confirming, key: str, nbytes: int, ran: str, run: Callable[[], None]) -> None:
    """``run()``, candidate ``ran`` of ``key`` on a real call, timed and reported
    (``observe``); a candidate that raises is withdrawn from the key's trial (else every
    later turn would hand it out again) and the error goes on."""
    start = cal.timer()
    try:
        run()
    except BaseException:
        cal.withdraw(key, ran)
        raise
    cal.observe(key, nbytes, cal.timer() - start, ran=ran)


def confirm_call(
    cal: Confirming,
    key: str,
    nbytes: int,
    runs: dict[str, Callable[[], None]],
    chosen: str,
    settled: list[str],
) -> None:
    """One real call of a copy whose candidates were built once (a per-layer load's step):
    while ``key``'s choice is confirmed, the trial's turn (``timed_turn``); after, the
    choice the trial made (``chosen``, the sample's, if that is not among ``runs``), kept
    in ``settled`` (the step's own list, empty at first) and the other candidates dropped:
    from then on the calibrator is not asked, so a load never waits for its lock (held
    while another thread measures)."""
    if settled:
        runs[settled[0]]()
        return
    ran = offered_turn(cal, key, runs)
    if ran is not None:
        timed_turn(cal, key, nbytes, ran, runs[ran])
        return
    # the trial is over, or this thread measures a sample
    name = cal.current(key) or chosen
    name = name if name in runs else chosen
    if key not in cal.confirming()[0]:
        settled.append(name)
        for other in [n for n in runs if n != name]:
            del runs[other]  # (their steps, e.g. streaming tables, are not kept)
    runs[name]()

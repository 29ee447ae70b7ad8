"""Whether a 429 that reports no budget follows the scope's rate or refuses one call at random (pure).

A provider whose window is full refuses *every* call until it has room: its
429s come in runs, with no answer between them (a run as long as the calls in
flight at once, then the storm's probes). A provider or gateway that refuses a
share of calls at random, whatever the rate, makes runs as long as chance
makes them: with a share ``b`` of refusals, a run of ``k`` has probability
about ``b ** k``. Lowering the rate cures the first kind and not the second.

So a 429 *follows the rate* (it may cool the scope down, start a storm and
lower the discovered rate) only when it makes the current run of refusals ``k``
long, ``k`` the shortest run that a random refusal at the learnt *noise* share
grows into with probability at most :data:`ALPHA` (``b ** (k - 1)``); shorter runs are per-call
refusals: that call alone retries (its Retry-After, else
``blip_retry_seconds``) and the scope keeps its rate and admits the others.

The noise share ``b`` is learnt from runs that ended (an answer came) shorter
than ``k``: their refusals over all outcomes, averaged over about the last
256 outcomes. Until :data:`CONFIRM` such short runs were seen,
``k`` is 1: every 429 follows the rate, as for a provider that never refused
at random (one lone 429 says nothing either way, and a real limit must not
wait for a second). Runs at least ``k`` long never count as noise, so a real
limit's storms do not raise ``k``.

A run that acted is doubted again as the share grows: once ``k`` (or the ``k`` of
the share counted with the refusals near a limit it taught, which
:meth:`RefusalEvidence.at_limit` keeps out of the share the rule acts by) is longer
than it, chance explains it, and what it did is undone (issue 34: a storm's probes
refused five times in a row before noise was confirmed, at 30 % random refusals,
otherwise stood for a limit for good and paced the scope lower and lower).

The rule counts outcomes in the order the answers come; it reads no clock.
"""

from __future__ import annotations

import math
from typing import Final, final

from ._discovery import Discovery
from ._limits import CooldownCore
from ._pacing import PacingCore

__all__ = ["ALPHA", "CONFIRM", "MAX_RUN", "RefusalEvidence", "RefusalRule", "run_needed"]

ALPHA: Final = 1e-5
"""How unlikely it must be that a random refusal grows into a run as long as asked for (``b ** (k - 1)``)."""
MAX_RUN: Final = 16
"""The longest run ever required: past it, even a provider refusing most calls is taken for full."""
CONFIRM: Final = 2
"""Short runs seen before the noise share is believed (one lone 429 is as likely a full window)."""
_WEIGHT: Final = 1.0 / 256.0  # each outcome's weight in the noise share


def run_needed(noise: float) -> int:
    """The shortest run ``k`` that a random refusal at share ``noise`` grows into with probability
    ``noise ** (k - 1) <= ALPHA``: each 429 that ends such a run is that unlikely to be chance."""
    if noise <= 0.0:
        return 1
    if noise >= 1.0:
        return MAX_RUN
    return min(MAX_RUN, max(2, 1 + math.ceil(math.log(ALPHA) / math.log(noise) - 1e-9)))


@final
class RefusalEvidence:
    """The refusals a scope has seen, in answer order: the current run and the learnt noise share."""

    __slots__ = ("_at_limit", "_pending", "_seen", "_seen_all", "lone", "needed", "noise", "noise_all", "run")

    def __init__(self) -> None:
        self.run = 0  # refusals since the last answer
        self.noise = 0.0  # the share of outcomes that were refusals in short runs
        self.lone = 0  # short runs seen
        self.needed = 1  # the run that follows the rate now (see run_needed)
        self._at_limit = False  # the current run came while pacing at a limit (see at_limit)
        self._pending = 0  # answers not yet folded into the noise share
        self._seen = 0  # outcomes folded in (the share is their plain mean until there are 1 / _WEIGHT)
        self.noise_all = 0.0  # the same share with the runs near a limit counted too (see explained)
        self._seen_all = 0

    @property
    def confirmed(self) -> bool:
        """Whether random refusals have been seen often enough to hold lone 429s to a longer run."""
        return self.needed > 1

    @property
    def explained(self) -> int:
        """The run that refusals at random explain, judged with every run near a limit counted too.

        :meth:`at_limit` keeps those runs out of :attr:`noise`, which is right only if the run that
        taught the limit was one: a run that acted before noise was confirmed (every 429 acted
        then) or against a share learnt from a few dozen outcomes may be chance. Its refusals go
        on at their share whatever the pace, and this share, left free, shows it (see
        :meth:`RefusalRule.doubted`).
        """
        return run_needed(self.noise_all) if self.confirmed else 1

    def answered(self) -> None:
        """An answer that was not a 429: a run of refusals (if any) ends here."""
        if self.run:
            self._end_run()
        self._pending += 1

    def refused(self) -> bool:
        """A 429 that reported no budget; return whether it follows the rate (ends a long enough run)."""
        self.run += 1
        return self.run >= self.needed

    def at_limit(self) -> None:
        """The current run came while the scope paced at a limit a long run taught it.

        Near such a limit a sliding window refuses lone calls as its room comes back one call
        at a time: once noise is confirmed, the noise share is left as it was before (counted
        as noise, the limit's own refusals would raise it until they were ignored; counted as
        answers, they would wear it down to nothing while the random refusals go on).
        """
        self._at_limit = True

    def beyond_noise(self, refused: int, outcomes: int) -> bool:
        """Whether ``refused`` of ``outcomes`` is more than refusals at the noise share would make.

        Three standard deviations and two calls above the mean (a normal bound on the binomial);
        with no noise seen, any refusal is.
        """
        noise = self.noise
        if noise <= 0.0:
            return refused > 0
        expected = noise * outcomes
        return refused > expected + 3.0 * math.sqrt(expected) + 2.0

    def _end_run(self) -> None:
        run, self.run = self.run, 0
        short = run < max(2, self.needed)
        outcomes = self._pending + run
        self._pending = 0
        share = (run if short else 0) / outcomes
        self._seen_all += outcomes
        self.noise_all = _fold(self.noise_all, self._seen_all, outcomes, share)
        if self._at_limit:
            self._at_limit = False
            if self.lone >= CONFIRM:  # (until noise is confirmed, a lone 429 still counts)
                return
        self._seen += outcomes
        self.noise = _fold(self.noise, self._seen, outcomes, share)
        if short:
            self.lone += 1
        self.needed = run_needed(self.noise) if self.lone >= CONFIRM else 1


def _fold(mean: float, seen: int, outcomes: int, share: float) -> float:
    """``mean`` with ``outcomes`` more at ``share`` (``seen``: all outcomes, these included).

    A plain mean of the first outcomes (an average from nothing would start far too low),
    then an exponential one over about the last 1 / _WEIGHT.
    """
    kept = (1.0 - _WEIGHT) ** outcomes if seen * _WEIGHT > 1.0 else (seen - outcomes) / seen
    return mean * kept + (1.0 - kept) * share


@final
class RefusalRule:
    """A scope's side of the rule: the evidence, and what the 429s it let act have done.

    The quota core asks :meth:`refused` for each 429 that reports no budget and
    acts on the scope only when it says so; :meth:`answered` and :meth:`forget`
    tell it when what lone 429s did must be undone (:meth:`forget` returns the
    cooldown generation to lift).
    """

    __slots__ = ("_epoch", "_fed_run", "_lift_pending", "_noise_cooldown", "_noise_until", "evidence",
                 "transient")

    def __init__(self) -> None:
        self.evidence = RefusalEvidence()
        self.transient = False  # the last 429 was a per-call refusal
        self._fed_run = 0  # the longest run that acted on the scope
        self._noise_cooldown = -1  # the cooldown generation a lone 429 began, before noise was confirmed
        self._noise_until = -math.inf  # the latest end a provider asked for (Retry-After) before it
        self._lift_pending = False  # noise confirmed: undo at the first look past _noise_until
        self._epoch = [0, 0, 0]  # the discovery generation, its answers and its 429s

    def _count(self, generation: int, refused: int) -> list[int]:
        epoch = self._epoch
        if epoch[0] != generation:
            epoch[:] = [generation, 0, 0]  # the rate fell (or a storm stepped): a new epoch
        epoch[1] += 1
        epoch[2] += refused
        return epoch

    def answered(self, generation: int | None = None) -> bool:
        """An answer that was not a 429 (``generation``: discovery's, when the scope paces);
        return whether what lone 429s did must now be undone (see :meth:`forget`)."""
        self.evidence.answered()
        if generation is not None:
            self._count(generation, 0)
        return self.doubted()

    def doubted(self) -> bool:
        """Whether the longest run that acted is one that refusals at random make: shorter than the
        rule asks for now, or than it would ask for had no run near a limit been set aside
        (:attr:`RefusalEvidence.explained`). Without the second, a run that happened to be as
        long as a share learnt from the first few dozen outcomes asked for would stand for a
        limit for good: near it no refusal counts (:meth:`RefusalEvidence.at_limit`), so the
        share could never grow to show it was chance, and the scope paced lower and lower."""
        evidence = self.evidence
        return 0 < self._fed_run < max(evidence.needed, evidence.explained)

    def refused(self, discovery: Discovery) -> bool:
        """A 429 that reported no budget; return whether it acts on the scope.

        Paced at a rate a real full window taught (``discovery`` has a rate, or Redis keeps it,
        and a run of two or more, as long as asked for, acted), a lone 429 is the window's
        edge, unless no more 429s came since the rate last fell than the noise share explains.
        """
        evidence = self.evidence
        follows = evidence.refused()
        paced = discovery.shared or discovery.rate is not None
        if paced and self._fed_run >= max(2, evidence.needed) and not self.doubted():
            evidence.at_limit()
            _, outcomes, refused = self._count(discovery.generation, 1)
            follows = follows or evidence.beyond_noise(refused, outcomes)
        self.transient = not follows
        if follows and evidence.run > self._fed_run:
            self._fed_run = evidence.run
        return follows

    def cooled(self, generation: int | None, asked_until: float) -> None:
        """A 429 that acted asked for a wait until ``asked_until`` and began cooldown ``generation``
        (``None``: it joined the running one). Lifted if it proves to be noise, but not before the
        latest time a provider asked for: its Retry-After is its word, noise or not."""
        if not self.evidence.confirmed:
            if generation is not None:
                self._noise_cooldown = generation
            self._noise_until = max(self._noise_until, asked_until)

    def forget(self, pacing: PacingCore | None, cooldown: CooldownCore, now: float) -> None:
        """Once random refusals are confirmed and no run as long as the rule now asks for ever
        acted, undo what lone 429s did: the discovered rate (it measured nothing but chance)
        and the cooldown they began."""
        if self.doubted():
            self._fed_run = 0
            self._lift_pending = True
        if not self._lift_pending or now < self._noise_until:
            return  # (not before the provider's Retry-After has run: its word, noise or not)
        self._lift_pending = False
        if pacing is not None:
            pacing.forget_discovery()
        cooldown.lift(self._noise_cooldown, now)
        self._noise_cooldown = -1

"""A trait of each simulated developer's own: how readily they take a suggestion they would
accept, persistent across everything they do (production before an experiment, the experiment).

Real developers differ a lot in how much of what an assistant offers they take: some accept
nearly every right suggestion, others keep typing through most of them (habit, distrust, not
looking at ghost text). Without such a trait every simulated developer is the same person, so a
developer's behaviour before an experiment says nothing about their behaviour in it, and the
regression adjustment of the experiments (docs/experiments.md) has nothing to work on.

**Propensity** q of a developer: drawn once per developer id from Beta(4, 1.5) (mean 0.73,
standard deviation 0.17; 10th to 90th percentile about 0.49 to 0.93), seeded by the id, so the
same developer has the same q in every round, session and process. A suggestion their
population's rule accepts (``developers.respond``) is taken with probability q, per request
(seeded by the developer and the task); otherwise they type it themselves and the editor
reports it rejected. Their other outcomes (edited, partial, rejected, not shown) are as the rule
says. A developer's accept rate of shown suggestions is then about q times what the rule alone
gives, so two developers on the same suggestions differ by their q, as people do.
"""

from __future__ import annotations

import random
from dataclasses import replace

from .developers import Decision

PROPENSITY_BETA = (4.0, 1.5)
"""(a, b) of the Beta distribution of developers' propensities."""


def propensity(user: str) -> float:
    """The developer's own propensity to take a suggestion they would accept (module docstring)."""
    a, b = PROPENSITY_BETA
    return random.Random(f"simdev-propensity:{user}").betavariate(a, b)


def with_propensity(decision: Decision, *, user: str, request_key: str) -> Decision:
    """``decision`` as developer ``user`` acts on it: an accept becomes a reject with probability
    1 − their propensity (drawn from ``request_key``, so a rerun decides the same)."""
    if decision.outcome != "accepted":
        return decision
    if random.Random(f"simdev-take:{user}:{request_key}").random() < propensity(user):
        return decision
    return replace(decision, outcome="rejected", accepted_text_chars=0, retained_chars=0)

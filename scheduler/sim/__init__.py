"""`lattice simulate`: replay a cluster trace through the production scheduling core.

No API server, no controller: a trace (:mod:`scheduler.sim.trace`: Alibaba's GPU trace
v2023 CSVs, or a ``kubectl get nodes,pods -o json`` dump) is turned into the same ``Node``
and ``Pod`` records the watch streams produce, and :mod:`scheduler.sim.replay` hands every
arriving task to the same :class:`~scheduler.core.schedule.Framework` ``lattice run`` uses,
one fresh Snapshot and TopologyState per policy. A simulator with a scoring copy of its own
would prove nothing about the scheduler; this one can only disagree with production where
the controller's own wiring does (queue, retries, binding), which a replay leaves out on
purpose (FGD's methodology: a task that does not fit fails and is never retried).

:mod:`scheduler.sim.plot` draws the result with matplotlib, an optional extra
(``pip install 'lattice-scheduler[plot]'``), imported only when a plot is asked for.
"""

from __future__ import annotations

from typing import Final

LATTICE: Final = "lattice"
KUBE_DEFAULT: Final = "kube-default"
KUBE_MOST_ALLOCATED: Final = "kube-mostallocated"
POLICY_NAMES: Final = (LATTICE, KUBE_DEFAULT, KUBE_MOST_ALLOCATED)
"""The policies `lattice simulate --policies` offers, in the order results are shown
(the profiles: :func:`scheduler.sim.replay.policy_profile`)."""

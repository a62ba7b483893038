"""The Lattice node agent: reads a node's hardware topology and load, and publishes them.

One process per node (a DaemonSet). It reads sysfs and procfs
(:func:`scheduler.agent.reader.read_hardware` and :func:`~scheduler.agent.reader.read_psi`,
pure file reading that never raises on odd or missing files but records warnings), samples
CPU and memory use (:mod:`scheduler.agent.load`), builds the ``NodeTopology`` object
(:mod:`scheduler.agent.resource`) and creates or patches it (:mod:`scheduler.agent.publisher`,
the only module here that talks to the API server), on the cadence of
:mod:`scheduler.agent.runner`: samples every 5 s, a status write every 15 s, the hardware
re-read every 60 s. ``lattice agent --once --dry-run`` prints the object instead of
publishing it.
"""

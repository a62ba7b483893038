"""The Lattice node agent: reads a node's hardware topology and publishes it.

One process per node (a DaemonSet). Each cycle it reads sysfs and procfs
(:func:`scheduler.agent.reader.read_node`, pure file reading that never raises on odd or
missing files but records warnings), builds the ``NodeTopology`` object
(:mod:`scheduler.agent.resource`) and creates or patches it
(:mod:`scheduler.agent.publisher`, the only module here that talks to the API server), then
sleeps. ``lattice agent --once --dry-run`` prints the object instead of publishing it.
"""

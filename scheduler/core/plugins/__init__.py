"""In-tree plugins, one module per kube-scheduler plugin, each exporting ``NAME`` and ``new``."""

"""Lattice: a topology-, gang- and load-aware second scheduler for Kubernetes."""

__version__ = "0.1.0"

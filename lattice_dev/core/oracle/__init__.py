"""Straightforward reference implementations of the inter-pod plugins.

These modules loop over nodes and pods in plain Python, written to be read next to the
kube-scheduler sources rather than to be fast. The plugins delegate to them today; a faster
implementation must agree with them and they stay as the test oracle.
"""

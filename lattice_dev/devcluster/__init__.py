"""A real local control plane (etcd, kube-apiserver, kwok, optionally kube-scheduler).

Everything Lattice claims about Kubernetes is checked against this: the upstream
binaries built from their Go modules, not mocks. The same code serves
`lattice devcluster` and the test suite's session fixture.
"""

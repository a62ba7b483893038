"""Dynamic Resource Allocation (``resource.k8s.io/v1``), pure: CEL selectors, the objects
the allocator reads, and the structured allocator kube-scheduler 1.34 runs per node."""

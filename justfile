# Lattice tasks. `just demo` and `just test` are the two commands the README promises.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Show the recipes.
default:
    @just --list

# The main job on the embedded default: control plane, fake nodes, Lattice, a sample workload.
demo:
    lattice demo

# Build the container image with buildah (no Docker, no registry), cached by content; prints its archive.
image:
    python -m lattice_dev.devcluster.image

# Stop the demo cluster and remove its state.
down:
    lattice devcluster down

# Static checks and the whole test suite (starts its own control plane, Kubernetes v1.37.2):
# the tests that start no process of their own on every core, then the `cluster` ones
# (control plane, kubelet, image) one at a time.
test: lint build
    python -m pytest -q -n auto --dist loadfile -m "not cluster" --ignore=tests/e2e --ignore=tests/devcluster --ignore=tests/charts
    python -m pytest -q -m cluster

# The differential suites at full size (~25 min): more cases per drawn seed, and every seed
# that once failed run whole (`just test` runs each at most the default count).
test-diff *ARGS:
    LATTICE_DRA_CASES=1000 python -m pytest -q tests/e2e/test_differential.py tests/e2e/test_differential_preemption.py tests/e2e/test_differential_volumes.py tests/e2e/test_dra_random_vs_kube.py --diff-cases 1000 --preempt-cases 300 --volume-cases 300 {{ARGS}}

# The tests that talk to Kubernetes again on the older supported releases, 1.35.4 and 1.36.3
# (each plane built once, ~20 min cold; LATTICE_KUBERNETES picks the release).
test-matrix *ARGS:
    for v in 1.35.4 1.36.3; do LATTICE_KUBERNETES=$v lattice devcluster build; LATTICE_KUBERNETES=$v python -m pytest -q tests/e2e tests/devcluster tests/charts {{ARGS}}; done

# ruff, mypy and the import layers, as CI runs them.
lint:
    ruff check .
    ruff format --check .
    mypy
    lint-imports --no-cache --no-logo

# Build the control-plane binaries into the cache (done on first use anyway).
build:
    lattice devcluster build

# Lattice beside kube-scheduler and a null-binder floor on one 1000-node control plane (pods/s, fraction of the floor, latency, CPU per pod windowed and whole-process, RSS).
bench *ARGS:
    python -m lattice_dev.benchmarks.scheduling {{ARGS}}

# cProfile of `lattice run` (plain pods by default, `--workload` for the bench's others; 500 nodes, 1000 existing, 2000 pods): CPU ms/pod by area.
profile *ARGS:
    python -m lattice_dev.benchmarks.profile {{ARGS}}

# Load-aware placement on 60 kwok nodes, 20 % hot from foreign load: kube-scheduler vs Lattice, α table.
bench-load *ARGS:
    python -m lattice_dev.benchmarks.loadaware {{ARGS}}

# Peak RSS of lattice run on 5000 kwok nodes with 30 000 existing pods (~15 min set-up; --state-dir keeps the plane).
bench-memory *ARGS:
    python -m lattice_dev.benchmarks.memory {{ARGS}}

# A new leader's first binding after the leader's SIGKILL, two replicas at the default lease, 5000 kwok nodes with 30 000 existing pods (~15 min set-up; --state-dir keeps the plane).
bench-failover *ARGS:
    python -m lattice_dev.benchmarks.failover {{ARGS}}

# The pure core's cycle time at 1000 and 5000 nodes against a per-node Python loop.
bench-core:
    python -m lattice_dev.core.bench

# One preemption at 1000 and 5000 nodes with 30 000 existing pods, four preemptor kinds, against the naive oracle.
bench-preemption *ARGS:
    python -m lattice_dev.benchmarks.preemption {{ARGS}}

# Gangs on 64 gpu-8x kwok nodes under churn: Lattice CP-SAT, greedy-only, kube-scheduler (~8 min).
bench-gang *ARGS:
    python -m lattice_dev.benchmarks.gangs {{ARGS}}

# The topology simulator's gang stream live on kwok nodes labelled as its cluster (2x4x4x8): Lattice with its levels and kube-scheduler 1.37 with the upstream PodGroup (--arms lattice greedy kube), each beside its offline figure (~4 min an arm).
bench-topology *ARGS:
    python -m lattice_dev.benchmarks.topology {{ARGS}}

# GPU fragmentation, live: the Alibaba GPU trace on 1213 kwok nodes, Lattice vs kube-scheduler default and MostAllocated (~15 min; --synthetic SHARE --seed N for a drawn mix).
bench-frag *ARGS:
    python -m lattice_dev.benchmarks.frag {{ARGS}}

# DRA on 1000 kwok nodes x 8 GPUs + 2 NICs (ResourceSlices), 2000 template-claim pods, half pcieRoot-constrained: Lattice vs kube-scheduler.
bench-dra *ARGS:
    python -m lattice_dev.benchmarks.dra {{ARGS}}

# Start-up's cache sync without a cluster: 5000 node and 30 000 bound-pod bodies applied as the initial lists, with the cyclic collector on and paused (CPU s, peak RSS).
bench-startup *ARGS:
    python -m lattice_dev.benchmarks.startup {{ARGS}}

# bench-dra's stream through the pure core, no cluster: where Lattice's and kube's 1.37 profiles put the claims, per seed (--seeds 4 5 6, --nodes 200 --pods 400; ~25 s per seed at full size).
bench-dra-offline *ARGS:
    python -m lattice_dev.benchmarks.dra_offline {{ARGS}}

# A hostile DRA pod (2 claims x 9 devices on 16-device kwok nodes) beside a stream of plain pods: their p50/p99 alone and beside it, and whether the lease was lost (--nodes 1000 for the issue's size).
bench-hostile-dra *ARGS:
    python -m lattice_dev.benchmarks.hostile_dra {{ARGS}}

# Render manifests/ from charts/lattice (default values) and copy crds/ into the chart.
manifests:
    python -m tests.charts.render --write

# Faults between Lattice and kube-apiserver (resets, lost replies, stalls, refusals, an API server restart every 2nd seed) while 345 plain/volume/DRA/gang pods stream in; a row per seed (~3 min each; --seeds N.. or --runs N).
chaos *ARGS:
    python -m tests.e2e.faults.chaos {{ARGS}}

# Tenants under ElasticQuotas live on 8 gpu-8x kwok nodes (the simulator's four by default), pods completing and re-created when evicted: per tenant GPUs used vs guaranteed min and weighted fair share, time to min, samples above max (must be 0), reclaim evictions (~4 min).
bench-quota *ARGS:
    python -m lattice_dev.benchmarks.quota {{ARGS}}

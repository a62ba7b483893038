# Lattice tasks. `just demo` and `just test` are the two commands the README promises.

set shell := ["bash", "-euo", "pipefail", "-c"]

nodes := "10"

# Show the recipes.
default:
    @just --list

# The main job on the embedded default: a local control plane with fake nodes, shown.
demo:
    lattice devcluster down >/dev/null
    lattice devcluster up --nodes {{nodes}} --with-kube-scheduler
    lattice devcluster kubectl get nodes -L topology.kubernetes.io/zone -L node.kubernetes.io/instance-type
    @echo "The cluster keeps running: export KUBECONFIG=$(lattice devcluster kubeconfig); stop it with: just down"

# Stop the demo cluster and remove its state.
down:
    lattice devcluster down

# Static checks and the whole test suite (starts its own control plane).
test: lint
    python -m pytest -q

# ruff and mypy, as CI runs them.
lint:
    ruff check .
    ruff format --check .
    mypy

# Build the control-plane binaries into the cache (done on first use anyway).
build:
    lattice devcluster build

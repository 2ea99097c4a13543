"""The single-node Kubernetes cluster built here from Go modules (issue 21): pins, wrapper go.mods,
builds, CRD schemas, and the scripts behind `make cluster` / `make cluster-down`. Stdlib only, so the
Makefile can run it before the virtual environment exists."""

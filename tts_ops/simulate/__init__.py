"""`tts-ops simulate` and `tts-ops profile`: scale-from-zero, replayed offline.

The shipped manifests' autoscaling values are read from the rendered manifests (settings), traffic
from a CSV or a generator (trace), the predictor's costs from a measured profile (profile). Models of
Knative's KPA (knative_kpa), the Kubernetes HPA (hpa) and KEDA with its HTTP add-on (keda) decide
replica counts; pods start, serve one synthesis at a time and drain (pods); simulator runs the
events; report summarises and draws; sweep tries values and marks the Pareto front.
"""

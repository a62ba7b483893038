"""Load prediction: what each node will really be using, for load-aware scheduling.

Node agents report absolute used CPU (millicores) and memory (bytes) with
capacity and PSI every ~15 s. `LoadPredictor` smooths them per node with a
continuous-time EWMA (`ewma`), adds a fading estimate for every pod placed
since (`note_placement`), and falls back to requests for nodes whose reports
are stale or missing, flagging them. `scoring` turns a `PredictionBatch` into
integer 0..100 scores and a threshold filter; `synthetic` fakes agents.

Pure: no I/O, no Kubernetes, no clock - callers pass `now` (seconds).
"""

from scheduler.predict.config import ConfigError, PredictConfig
from scheduler.predict.predictor import LoadPredictor, estimate_pod
from scheduler.predict.scoring import (
    ThresholdVerdict,
    least_loaded_scores,
    target_packing_scores,
    threshold_verdict,
    utilisation_after,
)
from scheduler.predict.types import (
    CpuMem,
    LoadReport,
    LoadStatus,
    NodeLoadBreakdown,
    ObserveOutcome,
    PodEstimate,
    PredictionBatch,
    PsiSample,
)

__all__ = [
    "ConfigError",
    "CpuMem",
    "LoadPredictor",
    "LoadReport",
    "LoadStatus",
    "NodeLoadBreakdown",
    "ObserveOutcome",
    "PodEstimate",
    "PredictConfig",
    "PredictionBatch",
    "PsiSample",
    "ThresholdVerdict",
    "estimate_pod",
    "least_loaded_scores",
    "target_packing_scores",
    "threshold_verdict",
    "utilisation_after",
]

"""Merging agents' branches back: prediction, tiered resolution, the per-target lock.

Tier 1 is git's own merge, tier 2 mechanical resolution that provably keeps every added
line, tier 3 model-assisted resolution (opt-in). See ``branch_merge`` for the flow.
Importing this package is cheap: the anthropic SDK is only imported when tier 3 runs.
"""

from __future__ import annotations

from overstory.merge.branch_merge import merge_branch
from overstory.merge.lock import TargetLock
from overstory.merge.model import AnthropicResolver, ModelResolver, accept_model_reply
from overstory.merge.predict import predict_merge
from overstory.merge.results import MergePrediction, MergeResult

__all__ = [
    "AnthropicResolver",
    "MergePrediction",
    "MergeResult",
    "ModelResolver",
    "TargetLock",
    "accept_model_reply",
    "merge_branch",
    "predict_merge",
]

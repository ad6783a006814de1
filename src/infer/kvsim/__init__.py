"""KV-cache simulator and capacity planner (``infer kvsim``): Lab 0.3's experiments run on
the engine's own scheduler and block allocator, without tensors."""

from infer.kvsim.footprint import KVFootprint, load_footprint
from infer.kvsim.planner import CapacityPlan, plan_capacity
from infer.kvsim.simulator import StrategyResult, simulate
from infer.kvsim.strategies import STRATEGIES
from infer.kvsim.trace import Trace, TraceRequest, make_trace

__all__ = [
    "STRATEGIES",
    "CapacityPlan",
    "KVFootprint",
    "StrategyResult",
    "Trace",
    "TraceRequest",
    "load_footprint",
    "make_trace",
    "plan_capacity",
    "simulate",
]

"""devkit's execution engine: plans, checked once and launched many times.

A plan is a sequence of prebuilt kernel calls (calls.KernelCall) over a
static memory plan (memory.plan_memory: one arena, liveness-based reuse),
launched by a Launcher (launch.HostReplay). ``devkit.onnx.prepare`` compiles
models into plans (plan.build_plan); an eager op reuses its prebuilt call
from devkit.ops' call cache. See docs/engine.md.
"""

from .calls import KernelCall, launch
from .launch import HostReplay, make_launcher
from .memory import Lifetime, MemoryPlan, plan_memory

__all__ = ["HostReplay", "KernelCall", "Lifetime", "MemoryPlan", "launch", "make_launcher", "plan_memory"]

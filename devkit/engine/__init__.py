"""devkit's execution engine: plans, checked once and launched many times.

A plan is a sequence of prebuilt kernel calls (calls.KernelCall) over a
static memory plan (memory.plan_memory: one arena, liveness-based reuse),
launched by a Launcher (launch.GraphLaunch where the plugin has the graph
section, launch.HostReplay elsewhere); a run that waits is one
launch.StagedGraph, the copies in and out captured with the calls.
``devkit.onnx.prepare`` compiles
models into plans (plan.build_plan); an eager op reuses its prebuilt call
from devkit.ops' call cache. A graph a plan cannot run goes node by node
through interpreter.Interpreter; graph.py holds Stream.capture's graphs.
See docs/engine.md.

calls, launch and memory sit below devkit.ops (this package's __init__
imports only them, so that ops can import calls); binding, plan, fusion,
graph and interpreter sit above it (README.md, "Layers").
"""

from .calls import KernelCall, launch
from .launch import GraphLaunch, HostReplay, StagedGraph, make_launcher
from .memory import Lifetime, MemoryPlan, plan_memory

__all__ = ["GraphLaunch", "HostReplay", "KernelCall", "Lifetime", "MemoryPlan", "StagedGraph", "launch", "make_launcher",
           "plan_memory"]

"""How a plan's prebuilt calls reach the device: a Launcher replays them on
a stream. HostReplay launches them one by one from the host, which works on
every plugin; GraphLaunch captures them once into the plugin's own graph
(the ABI's graph section) and then makes one graph launch per run."""

from __future__ import annotations

from collections.abc import Sequence

from .calls import KernelCall, launch


class HostReplay:
    """Launcher: replays prebuilt calls from the host, in order."""

    def __init__(self, calls: Sequence[KernelCall]):
        self.calls = list(calls)
        self._stream = None  # the stream handle the calls hold

    def replay(self, stream) -> None:
        """Launch every call on ``stream`` (a devkit Stream)."""
        handle = stream.handle
        calls = self.calls
        if handle != self._stream:
            for call in calls:
                call.cdata.stream = handle
            self._stream = handle
        for call in calls:
            launch(call)


class GraphLaunch:
    """Launcher: the calls captured into a native graph at the first replay
    (their tensors point into the plan's fixed arena, so nothing is ever
    rebound), then one graph_launch per replay, on any stream of the device."""

    def __init__(self, calls: Sequence[KernelCall]):
        self._capture = HostReplay(calls)
        self._graph = None

    def replay(self, stream) -> None:
        if self._graph is None:
            with stream.capture(mode="native") as graph:
                self._capture.replay(stream)  # recorded by the plugin, not run
            self._graph = graph
        self._graph.launch(stream)


def make_launcher(device, calls: Sequence[KernelCall]) -> HostReplay | GraphLaunch:
    """The launcher for a plan's calls on ``device``: a native graph where the
    plugin has the graph section, host replay elsewhere."""
    return GraphLaunch(calls) if device.plugin.has_graphs and calls else HostReplay(calls)

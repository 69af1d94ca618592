"""How a plan's prebuilt calls reach the device: a Launcher replays them on
a stream. HostReplay launches them one by one from the host, which works on
every plugin; GraphLaunch captures them once into the plugin's own graph
(the ABI's graph section) and then makes one graph launch per run.

StagedGraph goes further for a run that waits for its results: one graph
holds the whole run -- the input copies from host staging arrays, the calls,
the output copies into host staging arrays -- and is launched on the default
stream, which completes it before returning. A run is then one plugin call,
and on the cpu plugin no thread hand-off at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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

    def forget_stream(self) -> None:
        """Someone else pointed the calls at a stream: the next replay points them again."""
        self._stream = None


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

    @property
    def graph(self):
        """The captured graph, None before the first replay."""
        return self._graph

    def forget_stream(self) -> None:
        """The graph, once captured, holds its calls as they were; until then the capture replays them."""
        self._capture.forget_stream()


class StagedGraph:
    """A whole run captured as one native graph: host staging arrays copied
    into ``inputs``, the calls, ``outputs`` copied into host staging arrays.
    ``run`` fills the input staging arrays, makes one graph launch on the
    default stream (complete when it returns) and returns copies of the
    output staging arrays. The plugin must have the graph section."""

    def __init__(self, device, calls: Sequence[KernelCall], inputs: Sequence, outputs: Sequence):
        self.inputs = [np.empty(array.shape, array.dtype) for array in inputs]
        self.outputs = [np.empty(array.shape, array.dtype) for array in outputs]
        # The default stream cannot capture: a stream of the graph's own records it.
        self._capture_stream = device.create_stream()
        with self._capture_stream.capture(mode="native") as graph:
            for array, staging in zip(inputs, self.inputs):
                if staging.size:  # recorded with the staging array's address, read at every launch
                    array.buffer.copy_from_host(_bytes(staging), stream=self._capture_stream)
            HostReplay(calls).replay(self._capture_stream)
            for array, staging in zip(outputs, self.outputs):
                if staging.size:
                    array.buffer.copy_to_host(_bytes(staging), stream=self._capture_stream)
        self._graph = graph

    def run(self, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``values`` (one per input, of its shape and dtype) in; the outputs, fresh arrays, out."""
        self.fill(values)
        self.launch()
        return [staging.copy() for staging in self.outputs]

    def fill(self, values: Sequence[np.ndarray]) -> None:
        """Copies ``values`` into the input staging arrays, which the next launch reads."""
        for staging, value in zip(self.inputs, values):
            np.copyto(staging, value)

    def launch(self) -> None:
        """The graph alone on the default stream (complete when it returns): the
        input staging arrays as they are in, the output staging arrays written."""
        self._graph.launch(None)


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def make_launcher(device, calls: Sequence[KernelCall]) -> HostReplay | GraphLaunch:
    """The launcher for a plan's calls on ``device``: a native graph where the
    plugin has the graph section, host replay elsewhere."""
    return GraphLaunch(calls) if device.plugin.has_graphs and calls else HostReplay(calls)

"""How a plan's prebuilt calls reach the device: a Launcher replays them on
a stream. HostReplay launches them one by one from the host, which works on
every plugin; a launcher over the ABI's graph section (capture the calls
once, then one graph launch per run) fits the same interface."""

from __future__ import annotations

from collections.abc import Sequence

from .calls import KernelCall, launch


class HostReplay:
    """Launcher: replays prebuilt calls from the host, in order."""

    def __init__(self, calls: Sequence[KernelCall]):
        self.calls = list(calls)
        self._stream = None  # the stream handle the calls hold

    def replay(self, stream_handle) -> None:
        """Launch every call on ``stream_handle`` (a DK_Stream)."""
        calls = self.calls
        if stream_handle != self._stream:
            for call in calls:
                call.cdata.stream = stream_handle
            self._stream = stream_handle
        for call in calls:
            launch(call)


def make_launcher(calls: Sequence[KernelCall]) -> HostReplay:
    """The launcher for a plan's calls."""
    return HostReplay(calls)

"""Host programs recorded once and replayed: what a quantized layer's call decides from its
config and its inputs' shapes is worked out on one call, and later calls of the same shapes
only allocate and launch (`cache.ProgramCache`), or, where `graphs` asks for it, replay a CUDA
graph of those steps (`graphed.GraphedProgram`)."""

from fp4cli.replay.cache import ProgramCache, graph_mode, graphs, replay_enabled, replays
from fp4cli.replay.recorder import active_recorder, host_step

__all__ = [
    "ProgramCache",
    "active_recorder",
    "graph_mode",
    "graphs",
    "host_step",
    "replay_enabled",
    "replays",
]

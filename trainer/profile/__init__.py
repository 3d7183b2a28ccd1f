"""Profiles: per-layer compute time and bytes, their JSON form and PipeDream's graph.txt."""

from pipeboard.trainer.profile.graphtxt import parse_graph_txt, to_graph_txt
from pipeboard.trainer.profile.schema import SCHEMA_VERSION, Layer, Profile, ProfileError

__all__ = ["SCHEMA_VERSION", "Layer", "Profile", "ProfileError", "parse_graph_txt", "to_graph_txt"]

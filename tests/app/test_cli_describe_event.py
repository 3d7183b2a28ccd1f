"""`pipeboard submit --wait` prints each metrics batch as one line of its scalars."""

import json

from pipeboard.app.cli.jobs import describe_event


def test_a_step_summary_with_per_stage_rows_prints_its_scalars_only():
    point = {"step": 7, "values": {"loss": 0.5, "samples_per_s": 120.0, "stages": [[0.1, 0.2], [0.3, 0.4]]}}
    line = describe_event({"event": "metrics", "data": json.dumps({"points": [point]})})
    assert line == "[metrics] step 7: loss=0.5, samples_per_s=120"

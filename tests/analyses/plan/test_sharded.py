"""Sharded plans against sharded runs: 2 gloo ranks on this CPU (two processes), each rank's measured peak
(the Memory analysis' protocol) against the plan's prediction for that rank, traced in one process in a
fake process group (no communication)."""

import pytest

from diagnostics.analyses.plan.configs import Config, Setting
from diagnostics.analyses.plan.measured import measured_sharded
from diagnostics.analyses.plan.planner import Planner
from diagnostics.analyses.plan.targets import resolve
from diagnostics.intake import load_model
from diagnostics.spec import ModelSpec

GOAL_PCT = 5.0


@pytest.mark.slow
@pytest.mark.parametrize("shard, port", [("zero3", 29651), ("zero1", 29652)])
def test_each_ranks_prediction_matches_its_gloo_rank(shard, port):
    spec = ModelSpec(source="sample", name="transformer", batch_size=8)
    config = Config(8, 64, Setting(shard=shard, ranks=2))
    st = Planner(load_model(spec), resolve("cpu", cpu={"ram_available_bytes": 1 << 34})).run(config)
    assert set(st.per_rank) == {0, 1}
    unsharded = Planner(load_model(spec), resolve("cpu", cpu={"ram_available_bytes": 1 << 34})).run(
        Config(8, 64, Setting()))
    assert st.state_bytes < unsharded.state_bytes  # each rank keeps part of the optimizer state
    for m in measured_sharded(spec, config, port=port):
        pred = st.per_rank[m["rank"]]
        err = 100 * (pred - m["peak_bytes"]) / m["peak_bytes"]
        assert abs(err) <= GOAL_PCT, f"{shard} rank {m['rank']}: {pred:,} vs {m['peak_bytes']:,} ({err:+.2f} %)"


def test_fsdp_needs_blocks_and_says_so():
    from diagnostics.errors import TorchScopeError

    spec = ModelSpec(source="sample", name="mlp")
    with pytest.raises(TorchScopeError, match="FSDP2 shards per block, and this model has no repeated blocks"):
        Planner(load_model(spec), resolve("cpu", cpu={"ram_available_bytes": 1 << 34})).run(
            Config(32, None, Setting(shard="zero3", ranks=2)))

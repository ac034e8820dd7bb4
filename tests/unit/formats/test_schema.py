"""The canonical schema: keys, phases, legacy migration, fail-closed readers, strict mode."""

from __future__ import annotations

import pytest

from otel_rl.formats import schema
from otel_rl.formats.schema import SchemaError


def test_phase_keys_and_units():
    assert schema.phase_key("learner", "collector_wait") == "Perf/learner_collector_wait_ms"
    assert schema.phase_key("learner", "learning") == "Perf/learning_time"
    assert schema.phase_key_scale("learner", "learning") == 1e-3
    assert schema.phase_key("collector", "env_step") == "Perf/collector_env_step_ms"
    assert schema.METRICS["Perf/learning_time"].unit == "s"
    assert schema.METRICS["Perf/learner_inference_h2d_ms"].unit == "ms"
    assert schema.METRICS["Perf/total_fps"].aggregation == "sum"


def test_top_level_and_nested_phases():
    top = {p.name for p in schema.top_level_phases("learner")}
    assert "inference" in top and "inference_forward" not in top
    assert schema.PHASES[("learner", "inference_d2h")].parent == "inference"
    assert schema.PHASES[("collector", "backend_step")].parent == "env_step"


def test_custom_phases_are_allowed_unless_strict():
    spec = schema.phase_spec("learner", "target_update")
    assert spec.key == "Perf/learner_target_update_ms" and spec.title == "Target Update"
    with pytest.raises(SchemaError, match="strict"):
        schema.phase_spec("learner", "target_update", strict=True)
    with pytest.raises(SchemaError, match="snake_case"):
        schema.phase_spec("learner", "Bad Name")
    with pytest.raises(SchemaError, match="timeline"):
        schema.phase_spec("gpu", "learning")


def test_metric_specs_families_namespaces_and_strict():
    assert schema.metric_spec("Loss/critic").unit == ""
    assert schema.metric_spec("sys/rss_bytes").unit == "By"
    assert schema.metric_spec("myteam/thing").key == "myteam/thing"
    with pytest.raises(SchemaError, match="namespaced"):
        schema.metric_spec("loss")
    with pytest.raises(SchemaError, match="strict"):
        schema.metric_spec("myteam/thing", strict=True)
    assert schema.metric_spec("reward/upright", strict=True).key == "reward/upright"


def test_otel_gauge_names_leave_units_to_metadata():
    assert schema.otel_gauge_name("Perf/learner_collector_wait_ms") == "rl.perf.learner_collector_wait"
    assert schema.otel_gauge_name("Train/mean_reward") == "rl.train.mean_reward"
    assert schema.otel_gauge_name("reward/up-right") == "rl.reward.up_right"


def test_legacy_migration_converts_units():
    migrated = schema.migrate_legacy(
        {
            "perf/steps_per_sec": 1000.0,
            "perf/iter_ms": 250.0,
            "timing/learner_train_ms": 200.0,
            "timing/learner_collector_wait_ms": 3.0,
            "timing/collector_inference_wait_ms": 4.0,
            "train/dp_sync_time": 0.002,
            "timing/learner_other_ms": 1.0,
            "custom/kept": 5.0,
        }
    )
    assert migrated == {
        "Perf/total_fps": 1000.0,
        "Perf/iteration_time": 0.25,
        "Perf/learning_time": 0.2,
        "Perf/learner_collector_wait_ms": 3.0,
        "Perf/collector_learner_action_wait_ms": 4.0,
        "Perf/dp_gradient_sync_ms_per_rank": 2.0,
        "custom/kept": 5.0,
    }


def test_mixed_legacy_and_canonical_fails_closed():
    with pytest.raises(SchemaError, match="mixes"):
        schema.migrate_legacy({"perf/iter_ms": 1.0, "Perf/iteration_time": 0.001})


@pytest.mark.parametrize("document", [{}, {"metric_schema_version": 2}, {"metric_schema_version": "1"}, {"metric_schema_version": True}])
def test_unknown_schema_version_fails_closed(document):
    with pytest.raises(SchemaError):
        schema.check_schema_version(document)


def test_supported_schema_version():
    assert schema.check_schema_version({"metric_schema_version": 1}) == 1


def test_buckets_cover_ten_microseconds_to_ten_seconds():
    assert schema.PHASE_BUCKETS_MS[0] == pytest.approx(0.01)
    assert schema.PHASE_BUCKETS_MS[-1] == 10_000.0
    assert list(schema.PHASE_BUCKETS_MS) == sorted(schema.PHASE_BUCKETS_MS)


def test_every_library_tag_maps_into_a_canonical_family():
    for library, table in schema.LIBRARY_TAGS.items():
        for key, canonical in table.items():
            assert schema.library_key(library, key) == canonical
            assert schema.metric_spec(canonical, strict=True).key == canonical, (library, key)


def test_unmapped_library_keys_go_under_the_library_unless_of_a_canonical_family():
    assert schema.library_key("sb3", "rollout/custom_stat") == "sb3/rollout/custom_stat"
    assert schema.library_key("rsl_rl", "Episode/distance") == "Episode/distance"  # a canonical family already
    assert schema.library_key("torchrl", "grad_norm") == "torchrl/grad_norm"
    assert schema.library_key("skrl", "Stats / Inference time (ms)") == "skrl/Stats/Inference_time_ms"
    assert schema.library_key("skrl", " / ") == "skrl/unnamed"
    assert schema.library_key("rsl_rl", "Episode_Reward/") == "rslrl/Episode_Reward"  # a prefix alone names no term
    assert schema.library_key("rsl_rl", "Perf/collection time") == "rslrl/Perf/collection_time"  # seed 000's namespace


def test_manager_based_environments_keep_their_trees_apart():
    """Seed 001: reward/<term> is the per-step reward manager's; Episode_Reward/<term> the retired episode sums; terminations their own."""
    assert schema.library_key("rsl_rl", "reward/track_lin_vel") == "reward/track_lin_vel"
    assert schema.library_key("rsl_rl", "Episode_Reward/track_lin_vel") == "Episode_Reward/track_lin_vel"
    assert schema.library_key("rsl_rl", "Episode_Termination/time_out") == "Episode_Termination/time_out"
    assert schema.library_key("rsl_rl", "Episode/rew_tracking") == "Episode/rew_tracking"  # legacy Isaac Gym's sums, as logged
    with pytest.raises(KeyError):
        schema.library_key("unknown-library", "x")

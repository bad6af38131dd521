"""Queues and profiles in schedd.toml: what they become, and errors that name the field."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from schedd import policy, policy_config
from schedd.policy.resources import Resources
from shared.config import ConfigError, SchedConfig, load

GOOD = """
policy = "teams"
usage_half_life_s = 3600.0

[queues."vision"]
guarantee_gpus = 8
max_gpus = 16
max_memory_mib = 1000000

[queues."vision/detection"]
guarantee_gpus = 4
guarantee_cpus = 16.0
max_gpus = 12
weight = 2.0
user_limit_factor = 1.5

[queues."nlp"]
guarantee_gpus = 0
guarantee_gpu_memory_mib = 163840
max_gpu_memory_mib = 327680

[profiles.default]
tick_s = 0
[profiles.default.settings]
min_run_s = 0

[profiles.teams]
order = "drf"
place = "best_fit"
admit = ["quota"]
make_room = ["reclaim"]
pending_window = 500
tick_s = 15.0
"""


def config_from(tmp_path: Path, text: str) -> SchedConfig:
    path = tmp_path / "schedd.toml"
    path.write_text('join_token = "x"\n' + text)
    return load(SchedConfig, str(path))


def test_queues_become_queue_specs(tmp_path: Path) -> None:
    specs = {q.name: q for q in policy_config.queue_specs(config_from(tmp_path, GOOD))}
    assert set(specs) == {"vision", "vision/detection", "nlp"}
    det = specs["vision/detection"]
    assert det.guarantee == Resources(4, 16.0, 0)
    assert det.max is not None and det.max.gpus == 12 and math.isinf(det.max.cpus)
    assert (det.weight, det.user_limit_factor) == (2.0, 1.5)
    vision = specs["vision"]
    assert vision.max is not None and vision.max.memory_mib == 1000000
    nlp = specs["nlp"]
    assert nlp.guarantee == Resources(0, 0.0, 0, 163840) and nlp.weight == 1.0
    assert nlp.max is not None and nlp.max.gpu_memory_mib == 327680
    assert nlp.max.gpus == policy_config.UNBOUNDED_GPUS  # bounded in GPU memory alone
    assert specs["vision"].max.gpu_memory_mib == policy_config.UNBOUNDED_MEMORY_MIB


def test_profiles_from_config_override_and_add(tmp_path: Path) -> None:
    config = config_from(tmp_path, GOOD)
    known = policy_config.profiles(config)
    default = known["default"].spec
    assert default is not None
    # Only what the table sets changes; the rest is the built-in profile's.
    builtin = policy.PROFILES["default"].spec
    assert builtin is not None
    assert (default.order, default.make_room, default.anticipate, default.blocking) == (
        builtin.order,
        builtin.make_room,
        builtin.anticipate,
        builtin.blocking,
    )
    assert default.settings.gittins_min_finished == builtin.settings.gittins_min_finished == 256
    assert default.tick_s is None and default.settings.min_run_s == 0
    assert default.settings.las_thresholds_gpu_s == builtin.settings.las_thresholds_gpu_s
    assert default.settings.half_life_s == 3600.0  # usage_half_life_s, for every profile
    assert known["fifo"].spec is not None and known["fifo"].spec.settings.half_life_s == 3600.0
    teams = policy_config.active_profile(config)
    assert (teams.name, teams.pending_window, teams.tick_s) == ("teams", 500, 15.0)
    assert policy.PROFILES["default"].spec is builtin  # the built-in table is untouched


def test_the_shipped_defaults_build(tmp_path: Path) -> None:
    config = config_from(tmp_path, "")
    assert policy_config.queue_specs(config) == ()
    assert policy_config.active_profile(config).name == config.policy


BAD = [
    ('[queues."a"]\nguarantee_gpus = 2\nmax_gpus = 1',
     'queues."a".max_gpus: must be ≥ guarantee_gpus'),
    ('[queues."a"]\nguarantee_gpus = 1\nguarantee_cpus = 4.0\nmax_cpus = 2.0',
     'queues."a".max_cpus: must be ≥ guarantee_cpus'),
    ('[queues."a"]\nguarantee_gpus = 0\nguarantee_memory_mib = 10\nmax_memory_mib = 1',
     'queues."a".max_memory_mib: must be ≥ guarantee_memory_mib'),
    ('[queues."a"]\nguarantee_gpus = 0\nguarantee_gpu_memory_mib = 10\nmax_gpu_memory_mib = 1',
     'queues."a".max_gpu_memory_mib: must be ≥ guarantee_gpu_memory_mib'),
    ('[queues."a"]\nguarantee_gpus = 0\nmax_gpu_memory_mib = 0',
     'queues."a".max_gpu_memory_mib: must be > 0 (leave it out for no bound)'),
    ('[queues."a"]\nguarantee_gpus = -1',
     'queues."a".guarantee_gpus: Expected `int` >= 0'),
    ('[queues."a"]\nmax_gpus = 4',
     'queues."a".guarantee_gpus: required'),
    ('[queues."a"]\nguarantee_gpus = 1\nmaxgpus = 4',
     'queues."a".maxgpus: unknown key'),
    ('[queues."a"]\nguarantee_gpus = 1\nweight = 0',
     'queues."a".weight: Expected `float` > 0'),
    ('[queues."a"]\nguarantee_gpus = 1\nuser_limit_factor = -1.0',
     'queues."a".user_limit_factor: Expected `float` > 0'),
    ('[queues."a"]\nguarantee_gpus = "two"',
     'queues."a".guarantee_gpus: Expected `int`, got `str`'),
    ('[queues."Team A"]\nguarantee_gpus = 1',
     'queues."Team A": not a queue name'),
    ('[queues]\na = 3',
     'queues."a": expected a table'),
    ('queues = 3',
     'queues: expected tables'),
    ('[queues."a"]\nguarantee_gpus = 2\n[queues."a/x"]\nguarantee_gpus = 2\n'
     '[queues."a/y"]\nguarantee_gpus = 1',
     'queues."a".guarantee_gpus: 2 is less than its sub-queues\' guarantees together (3)'),
    ('[profiles.x]\norder = "nope"\nplace = "best_fit"',
     "profiles.x.order: unknown 'nope'; known:"),
    ('[profiles.x]\norder = "fifo"',
     'profiles.x.place: required'),
    ('[profiles.x]\norder = 3\nplace = "best_fit"',
     'profiles.x.order: Expected `str`, got `int`'),
    ('[profiles.default]\nplace = "worst_fit"',
     "profiles.default.place: unknown 'worst_fit'"),
    ('[profiles.default]\nadmit = ["quota", "nope"]',
     "profiles.default.admit: unknown 'nope'"),
    ('[profiles.default]\nmake_room = ["nope"]',
     "profiles.default.make_room: unknown 'nope'"),
    ('[profiles.default]\nblocking = "nah"',
     "profiles.default.blocking: unknown 'nah'"),
    ('[profiles.default]\nestimates = "magic"',
     "profiles.default.estimates: unknown 'magic'"),
    ('[profiles.default]\npending_window = 0',
     'profiles.default.pending_window: must be at least 1'),
    ('[profiles.default]\ntick_s = -1.0',
     'profiles.default.tick_s: must be positive'),
    ('[profiles.default]\nwindow = 3',
     'profiles.default.window: unknown key'),
    ('[profiles.default.settings]\nmin_run_s = -1',
     'profiles.default.settings.min_run_s: expected'),
    ('[profiles.default.settings]\nmin_run = 1',
     'profiles.default.settings.min_run: unknown'),
    ('[profiles.default.settings]\nlas_thresholds_gpu_s = ["a"]',
     'profiles.default.settings.las_thresholds_gpu_s: expected a list of positive numbers'),
    ('[profiles.default.settings]\ngittins_min_finished = 8',
     'profiles.default.settings.gittins_min_finished: expected a whole number ≥ 32'),
    ('[profiles.default.settings]\ngittins_min_finished = 64.5',
     'profiles.default.settings.gittins_min_finished: expected a whole number ≥ 32'),
    ('[profiles.default.settings]\ndeadline_lease_s = 0.5',
     'profiles.default.settings.deadline_lease_s: expected a number of seconds, at least 1'),
    ('[profiles.default.settings]\ndeadline_lease_s = inf',
     'profiles.default.settings.deadline_lease_s: expected a number of seconds, at least 1'),
    ('[profiles.default.settings]\nhalf_life_s = 60',
     'profiles.default.settings.half_life_s: set usage_half_life_s'),
    ('policy = "nope"',
     "policy: unknown policy profile 'nope'; known:"),
    ('usage_half_life_s = 0',
     'Expected `float` > 0'),
]  # fmt: skip


@pytest.mark.parametrize(("text", "error"), BAD, ids=[e.split(":")[0] for _, e in BAD])
def test_a_bad_value_is_refused_naming_the_field(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError) as err:
        policy_config.active_profile(config_from(tmp_path, text))
    assert error in str(err.value)


def start_schedd_with(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [Path(sys.executable).parent / "schedd", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_schedd_refuses_to_start_on_a_bad_queue(tmp_path: Path) -> None:
    path = tmp_path / "schedd.toml"
    path.write_text('join_token = "x"\n[queues."a"]\nguarantee_gpus = 2\nmax_gpus = 1\n')
    done = start_schedd_with(path)
    assert done.returncode == 2
    assert done.stderr == (
        f'schedd: config: {path}: queues."a".max_gpus: must be ≥ guarantee_gpus (2)\n'
    )


def test_schedd_refuses_to_start_on_a_bad_profile(tmp_path: Path) -> None:
    path = tmp_path / "schedd.toml"
    path.write_text('join_token = "x"\n[profiles.default]\norder = "nope"\n')
    done = start_schedd_with(path)
    assert done.returncode == 2
    assert done.stderr.startswith("schedd: config: profiles.default.order: unknown 'nope'")

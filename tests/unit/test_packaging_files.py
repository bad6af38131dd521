"""The files shipped for operators stay in step with the code.

- config/*.toml load into their structs and name every field, so the examples stay
  complete as fields are added;
- systemd/*.service pass `systemd-analyze verify` and keep the settings the daemons
  rely on (notify protocol, watchdog, state directories, KillMode=process for agentd).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schedd import policy
from shared.config import AgentConfig, SchedConfig, load

ROOT = Path(__file__).resolve().parents[2]
CONFIGS: dict[str, type[SchedConfig] | type[AgentConfig]] = {
    "schedd": SchedConfig,
    "agentd": AgentConfig,
}

_TABLE = re.compile(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(#.*)?$")


def config_path(name: str) -> Path:
    return ROOT / "config" / f"{name}.toml"


def unit_path(name: str) -> Path:
    return ROOT / "systemd" / f"{name}.service"


def commented_keys(text: str) -> set[str]:
    """Dotted names of the keys set on commented-out lines (`# dsn = "..."`).

    A comment line counts when, without its `#`, it is a valid TOML assignment; keys in
    a [table] are named `table.key`.
    """
    found = set()
    prefix = ""
    for line in text.splitlines():
        table = _TABLE.match(line)
        if table:
            prefix = table.group(1) + "."
            continue
        stripped = line.strip()
        if not stripped.startswith("#"):
            continue
        try:
            assignment = tomllib.loads(stripped.lstrip("#").strip())
        except tomllib.TOMLDecodeError:
            continue
        found.update(prefix + key for key in assignment)
    return found


def missing_fields(
    kind: type[msgspec.Struct], table: dict[str, Any], commented: set[str], prefix: str = ""
) -> list[str]:
    """Fields of `kind` the TOML table does not set, recursing into nested structs.

    A field whose default is None cannot be written in TOML (there is no null), so for
    those a commented-out example (`# dsn = "..."`) counts as present.
    """
    missing = []
    for field in msgspec.structs.fields(kind):
        name = prefix + field.encode_name
        if field.encode_name in table:
            sub = field.type
            if isinstance(sub, type) and issubclass(sub, msgspec.Struct):
                missing += missing_fields(sub, table[field.encode_name], commented, name + ".")
        elif not (field.default is None and name in commented):
            missing.append(name)
    return missing


def unit_settings(text: str) -> dict[str, list[str]]:
    """`Key` -> values of a unit file (all sections together; keys may repeat)."""
    settings: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


# ---- example configs ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_example_config_loads(name: str) -> None:
    kind = CONFIGS[name]
    config = load(kind, str(config_path(name)))
    assert isinstance(config, kind)
    # The example points at a token file rather than holding the secret itself.
    assert config.join_token is None
    assert config.join_token_file


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_example_config_names_every_field(name: str) -> None:
    text = config_path(name).read_text()
    missing = missing_fields(CONFIGS[name], tomllib.loads(text), commented_keys(text))
    assert not missing, f"config/{name}.toml does not show these keys: {', '.join(missing)}"


def test_example_schedd_policy_is_known() -> None:
    config = load(SchedConfig, str(config_path("schedd")))
    policy.profile(config.policy)  # raises on an unknown profile, as schedd would


def test_missing_fields_sees_nested_and_commented_keys() -> None:
    text = '# dsn = "postgresql://x"\nlisten_port = 1\n[simulated]\ncount = 1\n'
    table = tomllib.loads(text)
    commented = commented_keys(text)
    assert commented == {"dsn"}
    assert "dsn" not in missing_fields(SchedConfig, table, commented)
    assert "listen_host" in missing_fields(SchedConfig, table, commented)
    agent_missing = missing_fields(AgentConfig, table, commented)
    assert "simulated.model" in agent_missing
    assert "simulated.count" not in agent_missing


# ---- systemd units --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "state_key"), [("schedd", "data_dir"), ("agentd", "state_dir")])
def test_unit_matches_config(name: str, state_key: str) -> None:
    settings = unit_settings(unit_path(name).read_text())
    assert settings["ExecStart"] == [f"/usr/local/bin/{name} --config /etc/gpusched/{name}.toml"]
    assert settings["Type"] == ["notify"]
    assert settings["NotifyAccess"] == ["main"]
    assert settings["WatchdogSec"] == ["30s"]
    assert settings["Restart"] == ["on-failure"]
    # The state directory systemd creates is the one the example config uses.
    state_dir = getattr(load(CONFIGS[name], str(config_path(name))), state_key)
    assert [f"/var/lib/{d}" for d in settings["StateDirectory"]] == [state_dir]


def test_agentd_unit_leaves_jobs_running() -> None:
    settings = unit_settings(unit_path("agentd").read_text())
    # Jobs live in agentd's cgroup: anything but `process` kills them on every restart.
    assert settings["KillMode"] == ["process"]
    assert settings["User"] == ["root"]
    # Inherited by every job: these would hide GPUs or break CUDA and JIT compilers.
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in settings, key
    for key in ("NoNewPrivileges", "MemoryDenyWriteExecute", "SystemCallFilter"):
        assert key not in settings, key


def test_schedd_unit_does_not_run_as_root() -> None:
    settings = unit_settings(unit_path("schedd").read_text())
    assert settings.get("User") not in (None, ["root"])


def _systemd_analyze() -> str | None:
    found = shutil.which("systemd-analyze")
    if found is None and Path("/usr/bin/systemd-analyze").exists():
        found = "/usr/bin/systemd-analyze"
    return found


@pytest.mark.skipif(
    _systemd_analyze() is None,
    reason="systemd-analyze is not installed (it comes with the systemd package)",
)
@pytest.mark.parametrize("name", ["schedd", "agentd"])
def test_unit_passes_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    assert analyze is not None
    # verify insists that ExecStart's binary exists: point it at this venv's script.
    script = Path(sys.prefix) / "bin" / name
    assert script.is_file(), f"{script} is missing: install the project (pip install -e .)"
    text = unit_path(name).read_text()
    rewritten, count = re.subn(
        rf"^ExecStart=/usr/local/bin/{name}(?=\s|$)",
        f"ExecStart={script}",
        text,
        flags=re.MULTILINE,
    )
    assert count == 1, f"systemd/{name}.service: ExecStart=/usr/local/bin/{name} not found"
    unit = tmp_path / f"{name}.service"
    unit.write_text(rewritten)

    result = subprocess.run(
        [analyze, "verify", str(unit)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    print(output)
    about_unit = [
        line
        for line in result.stderr.splitlines()
        if f"{name}.service" in line or str(tmp_path) in line
    ]
    assert result.returncode == 0, output
    assert not about_unit, output

"""Config fields removed once measured: an old run folder or checkpoint that holds one at the value the
code keeps still loads; one at another value is refused in one line (the code no longer runs it)."""

import pytest

from speedrun.config import RETIRED, RunConfig, from_dict
from speedrun.errors import ConfigError


def _with(path: str, value) -> dict:
    d = RunConfig().to_dict()
    section, name = path.split(".")
    d[section][name] = value
    return d


@pytest.mark.parametrize("path", sorted(RETIRED))
def test_a_retired_field_at_the_kept_value_loads(path):
    assert from_dict(_with(path, RETIRED[path])).to_dict() == RunConfig().to_dict()


def test_a_retired_field_at_another_value_is_refused():
    with pytest.raises(ConfigError, match=r"train.pdl=True: this option was removed .* only train.pdl=False"):
        from_dict(_with("train.pdl", True))
    with pytest.raises(ConfigError, match="train.inductor_options='coordinate_descent_tuning=true'"):
        from_dict(_with("train.inductor_options", "coordinate_descent_tuning=true"))


@pytest.mark.parametrize("path", sorted(RETIRED))
def test_a_retired_field_cannot_be_set(path):
    from speedrun.config import apply_overrides

    with pytest.raises(ConfigError, match="no such config field"):
        apply_overrides(RunConfig(), [f"{path}=1"])

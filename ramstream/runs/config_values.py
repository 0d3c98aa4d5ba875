"""A mergekit config's values as its method will parse them, checked before any work: a value the
method refuses (a density of 1.5) is named by the config's key (``models[2].parameters.density``),
not by the flag the merge would name, which the user never typed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ramstream import mergekit_config
from ramstream.errors import ConfigError
from ramstream.methods.options import OptionError
from ramstream.methods.registry import get_method
from ramstream.runs.output import checked_eps


def check_config_values(
    config: mergekit_config.ConfigMerge, flags: Mapping[str, Any], settings: Mapping[str, Any]
) -> None:
    """Parse ``settings`` (the config's, with the ``flags`` given beside it) as the method will;
    raise its refusal as the user should read it (``mergekit_config.config_refusal``)."""
    try:
        if "eps" in settings:
            try:
                checked_eps(settings["eps"])
            except ConfigError as exc:
                raise OptionError("eps", str(exc).removeprefix("--eps ")) from None
        options = {k: v for k, v in settings.items() if k not in mergekit_config.RUN_SETTINGS and v is not None}
        get_method(settings["method"]).parse(options, len(config.agents))
    except ConfigError as exc:
        raise mergekit_config.config_refusal(config, flags, exc) from None
